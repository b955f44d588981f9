"""The cells both ``overhead.py`` and ``analytics_ab.py`` measure: the zero-delay simulator model, the
request and stream bodies, one load cell and one stream cell.  Kept apart so neither script imports
the other."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from _harness import Cell, cpu_seconds, measure, median

ZERO = {"kind": "text", "load_ms": 0, "prompt_tokens_per_s": 1e9, "gen_tokens_per_s": 1e9, "context": 4096}
BODY = {"model": "zero", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}
STREAM = {**BODY, "max_tokens": 20, "stream": True}


async def measure_cell(http: Any, url: str, conc: int, args: argparse.Namespace, pid: int | None) -> Cell:
    return await measure(http, url, BODY, conc, pid=pid, seconds=args.seconds if args.wrk else None,
                         requests=args.requests)


async def stream_cell(http: Any, url: str, rounds: int, pid: int | None) -> tuple[float, float | None, int]:
    """Median time to first chunk over ``rounds`` sequential streams, proxy CPU per stream, and the
    number of streams cut off mid-answer (counted, not fatal: Go's proxy truncates about one
    stream in 400 to the zero-delay simulator)."""
    import treq
    from twisted.web.client import ResponseFailed

    cpu0 = cpu_seconds(pid) if pid is not None else 0.0
    firsts: list[float] = []
    failed = 0
    payload = json.dumps(STREAM).encode()
    for _ in range(rounds):
        start = time.perf_counter()
        response = await http.post(url, data=payload, headers={b"content-type": [b"application/json"]},
                                   unbuffered=True)
        first: list[float] = []

        def got(data: bytes, first: list[float] = first, start: float = start) -> None:
            if not first:
                first.append(time.perf_counter() - start)

        try:
            await treq.collect(response, got)
        except ResponseFailed:
            failed += 1
            continue
        firsts.append(first[0])
    cpu = (cpu_seconds(pid) - cpu0) / rounds if pid is not None else None
    return median(firsts), cpu, failed
