"""Opcode-count windows for a node run by ``benchmarks/tree_node.py`` (``ROUTERD_BENCH_OPCODES``).

SIGUSR1 starts a window, SIGUSR2 ends it and writes ``PREFIX.N`` (N = 1, 2, ...): a JSON list of
``[[kind, filename, first line, function], count]`` rows, kind ``"ops"`` (bytecode instructions run
in that function's frames) or ``"calls"`` (frames entered).  Counted with ``sys.settrace`` and
``f_trace_opcodes`` in every thread, so the figures are the same on a quiet and on a loaded
machine: the instrument ``benchmarks/work.py`` compares trees with.  Tracing makes the node ~50×
slower; compare counts, never times, of a traced node.
"""

from __future__ import annotations

import collections
import json
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

Key = tuple[str, str, int, str]


def arm(prefix: str) -> None:
    counts: collections.Counter[Key] = collections.Counter()
    windows = [0]

    def tracer(frame: FrameType, event: str, _arg: Any) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        code = frame.f_code
        ops: Key = ("ops", code.co_filename, code.co_firstlineno, code.co_name)
        if event == "call":
            counts[("calls", code.co_filename, code.co_firstlineno, code.co_name)] += 1

        def local(_frame: FrameType, kind: str, _arg: Any) -> Any:
            if kind == "opcode":
                counts[ops] += 1
            return local
        return local

    def start(_signum: int, _frame: FrameType | None) -> None:
        counts.clear()
        sys.settrace(tracer)
        threading.settrace(tracer)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]
        windows[0] += 1
        rows = [[list(key), value] for key, value in counts.items()]
        Path(f"{prefix}.{windows[0]}").write_text(json.dumps(rows))

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
