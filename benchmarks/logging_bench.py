"""Events per second through a node's text log: twisted's observer against routerd's, same run.

Each "request" logs what a node logs per inference request: its access line (a ``literal``, namespace
``routerd.access``, ten keyword fields) and one backend output line (a ``literal``); every tenth
request also logs a line with replacement fields, and every request a debug line the level filter
drops.  Both pipelines run behind an info-level filter and write to a file on disk (like twistd's
``LogFile``), flushing each line:

- ``twisted``: ``FilteringLogObserver(textFileLogObserver(file), [LogLevelFilterPredicate, noise])``,
  what a node used before issue 14;
- ``routerd``: ``routerd.logs.filtered(routerd.logs.text_observer(file))``;
- ``routerd+quick``: the same observer, the lines logged through ``routerd.logs.QuickLogger`` (as
  backend lines are) instead of ``twisted.logger.Logger``.

All are timed in alternating rounds twice: the observers alone, fed the events ready-made
(``observer only``), and whole, from building the line to the write (``end to end``: what a request
pays; the producer's own ``str.format`` and field dicts are in both).  The ratio of the medians
is the figure (machines are shared: absolute rates drift, the ratio much less).
A last check asserts both wrote the same bytes.

    .venv/bin/python benchmarks/logging_bench.py [--requests 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from twisted.logger import (  # noqa: E402
    FilteringLogObserver,
    Logger,
    LogLevel,
    LogLevelFilterPredicate,
    LogPublisher,
    PredicateResult,
    textFileLogObserver,
)

from routerd.logs import (  # noqa: E402
    ACCESS_FORMAT,
    QuickLogger,
    filtered,
    is_noise,
    literal,
    text_observer,
)

Pipeline = Callable[[IO[str]], Any]


def _twisted(stream: IO[str]) -> Any:
    def noise(event: Any) -> Any:
        return PredicateResult.no if is_noise(event) else PredicateResult.maybe

    return FilteringLogObserver(textFileLogObserver(stream),
                                [LogLevelFilterPredicate(defaultLogLevel=LogLevel.info), noise])


def _routerd(stream: IO[str]) -> Any:
    return filtered(text_observer(stream), LogLevel.info)


def _requests(publisher: LogPublisher, count: int, logger: type[Logger] = Logger) -> None:
    access = logger(namespace="routerd.access", observer=publisher)
    backend = logger(namespace="routerd.backends.process", observer=publisher)
    lending = logger(namespace="routerd.lending.service", observer=publisher)
    for i in range(count):
        fields = {"method": "POST", "path": "/v1/chat/completions", "status": 200, "bytes": 312,
                  "ms": 3, "model": "chat-small", "node": "a", "lent_to": "-",
                  "request_id": f"r{i}", "client": "127.0.0.1"}
        access.info(literal(ACCESS_FORMAT.format(**fields)), **fields)
        line = f"slot {i % 4}: prompt done, n_tokens = 42, {{\"t\": {i}}}"
        backend.info(literal(f"chat-small: {line}"), backend="chat-small", line=line)
        backend.debug("{backend}: polled", backend="chat-small")
        if i % 10 == 0:
            lending.info("lent {request_id} to {helper} (est {ms:.1f} ms)", request_id=f"r{i}",
                         helper="b/helper", ms=12.5)


def _events_per_request(count: int) -> float:
    return 2 + (count + 9) // 10 / count  # access + backend (+ one in ten); the debug one is dropped


def _rate(pipeline: Pipeline, count: int, path: Path, logger: type[Logger] = Logger) -> float:
    with path.open("w", encoding="utf-8") as stream:
        publisher = LogPublisher(pipeline(stream))
        start = time.perf_counter()
        _requests(publisher, count, logger)
        elapsed = time.perf_counter() - start
    return count * _events_per_request(count) / elapsed


def _captured(count: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    _requests(LogPublisher(events.append), count)
    return events


def _observer_rate(pipeline: Pipeline, events: list[dict[str, Any]], path: Path) -> float:
    with path.open("w", encoding="utf-8") as stream:
        observer = pipeline(stream)
        start = time.perf_counter()
        for event in events:
            observer(event)
        elapsed = time.perf_counter() - start
    return sum(1 for e in events if e["log_level"] is not LogLevel.debug) / elapsed


def _same_output(path: Path) -> bool:
    texts = []
    for pipeline in (_twisted, _routerd):
        with path.open("w", encoding="utf-8") as stream:
            publisher = LogPublisher(pipeline(stream))
            Logger(namespace="routerd.access", observer=publisher).info(literal("GET / 200 {x}"))
            Logger(namespace="n", observer=publisher).warn("w {a!r} ☃", a="x")
        texts.append(path.read_text(encoding="utf-8").split(" ", 1)[1])  # same second is not assured
    return texts[0] == texts[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    rates: dict[str, list[float]] = {"twisted": [], "routerd": [], "quick": [],
                                     "observer twisted": [], "observer routerd": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "node.log"
        _rate(_routerd, 1000, path)  # warm-up
        _rate(_twisted, 1000, path)
        events = _captured(args.requests)
        for _ in range(args.rounds):
            rates["observer twisted"].append(_observer_rate(_twisted, events, path))
            rates["observer routerd"].append(_observer_rate(_routerd, events, path))
            rates["twisted"].append(_rate(_twisted, args.requests, path))
            rates["routerd"].append(_rate(_routerd, args.requests, path))
            rates["quick"].append(_rate(_routerd, args.requests, path, QuickLogger))
        same = _same_output(path)
    twisted, routerd, quick = (statistics.median(rates[k]) for k in ("twisted", "routerd", "quick"))
    print(f"requests per round: {args.requests} ({_events_per_request(args.requests):.1f} logged events"
          f" each, one more dropped by the level), rounds: {args.rounds}")
    spread = {k: f"{min(v):,.0f}..{max(v):,.0f}" for k, v in rates.items()}
    o_twisted, o_routerd = (statistics.median(rates[f"observer {k}"]) for k in ("twisted", "routerd"))
    print("observer only (events ready-made):")
    print(f"twisted textFileLogObserver: {o_twisted:>10,.0f} events/s (median; {spread['observer twisted']})")
    print(f"routerd text_observer:       {o_routerd:>10,.0f} events/s (median; {spread['observer routerd']})")
    print(f"ratio routerd / twisted: {o_routerd / o_twisted:.2f}x"
          f"  (per event: {1e6 / o_twisted:.2f} us -> {1e6 / o_routerd:.2f} us)")
    print("end to end (from building the line to the write):")
    print(f"twisted textFileLogObserver: {twisted:>10,.0f} events/s (median; "
          f"{min(rates['twisted']):,.0f}..{max(rates['twisted']):,.0f})")
    print(f"routerd text_observer:       {routerd:>10,.0f} events/s (median; "
          f"{min(rates['routerd']):,.0f}..{max(rates['routerd']):,.0f})")
    print(f"routerd text_observer+Quick: {quick:>10,.0f} events/s (median; "
          f"{min(rates['quick']):,.0f}..{max(rates['quick']):,.0f})")
    print(f"ratio routerd / twisted: {routerd / twisted:.2f}x"
          f"  (per event: {1e6 / twisted:.2f} us -> {1e6 / routerd:.2f} us)")
    print(f"ratio routerd+quick / twisted: {quick / twisted:.2f}x  (per event: {1e6 / quick:.2f} us)")
    print(f"same bytes written: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
