"""What one held request retains below the HTTP edge (issue 14, "Memory"), measured in process.

A real in-memory node (the unit tests' ``World``: one ``task.Clock``, simulator backends, no
sockets) serves ``alpha`` on a slow simulated backend (``scheduling_backend_depth`` 2, the default), and
``alpha`` is enrolled in a text link (owner of ``alpha`` -> a helper elsewhere), so its requests
wait in the lending queue.  N chat requests with 4 KB bodies go straight into
``InferenceFront.handle`` (the edge's ``Incoming`` and a minimal ``Reply``, as the HTTP edge would
hand them over); the clock does not move, so two run in the backend and the rest are held.

Printed, per held request: the bytes tracemalloc sees retained (total, and the top allocation
sites), the objects the garbage collector tracks (by type: coroutines, Deferreds, dicts...), and the
same after the clock runs every request to its answer (back to the baseline).  The request body
itself (made here, as the edge would) is one line of the table: it is the copy a held request must
keep.

Run: .venv/bin/python benchmarks/held_footprint.py [--requests 2000] [--body-bytes 4096] [--top 15]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from twisted.internet.defer import Deferred, ensureDeferred  # noqa: E402

from routerd.lending.links import LinkSet  # noqa: E402
from routerd.routing.call import Incoming  # noqa: E402
from routerd.routing.classify import classify  # noqa: E402
from routerd.wire.lending import Endpoint, Link  # noqa: E402
from tests.unit.node_fixture import World  # noqa: E402

CHAT = "/v1/chat/completions"
#: A slow text model: each answer token takes a simulated second (the clock stands still while held).
SLOW = {"kind": "text", "weights": "slow", "gen_tokens_per_s": 1.0}


class LeanReply:
    """The edge's side of a reply, kept as small as the real one (a slotted wrapper): headers are
    the edge's to keep, so this one only counts them."""

    __slots__ = ("status", "headers", "written", "gone")

    def __init__(self) -> None:
        self.status = 200
        self.headers = 0
        self.written = 0
        self.gone = False

    @property
    def started(self) -> bool:
        return self.written > 0

    def set_status(self, code: int) -> None:
        self.status = code

    def set_header(self, name: bytes, value: bytes) -> None:
        self.headers += 1

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def abort(self) -> None:
        self.gone = True

    def name_model(self, name: str) -> None:
        pass  # the edge's access line


def build(root: Path) -> tuple[World, Any]:
    world = World(root)
    node = world.node("owner", {"alpha": SLOW}, llama={"extra_args": ["--sim-time-scale", "1"]},
                      limits={"max_queued_per_model": 1_000_000})
    world.start(node)
    link = Link(Endpoint("owner", "alpha"), Endpoint("helper", "bravo"), True, False)
    node.lending.install_links(LinkSet.build("image", ()), LinkSet.build("text", [link]))
    return world, node


def payload(body_bytes: int, i: int) -> bytes:
    text = "x" * max(1, body_bytes - 90) + f"{i:08d}"  # a distinct bytes object per request
    return json.dumps({"model": "alpha", "max_tokens": 4, "messages": [
        {"role": "user", "content": text}]}).encode()


def send(world: World, node: Any, n: int, body_bytes: int, start: int) -> list[Deferred[bytes]]:
    route = classify("POST", CHAT)
    assert route is not None
    headers = {"host": "owner.test:8080", "content-type": "application/json",
               "content-length": str(body_bytes), "connection": "keep-alive"}
    out = []
    for i in range(start, start + n):
        incoming = Incoming(path=CHAT, body=payload(body_bytes, i), content_type="application/json",
                            query={}, headers=dict(headers))
        out.append(ensureDeferred(node.front.handle(incoming, LeanReply(), route)))
    while world.network.flush():
        pass
    return out


def finish(world: World, pending: list[Deferred[bytes]]) -> None:
    done: list[object] = []
    for d in pending:
        d.addBoth(done.append)
    while len(done) < len(pending):
        if world.network.flush():
            continue
        calls = world.clock.getDelayedCalls()
        assert calls, "nothing left to run, yet requests are unanswered"
        world.clock.advance(max(0.0, min(c.getTime() for c in calls) - world.clock.seconds()))
    bad = [r for r in done if not isinstance(r, bytes)]
    assert not bad, bad[:3]


def type_counts() -> Counter[str]:
    gc.collect()
    return Counter(type(o).__qualname__ for o in gc.get_objects())


def short(frame: tracemalloc.Frame) -> str:
    name = frame.filename
    for marker in ("/routerd/", "/benchmarks/", "/tests/", "/site-packages/", "/lib/python3"):
        if marker in name:
            name = name[name.index(marker) + 1:]
            break
    return f"{name}:{frame.lineno}"


def measure(n: int, body_bytes: int, top: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        world, node = build(Path(tmp))
        finish(world, send(world, node, 20, body_bytes, 0))  # warm: lazy imports, metrics children
        gc.collect()
        types_before = type_counts()
        tracemalloc.start(1)
        before = tracemalloc.take_snapshot()
        pending = send(world, node, n, body_bytes, 1000)
        held = len(node.lending.held_requests())
        gc.collect()
        during = tracemalloc.take_snapshot()
        types_during = type_counts()
        finish(world, pending)
        del pending
        uncollected = tracemalloc.take_snapshot()  # before a collection: cyclic garbage still in
        cycles = gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        world.run(node.stop())

    filters = [tracemalloc.Filter(False, tracemalloc.__file__)]
    before, during, uncollected, after = (
        s.filter_traces(filters) for s in (before, during, uncollected, after))
    stats = during.compare_to(before, "lineno")
    grown = sum(s.size_diff for s in stats)
    print(f"{n} requests sent, {held} held in the lending queue, body {len(payload(body_bytes, 0))} B")
    print(f"retained while held: {grown / n:,.0f} B per request (tracemalloc, Python allocations)")
    print(f"top {top} allocation sites, bytes per held request:")
    for s in sorted(stats, key=lambda s: -s.size_diff)[:top]:
        print(f"  {s.size_diff / n:8,.0f} B  {s.count_diff / n:5.2f} blocks  {short(s.traceback[0])}")
    diff = {t: types_during[t] - types_before[t] for t in types_during}
    print("gc-tracked objects per held request: " + ", ".join(
        f"{t} {c / n:.2f}" for t, c in sorted(diff.items(), key=lambda kv: -kv[1])[:14] if c > 0))
    # What the drain leaves: the node's own allocations (imports made by the first refit and the
    # in-memory test network's connection records are not the node's to give back).
    kept = after.filter_traces([tracemalloc.Filter(True, str(ROOT / "routerd" / "*"))]).compare_to(
        before.filter_traces([tracemalloc.Filter(True, str(ROOT / "routerd" / "*"))]), "lineno")
    left = sum(s.size_diff for s in kept)
    garbage = sum(s.size_diff for s in uncollected.compare_to(after, "lineno"))
    print(f"after the drain, cyclic garbage awaiting the collector: {garbage / n:,.0f} B per request "
          f"({cycles / n:.1f} objects)")
    print(f"after the drain: {left / n:,.0f} B per request still retained by routerd/ code "
          f"({left / 1024:,.1f} KiB in all)")
    for s in [s for s in sorted(kept, key=lambda s: -s.size_diff) if s.size_diff > 0][:5]:
        print(f"  {s.size_diff / n:8,.0f} B  {s.count_diff / n:5.2f} blocks  {short(s.traceback[0])}")
    return {"per_request": grown / n, "after": left / n, "body": sys.getsizeof(payload(body_bytes, 0))}


def reference(ref: str, args: argparse.Namespace) -> dict[str, float]:
    """The same measurement of ``routerd/`` (and the test fixtures) as of git ``ref``, in a child
    process run from an extracted copy of that tree (its directory comes first on ``sys.path``)."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "routerd", "tests"],
                                 check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        (Path(tmp) / "benchmarks").mkdir()
        script = Path(tmp) / "benchmarks" / Path(__file__).name
        shutil.copy(__file__, script)
        out = subprocess.run([sys.executable, str(script), "--requests", str(args.requests),
                              "--body-bytes", str(args.body_bytes), "--top", "0", "--json"],
                             check=True, capture_output=True, text=True, cwd=tmp).stdout
    return dict(json.loads(out.splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--body-bytes", type=int, default=4096)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--against", metavar="GIT_REF",
                        help="also measure routerd/ as of this commit and print the ratio")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json:
        with contextlib.redirect_stdout(io.StringIO()):
            figures = measure(args.requests, args.body_bytes, args.top)
        print(json.dumps(figures))
        return
    figures = measure(args.requests, args.body_bytes, args.top)
    if args.against:
        ref = reference(args.against, args)
        print(f"\nreference {args.against}: {ref['per_request']:,.0f} B per held request; this tree: "
              f"{figures['per_request']:,.0f} B (x{figures['per_request'] / ref['per_request']:.2f}); "
              f"without the body ({figures['body']:,.0f} B): {ref['per_request'] - figures['body']:,.0f} -> "
              f"{figures['per_request'] - figures['body']:,.0f} B "
              f"(x{(figures['per_request'] - figures['body']) / (ref['per_request'] - figures['body']):.2f})")


if __name__ == "__main__":
    main()
