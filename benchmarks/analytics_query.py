"""Analytics at size: the site query over filled rollups, and raw rows against the disk
estimate.

1. **Site query, 30 days × 32 nodes × 50 models.**  A node database (an SQLite file, WAL, as a node
   keeps it) is filled with every rollup a busy node would hold: day rows for 30 days, hour rows for
   30 days, minute rows for the last 48 h, for 50 models, every bucket non-empty (the worst case:
   real nodes leave most buckets empty); every one of the 32 nodes holds as much.  Measured: a node answering
   ``GET /router/v1/node/analytics?period=...`` (query + document + JSON), the master merging the 32
   answers (JSON decode + merge + JSON), and their sum as the site answers it (nodes are asked at
   once, so the site waits for one node's answer, then merges; the network between is not counted);
   plus the fully sequential sum (all 32 node queries one after another, as if every node shared
   this machine).  Medians; CPU time beside wall time, as the machine may be shared.
2. **10 million raw rows.**  ``analytics_requests`` rows written in batches as the recorder writes
   them (one transaction per batch, index included); the file size against the estimate the README
   documents (``BYTES_PER_ROW`` × rows).
3. **The request log's columns and indexes, same run** (``--schema-ab`` rows, default 200,000): the
   recorder's batch write (raw rows + rollups, one transaction per ``--ab-batch`` rows) into a fresh
   database without (``before``: schema step 5's four request-log indexes dropped, its new columns
   left at their defaults, as a version-4 row) and with them (``after``: request ID, local ID, key
   and reason filled, every index), alternating which goes first; CPU per row, and bytes per row
   after a checkpoint; per-round and median after ÷ before.

Run: .venv/bin/python benchmarks/analytics_query.py [--nodes 32] [--models 50] [--raw-rows 10000000]
[--schema-ab 200000] [--ab-rounds 6]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from routerd.inference.analytics import node_document  # noqa: E402
from routerd.site.analytics import merge  # noqa: E402
from routerd.store import analytics as sql  # noqa: E402
from routerd.store.analytics import HIST_BUCKETS, LEVELS, SUMS, Query, RequestRow  # noqa: E402
from routerd.store.migrations import migrate  # noqa: E402
from routerd.store.runner import connect  # noqa: E402

#: The documented disk estimate of one raw request row (the row and its index entries: at_ms and
#: the request log's request ID, model, key and failure indexes), bytes.
BYTES_PER_ROW = 260
DAY = 86_400_000


def fill_node(path: str, node_id: str, models: int, now_ms: int, rng: random.Random) -> int:
    """Every rollup bucket of 30 days (day, hour) and 48 h (minute) for ``models`` models."""
    conn = connect(path)
    migrate(conn)
    columns = ("level", "bucket_ms", "node_id", "model_id", "local_id", "lane", *SUMS,
               *(f"d{i}" for i in range(HIST_BUCKETS)), *(f"t{i}" for i in range(HIST_BUCKETS)))
    insert = (f"INSERT INTO analytics_rollups ({', '.join(columns)}) "
              f"VALUES ({', '.join('?' * len(columns))})")
    spans = {"day": 30 * DAY, "hour": 30 * DAY, "minute": 2 * DAY}
    rows = 0
    conn.execute("BEGIN")
    for level, span in spans.items():
        width = LEVELS[level]
        first = now_ms - span
        first -= first % width
        batch = []
        for bucket in range(first, now_ms, width):
            for m in range(models):
                requests = rng.randint(1, 500)
                sums = [requests, rng.randint(0, 5), requests * 300, requests * 200, 0, 0.0, 0, 1, 0,
                        rng.randint(0, 20), rng.randint(0, 20), 0, requests * 900.0, requests * 200]
                hist = [0] * HIST_BUCKETS
                ttft = [0] * HIST_BUCKETS
                for _ in range(4):
                    hist[rng.randint(12, 26)] += requests // 4
                    ttft[rng.randint(8, 16)] += requests // 4
                name = f"model-{m:02d}"
                batch.append((level, bucket, node_id, name, name, "text", *sums, *hist, *ttft))
        conn.executemany(insert, batch)
        rows += len(batch)
    conn.execute("COMMIT")
    conn.close()
    return rows


def node_answer(conn: sqlite3.Connection, node_id: str, query: Query, now_ms: int) -> bytes:
    tables, series = sql.query(conn, query, now_ms)
    return json.dumps(node_document(node_id, query, now_ms, True, tables, series)).encode()


def site_query(root: Path, nodes: int, models: int, now_ms: int, rounds: int) -> None:
    """Every node holds the same amount (one database filled, asked as each of the nodes: the same
    rows, the same work); the master merges ``nodes`` answers that differ by node ID."""
    rng = random.Random(22)
    started = time.perf_counter()
    path = str(root / "node.sqlite")
    total = fill_node(path, "node-00", models, now_ms, rng)
    print(f"filled a node database: {total:,} rollup rows, {os.path.getsize(path) / 1e6:.0f} MB, in "
          f"{time.perf_counter() - started:.0f} s; the site has {nodes} such nodes")
    conn = connect(path)
    print("times in ms; cpu = this process's CPU time (what an idle machine's wall time would be: the "
          "work is CPU-bound and the files are cached), wall = elapsed on this shared machine")
    print(f"{'period':>6} {'node cpu':>9} {'node wall':>9} {'merge cpu':>9} {'merge wall':>10} "
          f"{'site cpu':>9} {'site wall':>9} {'seq cpu':>8} {'answer KB':>9}")
    for period in ("30d", "7d", "24h", "1h"):
        query = Query(period=period)
        node_cpu: list[float] = []
        node_wall: list[float] = []
        merge_cpu: list[float] = []
        merge_wall: list[float] = []
        answer_bytes = 0
        for _ in range(rounds):
            answers = []
            for n in range(nodes):
                c0, t0 = time.process_time(), time.perf_counter()
                answer = node_answer(conn, "node-00", query, now_ms)
                node_cpu.append(time.process_time() - c0)
                node_wall.append(time.perf_counter() - t0)
                answers.append(answer.replace(b'"node-00"', f'"node-{n:02d}"'.encode()))
            c0, t0 = time.process_time(), time.perf_counter()
            document = merge([json.loads(a) for a in answers], query, now_ms)
            answer_bytes = len(json.dumps(document).encode())
            merge_cpu.append(time.process_time() - c0)
            merge_wall.append(time.perf_counter() - t0)
        ncpu, nwall = statistics.median(node_cpu) * 1000, statistics.median(node_wall) * 1000
        mcpu, mwall = statistics.median(merge_cpu) * 1000, statistics.median(merge_wall) * 1000
        # the nodes answer at once: the site waits for one node's answer, then merges
        print(f"{period:>6} {ncpu:9.1f} {nwall:9.1f} {mcpu:9.1f} {mwall:10.1f} {ncpu + mcpu:9.1f} "
              f"{nwall + mwall:9.1f} {ncpu * nodes + mcpu:8.1f} {answer_bytes / 1024:9.0f}")
    conn.close()


def raw_rows(root: Path, count: int, batch: int) -> None:
    path = str(root / "raw.sqlite")
    conn = connect(path)
    migrate(conn)
    rng = random.Random(7)
    now = int(time.time() * 1000)
    started = time.perf_counter()
    written = 0
    while written < count:
        n = min(batch, count - written)
        rows = [RequestRow(at_ms=now - (count - written - i) * 250, node_id="gpu-node-07",
                           model_id=f"model-{rng.randrange(50):02d}", lane="text", route="chat",
                           status="ok", http_status=200, duration_ms=rng.uniform(50, 5000),
                           ttft_ms=rng.uniform(10, 400) if i % 2 else None,
                           prompt_tokens=rng.randrange(2000), completion_tokens=rng.randrange(800),
                           key_name="team-analytics") for i in range(n)]
        conn.execute("BEGIN")
        conn.executemany(f"INSERT INTO analytics_requests ({sql.REQUEST_COLUMNS}) "
                         f"VALUES ({', '.join('?' * len(RequestRow._fields))})", rows)
        conn.execute("COMMIT")
        written += n
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    elapsed = time.perf_counter() - started
    size = os.path.getsize(path)
    estimate = BYTES_PER_ROW * count
    print(f"{count:,} raw rows in batches of {batch:,}: {elapsed:.0f} s ({count / elapsed:,.0f} rows/s), "
          f"{size / 1e6:,.0f} MB on disk = {size / count:.0f} B a row; documented estimate "
          f"{BYTES_PER_ROW} B a row = {estimate / 1e6:,.0f} MB (measured / estimate {size / estimate:.2f})")


#: Schema step 5's indexes (routerd.store.request_log): what ``before`` drops.
LOG_INDEXES = ("analytics_requests_request", "analytics_requests_model", "analytics_requests_key",
               "analytics_requests_failed")


def log_rows(count: int, filled: bool, rng: random.Random, now: int) -> list[RequestRow]:
    """Recorder-shaped rows, one a 250 ms; ``filled``: with what schema step 5 added (request ID, local
    ID, a key name; a reason on the 2 % that failed)."""
    rows = []
    for i in range(count):
        model = f"model-{rng.randrange(50):02d}"
        failed = rng.random() < 0.02
        rows.append(RequestRow(
            at_ms=now - (count - i) * 250, node_id="gpu-node-07", model_id=model, lane="text", route="chat",
            status="backend_error" if failed else "ok", http_status=502 if failed else 200,
            duration_ms=rng.uniform(50, 5000), ttft_ms=rng.uniform(10, 400) if i % 2 else None,
            prompt_tokens=rng.randrange(2000), completion_tokens=rng.randrange(800),
            key_name=f"team-{rng.randrange(12)}" if filled else "team-analytics",
            request_id=os.urandom(8).hex() if filled else "", local_id=model if filled else "",
            cached_tokens=rng.randrange(500) if filled else 0,
            reason="the backend failed: connection refused" if filled and failed else ""))
    return rows


def write_log(root: Path, name: str, rows: list[RequestRow], batch: int,
              indexed: bool) -> tuple[float, float]:
    """(CPU seconds a row, bytes a row) of writing ``rows`` as the recorder does into a fresh file."""
    path = str(root / f"{name}.sqlite")
    conn = connect(path)
    migrate(conn)
    if not indexed:
        for index in LOG_INDEXES:
            conn.execute(f"DROP INDEX {index}")
    c0 = time.process_time()
    for start in range(0, len(rows), batch):
        conn.execute("BEGIN")
        sql.write_batch(conn, rows[start:start + batch], [])
        conn.execute("COMMIT")
    cpu = time.process_time() - c0
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    size = os.path.getsize(path)
    for suffix in ("", "-wal", "-shm"):
        Path(path + suffix).unlink(missing_ok=True)
    return cpu / len(rows), size / len(rows)


def schema_ab(root: Path, count: int, batch: int, rounds: int) -> None:
    rng = random.Random(32)
    now = int(time.time() * 1000)
    before_rows, after_rows = log_rows(count, False, rng, now), log_rows(count, True, rng, now)
    print(f"request-log columns and indexes, {count:,} rows in batches of {batch:,} (CPU µs a row, B a row):")
    print(f"{'rnd':>3} {'before':>8} {'after':>8} {'ratio':>6} {'B before':>9} {'B after':>8} {'ratio':>6}")
    cpu_ratios, byte_ratios = [], []
    for rnd in range(1, rounds + 1):
        order = [("before", before_rows, False), ("after", after_rows, True)]
        if rnd % 2 == 0:
            order.reverse()
        found = {name: write_log(root, f"{name}-{rnd}", rows, batch, indexed)
                 for name, rows, indexed in order}
        (cb, bb), (ca, ba) = found["before"], found["after"]
        cpu_ratios.append(ca / cb)
        byte_ratios.append(ba / bb)
        print(f"{rnd:>3} {cb * 1e6:8.2f} {ca * 1e6:8.2f} {ca / cb:6.2f} {bb:9.0f} {ba:8.0f} {ba / bb:6.2f}")
    print(f"median after ÷ before: CPU {statistics.median(cpu_ratios):.2f} "
          f"(min {min(cpu_ratios):.2f}, max {max(cpu_ratios):.2f}), "
          f"bytes {statistics.median(byte_ratios):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--models", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--raw-rows", type=int, default=10_000_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--dir", default=None, help="where the databases go (default: a temporary dir)")
    parser.add_argument("--schema-ab", type=int, default=200_000,
                        help="rows of the request-log A/B (0: skip)")
    parser.add_argument("--ab-batch", type=int, default=5_000)
    parser.add_argument("--ab-rounds", type=int, default=6)
    parser.add_argument("--skip-site", action="store_true", help="skip the site query (part 1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        now_ms = int(time.time() * 1000)
        if not args.skip_site:
            site_query(root, args.nodes, args.models, now_ms, args.rounds)
        if args.schema_ab:
            schema_ab(root, args.schema_ab, args.ab_batch, args.ab_rounds)
        if args.raw_rows:
            raw_rows(root, args.raw_rows, args.batch)


if __name__ == "__main__":
    main()
