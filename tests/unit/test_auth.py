"""Access control (contract §4): route classes, keys, cluster token, CIDRs, envelopes."""

from __future__ import annotations

import json

import pytest
from treq.testing import StubTreq
from twisted.web.resource import Resource

from routerd.api.site import GuardResource
from routerd.cluster.auth import AuthPolicy, bearer, route_class
from routerd.errors import HTTPError

TOKEN = "cluster-token-0123456789"
LOOPBACK = ("127.0.0.0/8",)


def policy(inference: tuple[str, ...] = (), admin: tuple[str, ...] = (), token: str = TOKEN,
           cidrs: tuple[str, ...] = LOOPBACK) -> AuthPolicy:
    return AuthPolicy.build(inference, admin, token, cidrs)


def test_route_classes_follow_the_path_prefix() -> None:
    assert route_class("/router/v1/node/models") == "cluster"
    assert route_class("/router/v1/load") == "admin"
    assert route_class("/router/v1/site/inventory") == "admin"
    assert route_class("/v1/chat/completions") == "inference"
    assert route_class("/api/tags") == "inference"


def test_bearer_parsing_ignores_other_schemes() -> None:
    assert bearer(b"Bearer abc ") == "abc"
    assert bearer(b"bearer abc") == "abc"
    assert bearer(b"Basic abc") == ""
    assert bearer(None) == ""


def _denied(p: AuthPolicy, path: str, header: bytes | None, host: str = "127.0.0.1") -> int:
    try:
        p.check(path, host, header)
    except HTTPError as err:
        return err.status
    return 0


def test_inference_key_opens_inference_paths_only() -> None:
    p = policy(inference=("inf-key-000000000",), admin=("adm-key-000000000",))
    assert _denied(p, "/v1/models", b"Bearer inf-key-000000000") == 0
    assert _denied(p, "/v1/models", b"Bearer adm-key-000000000") == 401
    assert _denied(p, "/router/v1/load", b"Bearer adm-key-000000000") == 0
    assert _denied(p, "/router/v1/load", b"Bearer inf-key-000000000") == 401
    assert _denied(p, "/v1/models", None) == 401


def test_cluster_paths_accept_only_the_cluster_token() -> None:
    p = policy(inference=("inf-key-000000000",), admin=("adm-key-000000000",))
    assert _denied(p, "/router/v1/node/models", f"Bearer {TOKEN}".encode()) == 0
    assert _denied(p, "/router/v1/node/models", b"Bearer adm-key-000000000") == 401
    assert _denied(p, "/v1/models", f"Bearer {TOKEN}".encode()) == 401


def test_no_configured_token_closes_cluster_paths() -> None:
    p = policy(token="")
    assert _denied(p, "/router/v1/node/state", b"Bearer anything") == 401
    assert _denied(p, "/router/v1/node/state", None) == 401


def test_without_keys_inference_and_admin_paths_are_open() -> None:
    p = policy()
    assert _denied(p, "/v1/chat/completions", None) == 0
    assert _denied(p, "/router/v1/models", None) == 0


def test_clients_outside_allowed_cidrs_are_forbidden_first() -> None:
    p = policy(cidrs=("10.0.0.0/8",))
    assert _denied(p, "/v1/models", None, host="127.0.0.1") == 403
    assert _denied(p, "/v1/models", None, host="10.1.2.3") == 0
    assert _denied(p, "/v1/models", None, host="::ffff:10.1.2.3") == 0
    assert _denied(p, "/v1/models", None, host="not-an-ip") == 403


class _Ok(Resource):
    isLeaf = True

    def render(self, request: object) -> bytes:
        return b"ok"


def _get(client: StubTreq, url: str) -> tuple[int, bytes]:
    out: list[object] = []
    client.get(url).addCallback(lambda r: out.append(r.code) or r.content()).addCallback(out.append)
    client.flush()
    assert len(out) == 2, out
    return int(out[0]), bytes(out[1])  # type: ignore[call-overload]


@pytest.mark.parametrize("path,envelope", [("/v1/models", "openai"), ("/api/tags", "ollama"),
                                           ("/api/v1/generate", "openai")])
def test_guard_answers_refusals_in_the_path_familys_envelope(path: str, envelope: str) -> None:
    client = StubTreq(GuardResource(_Ok(), policy(inference=("inf-key-000000000",)), 1024))
    code, raw = _get(client, "http://node" + path)
    assert code == 401
    body = json.loads(raw)
    if envelope == "ollama":
        assert isinstance(body["error"], str)
    else:
        assert body["error"]["type"] == "unauthorized"


def test_guard_passes_allowed_requests_and_leaves_health_open() -> None:
    client = StubTreq(GuardResource(_Ok(), policy(inference=("inf-key-000000000",)), 1024))
    assert _get(client, "http://node/health") == (200, b"ok")
    assert _get(client, "http://node/metrics") == (200, b"ok")
