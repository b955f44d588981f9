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
    assert route_class("/openapi.json") == "docs"


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


def test_inference_key_opens_inference_paths_and_an_admin_key_opens_them_too() -> None:
    p = policy(inference=("inf-key-000000000",), admin=("adm-key-000000000",))
    assert _denied(p, "/v1/models", b"Bearer inf-key-000000000") == 0
    assert _denied(p, "/v1/models", b"Bearer adm-key-000000000") == 0
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


def test_guard_passes_health_without_a_key_and_metrics_when_no_admin_key_is_configured() -> None:
    client = StubTreq(GuardResource(_Ok(), policy(inference=("inf-key-000000000",)), 1024))
    assert _get(client, "http://node/health") == (200, b"ok")
    assert _get(client, "http://node/metrics") == (200, b"ok")


INF, ADM, MET = "inf-key-000000000", "adm-key-000000000", "met-key-000000000"
CREDENTIALS = {"none": None, "inference": INF, "admin": ADM, "metrics": MET, "cluster": TOKEN,
               "wrong": "wrong-key-0000000"}
ROUTES = {"health": "/health", "metrics": "/metrics", "openapi": "/openapi.json",
          "inference": "/v1/chat/completions",
          "ollama": "/api/tags", "admin": "/router/v1/models", "site": "/router/v1/site/inventory",
          "cluster": "/router/v1/node/state"}
#: Which credentials open each route when every kind of key is configured (401 otherwise).
OPENS = {"health": set(CREDENTIALS), "openapi": set(CREDENTIALS), "metrics": {"admin", "metrics"},
         "inference": {"inference", "admin"}, "ollama": {"inference", "admin"},
         "admin": {"admin"}, "site": {"admin"}, "cluster": {"cluster"}}


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("credential", sorted(CREDENTIALS))
@pytest.mark.parametrize("inside", [True, False], ids=["inside-cidrs", "outside-cidrs"])
def test_access_matrix_route_by_credential_by_cidr(route: str, credential: str, inside: bool) -> None:
    """Outside allowed_cidrs every route is 403 whatever the key; inside, each route opens to
    exactly its credentials (contract §4)."""
    p = AuthPolicy.build((INF,), (ADM,), TOKEN, ("10.0.0.0/8",), metrics_keys=(MET,))
    key = CREDENTIALS[credential]
    header = f"Bearer {key}".encode() if key else None
    host = "10.9.8.7" if inside else "192.0.2.1"
    expected = 403 if not inside else (0 if credential in OPENS[route] else 401)
    assert _denied(p, ROUTES[route], header, host=host) == expected


@pytest.mark.parametrize("credential,details", [("none", False), ("wrong", False), ("inference", True),
                                                ("admin", True), ("cluster", True), ("metrics", False)])
def test_health_shows_node_details_only_to_authenticated_callers(credential: str, details: bool) -> None:
    p = AuthPolicy.build((INF,), (ADM,), TOKEN, LOOPBACK, metrics_keys=(MET,))
    key = CREDENTIALS[credential]
    assert p.check("/health", "127.0.0.1", f"Bearer {key}".encode() if key else None) is details


def test_without_inference_keys_health_shows_details_to_anyone_allowed() -> None:
    assert policy(admin=(ADM,)).check("/health", "127.0.0.1", None) is True


def test_metrics_is_open_when_no_admin_or_metrics_key_is_configured() -> None:
    assert _denied(policy(inference=(INF,)), "/metrics", None) == 0
    assert _denied(policy(inference=(INF,), admin=(ADM,)), "/metrics", None) == 401


def test_forwarded_for_names_the_client_only_behind_a_trusted_proxy() -> None:
    p = AuthPolicy.build((), (), TOKEN, ("10.0.0.0/8",), trusted_proxies=("127.0.0.1/32",))
    # From the trusted proxy: the right-most untrusted hop is the client.
    assert p.client_host("127.0.0.1", "10.1.1.1") == "10.1.1.1"
    assert p.client_host("127.0.0.1", "192.0.2.9, 10.1.1.1") == "10.1.1.1"
    assert p.client_host("127.0.0.1", "10.1.1.1, 127.0.0.1") == "10.1.1.1"
    assert p.client_host("127.0.0.1", "garbage") == "garbage"  # refused by the CIDR check
    # From anyone else the header is ignored.
    assert p.client_host("10.2.2.2", "127.0.0.1") == "10.2.2.2"
    assert p.client_host("192.0.2.1", "10.1.1.1") == "192.0.2.1"
    assert p.client_host("127.0.0.1", None) == "127.0.0.1"


def _get_headers(client: StubTreq, url: str, headers: dict[bytes, list[bytes]]) -> int:
    out: list[int] = []
    client.get(url, headers=headers).addCallback(lambda r: out.append(r.code))
    client.flush()
    return out[0]


def test_guard_applies_allowed_cidrs_to_the_forwarded_client_of_a_trusted_proxy() -> None:
    """StubTreq's peer is 127.0.0.1: trusted here, so X-Forwarded-For decides."""
    p = AuthPolicy.build((), (), TOKEN, ("10.0.0.0/8",), trusted_proxies=("127.0.0.0/8",))
    client = StubTreq(GuardResource(_Ok(), p, 1024))
    assert _get_headers(client, "http://node/health", {b"x-forwarded-for": [b"10.3.3.3"]}) == 200
    assert _get_headers(client, "http://node/health", {b"x-forwarded-for": [b"192.0.2.5"]}) == 403
    assert _get_headers(client, "http://node/metrics", {}) == 403  # the proxy itself is not allowed


def test_guard_refuses_health_and_metrics_outside_allowed_cidrs() -> None:
    client = StubTreq(GuardResource(_Ok(), policy(cidrs=("10.0.0.0/8",)), 1024))
    assert _get(client, "http://node/health")[0] == 403
    assert _get(client, "http://node/metrics")[0] == 403


def test_client_checks_are_remembered_per_policy_and_change_neither_equality_nor_hash() -> None:
    """A reload builds a new policy: what one policy remembered of a client never answers for
    another, and what it remembered is not part of what the policy is."""
    narrow = AuthPolicy.build([], [], "t", ["10.0.0.0/8"])
    wide = AuthPolicy.build([], [], "t", ["0.0.0.0/0"])
    fresh = AuthPolicy.build([], [], "t", ["10.0.0.0/8"])
    before = hash(narrow)
    assert [narrow.client_allowed(h) for h in ("10.1.2.3", "192.168.1.1", "10.1.2.3", "x")] == [
        True, False, True, False]
    assert wide.client_allowed("192.168.1.1") and not narrow.client_allowed("192.168.1.1")
    assert narrow == fresh and hash(narrow) == before == hash(fresh)
    assert "10.1.2.3" not in repr(narrow)


def test_trusted_proxy_checks_are_remembered_apart_from_client_checks() -> None:
    policy = AuthPolicy.build([], [], "t", ["10.0.0.0/8"], trusted_proxies=["192.168.0.0/16"])
    assert policy.client_allowed("10.0.0.1") and not policy.proxy("10.0.0.1")
    assert policy.proxy("192.168.3.4") and not policy.client_allowed("192.168.3.4")
    assert [policy.proxy(h) for h in ("192.168.3.4", "10.0.0.1", "nope")] == [True, False, False]
