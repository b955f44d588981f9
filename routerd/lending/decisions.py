"""The lending decision log writer (spec "Decision log"; contract §8).

``DecisionLog.record`` checks one decision against the enumerations, stamps it
with this node's id, the clock's time and the router version, and appends it to
an in-memory buffer: nothing touches the database on the caller's turn of the
reactor.  While started, a ``LoopingCall`` on the injected clock writes the
buffer every second in one ``insert_decision_values`` call and, at most once a
minute, deletes rows older than the retention.  The buffer holds at most
``BUFFER_CAP`` rows; beyond that the oldest are dropped and the count logged.
Database failures are logged, never raised into callers.  An unknown kind,
outcome, reason, trigger, lane or column is a programming error and raises
``ValueError`` at once.

A plan writes one row per linked pair (8,192 on a site of 64 nodes x 32 owners x 4
helpers).  ``record_plan_rows`` therefore checks a plan's enumerations
once per distinct value and buffers the plan's rows as they came from the planner
(``routerd.wire.plan_rows.PlanRows``, one entry); each row becomes its insert
tuple only on the store thread, while the batch is written.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice, repeat
from operator import itemgetter
from typing import Any, Protocol

from twisted.internet import task
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from routerd import __version__
from routerd.registry.replica_choice import REASONS as REPLICA_REASONS
from routerd.replica_modes import MODES
from routerd.store.decisions import (
    DEFAULT_LIMIT,
    INT_COLUMNS,
    REAL_COLUMNS,
    TEXT_COLUMNS,
    row_values,
)
from routerd.wire.lending import LANES, OUTCOMES, REASONS, TRIGGERS, PlanRow
from routerd.wire.plan_rows import FlatRow, Gathered, PlanRows, distinct

log = Logger()

#: Rows kept in memory between flushes; past this the oldest are dropped.
BUFFER_CAP = 10_000
#: Seconds between buffer flushes.
FLUSH_INTERVAL_S = 1.0
#: Minimum seconds between two prunes.
PRUNE_INTERVAL_S = 60.0

KINDS: tuple[str, ...] = ("plan", "dispatch", "helper", "queue", "replica_choice")

#: Outcomes each kind may record (plan rows on the master; dispatch rows on the owner, and
#: ``relay_refused`` on the master; helper rows on the helper).  A ``guardian`` dispatch row is
#: written by the node that sent a request with an image to a guardian model (spec "Guardian
#: models"): owner = the text-only model named, helper = the guardian, reason ``structure`` (the
#: body carried an image) or ``backend_refused`` (the backend refused it).
OUTCOMES_BY_KIND: Mapping[str, frozenset[str]] = {
    "plan": frozenset(OUTCOMES),
    "dispatch": frozenset({"lease_updated", "lease_cleared", "lease_refused", "lent", "returned",
                           "held_for_helper", "relay_refused", "stall_reclaimed", "guardian"}),
    "helper": frozenset({"native_waited_behind_borrowed", "borrowed_returned"}),
    # any node: a request passed over by the swap-avoiding order (scheduling.swap_batch)
    "queue": frozenset({"passed_over"}),
    # the master's choice among a model's replicas (routing.replica_choice): the mode is the outcome
    "replica_choice": frozenset(m for m in MODES if m != "rotation"),
}
#: Reasons each kind may record ('' — no reason — is always allowed).
REASONS_BY_KIND: Mapping[str, frozenset[str]] = {
    "plan": frozenset(REASONS),
    "dispatch": frozenset({"not_an_owner", "helper_finishes_sooner", "no_live_lease", "helper_claimed",
                           "helper_unreachable", "forward_failed", "structure", "backend_refused"}),
    "helper": frozenset({"helper_busy_on_arrival", "own_work_arrived"}),
    "queue": frozenset({"swap_avoided"}),
    "replica_choice": frozenset(REPLICA_REASONS),
}
#: Triggers each kind may record ('' allowed except on plan rows).  ``grant`` marks a lease
#: that arrived by the master's push.
TRIGGERS_BY_KIND: Mapping[str, frozenset[str]] = {
    "plan": frozenset(TRIGGERS),
    "dispatch": frozenset({"", "grant", *TRIGGERS}),
    "helper": frozenset({""}),
    "queue": frozenset({""}),
    "replica_choice": frozenset({""}),
}
SERVICE_SOURCES: frozenset[str] = frozenset({"", "helper", "owner_fallback"})

#: Every outcome and reason of any kind (for validating API filters).
ALL_OUTCOMES: frozenset[str] = frozenset().union(*OUTCOMES_BY_KIND.values())
ALL_REASONS: frozenset[str] = frozenset().union(*REASONS_BY_KIND.values())

#: Columns ``record`` stamps itself; callers never pass them.
_STAMPED = frozenset({"recorded_at", "node_id", "router_version", "kind", "outcome"})
_TEXT_FIELDS = frozenset(TEXT_COLUMNS) - _STAMPED
_NUMBER_FIELDS = frozenset(INT_COLUMNS + REAL_COLUMNS) - _STAMPED


#: One buffered row's insert values (``routerd.store.decisions.COLUMNS`` order).
Values = tuple[object, ...]
#: An observer of recorded rows: ``observer(row, count)`` for ``count`` rows alike in kind,
#: outcome, lane and reason (the fields metrics count by); ``row`` has at least those.
Observer = Callable[[Mapping[str, Any], int], None]


class DecisionStore(Protocol):
    """What the log needs of the router database (``routerd.store.store.Store``)."""

    def insert_decision_values(self, values: Iterable[Values]) -> Deferred[None]: ...

    def query_decisions(
        self, *, lane: str | None = None, outcome: str | None = None, kind: str | None = None,
        limit: int = DEFAULT_LIMIT, since_ms: int | None = None,
    ) -> Deferred[list[dict[str, Any]]]: ...

    def prune_decisions(self, before_ms: int) -> Deferred[int]: ...


def validate(kind: str, outcome: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """Check one decision against the enumerations; return its columns (``''``/0 for None).

    Raises ``ValueError`` naming the first bad value.
    """
    outcomes = OUTCOMES_BY_KIND.get(kind)
    if outcomes is None:
        raise ValueError(f"unknown decision kind {kind!r}")
    if outcome not in outcomes:
        raise ValueError(f"unknown {kind} outcome {outcome!r}")
    row: dict[str, Any] = {"kind": kind, "outcome": outcome}
    for name, value in fields.items():
        if name in _TEXT_FIELDS:
            if value is None:
                value = ""
            elif not isinstance(value, str):
                raise ValueError(f"decision field {name} must be a string, got {value!r}")
        elif name in _NUMBER_FIELDS:
            if value is None:
                value = 0
            elif isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"decision field {name} must be a number, got {value!r}")
        else:
            raise ValueError(f"unknown decision field {name!r}")
        row[name] = value
    lane = row.get("lane", "")
    if lane not in LANES:
        raise ValueError(f"decision lane must be one of {', '.join(LANES)}, got {lane!r}")
    reason = row.get("reason", "")
    if reason and reason not in REASONS_BY_KIND[kind]:
        raise ValueError(f"unknown {kind} reason {reason!r}")
    trigger = row.get("trigger", "")
    if trigger not in TRIGGERS_BY_KIND[kind]:
        raise ValueError(f"unknown {kind} trigger {trigger!r}")
    source = row.get("service_source", "")
    if source not in SERVICE_SOURCES:
        raise ValueError(f"unknown service_source {source!r}")
    return row


class DecisionLog:
    """Buffered, batched writer of one node's ``offload_decisions`` rows."""

    def __init__(self, store: DecisionStore | None, clock: IReactorTime, node_id: str,
                 router_version: str = __version__, retention_s: float = 720 * 3600.0) -> None:
        self.store = store
        self.clock = clock
        self.node_id = node_id
        self.router_version = router_version
        self.retention_s = 0.0
        self.set_retention(retention_s)
        # Single rows as their insert values; a plan's rows as one _PlanEntry.
        self._buffer: deque[Values | _PlanEntry] = deque()
        self._rows = 0
        self._dropped = 0
        self._loop: task.LoopingCall | None = None
        self._last_prune: float | None = None
        self._observers: list[Observer] = []

    def observe(self, observer: Observer) -> None:
        """Call ``observer(row, count)`` for the rows recorded from now on (metrics count them):
        once per row from ``record``, once per distinct kind/outcome/lane/reason of a plan."""
        self._observers.append(observer)

    # -- recording ----------------------------------------------------------------------------

    def record(self, kind: str, outcome: str, **fields: Any) -> None:
        """Buffer one decision (see the module docstring); raises ``ValueError`` for a value
        outside the enumerations or an unknown field."""
        row = validate(kind, outcome, fields)
        row["node_id"] = self.node_id
        row["recorded_at"] = now = int(self.clock.seconds() * 1000)
        row["router_version"] = self.router_version
        self._buffer.append(row_values(row, now))
        self._rows += 1
        self._trim()
        for observer in self._observers:
            observer(row, 1)

    def record_plan_rows(self, rows: Iterable[PlanRow]) -> None:
        """Buffer the plan rows of one decision (``kind`` plan), all or none: raises
        ``ValueError`` for a value outside the enumerations or a number that is not one."""
        plan = PlanRows.of(rows)
        if not len(plan):
            return
        counts = _check_plan(plan)
        self._buffer.append(_PlanEntry(int(self.clock.seconds() * 1000), plan))
        self._rows += len(plan)
        self._trim()
        for (outcome, lane, reason), count in counts.items():
            row = {"kind": "plan", "outcome": outcome, "lane": lane, "reason": reason or ""}
            for observer in self._observers:
                observer(row, count)

    @property
    def pending(self) -> int:
        """Rows buffered and not yet handed to the store."""
        return self._rows

    def _trim(self) -> None:
        """Drop the oldest rows past ``BUFFER_CAP`` (the oldest rows of a plan first)."""
        while self._rows > BUFFER_CAP:
            oldest = self._buffer[0]
            excess = self._rows - BUFFER_CAP
            if isinstance(oldest, _PlanEntry) and oldest.remaining > excess:
                oldest.skip += excess
                gone = excess
            else:
                self._buffer.popleft()
                gone = oldest.remaining if isinstance(oldest, _PlanEntry) else 1
            self._rows -= gone
            self._dropped += gone

    # -- settings -----------------------------------------------------------------------------

    def set_retention(self, seconds: float) -> None:
        """Keep rows for ``seconds`` from now on (``offload_decisions_retention`` changed)."""
        if not seconds > 0:
            raise ValueError(f"decision retention must be positive, got {seconds!r}")
        self.retention_s = float(seconds)

    # -- writing ------------------------------------------------------------------------------

    def start(self, store: DecisionStore | None = None) -> None:
        """Flush every second (and prune at most once a minute) until ``stop``; ``store`` is the
        router database once it is open (rows recorded before wait in the buffer)."""
        if store is not None:
            self.store = store
        if self._loop is not None and self._loop.running:
            return
        self._loop = task.LoopingCall(self._tick)
        self._loop.clock = self.clock
        self._loop.start(FLUSH_INTERVAL_S, now=False).addErrback(self._loop_failed)

    def stop(self) -> Deferred[None]:
        """Stop the periodic flush and write what is buffered; never fails."""
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        return self.flush()

    def flush(self) -> Deferred[None]:
        """Write every buffered row in one ``insert_decisions`` call; fires when written (or
        when the failure has been logged).  Never fails."""
        self._report_dropped()
        if not self._buffer or self.store is None:
            return succeed(None)
        batch = list(self._buffer)
        count = self._rows
        self._buffer.clear()
        self._rows = 0
        try:
            d = self.store.insert_decision_values(self._values(batch))
        except Exception:
            d = Deferred()
            d.errback(Failure())

        def failed(failure: Failure) -> None:
            log.failure("writing {count} lending decision rows failed", failure, count=count)

        return d.addErrback(failed)

    def query(self, *, lane: str | None = None, outcome: str | None = None, kind: str | None = None,
              limit: int = DEFAULT_LIMIT, since_ms: int | None = None,
              ) -> Deferred[list[dict[str, Any]]]:
        """Flush, then the store's ``query_decisions`` (so recent rows are included)."""
        store = self.store
        if store is None:
            return succeed([])
        return self.flush().addCallback(lambda _: store.query_decisions(
            lane=lane, outcome=outcome, kind=kind, limit=limit, since_ms=since_ms))

    def prune(self) -> Deferred[int]:
        """Delete rows older than the retention now; fires the number removed (0 on failure)."""
        self._last_prune = self.clock.seconds()
        before_ms = int((self._last_prune - self.retention_s) * 1000)
        if self.store is None:
            return succeed(0)
        try:
            d = self.store.prune_decisions(before_ms)
        except Exception:
            d = Deferred()
            d.errback(Failure())

        def failed(failure: Failure) -> int:
            log.failure("pruning lending decisions before {before_ms} failed", failure, before_ms=before_ms)
            return 0

        return d.addErrback(failed)

    def _tick(self) -> Deferred[None]:
        d = self.flush()
        now = self.clock.seconds()
        if self._last_prune is None or now - self._last_prune >= PRUNE_INTERVAL_S:
            d.addCallback(lambda _: self.prune()).addCallback(lambda _: None)
        return d

    def _report_dropped(self) -> None:
        if self._dropped:
            log.warn("lending decision buffer full: dropped the {dropped} oldest rows",
                     dropped=self._dropped)
            self._dropped = 0

    def _loop_failed(self, failure: Failure) -> None:
        log.failure("lending decision flush loop stopped", failure)

    def _values(self, batch: list[Values | _PlanEntry]) -> Iterator[Values]:
        """Every buffered row's insert values, in order; a plan's rows are made into them as they
        are read (by the store thread, writing the batch)."""
        node_id, version = self.node_id, self.router_version
        for entry in batch:
            if isinstance(entry, _PlanEntry):
                rows = islice(entry.rows.flat(), entry.skip, None)
                stamp = repeat(entry.recorded_at)
                yield from map(_plan_values, stamp, repeat(node_id), repeat(version), rows)
            else:
                yield entry


class _PlanEntry:
    """One plan's rows in the buffer: stamped once, the first ``skip`` dropped (the buffer was full)."""

    __slots__ = ("recorded_at", "rows", "skip")

    def __init__(self, recorded_at: int, rows: PlanRows) -> None:
        self.recorded_at = recorded_at
        self.rows = rows
        self.skip = 0

    @property
    def remaining(self) -> int:
        return len(self.rows) - self.skip


def _plan_values(recorded_at: int, node_id: str, version: str, row: FlatRow) -> Values:
    """A plan row's insert values (``COLUMNS`` order; what ``validate`` and ``row_values`` make of
    ``PlanRow.columns()``: None is ``''``, the columns a plan row leaves out ``''`` or 0)."""
    (trigger, lane, owner_node, owner_model, helper_node, helper_model, outcome, reason, pending, backlog,
     keep, switch, restore, service, owner_job, source, idle, slots) = row
    return (recorded_at, node_id, "plan", trigger, lane, owner_node, owner_model, helper_node, helper_model,
            outcome, reason or "", "", pending, backlog, keep, switch, restore, service, owner_job,
            source or "", idle, slots, 0, 0, 0.0, version, "", "", "", 0.0, 0.0, "")


_PLAN_TRIGGERS = TRIGGERS_BY_KIND["plan"]
_PLAN_OUTCOMES = OUTCOMES_BY_KIND["plan"]
_PLAN_REASONS = REASONS_BY_KIND["plan"] | {None}
_PLAN_SOURCES = SERVICE_SOURCES | {None}
_NUMBER_TYPES = frozenset({int, float})
_STRING_TYPES = frozenset({str})


def _check_plan(plan: PlanRows) -> Counter[tuple[str, str, str | None]]:
    """Check a plan's rows as ``validate`` checks one row, each distinct value once (a plan's rows
    share their owners' and helpers' parts); the count of rows per (outcome, lane, reason)."""
    heads: list[tuple[Any, ...]] = []
    tails: list[tuple[Any, ...]] = []
    counts: Counter[tuple[str, str, str | None]] = Counter()
    for head_column, tail_column, outcomes, reasons, services, sources, slots in plan.chunks:
        chunk_heads = distinct(head_column)
        heads += chunk_heads
        tails += distinct(tail_column)
        _within(set(distinct(outcomes)), _PLAN_OUTCOMES, "plan outcome")
        _within(set(distinct(reasons)), _PLAN_REASONS, "plan reason")
        _within(set(distinct(sources)), _PLAN_SOURCES, "service_source")
        _numbers((services, slots))
        chunk_lanes = {head[1] for head in chunk_heads}
        if len(chunk_lanes) == 1 and isinstance(outcomes, Gathered) and isinstance(reasons, Gathered):
            (lane,) = chunk_lanes  # one lane's rows (a planner's chunk): count by codes
            pairs = zip(outcomes.codes(), reasons.codes(), strict=True)
            for (outcome, reason), count in Counter(pairs).items():
                counts[(outcomes.values[outcome], lane, reasons.values[reason])] += count
        else:
            counts.update(zip(outcomes, map(_LANE_OF_HEAD, head_column), reasons, strict=True))
    if heads:
        triggers, lanes, owner_nodes, owner_models, *numbers = zip(*heads, strict=True)
        _within(set(triggers), _PLAN_TRIGGERS, "plan trigger")
        _within(set(lanes), _LANES, "decision lane")
        _strings((owner_nodes, owner_models))
        _numbers(numbers)
    if tails:
        helper_nodes, helper_models, *numbers = zip(*tails, strict=True)
        _strings((helper_nodes, helper_models))
        _numbers(numbers)
    return counts


_LANES: frozenset[str | None] = frozenset(LANES)
_LANE_OF_HEAD = itemgetter(1)


def _within(values: set[Any], allowed: frozenset[Any], what: str) -> None:
    if not values <= allowed:
        raise ValueError(f"unknown {what} {sorted(map(repr, values - allowed))[0]}")


def _numbers(columns: Iterable[Sequence[object]]) -> None:
    for values in columns:
        if not set(map(type, values)) <= _NUMBER_TYPES:
            bad = next(v for v in values if type(v) not in _NUMBER_TYPES)
            raise ValueError(f"plan row numbers must be numbers, got {bad!r}")


def _strings(columns: Iterable[Sequence[object]]) -> None:
    for values in columns:
        if not set(map(type, values)) <= _STRING_TYPES:
            bad = next(v for v in values if type(v) is not str)
            raise ValueError(f"plan row ids must be strings, got {bad!r}")
