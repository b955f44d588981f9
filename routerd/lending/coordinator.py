"""The master's side of lending: plan on events and ticks, keep the lease book,
push leases, links and settings, and relay lent requests to helpers.

Plans are serialised (one at a time).  Each plan polls every node's runtime
status, runs the pure planner, replaces the whole lease book with its leases,
writes one plan row per owner/helper pair, arms the probe timer, and pushes
leases to owners other than the one whose event it answers.

The coordinator does not hold the master's lending service: it is given a :class:`LeaseSink`,
the few things it reads and calls there (the site's links, guardians, settings and decision log;
a lease for one of the master's own models; the borrowed work the master holds as helper).  What
the owners call on it in process is declared by :class:`~routerd.lending.transport.MasterSide`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import attrs
from twisted.application.service import MultiService
from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from routerd.config.lending import LendingSettings
from routerd.lending.decisions import DecisionLog
from routerd.lending.events import HeldLease
from routerd.lending.links import LinkSet
from routerd.lending.offload import Borrowed, RelayRequest, borrowed_headers
from routerd.lending.planner import FactKey, ModelFacts, plan
from routerd.lending.stall_check import HelperGone, StallCheck, ask_over_http
from routerd.paths import GRANT_PATH, INFERENCE_PREFIX, LINKS_PATH, SETTINGS_PATH
from routerd.routing.call import PUBLIC_MODEL_HEADER, Call, Incoming, Reply
from routerd.routing.forward import CameBack, Forwarder, Outbound, Unreachable, record_headers
from routerd.routing.guardians import GuardianSet
from routerd.routing.selector import replace_model
from routerd.services import IntervalService
from routerd.tracing import header_fields
from routerd.wire.lending import LANES, Endpoint, Lane, Lease, Trigger, lane_model_id, to_json
from routerd.wire.records import text_ineligibility

if TYPE_CHECKING:
    from routerd.cluster.master import MasterAgent

log = Logger()

#: Serves borrowed work on this node (the master as helper): the answer goes into the reply.
ServeBorrowed = Callable[[Reply, Incoming, Borrowed], defer.Deferred[bytes]]


class LeaseSink(Protocol):
    """What the coordinator reads and calls on the master's own lending service."""

    @property
    def settings(self) -> LendingSettings:
        """The effective lending settings (planned with, pushed to the slaves)."""

    @property
    def links(self) -> Mapping[Lane, LinkSet]:
        """Each lane's links (planned with, pushed to the slaves)."""

    @property
    def guardians(self) -> GuardianSet:
        """The guardian models (pushed with the links)."""

    @property
    def decisions(self) -> DecisionLog | None:
        """Where plan rows and refused relays are written (None: no log)."""

    def receive_lease(self, lease: Lease | None, lane: Lane, model_id: str, trigger: str) -> None:
        """A lease granted to one of the master's own models."""

    def borrowed_requests(self) -> list[dict[str, Any]]:
        """The borrowed work the master holds as helper (the stall check asks)."""


class Coordinator(MultiService):
    def __init__(self, *, node_id: str, master: MasterAgent, service: LeaseSink, clock: IReactorTime,
                 forwarder: Forwarder,
                 serve_borrowed: ServeBorrowed,
                 observe_plan: Callable[[float], None] = lambda _seconds: None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.node_id = node_id
        self.master = master
        self.service = service
        self.clock = clock
        self.forwarder = forwarder
        self.serve_borrowed = serve_borrowed
        self.observe_plan = observe_plan  # seconds one pure plan took (a metrics histogram)
        self.book: dict[tuple[Lane, str, str], HeldLease] = {}
        self._lock = defer.DeferredLock()
        self._probe: IDelayedCall | None = None
        self.tick_loop = IntervalService("lending refresh tick", self.tick,
                                         service.settings.scheduling_refresh_interval, clock)
        self.tick_loop.setServiceParent(self)  # type: ignore[no-untyped-call]
        self.stall = StallCheck(clock=clock, timeout=lambda: self.service.settings.offload_lent_stall_timeout,
                                ask=self._ask_helper, decisions=lambda: self.service.decisions)

    # -- lifecycle ---------------------------------------------------------------------------
    # The refresh tick is a child IntervalService: events plan at once, the tick is the fallback.

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self.stall.start()

    def stopService(self) -> defer.Deferred[None]:
        if self._probe is not None and self._probe.active():
            self._probe.cancel()
        self.stall.stop()
        self._probe = None
        d: defer.Deferred[None] = super().stopService()  # type: ignore[no-untyped-call]
        return d

    def start(self) -> None:
        self.startService()

    def stop(self) -> None:
        self.stopService()

    def restart_tick(self) -> None:
        """Apply a changed ``scheduling_refresh_interval``."""
        self.tick_loop.set_interval(self.service.settings.scheduling_refresh_interval)

    async def tick(self) -> None:
        """The fallback refresh (:meth:`refresh`).  A failure is logged and never stops the next
        tick."""
        try:
            await self.refresh()
        except Exception:  # noqa: BLE001 - the loop must survive any one bad cycle
            log.failure("lending refresh tick failed")

    async def refresh(self) -> None:
        """Push links and settings, then plan: every refresh tick, and at once when the site's links
        or settings change (a saved link is planned with now, not at the next tick).  Its plan rows
        carry the trigger ``tick``: the same cycle, run early."""
        await self.push()
        await self.plan("tick")

    # -- planning ------------------------------------------------------------------------------

    async def event(self, lane: Lane, owner_node_id: str, model_id: str, trigger: Trigger) -> Lease | None:
        """An owner's queue event: plan now and answer with that owner's lease (or none)."""
        return await self.plan(trigger, answer_for=(lane, owner_node_id, model_id))

    async def plan(self, trigger: Trigger, answer_for: tuple[Lane, str, str] | None = None) -> Lease | None:
        await self._lock.acquire()
        try:
            return await self._plan(trigger, answer_for)
        finally:
            self._lock.release()

    async def _plan(self, trigger: Trigger, answer_for: tuple[Lane, str, str] | None) -> Lease | None:
        statuses = await self.master.statuses()
        now = self.clock.seconds()
        began = time.perf_counter()
        result = plan(trigger, int(now * 1000), self.service.links.values(), statuses,
                      self.service.settings, self._facts())
        self.observe_plan(time.perf_counter() - began)
        self.book = {lease.key(): HeldLease(lease, now + lease.ttl_ms / 1000.0) for lease in result.leases}
        if self.service.decisions is not None:
            self.service.decisions.record_plan_rows(result.rows)
        self._arm_probe(result.next_probe_due_ms)
        answer: Lease | None = None
        for lease in result.leases:
            if lease.key() == answer_for:
                answer = lease
            else:
                self._grant(lease)
        return answer

    def _facts(self) -> dict[FactKey, ModelFacts]:
        facts: dict[FactKey, ModelFacts] = {}
        for record in self.master.registry.records():
            caps = record.capabilities
            eligible = record.available and not record.disabled
            for lane in LANES:
                model_id = lane_model_id(lane, record)
                if model_id is not None:
                    context = caps.context if lane == "text" else 0
                    # text lending eligibility is re-checked at every plan (spec "LLM lending")
                    ineligible = (text_ineligibility(record) or "") if lane == "text" else ""
                    facts[(lane, record.node_id, model_id)] = ModelFacts(
                        record.filename, context, eligible, caps.multimodal, ineligible)
        return facts

    def _arm_probe(self, due_ms: int | None) -> None:
        if self._probe is not None and self._probe.active():
            self._probe.cancel()
        self._probe = None
        if due_ms is None:
            return
        delay = max(0.0, due_ms / 1000.0 - self.clock.seconds())
        self._probe = self.clock.callLater(delay, self._probe_due)

    def _probe_due(self) -> None:
        self._probe = None
        defer.ensureDeferred(self.plan("probe_due")).addErrback(
            lambda f: log.failure("probe plan failed", failure=f))

    def _grant(self, lease: Lease) -> None:
        """Send a lease to its owner: in-process for the master's own models, else pushed."""
        if lease.owner_node_id == self.node_id:
            self.service.receive_lease(lease, lease.lane, lease.owner_model_id, "grant")
            return
        node = self.master.registry.node(lease.owner_node_id)
        if node is None:
            return
        d = self.master.client.post_json(node.node_url, GRANT_PATH, to_json(lease))
        d.addErrback(lambda f: log.warn("lease push to {node} failed: {reason}", node=lease.owner_node_id,
                                        reason=f.getErrorMessage()))

    def live_lease(self, key: tuple[Lane, str, str]) -> Lease | None:
        held = self.book.get(key)
        if held is None or held.expires_at <= self.clock.seconds():
            return None
        return held.lease

    def live_leases(self) -> list[dict[str, Any]]:
        now = self.clock.seconds()
        return [{**to_json(h.lease), "expires_in_ms": int((h.expires_at - now) * 1000)}
                for h in self.book.values() if h.expires_at > now]

    # -- pushes ----------------------------------------------------------------------------------

    def push_soon(self, node_id: str) -> None:
        """Push now without waiting (a slave just registered); a failure is logged."""
        defer.ensureDeferred(self.push()).addErrback(
            lambda f: log.failure("push to {node_id} failed", failure=f, node_id=node_id))

    async def push(self) -> None:
        """Push the links (with the guardians) and the resolved settings to every healthy slave."""
        links: dict[str, Any] = {lane: [to_json(link) for link in self.service.links[lane].links]
                                 for lane in LANES}
        links["guardians"] = self.service.guardians.to_json()  # pushed with the links (guardian models)
        settings = {"values": self.service.settings.texts(),
                    "fingerprint": self.service.settings.fingerprint()}
        sends = []
        for node in self.master.registry.nodes():
            if not node.healthy:
                continue
            sends.append(self.master.client.post_json(node.node_url, LINKS_PATH, links))
            sends.append(self.master.client.post_json(node.node_url, SETTINGS_PATH,
                                                      settings))
        for ok, value in await defer.DeferredList(sends, consumeErrors=True):
            if not ok:
                log.warn("lending push failed: {reason}", reason=value.getErrorMessage())

    # -- the relay ---------------------------------------------------------------------------------

    def _refused(self, relay: RelayRequest, reason: str, lease: Lease | None = None) -> None:
        if self.service.decisions is None:
            return
        fields: dict[str, Any] = {"lane": relay.lane, "owner_node_id": relay.owner_node_id,
                                  "owner_model_id": relay.owner_model_id, "reason": reason}
        if lease is not None:
            fields.update(helper_node_id=lease.helper_node_id, helper_model_id=lease.helper_model_id)
        self.service.decisions.record("dispatch", "relay_refused", **fields)

    async def relay(self, reply: Reply, relay: RelayRequest, call: Call, *,
                    rewrite_to: str | None, returns_raise: bool,
                    answering: Callable[[], None] | None = None) -> bytes:
        """Send a lent request to the helper its live lease names.

        ``reply`` receives the helper's answer: the owner's client when the master
        itself owns the request (then ``rewrite_to`` is the public ID and a 409 raises
        ``CameBack``), or the owner's relay call (answer passed on unchanged).
        """
        live = {key: held.lease for key, held in self.book.items() if held.expires_at > self.clock.seconds()}
        lease = relay_lease(relay, live, self.service.links[relay.lane])
        if isinstance(lease, str):
            self._refused(relay, lease)
            raise CameBack(lease.replace("_", " "))
        body = replace_model(call.route, call.body, call.content_type, lease.helper_model_id)
        borrowed = Borrowed(load_allowed=lease.load_helper_model, restore=lease.restore_helper_model,
                            owner_node_id=relay.owner_node_id, owner_model_id=relay.owner_model_id)
        lent_to = f"{lease.helper_node_id}/{lease.helper_model_id}".encode()
        out_to = self.stall.lent(call.request_id, relay, lease)
        if lease.helper_node_id == self.node_id:
            reply.set_header(b"x-routerd-lent-to", lent_to)
            incoming = Incoming(path=relay.path, body=body, content_type=call.content_type,
                                query=call.query, key_name=call.key_name,
                                headers={"x-routerd-request-id": call.request_id,
                                         PUBLIC_MODEL_HEADER: call.public_model, **header_fields(call.trace)})
            return await self.stall.send(out_to, _awaited(self.serve_borrowed(reply, incoming, borrowed)))
        helper = self.master.registry.node(lease.helper_node_id)
        if helper is None or not helper.node_url:
            self.stall.tracker.over(self.clock.seconds(), out_to)
            self._refused(relay, "helper_unreachable", lease)
            raise CameBack("helper unreachable")
        out = Outbound(url=helper.node_url.rstrip("/") + INFERENCE_PREFIX + relay.path, body=body,
                       content_type=call.content_type, request_id=call.request_id,
                       headers=(*borrowed_headers(borrowed), *record_headers(call)),
                       rewrite_to=rewrite_to, returns_raise=returns_raise, on_answer=answering,
                       trace=call.trace)
        reply.set_header(b"x-routerd-lent-to", lent_to)
        try:
            _code, result = await self.stall.send(out_to, self.forwarder.send(reply, out))
        except Unreachable:
            self._refused(relay, "forward_failed", lease)
            raise CameBack("forward failed") from None
        return result

    # -- the stall check -----------------------------------------------------------------------------

    async def _ask_helper(self, helper_node_id: str) -> list[str] | None:
        """Which borrowed requests ``helper_node_id`` holds (stall check; the master answers itself)."""
        if helper_node_id == self.node_id:
            return [b["request_id"] for b in self.service.borrowed_requests()]
        helper = self.master.registry.node(helper_node_id)
        if helper is None or not helper.node_url:
            raise HelperGone(f"{helper_node_id} is not a known node")
        return await ask_over_http(self.master.client.get_json, helper.node_url)


def relay_lease(relay: RelayRequest, live: Mapping[tuple[Lane, str, str], Lease],
                links: LinkSet) -> Lease | str:
    """The lease to relay ``relay`` under, or why it is refused (spec "Who decides").

    An owner lends only under a lease it times on its own clock, and names that lease's helper: that
    lease and the helper's claim decide.  The request goes to the named helper, with the flags of
    the owner's link to it, even when the master's own record of the lease has expired or a newer
    plan chose another helper for this owner (the owner's ``lent`` row, held list and
    ``X-Routerd-Lent-To`` then name the helper that serves it); it is refused ``helper_claimed`` when
    a newer plan gave that helper node to another owner in this lane (a helper node serves one owner
    per lane).  A relay naming no helper (an owner of an older build) or one the owner no longer
    links to goes under the master's live lease, or is refused ``no_live_lease``."""
    key = (relay.lane, relay.owner_node_id, relay.owner_model_id)
    own = live.get(key)
    link = links.link(Endpoint(relay.owner_node_id, relay.owner_model_id),
                      Endpoint(relay.helper_node_id, relay.helper_model_id)) if relay.helper_node_id else None
    if link is None:
        return own if own is not None else "no_live_lease"
    if any(other.helper_node_id == relay.helper_node_id and other_key != key
           for other_key, other in live.items() if other.lane == relay.lane):
        return "helper_claimed"
    base = own if own is not None else Lease(
        lane=relay.lane, owner_node_id=relay.owner_node_id, owner_model_id=relay.owner_model_id,
        helper_node_id=relay.helper_node_id, helper_model_id=relay.helper_model_id,
        load_helper_model=link.load_if_unloaded, restore_helper_model=link.restore_after_borrow,
        helper_slots=1, probe=False, ttl_ms=0)
    return attrs.evolve(base, helper_node_id=relay.helper_node_id, helper_model_id=relay.helper_model_id,
                        load_helper_model=link.load_if_unloaded,
                        restore_helper_model=link.restore_after_borrow)


async def _awaited(d: defer.Deferred[bytes]) -> bytes:
    return await d
