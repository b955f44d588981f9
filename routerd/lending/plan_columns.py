"""The numbers one lane's lease plan works on: owners, pairs and helpers read once into columns.

Python reads each owner and each helper once (lookups and attributes: :func:`weigh_owners`,
:func:`weigh_helpers`) into rows of numbers, one column per figure (the ``O_*`` and ``S_*``
positions); :func:`lay_out` lists every pair of the planned owners in planning order as index
arrays.  The rules that judge them are :mod:`routerd.lending.plan_lane`'s.  A skip reason, an
outcome and a service source travel as small integer codes while a plan works on arrays; their
names are in ``REASON_NAMES``, ``OUTCOME_NAMES`` and ``SOURCE_NAMES``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from operator import itemgetter
from typing import TypeVar

import attrs
import numpy as np
import numpy.typing as npt

from routerd.lending.links import PairIndex
from routerd.lending.plan_inputs import UNLOADED_PROBE_FACTOR, FactKey, ModelFacts, NodeView
from routerd.lending.pricing import predict, predict_queue
from routerd.wire.lending import LANE_SECTION, Lane, Link, Outcome, Reason, ServiceSource, Trigger
from routerd.wire.plan_rows import Chunk, Head, Tail
from routerd.wire.status import RuntimeStatus

Floats = npt.NDArray[np.float64]
Flags = npt.NDArray[np.bool_]
Ints = npt.NDArray[np.intp]
Codes = npt.NDArray[np.int64]

# Skip reasons as small codes while a plan works on arrays (0: none); names in REASON_NAMES.
(
    NO_REASON, MODEL_INELIGIBLE, NOT_ACCEPTING, CLAIMED, LOAD_FORBIDDEN, CONTEXT_TOO_SMALL, BUSY,
    OWNER_UNPRICED, SWITCH_UNPRICED, RESTORE_UNPRICED, COST_REJECTED, OUTRANKED, HELPER_UNAVAILABLE,
) = range(13)  # fmt: skip
REASON_NAMES: tuple[Reason | None, ...] = (
    None, "model_ineligible", "helper_not_accepting", "helper_claimed", "load_forbidden",
    "context_too_small", "helper_recently_busy", "owner_unpriced", "switch_unpriced", "restore_unpriced",
    "cost_rejected", "outranked", "helper_unavailable",
)  # fmt: skip
# Outcomes as codes.
OUTCOME_NAMES: tuple[Outcome, ...] = ("skipped", "granted", "probe")
GRANTED, PROBE = 1, 2
# Service sources as codes: none, the helper's own fit, the owner's job time.
SOURCE_NAMES: tuple[ServiceSource | None, ...] = (None, "helper", "owner_fallback")

# Columns of an owner's numbers: -backlog work, -backlog count (the planning order), keep, owner
# job (0 when unpriced), both priced, job priced, number of work terms, mean work of the first term,
# ineligible; in the text lane also the mean work of the second term, multimodal, mean context and
# whether the context gates.
O_WORK, O_COUNT, O_KEEP, O_JOB, O_PRICED, O_JOB_OK, O_WIDTH, O_W0, O_INELIGIBLE, O_W1, \
    O_MULTIMODAL, O_CONTEXT, O_CONTEXT_GATE = range(13)
# Columns of a helper's numbers: weighable (node reachable, model available), ineligible, loaded,
# switch and restore ms (0 when unpriced), switch/restore unpriced, number of slopes (-1: no fit),
# uniform fit, base, first slope; in the text lane also the second slope, the context window and
# multimodal.
S_LIVE, S_INELIGIBLE, S_LOADED, S_SWITCH, S_RESTORE, S_UNPRICED, S_SLOPES, S_UNIFORM, S_BASE, \
    S_SLOPE0, S_SLOPE1, S_CONTEXT, S_MULTIMODAL = range(13)
_DEAD_SIDE = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
_DEAD_SIDE_IMAGE = _DEAD_SIDE[:S_SLOPE1]

T = TypeVar("T")


def take(values: Sequence[T], at: list[int]) -> Sequence[T]:
    """``[values[i] for i in at]`` without a Python loop."""
    if len(at) > 1:
        return itemgetter(*at)(values)  # type: ignore[no-any-return]
    return [values[i] for i in at]


class Views:
    """Each node's :class:`NodeView` for one lane's plan, built the first time it is asked for
    (None: the node is unreachable)."""

    __slots__ = ("statuses", "lane", "section", "built")

    def __init__(self, statuses: Mapping[str, RuntimeStatus], lane: Lane) -> None:
        self.statuses = statuses
        self.lane = lane
        self.section = LANE_SECTION[lane]
        self.built: dict[str, NodeView | None] = {}

    def __call__(self, node_id: str) -> NodeView | None:
        try:
            return self.built[node_id]
        except KeyError:
            status = self.statuses.get(node_id)
            view = self.built[node_id] = None if status is None else NodeView(status, self.lane, self.section)
            return view


@attrs.define
class Owners:
    """The owners a lane's plan weighs (reachable, model available, work waiting), in index order."""

    #: Positions in ``PairIndex.owners``.
    positions: list[int]
    #: One row per owner, the ``O_*`` columns.
    numbers: Floats
    #: The owner's part of its rows.
    heads: list[Head]

    def job(self, owner: int) -> float | None:
        """The owner's job time (None when unpriced)."""
        numbers = self.numbers[owner]
        return float(numbers[O_JOB]) if numbers[O_JOB_OK] else None


class _NodeReader:
    """A side's node view and model facts, the view asked once per node (keys come node by node)."""

    __slots__ = ("_views", "_facts", "_node", "_view")

    def __init__(self, views: Views, facts: Mapping[FactKey, ModelFacts]) -> None:
        self._views = views
        self._facts = facts
        self._node = ""
        self._view: NodeView | None = None

    def read(self, key: FactKey) -> tuple[NodeView, ModelFacts] | None:
        """The view of ``key``'s node and its model's facts; None when the node is unreachable or the
        model disabled or gone."""
        node_id = key[1]
        if node_id != self._node:
            self._node = node_id
            self._view = self._views(node_id)
        model_facts = self._facts.get(key)
        if self._view is None or model_facts is None or not model_facts.eligible:
            return None
        return self._view, model_facts


def weigh_owners(
    lane: Lane, trigger: Trigger, index: PairIndex, facts: Mapping[FactKey, ModelFacts],
    only_owners: Collection[FactKey] | None, views: Views,
) -> tuple[Owners | None, Chunk | None]:
    """Read every owner once (keep and owner job priced here).  The owners with work (None when
    none has), and the rows of the pairs of an unreachable or unavailable owner, skipped as
    ``owner_unavailable`` (None when there are none)."""
    text = lane == "text"
    gone: list[tuple[Head, Link]] = []
    positions: list[int] = []
    numbers: list[tuple[float, ...]] = []
    heads: list[Head] = []
    reader = _NodeReader(views, facts)  # owners come node by node
    for position, (_owner, key, links) in enumerate(index.owners):
        if only_owners is not None and key not in only_owners:
            continue
        _lane, node_id, model_id = key
        live = reader.read(key)
        if live is None:
            # unreachable, or its model disabled or gone: every pair of it says so
            head: Head = (trigger, lane, node_id, model_id, 0, 0, 0.0, 0.0)
            gone.extend((head, link) for link in links)
            continue
        view, owner_facts = live
        stat = view.queue.get(model_id)
        if stat is None or stat.pending_count <= 0:
            continue
        count = stat.pending_count
        backlog = stat.backlog_count
        pending_work = stat.pending_work
        width = len(pending_work)
        fit = view.fits.get(model_id)
        keep: float | None
        owner_job: float | None
        if (
            width == 1 and not text and fit is not None and fit.uniform_work is None
            and len(fit.slopes_ms) == 1 and backlog > 0 and len(stat.backlog_work) == 1
        ):  # fmt: skip
            # predict_queue and predict for the common one-term linear fit, inline
            w0 = pending_work[0] / count
            w1 = 0.0
            base, slope = fit.base_ms, fit.slopes_ms[0]
            owner_job = base + slope * w0 if w0 > 0 else base
            backlog_work = stat.backlog_work[0]
            keep = backlog * base + slope * backlog_work if backlog_work > 0 else backlog * base
            work = -backlog_work
        else:
            work = -sum(stat.backlog_work)
            mean_work = [w / count for w in pending_work]
            w0 = mean_work[0] if width >= 1 else 0.0
            w1 = mean_work[1] if width >= 2 else 0.0
            keep = predict_queue(fit, backlog, stat.backlog_work)
            owner_job = predict(fit, mean_work)
            if text and not any(w > 0 for w in pending_work):
                keep = owner_job = None  # no token profile: the queue has no size to price
        keep_ms = keep or 0.0
        owner_job_ms = owner_job or 0.0
        row: tuple[float, ...] = (
            work, -backlog, keep_ms, owner_job_ms,
            keep is not None and owner_job is not None, owner_job is not None, width, w0,
            owner_facts.ineligible != "",
        )  # fmt: skip
        if text:
            mean_context = stat.pending_context / count
            row += (w1, owner_facts.multimodal, mean_context, mean_context > 0)
        positions.append(position)
        numbers.append(row)
        heads.append((trigger, lane, node_id, model_id, count, backlog, keep_ms, owner_job_ms))
    unweighed: Chunk | None = None
    if gone:
        many = len(gone)
        unweighed = (
            [head for head, _link in gone], [_no_prices(link) for _head, link in gone], ["skipped"] * many,
            ["owner_unavailable"] * many, [0.0] * many, [None] * many, [0] * many,
        )  # fmt: skip
    if not positions:
        return None, unweighed
    return Owners(positions, np.array(numbers, dtype=np.float64), heads), unweighed


@attrs.define
class Pairs:
    """Every pair of the planned owners: owners in planning order, each one's links in listing
    order.  Per pair: its position in ``PairIndex.links``, its owner (in :class:`Owners`), that
    owner's rank in planning order, its helper's position in ``PairIndex.helpers`` and node."""

    at: Ints
    owner: Ints
    rank: Ints
    helper: Ints
    node: Ints
    owners: int

    @property
    def count(self) -> int:
        return len(self.at)


def lay_out(index: PairIndex, owners: Owners) -> Pairs:
    """Biggest backlog first (work, then count), then node id and model id (index order)."""
    by_count = np.argsort(owners.numbers[:, O_COUNT], kind="stable")
    order = by_count[np.argsort(owners.numbers[by_count, O_WORK], kind="stable")]
    planned = np.array(owners.positions, dtype=np.intp)[order]
    first = index.owner_first[planned]
    lengths = index.owner_first[planned + 1] - first
    count = int(lengths.sum())
    at = np.repeat(first - (np.cumsum(lengths) - lengths), lengths) + np.arange(count)
    helper = index.pair_helper[at]
    return Pairs(at, np.repeat(order, lengths), np.repeat(np.arange(len(order)), lengths), helper,
                  index.helper_node[helper], len(order))


@attrs.define
class Helpers:
    """The helpers the planned owners reach, each weighed once (what does not depend on the owner).

    ``slot`` maps a position in ``PairIndex.helpers`` to a reached helper.  Per reached helper: its
    ``S_*`` numbers (one column per number), the helper's part of its rows, and figures from them
    and its node: idle ms, switch + restore, its own gate, recently busy, probe-ready, when it will
    be."""

    slot: Ints
    numbers: Floats
    tails: list[Tail]
    idle: Floats
    total: Floats
    gate: Codes
    busy: Flags
    ready: Flags
    due_at: Floats


def weigh_helpers(
    lane: Lane, index: PairIndex, reached: Ints, facts: Mapping[FactKey, ModelFacts], views: Views,
    probe_idle_ms: float, now_ms: int,
) -> Helpers:
    text = lane == "text"
    mask = np.zeros(len(index.helpers), dtype=np.bool_)
    mask[reached] = True
    needed = np.flatnonzero(mask)
    slot = np.empty(len(index.helpers), dtype=np.intp)
    slot[needed] = np.arange(len(needed))
    at = needed.tolist()
    numbers: list[tuple[float, ...]] = []
    tails: list[Tail] = []
    reader = _NodeReader(views, facts)  # helpers come node by node
    for key in take(index.helper_keys, at):
        _lane, node_id, model_id = key
        live = reader.read(key)
        if live is None:
            # its node unreachable, or its model disabled or gone
            numbers.append(_DEAD_SIDE if text else _DEAD_SIDE_IMAGE)
            tails.append((node_id, model_id, 0.0, 0.0, 0))
            continue
        view, helper_facts = live
        config = helper_facts.config_filename
        switch: float | None
        restore: float | None
        if config and view.active == config:
            loaded = True
            switch = restore = 0.0
        else:
            loaded = False
            switch = view.loads.get(config)
            restore = view.restore(config) if config in view.displaceable else view.restore_all
        unpriced = NO_REASON
        if switch is None:
            unpriced = SWITCH_UNPRICED
        elif restore is None:
            unpriced = RESTORE_UNPRICED
        fit = view.fits.get(model_id)
        slopes_n, uniform, base, s0, s1 = -1, False, 0.0, 0.0, 0.0
        if fit is not None:
            slopes = fit.slopes_ms
            slopes_n, uniform = len(slopes), fit.uniform_work is not None
            if not uniform:
                base = fit.base_ms
                s0 = slopes[0] if slopes_n >= 1 else 0.0
                s1 = slopes[1] if slopes_n >= 2 else 0.0
        row: tuple[float, ...] = (
            1.0, helper_facts.ineligible != "", loaded, switch or 0.0, restore or 0.0, unpriced, slopes_n,
            uniform, base, s0,
        )  # fmt: skip
        if text:
            row += (s1, helper_facts.context, helper_facts.multimodal)
        numbers.append(row)
        tails.append((node_id, model_id, switch or 0.0, restore or 0.0, view.idle_ms))

    sides = np.array(numbers, dtype=np.float64).T
    node_views = [views.built.get(node_id) for node_id in index.nodes]
    node_of = index.helper_node[needed]
    idle = np.array([0 if v is None else v.idle_ms for v in node_views], dtype=np.float64)[node_of]
    accepting = np.array([v is not None and v.accepting for v in node_views], dtype=np.bool_)[node_of]
    loaded_s = sides[S_LOADED] > 0
    priced = sides[S_UNPRICED] == NO_REASON
    total = sides[S_SWITCH] + sides[S_RESTORE]  # switch + restore, when both are priced
    bar = np.where(loaded_s, probe_idle_ms, UNLOADED_PROBE_FACTOR * probe_idle_ms)
    return Helpers(
        slot=slot,
        numbers=sides,
        tails=tails,
        idle=idle,
        total=total,
        gate=np.where(
            sides[S_INELIGIBLE] > 0, MODEL_INELIGIBLE, np.where(accepting, NO_REASON, NOT_ACCEPTING)
        ),
        # unloaded and busy with its own work more recently than the switch and the way back take
        busy=~loaded_s & priced & (idle < total),
        ready=idle >= bar,
        due_at=(now_ms + bar) - idle,
    )


def _no_prices(link: Link) -> Tail:
    """The helper's part of the row of a pair the master cannot weigh."""
    helper = link.helper
    return (helper.node_id, helper.model_id, 0.0, 0.0, 0)
