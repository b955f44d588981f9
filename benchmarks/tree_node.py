"""Run one routerd node from a given source tree, optionally under cProfile in windows.

``benchmarks/trees.py`` starts every tree it compares through this wrapper: the tree's folder goes
first on ``sys.path`` (so its ``routerd`` package and its ``twisted/plugins/routerd_plugin.py`` are
the ones found, whatever the venv has installed, editable or not), then twistd runs in this very
process, so the pid the harness watches in /proc is the node's own.

With ``ROUTERD_BENCH_OPCODES=PREFIX`` the same signals open and close opcode-count windows instead
(``benchmarks/opcode_windows.py``, read by ``benchmarks/work.py``).

With ``ROUTERD_BENCH_PROFILE=PREFIX`` in the environment, SIGUSR1 starts a cProfile window and
SIGUSR2 ends it, writing the stats to ``PREFIX.N`` (N = 1, 2, ... in order), so a profile holds the
measured load only, not start-up or warm-up.  Without it the signals are left alone.

The profiler's clock is the main thread's CPU time (``time.thread_time_ns``), not the wall clock: on
a loaded machine the wall clock charges every stretch the process waited for a core to whatever
function it was in.  Reading that clock is a system call, which costs the same for every function
entry and exit; the window measures that cost first (``PREFIX.N.cal``: nanoseconds of clock
overhead per profiled interval) so the reader can take it off each entry's own time
(``benchmarks/trees.py`` does).

Run: python benchmarks/tree_node.py TREE_DIR [twistd arguments, e.g. -n --pidfile= routerd --config F]
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import FrameType


def _profile_windows(prefix: str) -> None:
    import cProfile
    import pstats
    import time

    state: dict[str, object] = {"n": 0, "prof": None, "cal": 0.0}

    def empty() -> None:
        pass

    def calibrate() -> float:
        """Nanoseconds the profiler's clock adds to one profiled interval (one call of an empty
        function)."""
        prof = cProfile.Profile(time.thread_time_ns, 1e-9)
        prof.enable()
        for _ in range(20000):
            empty()
        prof.disable()
        stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
        own = [v[2] / v[1] for k, v in stats.items() if k[2] == "empty"]
        return own[0] * 1e9 if own else 0.0

    def start(_signum: int, _frame: FrameType | None) -> None:
        state["cal"] = calibrate()
        prof = cProfile.Profile(time.thread_time_ns, 1e-9)
        state["prof"] = prof
        prof.enable()

    def stop(_signum: int, _frame: FrameType | None) -> None:
        prof = state["prof"]
        if isinstance(prof, cProfile.Profile):
            prof.disable()
            n = int(str(state["n"])) + 1
            state["n"] = n
            Path(f"{prefix}.{n}.cal").write_text(f"{state['cal']}\n")
            prof.dump_stats(f"{prefix}.{n}")
            state["prof"] = None

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)


def main() -> None:
    tree = Path(sys.argv[1]).resolve()
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [str(tree)] + [p for p in sys.path if p not in (here, "", ".")]
    import routerd

    where = Path(routerd.__file__).resolve()
    if tree not in where.parents:
        raise SystemExit(f"routerd came from {where}, not from {tree}")
    prefix = os.environ.get("ROUTERD_BENCH_PROFILE")
    opcodes = os.environ.get("ROUTERD_BENCH_OPCODES")
    if prefix or opcodes:
        from twisted.internet import reactor

        if prefix:
            reactor.callWhenRunning(_profile_windows, prefix)  # after twistd's own signal handlers
        else:
            import importlib.util

            spec = importlib.util.spec_from_file_location("opcode_windows", Path(here) / "opcode_windows.py")
            assert spec is not None and spec.loader is not None
            windows = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(windows)
            reactor.callWhenRunning(windows.arm, opcodes)
    from twisted.scripts.twistd import run

    sys.argv = ["twistd", *sys.argv[2:]]
    run()


if __name__ == "__main__":
    main()
