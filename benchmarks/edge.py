"""CPU per request of the HTTP edge alone (issue 20): head -> admission -> handler -> answer -> access
line gate, in process, on the lean channel and on twisted.web's channel (the same request as
HTTP/1.0, which the lean channel hands over; one connection per request there, as HTTP/1.0
closes).  No sockets: an in-memory transport and a handler that answers at once, so the figure is
the edge's own cost; the ratio lean / twisted.web is the point.

Run: .venv/bin/python benchmarks/edge.py [--requests 40000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from twisted.internet.address import IPv4Address  # noqa: E402
from twisted.internet.error import ConnectionDone  # noqa: E402
from twisted.internet.task import Clock  # noqa: E402
from twisted.internet.testing import StringTransport  # noqa: E402

from routerd.api.channel import NodeServerFactory  # noqa: E402
from routerd.api.dispatch import Dispatch  # noqa: E402
from routerd.api.routes import Routes  # noqa: E402
from routerd.api.site import GuardResource, NodeSite  # noqa: E402
from routerd.cluster.auth import AuthPolicy  # noqa: E402
from routerd.routing.call import Incoming, Reply  # noqa: E402

KEY = "inference-key-0123"
BODY = b'{"model":"zero","messages":[{"role":"user","content":"hello there"}],"max_tokens":4}'


class Api:
    routes = Routes()

    @routes.lean("/v1/chat/completions", methods=["POST"], auth="inference")
    def chat(self, method: str, path: str, facts: Incoming, reply: Reply) -> bytes:
        reply.set_header(b"x-routerd-node", b"n1")
        return b'{"ok":true}'


def request(version: bytes) -> bytes:
    return (b"POST /v1/chat/completions " + version + b"\r\nHost: 127.0.0.1:8080\r\nUser-Agent: wrk\r\n"
            b"Accept: */*\r\nAuthorization: Bearer " + KEY.encode()
            + b"\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY)


def per_request(version: bytes, count: int, rounds: int) -> float:
    policy = AuthPolicy.build((KEY,), (), "", ["127.0.0.0/8"])
    site = NodeSite(GuardResource(Dispatch([Api()]), policy, 1 << 20), 1 << 20, 1 << 26)
    site.reactor = Clock()
    site.timeOut = None
    factory = NodeServerFactory(site, lambda: "ready")
    peer = IPv4Address("TCP", "127.0.0.1", 50000)
    raw = request(version)
    keep_alive = version == b"HTTP/1.1"  # twisted.web closes after an HTTP/1.0 answer: one connection each
    transport = StringTransport(peerAddress=peer)
    channel = factory.buildProtocol(peer)
    channel.makeConnection(transport)
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(count):
            if not keep_alive:
                transport = StringTransport(peerAddress=peer)
                channel = factory.buildProtocol(peer)
                channel.makeConnection(transport)
            channel.dataReceived(raw)
            if not keep_alive:
                channel.connectionLost(ConnectionDone())
            transport.clear()
        best = min(best, time.process_time() - start)
    transport = StringTransport(peerAddress=peer)
    channel = factory.buildProtocol(peer)
    channel.makeConnection(transport)
    channel.dataReceived(raw)
    assert transport.value()[8:13] == b" 200 ", transport.value()[:200]  # what was timed was served
    return best / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    lean = per_request(b"HTTP/1.1", args.requests, args.rounds)
    web = per_request(b"HTTP/1.0", args.requests // 4, args.rounds)
    print(f"lean channel   {lean:7.1f} us/request (best of {args.rounds})")
    print(f"twisted.web    {web:7.1f} us/request")
    print(f"lean / twisted.web  {lean / web:.2f}")


if __name__ == "__main__":
    main()
