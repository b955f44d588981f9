"""What no one client can pin on the HTTP edge, on both edges where both apply: a body that trickles
in slower than ``server.min_body_rate``, connections from outside ``server.allowed_cidrs`` or past
one peer's cap, a client that stops reading after a hand-over, and the access line's client behind
a trusted proxy.  A Clock and in-memory transports: no sockets, no sleeps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs
from twisted.python.failure import Failure

from routerd.api.accept import ConnectionBook, accept
from routerd.api.admission import EdgeRules, decide
from routerd.api.budget import BufferBudget
from routerd.api.head import RequestHead, build_head
from routerd.cluster.auth import AuthPolicy
from routerd.config.keys import InferenceKey, KeyLimits
from routerd.config.load import ConfigError, parse_config
from routerd.config.schema import ServerConfig
from routerd.errors import Saturated
from routerd.paths import NODE_PREFIX
from tests.unit.edge_support import KEY, Edges, handed_over, request, status_and_code

HANDED_OVER = b"GET /health HTTP/1.1\r\nHost: n\r\n\r\n"


def head_only(length: int, fields: tuple[bytes, ...] | None = None) -> bytes:
    raw = request(body=b"x" * length) if fields is None else request(body=b"x" * length, fields=fields)
    return raw[:len(raw) - length]


def connect(edges: Edges, edge: str, peer: str = "127.0.0.1") -> tuple[Any, StringTransport]:
    """A connection through the lean factory; on ``twisted`` a first request hands it over."""
    channel, out = edges.connect(peer=peer)
    if edge == "twisted":
        channel.dataReceived(HANDED_OVER)
        assert handed_over(channel)
        out.clear()
    return channel, out


# -- a body slower than server.min_body_rate ------------------------------------------------------

def trickle_edges(edge: str, min_body_rate: int) -> tuple[Edges, Any, StringTransport]:
    """Both edges with a 10 s body timeout, a 5 s deadline floor and ``min_body_rate``; a connection."""
    edges = Edges(server=ServerConfig(body_timeout=10, body_deadline_floor=5, min_body_rate=min_body_rate),
                  buffer=10_000, limit=10_000)
    edges.factory.startFactory()
    channel, out = connect(edges, edge)
    return edges, channel, out


def test_a_body_trickled_below_the_minimum_rate_gets_408_while_a_byte_arrives_every_few_seconds() -> None:
    for edge in ("lean", "twisted"):
        edges, channel, out = trickle_edges(edge, min_body_rate=50)
        channel.dataReceived(head_only(2000))  # due 2000 / 50 = 40 s after its head
        assert edges.site.buffer is not None and edges.site.buffer.used == 2000, edge
        for _ in range(7):
            edges.clock.advance(5)
            channel.dataReceived(b"x")  # progress every 5 s: body_timeout alone never fires
        assert out.value() == b"", edge
        edges.clock.advance(6)
        assert status_and_code(out.value()) == (408, "request_timeout") and out.disconnecting, edge
        channel.connectionLost(Failure(ConnectionDone()))
        assert edges.site.buffer.used == 0 and not edges.api.served, edge


def test_a_body_arriving_at_the_minimum_rate_is_served() -> None:
    for edge in ("lean", "twisted"):
        edges, channel, out = trickle_edges(edge, min_body_rate=100)
        raw = request(body=b"x" * 2000)
        channel.dataReceived(raw[:len(raw) - 2000])
        for _ in range(20):
            edges.clock.advance(1)
            channel.dataReceived(b"x" * 100)
        assert len(edges.api.served) == 1 and status_and_code(out.value())[0] == 200, edge


def test_the_minimum_body_rate_defaults_to_64_kib_a_second_with_a_60_s_floor() -> None:
    assert (ServerConfig().min_body_rate, ServerConfig().body_deadline_floor) == (65536, 60.0)


# -- connections: the CIDR check at accept, the per-peer cap, silent ones first ------------------

def test_a_connection_from_outside_the_cidrs_does_not_count_against_max_connections() -> None:
    edges = Edges(server=ServerConfig(max_connections=2))
    outsiders = [edges.connect(peer=f"192.0.2.{n}") for n in (1, 2)]
    assert all(not out.value() and not out.disconnecting for _, out in outsiders)
    for n in (1, 2):
        inside, out = edges.connect(peer=f"10.0.0.{n}")
        inside.dataReceived(request())
        assert status_and_code(out.value()) == (200, "")
    _, out = edges.connect(peer="192.0.2.3")  # outsiders together are held to max_connections too
    assert status_and_code(out.value()) == (503, "too_many_connections") and out.disconnecting


def test_a_connection_from_outside_the_cidrs_that_sends_nothing_is_closed_after_the_head_timeout() -> None:
    edges = Edges(server=ServerConfig(head_timeout=10))
    edges.site.timeOut = 300
    edges.factory.startFactory()
    _, outside = edges.connect(peer="192.0.2.9")
    _, inside = edges.connect(peer="10.0.0.5")
    edges.clock.advance(12)
    assert outside.disconnecting and not inside.disconnecting


def test_a_connection_from_outside_the_cidrs_still_gets_its_403_in_its_routes_family() -> None:
    for edge in ("lean", "twisted"):
        assert Edges().answer(request(), edge, "192.0.2.9") == (403, "forbidden")


def test_one_peer_beyond_max_connections_per_peer_gets_503_and_others_are_served() -> None:
    edges = Edges(server=ServerConfig(max_connections_per_peer=3))
    for _ in range(3):
        edges.connect(peer="10.0.0.5")
    _, out = edges.connect(peer="10.0.0.5")
    assert status_and_code(out.value()) == (503, "too_many_connections") and out.disconnecting
    other, out = edges.connect(peer="10.0.0.6")
    other.dataReceived(request())
    assert status_and_code(out.value()) == (200, "")


def test_loopback_and_trusted_proxies_are_not_capped_per_peer() -> None:
    edges = Edges(server=ServerConfig(max_connections_per_peer=1))
    for peer in ("127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2"):  # 127.0.0.2: the trusted proxy
        _, out = edges.connect(peer=peer)
        assert out.value() == b"" and not out.disconnecting


def test_at_the_limit_the_oldest_connection_that_sent_nothing_is_closed_to_make_room() -> None:
    edges = Edges(server=ServerConfig(max_connections=3))
    busy, _ = edges.connect(peer="10.0.0.1")
    busy.dataReceived(b"POST /v1/chat")  # a head under way
    edges.clock.advance(1)
    _, oldest_silent = edges.connect(peer="10.0.0.2")
    edges.clock.advance(1)
    _, silent = edges.connect(peer="10.0.0.3")
    edges.clock.advance(5)
    new, out = edges.connect(peer="10.0.0.4")
    assert oldest_silent.disconnected and not silent.disconnected and len(edges.factory.protocols) == 3
    new.dataReceived(request())
    assert status_and_code(out.value()) == (200, "")


def test_accept_decides_before_a_byte_is_read() -> None:
    policy = AuthPolicy.build((), (), "", ("10.0.0.0/8",), trusted_proxies=("192.0.2.1/32",))
    limits = ServerConfig(max_connections=2, max_connections_per_peer=2)
    book = ConnectionBook()
    assert accept(book, limits, policy, "10.0.0.5", False) == "counted"
    assert accept(book, limits, policy, "192.0.2.9", False) == "foreign"
    assert accept(book, limits, policy, "192.0.2.1", False) == "counted"  # a trusted proxy is not foreign
    book.opened("10.0.0.5", False)
    book.opened("10.0.0.5", False)
    assert isinstance(accept(book, limits, policy, "10.0.0.5", True), Saturated)
    assert accept(book, limits, policy, "10.0.0.6", True) == "evict"
    refused = accept(book, limits, policy, "10.0.0.6", False)
    assert isinstance(refused, Saturated) and refused.code == "too_many_connections"
    book.closed("10.0.0.5", False)
    assert accept(book, limits, policy, "10.0.0.5", False) == "counted" and book.per_peer == {"10.0.0.5": 1}


# -- a client that stops reading (both edges) -----------------------------------------------------

def test_a_client_that_stops_reading_an_answer_is_aborted_after_send_timeout_on_both_edges() -> None:
    for edge in ("lean", "twisted"):
        edges = Edges(server=ServerConfig(send_timeout=20))
        edges.site.timeOut = 100
        edges.factory.startFactory()
        channel, out = connect(edges, edge)
        channel.dataReceived(request() if edge == "lean" else HANDED_OVER)
        assert status_and_code(out.value())[0] == 200, edge
        out.producer.pauseProducing()  # the answer is written, its output backed up: not read
        edges.clock.advance(19)
        assert not out.disconnected, edge
        edges.clock.advance(3)
        assert out.disconnected, edge


def test_a_handed_over_connection_asked_to_close_is_aborted_after_send_timeout() -> None:
    edges = Edges(server=ServerConfig(send_timeout=5))
    edges.site.timeOut = 30
    edges.factory.startFactory()
    _, out = connect(edges, "twisted")
    edges.clock.advance(32)
    assert out.disconnecting and not out.disconnected  # idle: asked to close, output still queued
    edges.clock.advance(6)  # before twisted.web's own abort (15 s after its idle timeout)
    assert out.disconnected


# -- the access line behind a trusted proxy --------------------------------------------------------

def test_the_access_line_names_the_client_admission_decided_behind_a_trusted_proxy() -> None:
    for edge in ("lean", "twisted"):
        for forwarded, status in ((b"10.1.2.3", 200), (b"192.0.2.9", 403)):
            fields = (b"Host: node", b"Authorization: Bearer inference-key-0123",
                      b"X-Forwarded-For: " + forwarded)
            with capturedLogs() as events:
                answer = Edges().answer(request(fields=fields), edge, "127.0.0.2")  # the trusted proxy
            [line] = [e for e in events if e.get("log_namespace") == "routerd.access"]
            assert answer[0] == status and line["client"] == forwarded.decode(), (edge, forwarded)


def test_the_access_line_names_the_peer_when_it_is_no_trusted_proxy() -> None:
    for edge in ("lean", "twisted"):
        fields = (b"Host: node", b"Authorization: Bearer inference-key-0123", b"X-Forwarded-For: 10.1.2.3")
        with capturedLogs() as events:
            Edges().answer(request(fields=fields), edge, "127.0.0.9")
        [line] = [e for e in events if e.get("log_namespace") == "routerd.access"]
        assert line["client"] == "127.0.0.9", edge


def test_an_address_that_is_not_ip_is_counted_as_before() -> None:
    edges = Edges(server=ServerConfig(max_connections=1))
    protocol = edges.factory.buildProtocol(IPv4Address("TCP", "10.0.0.1", 1))
    protocol.makeConnection(StringTransport())
    second = edges.factory.buildProtocol(None)
    transport = StringTransport()
    second.makeConnection(transport)
    assert status_and_code(transport.value()) == (503, "too_many_connections")


# -- shares of the replay budget, key limits from the head ---------------------------------------

OTHER = "other-key-0123456"


def keyed_edges(**server: Any) -> Edges:
    """Edges with two keys: ``slow`` (max_concurrent 2) and ``other``; a 4,000-byte budget, bodies
    up to 1,000 bytes, one holder at most half the budget."""
    edges = Edges(keys=(KEY, OTHER), buffer=4000, limit=1000,
                  server=ServerConfig(max_client_buffer_share=0.5, **server))
    named = (InferenceKey("slow", KEY, limits=KeyLimits(max_concurrent=2)), InferenceKey("other", OTHER))
    policy = AuthPolicy.build((KEY, OTHER), (), "cluster-token", ("127.0.0.0/8", "10.0.0.0/8"),
                              named_keys=named)
    edges.guard.rules = attrs.evolve(edges.guard.rules, policy=policy)
    return edges


def keyed(key: str) -> tuple[bytes, ...]:
    return (b"Host: node", b"Authorization: Bearer " + key.encode())


def test_one_key_cannot_hold_more_than_its_share_of_the_replay_budget_on_both_edges() -> None:
    for edge in ("lean", "twisted"):
        edges = keyed_edges()
        edges.guard.rules = attrs.evolve(edges.guard.rules, policy=AuthPolicy.build(
            (KEY, OTHER), (), "cluster-token", ("127.0.0.0/8",),
            named_keys=(InferenceKey("slow", KEY), InferenceKey("other", OTHER))))
        for _ in range(2):  # 2 x 1000 bytes: half the budget, trickling
            channel, out = connect(edges, edge)
            channel.dataReceived(head_only(1000, keyed(KEY)))
            assert out.value() == b"", edge
        channel, out = connect(edges, edge)
        channel.dataReceived(head_only(1000, keyed(KEY)))
        assert status_and_code(out.value()) == (503, "buffer_full"), edge
        channel, out = connect(edges, edge)
        channel.dataReceived(request(body=b"x" * 1000, fields=keyed(OTHER)))
        assert status_and_code(out.value()) == (200, ""), edge


def test_a_keys_max_concurrent_counts_requests_whose_bodies_are_still_arriving_on_both_edges() -> None:
    for edge in ("lean", "twisted"):
        edges = keyed_edges()
        channel, first = connect(edges, edge)
        channel.dataReceived(head_only(100, keyed(KEY)))
        channel, second = connect(edges, edge)
        channel.dataReceived(head_only(100, keyed(KEY)))
        channel, out = connect(edges, edge)
        channel.dataReceived(head_only(100, keyed(KEY)))
        assert (first.value(), second.value()) == (b"", b""), edge
        assert status_and_code(out.value()) == (429, "key_limited") and b"Retry-After: 1" in out.value(), edge
        channel, out = connect(edges, edge)
        channel.dataReceived(request(body=b"x" * 100, fields=keyed(OTHER)))
        assert status_and_code(out.value()) == (200, ""), edge


def test_a_body_as_large_as_the_limit_is_admitted_whatever_the_share() -> None:
    budget = BufferBudget(1000, share=0.1, floor=400)
    assert budget.free_for("key a") == 400 and budget.take(400, "key a")
    assert budget.free_for("key a") == 0 and budget.free_for("key b") == 400 and budget.free_for("") == 600
    assert budget.arriving("key a") == 1
    budget.arrived("key a")  # whole: no longer arriving, its bytes still held
    assert budget.arriving("key a") == 0 and budget.free_for("key a") == 0
    budget.give(400, "key a")
    assert budget.free_for("key a") == 400 and budget.used == 0
    assert budget.take(100, "key a") and budget.arriving("key a") == 1
    budget.give(100, "key a", arriving=True)  # lost while arriving
    assert budget.arriving("key a") == 0 and budget.used == 0 and not budget._held


def test_admission_counts_a_body_to_its_key_else_its_client_and_a_masters_to_no_one() -> None:
    named = (InferenceKey("slow", KEY, limits=KeyLimits(max_concurrent=1)),)
    rules = EdgeRules(AuthPolicy.build((KEY,), (), "cluster-token", ("10.0.0.0/8",), named_keys=named), 1000)
    budget = BufferBudget(4000, share=0.25, floor=500)

    def head(path: bytes, *fields: bytes) -> RequestHead:
        lines = (b"Host: node", b"Content-Length: 800", *fields)
        return build_head(b"POST", path, b"HTTP/1.1", [(name, value) for name, _, value in
                                                      (line.partition(b":") for line in lines)])

    chat = head(b"/v1/chat/completions", b"Authorization: Bearer " + KEY.encode())
    verdict = decide(rules, chat, "10.0.0.5", "ready", budget)
    assert (verdict.holder, verdict.reserve, verdict.client) == ("key slow", 800, "10.0.0.5")
    assert budget.take(800, verdict.holder)
    refused = decide(rules, chat, "10.0.0.6", "ready", budget)  # its one request's body is arriving
    assert refused.error is not None and refused.error.code == "key_limited"
    budget.arrived("key slow")  # whole: from here the inference front counts it
    over_share = decide(rules, chat, "10.0.0.6", "ready", budget).error  # 800 + 800 > 4000 / 4
    assert over_share is not None and over_share.code == "buffer_full" and budget.free == 3200
    budget.give(800, "key slow")
    assert decide(rules, chat, "10.0.0.6", "ready", budget).error is None
    assert decide(rules, chat, "10.0.0.5", "ready", 4000).error is None  # a plain count: as before
    forwarded = head(NODE_PREFIX.encode() + b"/forward", b"Authorization: Bearer cluster-token")
    master = decide(rules, forwarded, "10.0.0.7", "ready", budget)
    assert master.error is None and master.reserve == 800 and master.holder == ""


def test_the_new_server_limits_are_read_from_the_config_with_documented_defaults(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    base = {"models": {"config_dir": "models"}}
    server = parse_config(base, base_dir=str(tmp_path), env={}).server
    assert (server.min_body_rate, server.body_deadline_floor, server.max_client_buffer_share,
            server.max_connections_per_peer) == (65536, 60.0, 0.25, 256)
    set_ = {"min_body_rate": 0, "body_deadline_floor": "2m", "max_client_buffer_share": 0.5,
            "max_connections_per_peer": 8}
    server = parse_config({**base, "server": set_}, base_dir=str(tmp_path), env={}).server
    assert (server.min_body_rate, server.body_deadline_floor, server.max_client_buffer_share,
            server.max_connections_per_peer) == (0, 120.0, 0.5, 8)
    with pytest.raises(ConfigError) as info:
        parse_config({**base, "server": {"max_client_buffer_share": 1.5, "max_connections_per_peer": 0}},
                     base_dir=str(tmp_path), env={})
    assert any("server.max_client_buffer_share" in e for e in info.value.errors)
    assert any("server.max_connections_per_peer" in e for e in info.value.errors)
