"""The master's replica choice beyond rotation (``routing.replica_choice``).

For a request routed by public ID on a lending lane (text or image), the mode is the model's own
``router_replica_choice`` (the first replica, by ``node:local``, whose record states one this build
knows), else the site's ``routing.replica_choice``.  ``rotation`` leaves the choice to the registry
as before (:func:`routerd.registry.replicas.choose_replica`).  Otherwise the usable replicas are
priced (:func:`routerd.lending.replica_loads.replica_candidates`: loads and this request's cost in
predicted seconds) and chosen among by the pure rules of :mod:`routerd.registry.replica_choice`;
the choice is written to the decision log (a ``replica_choice`` row: mode, key hash, chosen replica,
its load, the mean load and the reason) and counted in ``/metrics`` per replica.

The nodes' runtime statuses (the queues they report and the cost fits they publish) are the
master's latest (:meth:`MasterAgent.latest_statuses`, with what it held reserved then); when they
are older than
:data:`STATUS_MAX_AGE_S` a fresh poll starts in the background, and the request is priced with what
is known (the master's own reservations are always current).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs
from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from routerd.catalog.model import RuntimeKind
from routerd.cluster.master import MasterAgent
from routerd.config.routing import RoutingConfig
from routerd.lending.decisions import DecisionLog
from routerd.lending.replica_loads import replica_candidates
from routerd.metrics import NodeMetrics
from routerd.registry.replica_choice import AffinityHistory, Choice, affinity, key_hash, least_loaded
from routerd.registry.replicas import busy_key, replica_order
from routerd.replica_modes import MODES, Mode
from routerd.routing.call import Call
from routerd.routing.session_key import session_key
from routerd.wire.records import ModelRecord
from routerd.wire.status import RuntimeStatus

__all__ = ["STATUS_MAX_AGE_S", "ReplicaSteering", "Steered", "model_mode"]

log = Logger()

#: Seconds the nodes' statuses are used before a fresh poll is started (in the background).
STATUS_MAX_AGE_S = 5.0


@attrs.frozen
class Steered:
    """The chosen replica, the request's predicted seconds there (reserved with it) and why."""

    record: ModelRecord
    seconds: float
    choice: Choice


def model_mode(records: list[ModelRecord], site: Mode) -> Mode:
    """The mode of a model: the first record (by ``node:local``) stating a mode this build knows,
    else the site's."""
    for record in sorted(records, key=replica_order):
        stated = record.replica_choice
        if stated in MODES:
            return stated
    return site


class ReplicaSteering:
    """Chooses a replica for the modes other than rotation (see the module)."""

    def __init__(self, *, master: MasterAgent, settings: Callable[[], RoutingConfig],
                 context_reserve: Callable[[], int], decisions: DecisionLog | None,
                 metrics: NodeMetrics | None, clock: IReactorTime) -> None:
        self.master = master
        self.registry = master.registry
        self.settings = settings
        self.context_reserve = context_reserve
        self.decisions = decisions
        self.metrics = metrics
        self.clock = clock
        self.history = AffinityHistory(settings().affinity_history)
        self._polling: defer.Deferred[object] | None = None

    def steer(self, call: Call, name: str, runtime: RuntimeKind) -> Steered | None:
        """The replica for ``call`` naming ``name`` on ``runtime``, or None when rotation chooses
        (the mode is ``rotation``, the route has no lane, or no replica is usable: the registry
        then answers as before)."""
        lane = call.route.lane
        if lane is None:
            return None
        settings = self.settings()
        records = self.registry.usable(name, runtime)
        if not records:
            return None
        way = model_mode(records, settings.replica_choice)
        if way == "rotation":
            return None
        statuses, then = self._statuses()
        candidates = replica_candidates(call, lane, records, statuses,
                                        lambda record: self.registry.busy_seconds(record, runtime),
                                        lambda record: then.get(busy_key(record, runtime), 0.0),
                                        self.context_reserve())
        key = session_key(call, settings.affinity_key) if way == "affinity" else None
        hashed = ""
        if key is None:
            choice = least_loaded(candidates, self.registry.take_turn(f"{runtime}:{name}"))
        else:
            hashed = key_hash(key)
            remembered = f"{name}\0{hashed}"
            if self.history.cap != settings.affinity_history:
                self.history.resize(settings.affinity_history)
            choice = affinity(hashed, candidates, self.history.get(remembered), settings.load_bound)
            self.history.put(remembered, choice.id)
        by_id = {candidate.id: (record, candidate.cost)
                 for record, candidate in zip(records, candidates, strict=True)}
        record, cost = by_id[choice.id]
        left = by_id[choice.left][0] if choice.left else None
        self._note(call, way, name, record, choice, hashed, cost, left)
        return Steered(record, cost, choice)

    def _statuses(self) -> tuple[Mapping[str, RuntimeStatus], Mapping[str, float]]:
        statuses, taken_at, reserved = self.master.latest_statuses()
        if self._polling is None and (taken_at is None
                                      or self.clock.seconds() - taken_at > STATUS_MAX_AGE_S):
            self._polling = defer.ensureDeferred(self.master.statuses())

            def done(result: object) -> None:
                self._polling = None

            self._polling.addErrback(lambda f: log.failure("status poll for replica choice failed", f))
            self._polling.addBoth(done)
        return statuses, reserved

    def _note(self, call: Call, way: Mode, name: str, record: ModelRecord, choice: Choice, hashed: str,
              cost: float, left: ModelRecord | None) -> None:
        """The choice's decision row and metrics (``left``: the replica a moved key left)."""
        lane = call.route.lane
        if self.metrics is not None:
            self.metrics.replica_choices.child(name, record.node_id, way, choice.reason).inc()
            if left is not None:
                self.metrics.replica_bound_moves.child(name, left.node_id).inc()
        if self.decisions is not None:
            self.decisions.record(
                "replica_choice", way, lane=lane, owner_model_id=name, helper_node_id=record.node_id,
                helper_model_id=record.local_id, reason=choice.reason, request_id=call.request_id,
                key_hash=hashed, load_ms=choice.load * 1000.0, mean_load_ms=choice.mean * 1000.0,
                service_ms=cost * 1000.0, moved_from=choice.left, priority=call.priority,
                key_name=call.key_name)
