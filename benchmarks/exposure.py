"""The CPU cost of the exposure rules (drive-by, Host, body deadline, per-holder budget share), as
same-run ratios rules-on ÷ rules-off; on a shared, loaded machine read the ratios only.

In process (``--inproc``, no sockets; each round alternates batches of on and off, the order
flipping every batch, and gives one ratio):

- ``decide/curl``, ``decide/webui``: the one admission decision
  (:func:`routerd.api.admission.decide`) on a keyless loopback chat head (as curl sends it, and as
  the node's own WebUI page sends it: ``Origin`` and ``Sec-Fetch-Site: same-origin``), with the
  browser rules on as ``build_site`` turns them on (``browser_rules`` of the embedded default) and
  a budget with the default per-holder share, against an edge built without the browser rules and
  a budget without a share (share 1, no floor);
- ``edge``: the whole lean-channel request (head -> admission -> handler -> answer -> access-line
  gate, ``benchmarks/edge.py``'s loop) with the node's ``ServerConfig`` defaults (body deadline from
  ``min_body_rate``, per-holder share) and the browser rules, against ``min_body_rate: 0``,
  ``max_client_buffer_share: 1`` and no browser rules.  The accept-time bookkeeping (CIDR check,
  per-peer count) and the per-holder counting of the budget cannot be switched off: both sides pay it.

End to end (``--tree NAME=DIR`` pairs, ``benchmarks/trees.py``'s nodes and wrk): one keyless node per
source tree (the embedded default's shape), cells of non-streaming chat at the given concurrencies;
within a round the trees run one after another (the order flipping every round) and each
``--pair AFTER/BEFORE`` gives one ratio of CPU per request per round.

Run: .venv/bin/python benchmarks/exposure.py --inproc [--requests 20000] [--rounds 9]
     .venv/bin/python benchmarks/exposure.py --tree pre=/work/wt/tpre --tree exp1=/work/wt/texp1 \
         --pair exp1/pre [--seconds 3] [--rounds 7] [--concurrency 1,16]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge import BODY, Api  # noqa: E402
from twisted.internet.address import IPv4Address  # noqa: E402
from twisted.internet.task import Clock  # noqa: E402
from twisted.internet.testing import StringTransport  # noqa: E402

from routerd.api.admission import EdgeRules, decide  # noqa: E402
from routerd.api.browser import BrowserRules  # noqa: E402
from routerd.api.budget import BufferBudget  # noqa: E402
from routerd.api.channel import NodeServerFactory  # noqa: E402
from routerd.api.dispatch import Dispatch  # noqa: E402
from routerd.api.head import build_head  # noqa: E402
from routerd.api.site import GuardResource, NodeSite  # noqa: E402
from routerd.cluster.auth import AuthPolicy  # noqa: E402
from routerd.config.schema import ServerConfig  # noqa: E402

LIMIT = 8 << 20
BUDGET = 32 << 20
DEFAULT = ServerConfig()
#: what build_site turns on for the embedded default (browser_rules: allowed_hosts, public_url, bind host)
ON = BrowserRules.build(DEFAULT.allowed_hosts, "", DEFAULT.host)
OFF_SERVER = ServerConfig(min_body_rate=0, max_client_buffer_share=1.0)
CURL = [(b"Host", b"127.0.0.1:8080"), (b"User-Agent", b"curl/8.5.0"), (b"Accept", b"*/*"),
        (b"Content-Type", b"application/json"), (b"Content-Length", b"%d" % len(BODY))]
WEBUI = [*CURL[:3], (b"Origin", b"http://127.0.0.1:8080"), (b"Sec-Fetch-Site", b"same-origin"),
         (b"Sec-Fetch-Mode", b"cors"), *CURL[3:]]


#: one policy for both sides, as a node has one: ``AuthPolicy``'s address checks are cached by its
#: networks tuple, and a second, equal tuple compares field by field on every lookup (a few µs per
#: request; a side built with its own policy measured that, not the rules)
POLICY = AuthPolicy.build((), (), "", list(DEFAULT.allowed_cidrs))


def decide_loop(fields: list[tuple[bytes, bytes]], on: bool) -> Callable[[int], None]:
    head = build_head(b"POST", b"/v1/chat/completions", b"HTTP/1.1", fields)
    rules = EdgeRules(POLICY, LIMIT, browser=ON if on else BrowserRules())
    budget = BufferBudget(BUDGET, DEFAULT.max_client_buffer_share, LIMIT) if on else BufferBudget(BUDGET)
    verdict = decide(rules, head, "127.0.0.1", "ready", budget)
    assert verdict.error is None, verdict.error  # what is timed is an admission

    def loop(count: int) -> None:
        for _ in range(count):
            decide(rules, head, "127.0.0.1", "ready", budget)
    return loop


def edge_loop(on: bool) -> Callable[[int], None]:
    guard = GuardResource(Dispatch([Api()]), POLICY, LIMIT, (), lambda: "ready",
                          DEFAULT if on else OFF_SERVER, ON if on else BrowserRules())
    site = NodeSite(guard, LIMIT, BUDGET)
    site.reactor = Clock()
    site.timeOut = None
    factory = NodeServerFactory(site, lambda: "ready")
    peer = IPv4Address("TCP", "127.0.0.1", 50000)
    raw = b"POST /v1/chat/completions HTTP/1.1\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in CURL) \
        + b"\r\n" + BODY
    transport = StringTransport(peerAddress=peer)
    channel = factory.buildProtocol(peer)
    channel.makeConnection(transport)
    channel.dataReceived(raw)
    assert transport.value()[8:13] == b" 200 ", transport.value()[:200]  # what is timed is served
    transport.clear()

    def loop(count: int) -> None:
        for _ in range(count):
            channel.dataReceived(raw)
            transport.clear()
    return loop


def _cpu(loop: Callable[[int], None], count: int) -> float:
    start = time.process_time()
    loop(count)
    return (time.process_time() - start) / count


def _span(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def inproc(requests: int, rounds: int, batches: int = 20) -> None:
    cells: dict[str, tuple[Callable[[int], None], Callable[[int], None], int]] = {
        "decide/curl": (decide_loop(CURL, True), decide_loop(CURL, False), requests * 5),
        "decide/webui": (decide_loop(WEBUI, True), decide_loop(WEBUI, False), requests * 5),
        "edge": (edge_loop(True), edge_loop(False), requests),
    }
    print(f"in process: {rounds} rounds of {batches} on/off batches (the order flipping every batch); "
          "µs per request (CPU, process_time)")
    for label, (on, off, count) in cells.items():
        on(count // 10), off(count // 10)  # warm
        ratios, ons, offs = [], [], []
        each = max(1, count // batches)
        for _ in range(rounds):
            got = {"on": 0.0, "off": 0.0}
            for batch in range(batches):
                pair = [("on", on), ("off", off)] if batch % 2 == 0 else [("off", off), ("on", on)]
                for name, loop in pair:
                    got[name] += _cpu(loop, each) / batches
            ons.append(got["on"] * 1e6)
            offs.append(got["off"] * 1e6)
            ratios.append(got["on"] / got["off"])
        print(f"  {label:>13}: on {statistics.median(ons):6.2f} µs, off {statistics.median(offs):6.2f} µs; "
              f"on÷off median (min-max) {_span(ratios)}")


def end_to_end(args: argparse.Namespace) -> None:
    import trees
    from _harness import client, have_wrk, run, run_load, tempdir
    from overhead import BODY as CHAT

    folders = {}
    for item in args.tree:
        name, _, folder = item.partition("=")
        folders[name] = Path(folder).resolve()
    pairs = [tuple(pair.split("/", 1)) for pair in args.pair]
    args.wrk = have_wrk()
    assert args.wrk, "the end-to-end cells want wrk"
    root = tempdir()
    nodes: dict[str, Any] = {}
    try:
        for name, folder in folders.items():
            nodes[name] = trees.TreeNode(name, folder, root, None, False)
        for node in nodes.values():
            node.wait_ready()
            node.load_backend()
        paths = {name: (node.url + "/v1/chat/completions", node.proc.pid) for name, node in nodes.items()}

        async def go() -> None:
            http = client()
            for url, _pid in paths.values():
                await run_load(http, url, CHAT, 8, 300)
            print(f"end to end: wrk, {args.rounds} rounds, {args.seconds:g} s a cell; CPU per request of "
                  "the node process (schedstat); ratios per round")
            for conc in [int(c) for c in args.concurrency.split(",")]:
                spec = (f"c={conc}", CHAT, conc)
                ratios: dict[tuple[str, ...], list[float]] = {pair: [] for pair in pairs}
                for rnd in range(args.rounds):
                    order = list(paths) if rnd % 2 == 0 else list(reversed(paths))
                    got = {}
                    for name in order:
                        url, pid = paths[name]
                        got[name], _count, errors = await trees.cpu_of(http, url, pid, spec, args)
                        assert not errors, (name, errors)
                    for pair in pairs:
                        ratios[pair].append(got[pair[0]] / got[pair[1]])
                    print(f"  c={conc} round {rnd + 1}: " + ", ".join(
                        f"{n} {got[n] * 1e6:.0f} µs" for n in paths))
                for pair, values in ratios.items():
                    print(f"  c={conc:<3} {pair[0]}÷{pair[1]}: median (min-max) {_span(values)}")

        run(go)
    finally:
        for node in nodes.values():
            node.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inproc", action="store_true", help="the in-process cells")
    parser.add_argument("--requests", type=int, default=20000, help="requests per in-process edge round")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=DIR")
    parser.add_argument("--pair", action="append", default=[], metavar="AFTER/BEFORE")
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--concurrency", default="1,16")
    args = parser.parse_args()
    if args.inproc:
        inproc(args.requests, args.rounds)
    if args.tree:
        end_to_end(args)


if __name__ == "__main__":
    main()
