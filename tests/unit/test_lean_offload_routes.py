"""The offload routes every lent request calls (queue events, grants, the master's
relay) are lean routes, served by the lean channel itself (StringTransport, no sockets), and the
relay streams the helper's answer through as it arrives; the lean peer client picks its pool by path.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.web.http_headers import Headers

from routerd.api.channel import LeanChannel, NodeServerFactory
from routerd.api.dispatch import Dispatch
from routerd.api.offload_routes import OffloadAPI
from routerd.api.site import GuardResource, NodeSite
from routerd.clients.peer_http import PeerHTTP, is_lean_path
from routerd.cluster.auth import AuthPolicy
from routerd.lending.offload import RelayRequest, relay_headers
from routerd.routing.call import Call, Reply
from routerd.wire.lending import Lease

TOKEN = "cluster-secret"


class Coordinator:
    """The master's coordinator as the routes see it: events answered with no lease, a relay
    whose answer the test writes."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, str]] = []
        self.relays: list[tuple[Reply, RelayRequest, Call, Deferred[bytes]]] = []

    async def event(self, lane: str, owner: str, model: str, trigger: str) -> Lease | None:
        self.events.append((lane, owner, model, trigger))
        return None

    async def relay(self, reply: Reply, relay: RelayRequest, call: Call, *, rewrite_to: str | None,
                    returns_raise: bool) -> bytes:
        done: Deferred[bytes] = Deferred()
        self.relays.append((reply, relay, call, done))
        return await done


class Lending:
    def __init__(self) -> None:
        self.leases: list[Lease] = []

    def receive_lease(self, lease: Lease, lane: str, model: str, why: str) -> None:
        self.leases.append(lease)

    def borrowed_requests(self) -> list[Any]:
        return []


class Served:
    def __init__(self) -> None:
        self.coordinator = Coordinator()
        self.lending = Lending()
        api = OffloadAPI(coordinator=self.coordinator, lending=self.lending)  # type: ignore[arg-type]
        policy = AuthPolicy.build((), (), TOKEN, ["127.0.0.0/8"])
        guard = GuardResource(Dispatch([api]), policy, 1 << 20, phase=lambda: "ready")
        site = NodeSite(guard, 1 << 20, None)
        site.reactor = Clock()
        site.timeOut = None
        factory = NodeServerFactory(site, lambda: "ready")
        self.transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 50000))
        channel = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 50000))
        assert isinstance(channel, LeanChannel)
        self.channel = channel
        channel.makeConnection(self.transport)

    def send(self, method: bytes, path: bytes, body: bytes = b"",
             headers: tuple[tuple[bytes, bytes], ...] = (), token: str = TOKEN) -> None:
        extra = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
        self.channel.dataReceived(
            method + b" " + path + b" HTTP/1.1\r\nHost: master\r\nContent-Type: application/json\r\n"
            + b"Authorization: Bearer " + token.encode() + b"\r\n" + extra
            + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)

    def written(self) -> bytes:
        out = self.transport.value()
        self.transport.clear()
        return out


def _json(out: bytes) -> Any:
    return json.loads(out.partition(b"\r\n\r\n")[2])


def test_a_queue_event_is_served_by_the_lean_channel_and_answered_with_the_lease() -> None:
    """Fails on the Klein route: the channel handed the connection to twisted.web (``_inner``)."""
    served = Served()
    served.send(b"POST", b"/router/v1/node/offload/event", json.dumps(
        {"lane": "text", "owner_node_id": " owner ", "model_id": "alpha", "trigger": "enqueued"}).encode())
    assert served.channel._inner is None
    out = served.written()
    assert out.startswith(b"HTTP/1.1 200 OK\r\n") and _json(out) == {"lease": None}
    assert served.coordinator.events == [("text", "owner", "alpha", "enqueued")]


def test_a_bad_event_is_a_400_with_a_reason_and_a_wrong_token_401_both_on_the_lean_channel() -> None:
    served = Served()
    served.send(b"POST", b"/router/v1/node/offload/event", b"[1,2")
    out = served.written()
    assert out.startswith(b"HTTP/1.1 400 ") and "error" in _json(out)
    served.send(b"POST", b"/router/v1/node/offload/event", json.dumps(
        {"lane": "sideways", "owner_node_id": "o", "model_id": "m", "trigger": "queued"}).encode())
    out = served.written()
    assert out.startswith(b"HTTP/1.1 400 ") and "lane" in _json(out)["error"]["message"]
    assert served.channel._inner is None and served.coordinator.events == []
    other = Served()
    other.send(b"POST", b"/router/v1/node/offload/event", b"{}", token="wrong")
    assert other.written().startswith(b"HTTP/1.1 401 ")


def test_a_get_on_a_lean_offload_route_is_405_with_allow_post() -> None:
    served = Served()
    served.send(b"GET", b"/router/v1/node/offload/grant")
    out = served.written()
    assert out.startswith(b"HTTP/1.1 405 ") and b"allow: post\r\n" in out.lower()


def test_a_grant_is_handed_to_lending_on_the_lean_channel() -> None:
    served = Served()
    lease = {"lane": "text", "owner_node_id": "owner", "owner_model_id": "alpha", "helper_node_id": "helper",
             "helper_model_id": "beta", "load_helper_model": False, "restore_helper_model": False,
             "helper_slots": 1, "probe": False, "ttl_ms": 5000}
    served.send(b"POST", b"/router/v1/node/offload/grant", json.dumps(lease).encode())
    out = served.written()
    assert served.channel._inner is None
    assert out.startswith(b"HTTP/1.1 200 "), out
    assert [(g.owner_model_id, g.helper_node_id) for g in served.lending.leases] == [("alpha", "helper")]


def test_the_relay_streams_the_helpers_answer_through_as_it_arrives() -> None:
    """The relay's chunks reach the owner's connection before the helper's answer is complete
    (nothing buffered on the master); the end closes the chunked answer."""
    served = Served()
    relay = RelayRequest("text", "owner", "alpha", "/v1/chat/completions", "helper", "beta")
    served.send(b"POST", b"/router/v1/node/offload/request", b'{"model":"alpha","stream":true}',
                tuple(relay_headers(relay)))
    assert served.channel._inner is None
    reply, got, call, done = served.coordinator.relays[0]
    assert got == relay and call.path == "/v1/chat/completions"
    reply.set_header(b"content-type", b"text/event-stream")
    reply.write(b"data: one\n\n")
    first = served.written()
    assert first.startswith(b"HTTP/1.1 200 ") and b"transfer-encoding: chunked" in first.lower()
    assert first.endswith(b"data: one\n\n\r\n")
    reply.write(b"data: two\n\n")
    assert served.written() == b"b\r\ndata: two\n\n\r\n"
    done.callback(b"")
    assert served.written() == b"0\r\n\r\n"


def test_a_relay_without_its_headers_is_a_400_naming_them() -> None:
    served = Served()
    served.send(b"POST", b"/router/v1/node/offload/request", b'{"model":"alpha"}')
    out = served.written()
    assert out.startswith(b"HTTP/1.1 400 ") and "X-Routerd-Offload-Owner" in _json(out)["error"]["message"]


class Agent:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes, Headers, Any]] = []

    def request(self, method: bytes, uri: bytes, headers: Headers | None = None,
                bodyProducer: Any = None) -> Deferred[Any]:
        assert headers is not None
        self.sent.append((method, uri, headers, bodyProducer))
        return succeed("response")


def test_the_peer_client_sends_lean_routes_on_the_lean_pool_and_other_calls_on_the_control_pool() -> None:
    lean, control = Agent(), Agent()
    http = PeerHTTP(lean, control)
    base = "http://10.0.0.2:8080"
    for path in ("/router/v1/node/offload/event", "/router/v1/node/offload/grant",
                 "/router/v1/node/offload/request?x=1", "/router/v1/node/inference/v1/chat/completions"):
        http.request("POST", base + path, headers={b"Authorization": [b"Bearer t"]}, data=b"{}")
    for path in ("/router/v1/node/runtime-status", "/router/v1/node/register",
                 "/router/v1/node/offload/links", "/router/v1/node/offload/borrowed"):
        http.request("GET", base + path, headers={b"Accept": [b"application/json"]}, data=None)
    assert [uri for _, uri, _, _ in lean.sent] == [
        b"http://10.0.0.2:8080/router/v1/node/offload/event", b"http://10.0.0.2:8080/router/v1/node/offload/grant",
        b"http://10.0.0.2:8080/router/v1/node/offload/request?x=1",
        b"http://10.0.0.2:8080/router/v1/node/inference/v1/chat/completions"]
    assert len(control.sent) == 4 and all(method == b"GET" for method, _, _, _ in control.sent)
    method, _, headers, producer = lean.sent[0]
    assert method == b"POST" and headers.getRawHeaders(b"authorization") == [b"Bearer t"]
    assert producer.body == b"{}"
    assert control.sent[0][3] is None


def test_is_lean_path_reads_the_path_not_the_host_or_query() -> None:
    assert is_lean_path("http://h:1/router/v1/node/offload/event")
    assert not is_lean_path("http://router-v1-node-offload-event:1/x?/router/v1/node/offload/event")
    assert not is_lean_path("http://h:1/router/v1/node/inference")  # the prefix itself is no route
    assert not is_lean_path("http://h:1")
