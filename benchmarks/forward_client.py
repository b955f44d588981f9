"""The master's forwarding client alone, in process: ``Forwarder.send`` over the lean
keep-alive client, from building the request to the answer read whole, against an in-memory
connection (no sockets, no other process: the machine's other load moves it little).

One forwarded chat a step: the request goes out on a kept-alive connection (``StringTransport``),
the slave's answer (a 493-byte chat completion with the headers a slave sends) comes back in one
read, and the answer is read whole and its model rewritten, as the master does for a
non-streaming forward.  Printed: microseconds per forward, best and median of ``--rounds``.

``--tree DIR`` measures the ``routerd/`` found in ``DIR`` instead (e.g. an older commit:
``git archive REF routerd | tar -x -C DIR``), in a child process, its rounds interleaved with
this tree's, and prints the ratio.

Run: .venv/bin/python benchmarks/forward_client.py [--requests 20000] [--rounds 7] [--tree DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ANSWER_BODY = json.dumps({
    "id": "chatcmpl-49436735cd624ba1855457e5f6794959", "object": "chat.completion", "created": 1796148199,
    "model": "remote-zero", "system_fingerprint": "routerd-sim",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "prairie nebula zephyr valley"},
                 "finish_reason": "length"}],
    "usage": {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6},
}).encode()
ANSWER = (b"HTTP/1.1 200 OK\r\nx-routerd-request-id: 9f6053df7a726207\r\nx-routerd-node: slave\r\n"
          b"x-routerd-queue-position: 1\r\ncontent-type: application/json; charset=utf-8\r\n"
          b"content-length: %d\r\ndate: Tue, 01 Dec 2026 18:03:19 GMT\r\n\r\n%b"
          % (len(ANSWER_BODY), ANSWER_BODY))
BODY = json.dumps({"model": "remote-zero", "messages": [{"role": "user", "content": "hello there"}],
                   "max_tokens": 4}).encode()
URL = "http://127.0.0.1:8080/router/v1/node/inference/v1/chat/completions"


def rounds_of(requests: int, rounds: int) -> list[float]:
    """Seconds per forward, one figure a round (after a warm-up)."""
    from twisted.internet.defer import ensureDeferred
    from twisted.internet.testing import MemoryReactorClock, StringTransport

    from routerd.clients.backend_http import BackendAgent
    from routerd.routing.forward import Forwarder, Outbound
    from routerd.routing.relay import Timeouts
    from routerd.urls import AllowList

    class NoFallback:
        def request(self, *_args: Any) -> Any:
            raise AssertionError("the lean client handed the forward on")

    class Reply:
        started = False

        def set_status(self, code: int) -> None:
            pass

        def set_header(self, name: bytes, value: bytes) -> None:
            pass

    reactor = MemoryReactorClock()
    agent = BackendAgent(reactor, NoFallback())  # type: ignore[arg-type]
    forwarder = Forwarder(agent, "benchmark-cluster-token-0123456789", AllowList(["http://127.0.0.1:8080"]),
                          Timeouts(reactor, 600, 300))
    reply = Reply()
    out = Outbound(url=URL, body=BODY, content_type="application/json", request_id="9f6053df7a726207",
                   headers=((b"x-routerd-key-class", b"normal"),), rewrite_to="remote-zero")
    connection: list[Any] = []

    def one() -> None:
        done = ensureDeferred(forwarder.send(reply, out))  # type: ignore[arg-type]
        if not connection:
            _host, _port, factory, _timeout, _bind = reactor.tcpClients[-1]
            protocol = factory.buildProtocol(None)
            transport = StringTransport()
            protocol.makeConnection(transport)
            connection.extend([protocol, transport])
        protocol, transport = connection
        transport.clear()
        protocol.dataReceived(ANSWER)
        got: list[Any] = []
        done.addBoth(got.append)
        if not got or not isinstance(got[0], tuple):
            raise RuntimeError(f"the forward did not complete: {got}")

    for _ in range(2000):
        one()
    figures = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(requests):
            one()
        figures.append((time.perf_counter() - start) / requests)
    return figures


def child(tree: str, requests: int) -> float:
    """One round of the ``routerd/`` in ``tree``, in a child process."""
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run([sys.executable, __file__, "--requests", str(requests), "--rounds", "1", "--json"],
                         check=True, capture_output=True, text=True, env=env, cwd=tree).stdout
    return float(json.loads(out.splitlines()[-1])[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20000, help="forwards a round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tree", help="also measure the routerd/ in this folder, rounds interleaved")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json:
        print(json.dumps(rounds_of(args.requests, args.rounds)))
        return
    if not args.tree:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        mine = rounds_of(args.requests, args.rounds)
        print(f"Forwarder.send: {min(mine) * 1e6:.1f} us best, {statistics.median(mine) * 1e6:.1f} us median "
              f"of {args.rounds} rounds of {args.requests}")
        return
    here = str(Path(__file__).resolve().parent.parent)
    mine, theirs = [], []
    for _ in range(args.rounds):
        mine.append(child(here, args.requests))
        theirs.append(child(args.tree, args.requests))
    for name, got in (("this tree", mine), (args.tree, theirs)):
        print(f"{name}: Forwarder.send {min(got) * 1e6:.1f} us best, {statistics.median(got) * 1e6:.1f} us "
              f"median of {args.rounds} rounds of {args.requests}")
    print(f"this tree / {args.tree}: {min(mine) / min(theirs):.2f} (best), "
          f"{statistics.median(mine) / statistics.median(theirs):.2f} (median)")


if __name__ == "__main__":
    main()
