"""NodeClient: allow-list, bearer token, manual redirects, size caps, timeouts, error envelopes.

Reference scenarios 18, 23-31.  A small Klein app behind ``treq.testing.StubTreq`` plays every
node (StubTreq sends every host to the same resource; the app records the Host header).  Time is
a ``task.Clock``; no sockets.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from klein import Klein
from treq.testing import StubTreq
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest

from routerd.clients.node_client import (
    MAX_JSON_BYTES,
    ClusterTimeout,
    IncompatibleMaster,
    NodeClient,
    NotAllowed,
    RedirectRefused,
    RegisterReply,
    RemoteError,
    RequestTooLarge,
    ResponseTooLarge,
    TooManyRedirects,
    Unreachable,
)
from routerd.urls import AllowList, URLError
from routerd.wire.records import ModelRecord, Snapshot, WireError
from routerd.wire.status import RuntimeStatus, parse_status

TOKEN = "cluster-secret-0123456789"


class FakeNode:
    """Every node at once; records each request as (host, method, path, authorization, body)."""

    app = Klein()

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.pending: list[Deferred[bytes]] = []
        self.register_reply: dict[str, Any] = {"ok": True, "protocol_version": 2}
        self.error: tuple[int, bytes] | None = None
        self.big_answer = b""
        self.slow_control = False

    def _record(self, request: IRequest) -> dict[str, Any]:
        body = request.content.read()  # type: ignore[attr-defined]
        call = {
            "host": request.getHeader(b"host").decode(),
            "method": request.method.decode(),
            "path": request.path.decode(),  # type: ignore[attr-defined]
            "authorization": (request.getHeader(b"authorization") or b"").decode(),
            "body": json.loads(body) if body else None,
        }
        self.calls.append(call)
        return call

    def _json(self, request: IRequest, doc: Any, code: int = 200) -> bytes:
        request.setResponseCode(code)
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(doc).encode()

    @app.route("/router/v1/node/models", methods=["GET"])
    def models(self, request: IRequest) -> bytes:
        call = self._record(request)
        return self._json(request, {
            "node_id": call["host"].split(":")[0], "node_url": "http://" + call["host"],
            "build_version": "0.1.0", "protocol_version": 2,
            "models": [{"local_id": "llm", "filename": "llm.kcpps",
                        "capabilities": {"llm": True, "context": 4096}}]})

    @app.route("/router/v1/node/runtime-status", methods=["GET"])
    def status(self, request: IRequest) -> bytes:
        self._record(request)
        return self._json(request, {"node_id": "slave-a", "active_requests": 2,
                                    "queued_requests": 1, "active_stt_config": "whisper.kcpps"})

    @app.route("/router/v1/node/bad-status", methods=["GET"])
    def bad_status(self, request: IRequest) -> bytes:
        self._record(request)
        return self._json(request, {"active_requests": "two"})

    @app.route("/router/v1/node/register", methods=["POST"])
    def register(self, request: IRequest) -> bytes:
        self._record(request)
        if self.error is not None:
            request.setResponseCode(self.error[0])
            request.setHeader(b"content-type", b"application/json")
            return self.error[1]
        return self._json(request, self.register_reply)

    @app.route("/router/v1/node/load", methods=["POST"])
    @app.route("/router/v1/node/unload", methods=["POST"])
    def control(self, request: IRequest) -> bytes | Deferred[bytes]:
        self._record(request)
        if self.slow_control:
            d: Deferred[bytes] = Deferred()
            self.pending.append(d)
            return d
        return self._json(request, {"ok": True})

    @app.route("/router/v1/node/error", methods=["GET"])
    def error_route(self, request: IRequest) -> bytes:
        self._record(request)
        assert self.error is not None
        request.setResponseCode(self.error[0])
        return self.error[1]

    @app.route("/router/v1/node/big", methods=["GET"])
    def big(self, request: IRequest) -> bytes:
        self._record(request)
        request.setHeader(b"content-type", b"application/json")
        return self.big_answer

    @app.route("/router/v1/node/slow", methods=["GET"])
    def slow(self, request: IRequest) -> Deferred[bytes]:
        self._record(request)
        d: Deferred[bytes] = Deferred()
        self.pending.append(d)
        return d

    @app.route("/router/v1/node/redirect", methods=["GET", "POST"])
    def redirect(self, request: IRequest) -> bytes:
        self._record(request)
        target = request.args[b"to"][0]  # type: ignore[attr-defined]
        code = int(request.args.get(b"code", [b"302"])[0])  # type: ignore[attr-defined]
        request.setResponseCode(code)
        request.setHeader(b"location", target)
        return b"moved"

    @app.route("/router/v1/node/loop", methods=["GET"])
    def loop(self, request: IRequest) -> bytes:
        self._record(request)
        request.setResponseCode(302)
        request.setHeader(b"location", b"/router/v1/node/loop")
        return b""

    @app.route("/base/router/v1/node/models", methods=["GET"])
    def prefixed(self, request: IRequest) -> bytes:
        self._record(request)
        return self._json(request, {"node_id": "prefixed", "protocol_version": 2})

    @app.route("/router/v1/node/echo", methods=["POST"])
    def echo(self, request: IRequest) -> bytes:
        call = self._record(request)
        return self._json(request, {"got": call["body"]})


def result(d: Deferred[Any]) -> Any:
    out: list[Any] = []
    d.addBoth(out.append)
    assert out, "the Deferred has not fired"
    if isinstance(out[0], Failure):
        out[0].raiseException()
    return out[0]


def failure(d: Deferred[Any], kind: type[BaseException]) -> Any:
    out: list[Any] = []
    d.addBoth(out.append)
    assert out, "the Deferred has not fired"
    assert isinstance(out[0], Failure), f"expected a failure, got {out[0]!r}"
    assert out[0].check(kind), out[0]
    return out[0].value


@pytest.fixture
def node() -> FakeNode:
    return FakeNode()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make_client(node: FakeNode, clock: Clock, allowed: tuple[str, ...] = ("http://slave-a",),
                **kwargs: Any) -> NodeClient:
    return NodeClient(StubTreq(node.app.resource()), TOKEN, AllowList(allowed), 30.0, clock,
                      **kwargs)


# -- allow-list (scenario 27) --------------------------------------------------------------


def test_allow_list_compares_normalised_urls() -> None:
    allowed = AllowList(["HTTP://Slave-A:80/"])
    assert allowed.contains("http://slave-a")
    assert "http://slave-a/" in allowed
    assert allowed.bases() == ("http://slave-a",)
    allowed.remove("http://SLAVE-A")
    assert not allowed.contains("http://slave-a")
    assert not allowed.contains("not a url")
    with pytest.raises(URLError):
        allowed.add("ftp://slave-a")


def test_allow_list_permits_only_targets_under_a_base_path() -> None:
    allowed = AllowList(["http://slave-a/base"])
    assert allowed.permits("http://slave-a/base/router/v1/node/models?x=1")
    assert allowed.permits("http://SLAVE-A:80/base")
    assert not allowed.permits("http://slave-a/basement")
    assert not allowed.permits("http://slave-a/other")
    assert not allowed.permits("https://slave-a/base/x")
    assert not allowed.permits("http://slave-a:8080/base/x")
    assert not allowed.permits("http://slave-a/base/../admin")


def test_target_outside_the_allow_list_fails_unsent(node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock)
    err = failure(client.models("http://slave-b"), NotAllowed)
    assert err.reason == 'cluster target "http://slave-b/router/v1/node/models" is not allowed'
    assert node.calls == []
    assert clock.getDelayedCalls() == []


def test_unparseable_base_fails_unsent(node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock)
    failure(client.get_json("ftp://slave-a", "/router/v1/node/models"), NotAllowed)
    assert node.calls == []


def test_allowed_target_succeeds_with_the_bearer_token(node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock)
    snapshot = result(client.models("HTTP://SLAVE-A:80/"))
    assert isinstance(snapshot, Snapshot)
    assert snapshot.node_id == "slave-a"
    assert snapshot.models[0].local_id == "llm"
    assert node.calls == [{"host": "slave-a", "method": "GET", "path": "/router/v1/node/models",
                           "authorization": f"Bearer {TOKEN}", "body": None}]
    assert clock.getDelayedCalls() == [], "the deadline timer is cancelled once answered"


def test_base_with_a_path_prefix_is_kept(node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock, allowed=("http://slave-a/base",))
    snapshot = result(client.models("http://slave-a/base/"))
    assert snapshot.node_id == "prefixed"
    assert node.calls[0]["path"] == "/base/router/v1/node/models"


def test_adding_a_url_to_the_allow_list_enables_it(node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock, allowed=())
    failure(client.models("http://slave-a"), NotAllowed)
    client.allowed.add("http://slave-a/")
    assert result(client.models("http://slave-a")).node_id == "slave-a"


# -- redirects (scenario 28) ---------------------------------------------------------------


def test_redirect_to_an_unconfigured_host_is_refused_and_the_token_not_leaked(
        node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock)
    err = failure(client.get_json(
        "http://slave-a", "/router/v1/node/redirect?to=http://evil/router/v1/node/models"),
        RedirectRefused)
    assert isinstance(err, NotAllowed)
    assert "http://evil/router/v1/node/models" in err.reason
    assert [c["host"] for c in node.calls] == ["slave-a"]


def test_redirect_outside_the_allowed_base_path_is_refused(node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock, allowed=("http://slave-a/router",))
    failure(client.get_json("http://slave-a/router", "/v1/node/redirect?to=/admin"),
            RedirectRefused)
    assert len(node.calls) == 1


def test_redirect_within_the_allowed_base_is_followed_with_the_token(
        node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock)
    snapshot = result(client.get_json(
        "http://slave-a", "/router/v1/node/redirect?to=http://SLAVE-A:80/router/v1/node/models"))
    assert snapshot["node_id"] == "slave-a"
    assert [c["path"] for c in node.calls] == ["/router/v1/node/redirect", "/router/v1/node/models"]
    assert all(c["authorization"] == f"Bearer {TOKEN}" for c in node.calls)


def test_relative_redirect_to_another_allowed_base_is_followed(node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock, allowed=("http://slave-a", "http://slave-b"))
    result(client.get_json(
        "http://slave-a", "/router/v1/node/redirect?to=http://slave-b/router/v1/node/models"))
    assert [c["host"] for c in node.calls] == ["slave-a", "slave-b"]


def test_303_turns_a_post_into_a_get_and_307_keeps_it(node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock)
    result(client.post_json("http://slave-a",
                            "/router/v1/node/redirect?code=303&to=/router/v1/node/models", {"a": 1}))
    assert [(c["method"], c["body"]) for c in node.calls] == [("POST", {"a": 1}), ("GET", None)]
    node.calls.clear()
    answer = result(client.post_json(
        "http://slave-a", "/router/v1/node/redirect?code=307&to=/router/v1/node/echo", {"a": 1}))
    assert answer == {"got": {"a": 1}}
    assert [(c["method"], c["body"]) for c in node.calls] == [("POST", {"a": 1}), ("POST", {"a": 1})]


def test_at_most_ten_redirects_are_followed(node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock)
    failure(client.get_json("http://slave-a", "/router/v1/node/loop"), TooManyRedirects)
    assert len(node.calls) == 11


# -- size caps (scenario 29) ---------------------------------------------------------------


def test_request_body_over_8_mib_is_rejected_before_sending(node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock)
    body = {"blob": "x" * MAX_JSON_BYTES}
    err = failure(client.post_json("http://slave-a", "/router/v1/node/echo", body), RequestTooLarge)
    assert "limit" in err.reason
    assert node.calls == []


def test_request_body_at_the_cap_is_sent(node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock, max_json_bytes=64)
    body = {"blob": "x" * (64 - len('{"blob":""}'))}
    assert result(client.post_json("http://slave-a", "/router/v1/node/load", body)) == {"ok": True}
    assert node.calls[0]["body"] == body


def test_response_over_the_cap_is_refused(node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock, max_json_bytes=1000)
    node.big_answer = json.dumps({"blob": "y" * 1000}).encode()
    failure(client.get_json("http://slave-a", "/router/v1/node/big"), ResponseTooLarge)
    node.big_answer = json.dumps({"blob": "y" * 900}).encode()
    assert len(result(client.get_json("http://slave-a", "/router/v1/node/big"))["blob"]) == 900


def test_default_response_cap_is_8_mib(node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock)
    node.big_answer = b'"' + b"z" * MAX_JSON_BYTES + b'"'
    failure(client.get_json("http://slave-a", "/router/v1/node/big"), ResponseTooLarge)


# -- error envelopes (scenarios 23-25, 30) ---------------------------------------------------


def test_json_error_envelope_is_decoded(node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock)
    node.error = (409, json.dumps({"error": {"message": "node slave-a is taken",
                                             "type": "cluster_error",
                                             "code": "duplicate_node"}}).encode())
    err = failure(client.get_json("http://slave-a", "/router/v1/node/error"), RemoteError)
    assert (err.status, err.type, err.code, err.message) == (
        409, "cluster_error", "duplicate_node", "node slave-a is taken")
    assert err.is_duplicate_node


def test_ollama_style_and_plain_text_errors_keep_status_and_message(
        node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock)
    node.error = (404, b'{"error": "model not found"}')
    err = failure(client.get_json("http://slave-a", "/router/v1/node/error"), RemoteError)
    assert (err.status, err.type, err.code, err.message) == (404, "", "", "model not found")
    node.error = (500, b"boom")
    err = failure(client.get_json("http://slave-a", "/router/v1/node/error"), RemoteError)
    assert (err.status, err.message) == (500, "boom")
    assert not err.is_duplicate_node


@pytest.mark.parametrize("status, type_, code, terminal", [
    (409, "cluster_error", "duplicate_node", True),
    (500, "cluster_error", "duplicate_node", False),
    (409, "other_error", "duplicate_node", False),
    (409, "cluster_error", "other", False),
    (503, "", "", False),
])
def test_only_409_cluster_error_duplicate_node_is_a_duplicate(
        node: FakeNode, clock: Clock, status: int, type_: str, code: str, terminal: bool) -> None:
    client = make_client(node, clock)
    node.error = (status, json.dumps({"error": {"message": "m", "type": type_,
                                                "code": code}}).encode())
    snapshot = Snapshot(node_id="slave-a", node_url="http://slave-a", protocol_version=2)
    err = failure(client.register("http://slave-a", snapshot), RemoteError)
    assert err.is_duplicate_node is terminal


# -- node API calls (scenarios 18, 31) ------------------------------------------------------


def test_register_posts_the_snapshot_and_checks_the_masters_protocol(
        node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock, allowed=("http://master",))
    snapshot = Snapshot(node_id="slave-a", node_url="http://slave-a", build_version="0.1.0",
                        protocol_version=2, models=(ModelRecord(local_id="llm", public_id="llm"),))
    reply = result(client.register("http://master", snapshot))
    assert reply == RegisterReply(ok=True, protocol_version=2)
    (call,) = node.calls
    assert call["path"] == "/router/v1/node/register"
    assert call["body"]["node_id"] == "slave-a"
    assert call["body"]["models"][0]["local_id"] == "llm"


@pytest.mark.parametrize("reply", [{"ok": True, "protocol_version": 1}, {"ok": True}])
def test_register_reply_below_the_minimum_protocol_is_an_error(
        node: FakeNode, clock: Clock, reply: dict[str, Any]) -> None:
    client = make_client(node, clock, allowed=("http://master",))
    node.register_reply = reply
    err = failure(client.register("http://master", Snapshot(node_id="s", protocol_version=2)),
                  IncompatibleMaster)
    assert "update the master" in err.reason


def test_runtime_status_is_parsed(node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock)
    status = result(client.runtime_status("http://slave-a"))
    assert isinstance(status, RuntimeStatus)
    assert (status.node_id, status.workload, status.active_stt_config) == (
        "slave-a", 3, "whisper.kcpps")


def test_malformed_node_document_is_a_wire_error(node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock)

    d = client.get_json("http://slave-a", "/router/v1/node/bad-status").addCallback(parse_status)
    failure(d, WireError)


def test_load_sends_the_model_to_node_load(node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock)
    assert result(client.load("http://slave-a", "llm")) == {"ok": True}
    assert [(c["path"], c["body"]) for c in node.calls] == [("/router/v1/node/load", {"model": "llm"})]


def test_unload_sends_model_and_target(node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock)
    result(client.unload("http://slave-a", "llm", "text"))
    result(client.unload("http://slave-a"))
    assert [(c["path"], c["body"]) for c in node.calls] == [
        ("/router/v1/node/unload", {"model": "llm", "target": "text"}),
        ("/router/v1/node/unload", {}),
    ]


# -- deadlines and cancellation (scenario 26) -------------------------------------------------


def test_call_times_out_after_control_timeout(node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock)
    d = client.get_json("http://slave-a", "/router/v1/node/slow")
    clock.advance(29.9)
    assert not d.called
    clock.advance(0.1)
    err = failure(d, ClusterTimeout)
    assert "30s" in err.reason
    assert clock.getDelayedCalls() == []


def test_load_and_unload_use_the_longer_operation_timeout(node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock, operation_timeout=600.0)
    node.slow_control = True
    load = client.load("http://slave-a", "llm")
    unload = client.unload("http://slave-a", "llm")
    clock.advance(30)
    assert not load.called and not unload.called
    clock.advance(570)
    failure(load, ClusterTimeout)
    failure(unload, ClusterTimeout)


def test_per_call_timeout_overrides_control_timeout(node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock)
    d = client.get_json("http://slave-a", "/router/v1/node/slow", timeout=5.0)
    clock.advance(5)
    failure(d, ClusterTimeout)


def test_cancelling_a_call_aborts_it_at_once(node: FakeNode, clock: Clock) -> None:
    client = make_client(node, clock)
    d = client.get_json("http://slave-a", "/router/v1/node/slow")
    assert len(node.pending) == 1
    d.cancel()
    failure(d, CancelledError)
    assert clock.getDelayedCalls() == [], "the deadline timer is cancelled with the call"


def test_answer_arriving_before_the_deadline_wins(node: FakeNode, clock: Clock) -> None:
    stub = StubTreq(node.app.resource())
    client = NodeClient(stub, TOKEN, AllowList(["http://slave-a"]), 30.0, clock)
    d = client.get_json("http://slave-a", "/router/v1/node/slow")
    clock.advance(10)
    node.pending[0].callback(b'{"late": false}')
    stub.flush()
    assert result(d) == {"late": False}
    assert clock.getDelayedCalls() == []


def test_a_refused_connection_is_a_cluster_error_not_twisteds_own() -> None:
    """Found by the fault soak: a slave whose master was not (yet, or while it restarted)
    listening got Twisted's ConnectionRefusedError from ``register``; the slave only handles
    ClusterError, so it failed to start.  Every transport failure is now ``Unreachable``."""
    from tests.unit.memory_http import MemoryNetwork

    clock = Clock()
    network = MemoryNetwork()
    client = NodeClient(network.client(clock), TOKEN, AllowList(("http://master.test:8080",)), 30.0, clock)
    d = client.register("http://master.test:8080", Snapshot(node_id="slave-a"))
    network.flush()
    err = failure(d, Unreachable)
    assert "refused" in err.reason.lower()
