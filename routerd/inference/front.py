"""The inference front: one client request from its arrival to its end.

It builds the :class:`~routerd.routing.call.Call`, asks :func:`routerd.routing.choice.choose` once
for the target that serves it (standalone nodes and slaves resolve the selector in their own
catalog; a master resolves the public ID in the merged registry and picks a replica), hands the
target to :class:`~routerd.inference.serving.TargetRunner` (which reserves and releases the
replica), and ends it through :mod:`routerd.inference.ending` (the one answer to a failure, the
bookkeeping).  Selector-less transcriptions on a master fetch the nodes' runtime statuses first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from twisted.internet.defer import Deferred, ensureDeferred, fail
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from routerd.catalog.catalog import Catalog
from routerd.cluster.master import MasterAgent
from routerd.errors import HTTPError
from routerd.inference.analytics import AnalyticsRecorder
from routerd.inference.ending import Books, Handling, Outcome, answer_outcome
from routerd.inference.local import LocalInference
from routerd.inference.memory import Trimmer
from routerd.inference.recipes import RecipeRouter
from routerd.inference.serving import TargetRunner
from routerd.inference.timing import FirstWrite
from routerd.inference.traces import end_request_span, request_span, traced_choice
from routerd.lending.offload import Borrowed
from routerd.lending.service import LendingService
from routerd.metrics import NodeMetrics
from routerd.routing.call import (
    AS_GUARDIAN_HEADER,
    PUBLIC_MODEL_HEADER,
    SESSION_HEADER,
    Call,
    Incoming,
    Reply,
    new_request_id,
    request_class,
    sent_public_model,
)
from routerd.routing.choice import RoutingView, Steer, needs_statuses
from routerd.routing.classify import Route, wants_stream
from routerd.routing.forward import Forwarder
from routerd.routing.guardians import GuardianSet
from routerd.routing.key_limits import KeyLimiter
from routerd.routing.multipart import MAX_PARTS, MultipartError, TooManyParts
from routerd.routing.native_bodies import refuse_malformed
from routerd.routing.selector import SelectorError, parse_json_object, select_model
from routerd.routing.server_state import refuse_server_state
from routerd.tracing import NO_SPAN, NO_TRACER, Tracer

log = Logger()

_NO_QUERY: Mapping[str, list[str]] = MappingProxyType({})  # the usual query, shared by every call


def _named_by_sender(call: Call, incoming: Incoming, borrowed: Borrowed | None) -> None:
    """What the master (or a lending relay) said of a cluster call, for its analytics row: the
    public ID the client asked for, a guardian answering in its place, the owner of borrowed work."""
    call.public_model = sent_public_model(incoming.header(PUBLIC_MODEL_HEADER))
    if incoming.header(AS_GUARDIAN_HEADER) == "1":
        call.guardian = True
    if borrowed is not None:
        call.lent_from = f"{borrowed.owner_node_id}/{borrowed.owner_model_id}"


def _named_by_route(call: Call, label: str) -> None:
    """The record a request was routed to names it in analytics, unless its sender already did."""
    if label != "-" and not call.public_model:
        call.public_model = label


class InferenceFront:
    def __init__(self, *, node_id: str, clock: IReactorTime, catalog: Callable[[], Catalog],
                 local: LocalInference, metrics: NodeMetrics, master: MasterAgent | None = None,
                 forwarder: Forwarder | None = None, loaded_config: Callable[[Any], str | None],
                 lending: LendingService | None = None, recipes: RecipeRouter | None = None,
                 limiter: KeyLimiter | None = None, analytics: AnalyticsRecorder | None = None,
                 max_form_parts: Callable[[], int] = lambda: MAX_PARTS, steer: Steer | None = None,
                 tracer: Tracer = NO_TRACER) -> None:
        self.tracer = tracer
        self.node_id = node_id
        self._node_header = node_id.encode()  # one copy, not one per request (held requests keep it)
        self.clock = clock
        self.local = local
        self.metrics = metrics
        self.master = master
        #: ``limits.max_form_parts``: a form with more parts is refused (413) before they are read.
        self.max_form_parts = max_form_parts
        #: Per-key limits, counted for the requests clients send this node (not forwarded ones).
        self.limiter = limiter if limiter is not None else KeyLimiter(lambda _name: None)
        self.books = Books(node_id=node_id, clock=clock, metrics=metrics, limiter=self.limiter,
                           analytics=analytics)
        registry = master.registry if master is not None else None
        self.runner = TargetRunner(node_id=node_id, local=local, lending=lending, forwarder=forwarder,
                                   registry=registry, loaded_config=loaded_config)
        self._embeddings_turn = 0  # round-robin start of selector-less embeddings

        def guardians() -> GuardianSet | None:
            return lending.guardians if lending is not None else None

        #: What the choice reads: this node's own catalog (its cluster calls, or every request of
        #: a standalone node or slave) and, on a master, its clients' requests routed on the site.
        self.own_view = RoutingView(node_id=node_id, catalog=catalog, loaded_config=loaded_config,
                                    guardians=guardians, registry=registry, recipes=recipes)
        self.site_view = self.own_view if master is None else RoutingView(
            node_id=node_id, catalog=catalog, loaded_config=loaded_config, guardians=guardians,
            registry=registry, routes=True, recipes=recipes, embeddings_turn=self._next_embeddings_turn,
            stt_counter=master.stt_counter, steer=steer)
        #: Requests inside :meth:`handle` (a drain waits for this to reach 0).
        self.active_calls = 0
        self.trimmer = Trimmer(clock)  # memory back to the system after a crowd of requests

    def _next_embeddings_turn(self) -> int:
        turn, self._embeddings_turn = self._embeddings_turn, self._embeddings_turn + 1
        return turn

    async def drain(self, timeout: float) -> None:
        """New requests are refused by the node's phase; requests held in a router queue or still
        waiting for a backend slot are answered at once here (own ones 503 ``draining`` with
        Retry-After, borrowed ones 409 ``offload_returned``: their owner runs them), and running and
        lent ones (and running video jobs) go on for up to ``timeout`` seconds."""
        from twisted.internet import task

        held = self.runner.lending
        if held is not None:
            held.drain()
        refused = self.local.drain()
        log.info("draining: {active} requests in flight, {refused} waiting requests refused",
                 active=self.active_calls, refused=refused)
        deadline = self.clock.seconds() + timeout
        while self.active_calls + self.local.jobs_running > 0 and self.clock.seconds() < deadline:
            await task.deferLater(self.clock, min(0.05, max(0.0, deadline - self.clock.seconds())),
                                  lambda: None)
        if self.active_calls:
            log.warn("drain timeout ({timeout} s): {active} requests still in flight are cut off",
                     timeout=timeout, active=self.active_calls)

    def handle(self, incoming: Incoming, reply: Reply, route: Route, *,
               cluster_call: bool = False, borrowed: Borrowed | None = None) -> Deferred[bytes]:
        """Serve one request; the Deferred fires with the final bytes to write (the HTTP edge
        finishes the answer).  Cancel it when the client goes.

        Not a coroutine, so a held request stays small: the request's own part runs now, up to
        the Deferred of what serves it (a lending queue's, while it waits there); its end (the
        one answer to a failure and the bookkeeping) is a callback on that Deferred carrying its
        :class:`~routerd.inference.ending.Handling` record."""
        request_id = new_request_id()
        if cluster_call:
            given = incoming.header("x-routerd-request-id")
            if given and len(given) <= 64 and given.isprintable():
                request_id = given
        reply.set_header(b"x-routerd-request-id", request_id.encode())
        reply.set_header(b"x-routerd-node", self._node_header)
        handling = Handling(reply, route, request_id, cluster_call,
                            self.metrics.in_flight.child(route.runtime))
        handling.in_flight.inc()
        self.active_calls += 1
        self.trimmer.entered(self.active_calls)
        handling.started = self.clock.seconds()
        tracer = self.tracer
        try:
            if tracer is not NO_TRACER:
                handling.trace = request_span(tracer, incoming, route, request_id, borrowed)
            answer = self._begin(handling, incoming, borrowed)
        except Exception:  # noqa: BLE001 - answered by the one end below
            answer = fail()
        return answer.addBoth(self._end, handling)

    def _begin(self, handling: Handling, incoming: Incoming, borrowed: Borrowed | None) -> Deferred[bytes]:
        """The request's own part: its call, its target, and what serves it (its Deferred)."""
        reply, route = handling.reply, handling.route
        call = handling.call = self._call(incoming, reply, route, handling.request_id, handling.started)
        call.trace = handling.trace
        if handling.cluster_call:
            _named_by_sender(call, incoming, borrowed)
        # The call holds what it needs of the request: the edge's header and query maps are not
        # kept alive while the request waits.
        del incoming
        if not handling.cluster_call and call.key_name:
            self.limiter.admit(call.key_name, handling.started)
            handling.limited = call.key_name
        if call.selector:
            reply.name_model(call.selector)
        if call.stream:  # time to first chunk is a stream's figure only
            call.reply = handling.timed = FirstWrite(reply, self.clock)
        call.borrowed = borrowed is not None
        call.restore_after_borrow = borrowed is not None and borrowed.restore
        view = self.own_view if handling.cluster_call else self.site_view
        if not view.routes:
            target = traced_choice(call, view)
            handling.model_label = target.label
            _named_by_route(call, target.label)
            served = self.runner.serve(call, target, borrowed)
            # a lending queue's Deferred as it is; a coroutine (straight to the backend) wrapped
            return served if isinstance(served, Deferred) else Deferred.fromCoroutine(served)
        if needs_statuses(call, view):
            return ensureDeferred(self._scheduled(handling, call, view))
        # a master labels the request with the record it routed to once that answered
        target = traced_choice(call, view)
        _named_by_route(call, target.label)
        served = ensureDeferred(self.runner.serve(call, target, None))
        return served.addCallback(handling.routed, target.label)

    async def _scheduled(self, handling: Handling, call: Call, view: RoutingView) -> bytes:
        """A selector-less transcription on a master: the nodes' runtime statuses, then the choice."""
        assert self.master is not None
        target = traced_choice(call, view, await self.master.statuses())
        _named_by_route(call, target.label)
        return handling.routed(await self.runner.serve(call, target, None), target.label)

    def _end(self, outcome: Outcome, handling: Handling) -> Outcome:
        """The request's end: the one answer to a failure, then its bookkeeping."""
        try:
            return answer_outcome(handling, outcome)
        finally:
            if handling.trace is not NO_SPAN:
                end_request_span(handling, self.clock.seconds())
            self.active_calls -= 1
            self.trimmer.left(self.active_calls)
            self.books.close(handling)

    # -- the call -----------------------------------------------------------------------------

    def _call(self, incoming: Incoming, reply: Reply, route: Route, request_id: str,
              started: float) -> Call:
        content_type = incoming.content_type
        body = incoming.body
        try:
            result = select_model(route, body, content_type, incoming.query, incoming.headers,
                                  self.max_form_parts)
            parsed = result.payload
            if route.runtime != "stt" and parsed is None:
                parsed = parse_json_object(body)
        except TooManyParts as exc:
            raise HTTPError(413, str(exc), "request_too_large", "too_many_parts") from None
        except (SelectorError, MultipartError) as exc:
            raise HTTPError(400, str(exc)) from None
        if result.model is None and route.model_required:
            raise HTTPError(400, "model is required")
        refuse_server_state(route, parsed)
        refuse_malformed(route, parsed)
        stream = wants_stream(route, parsed) if parsed is not None else False
        # a request held in a lending queue is shaped for memory there (lending.waiting)
        return Call(reply=reply, route=route, path=incoming.path, body=body, content_type=content_type,
                    parsed=parsed, stream=stream, request_id=request_id, started=started,
                    selector=result.model,
                    query=incoming.query or _NO_QUERY, priority=request_class(incoming),
                    key_name=incoming.key_name, session=incoming.header(SESSION_HEADER)[:256])
