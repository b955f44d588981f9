"""Which model and which node serve a client inference request.

Standalone nodes and slaves resolve the selector in their own catalog.  A
master resolves the public ID in the merged registry, picks a replica (idle
local first, then healthy remote replicas round-robin, then a busy local one),
reserves it before anything loads, and serves it locally or forwards it.
Selector-less transcriptions on a master go through STT scheduling.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from types import MappingProxyType
from typing import Any

from twisted.internet.defer import CancelledError, Deferred, ensureDeferred, fail
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from routerd.catalog.catalog import Catalog
from routerd.catalog.model import Capabilities, ModelConfig
from routerd.cluster.master import MasterAgent
from routerd.errors import HTTPError, Saturated, StatusError, error_body
from routerd.lending.offload import Borrowed, offload_returned
from routerd.lending.service import LendingService
from routerd.metrics import NodeMetrics
from routerd.registry.replicas import NoReplica, Reservation
from routerd.routing.call import Call, Incoming, Reply, new_request_id, request_class
from routerd.routing.classify import Route, wants_stream
from routerd.routing.embeddings import embeddings_candidates, rotated
from routerd.routing.forward import Forwarder
from routerd.routing.guardians import (
    BACKEND_REFUSED,
    GUARDIAN_HEADER,
    STRUCTURE,
    Guardian,
    ImageRefused,
)
from routerd.routing.images import has_image
from routerd.routing.key_limits import KeyLimiter
from routerd.routing.multipart import MultipartError
from routerd.routing.plan import NEEDS, SECTIONS
from routerd.routing.relay import StreamBroken
from routerd.routing.selector import SelectorError, parse_json_object, select_model
from routerd.routing.upstream import upstream_gone
from routerd.serve.analytics import AnalyticsRecorder, request_row
from routerd.serve.local import LocalInference
from routerd.serve.memory import Trimmer
from routerd.serve.recipes import RecipeRouter
from routerd.serve.timing import FirstWrite
from routerd.wire.records import ModelRecord

log = Logger()

#: What serves a request: a coroutine, or the Deferred of a lending queue's wait.
Served = Deferred[bytes] | Coroutine[Any, Any, bytes]
_NO_QUERY: Mapping[str, list[str]] = MappingProxyType({})  # the usual query, shared by every call


class InferenceFront:
    def __init__(self, *, node_id: str, clock: IReactorTime, catalog: Callable[[], Catalog],
                 local: LocalInference, metrics: NodeMetrics, master: MasterAgent | None = None,
                 forwarder: Forwarder | None = None, loaded_config: Callable[[Any], str | None],
                 lending: LendingService | None = None, recipes: RecipeRouter | None = None,
                 limiter: KeyLimiter | None = None, analytics: AnalyticsRecorder | None = None) -> None:
        self.node_id = node_id
        self._node_header = node_id.encode()  # one copy, not one per request (held requests keep it)
        self.analytics = analytics
        self.clock = clock
        self.catalog = catalog
        self.local = local
        self._serve_here = local.serve  # bound once: what an admitted queued request runs
        self.metrics = metrics
        self.master = master
        self.forwarder = forwarder
        self.loaded_config = loaded_config
        self.lending = lending
        self.recipes = recipes
        #: Per-key limits, counted for the requests clients send this node (not forwarded ones).
        self.limiter = limiter if limiter is not None else KeyLimiter(lambda _name: None)
        #: Requests inside :meth:`handle` (a drain waits for this to reach 0).
        self.active_calls = 0
        self.trimmer = Trimmer(clock)  # memory back to the system after a crowd of requests
        self._embeddings_turn = 0  # round-robin start of selector-less embeddings

    async def drain(self, timeout: float) -> None:
        """New requests are refused by the node's phase; requests still waiting for a backend slot
        are refused (503) here, and running and lent ones (and running video jobs) go on for up to
        ``timeout`` seconds."""
        from twisted.internet import task

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

        Not a coroutine (issue 24, held-request memory): the request's own part runs now, up to
        the Deferred of what serves it (a lending queue's, while it waits there); its end — the
        one answer to a failure and the bookkeeping — is a callback of a :class:`_Handling`
        record on that Deferred.  A held request keeps that record, not a suspended frame and the
        coroutine driver's objects."""
        request_id = new_request_id()
        if cluster_call:
            given = incoming.header("x-routerd-request-id")
            if given and len(given) <= 64 and given.isprintable():
                request_id = given
        reply.set_header(b"x-routerd-request-id", request_id.encode())
        reply.set_header(b"x-routerd-node", self._node_header)
        metrics = self.metrics
        handling = _Handling(self, reply, route, request_id, cluster_call,
                             metrics.child(metrics.in_flight, route.runtime))
        handling.in_flight.inc()
        self.active_calls += 1
        self.trimmer.entered(self.active_calls)
        handling.started = self.clock.seconds()
        try:
            answer = self._begin(handling, incoming, borrowed)
        except Exception:  # noqa: BLE001 - answered by the one end below
            answer = fail()
        return answer.addBoth(handling)

    def _begin(self, handling: _Handling, incoming: Incoming, borrowed: Borrowed | None) -> Deferred[bytes]:
        """The request's own part, up to what serves it (its Deferred)."""
        reply, route = handling.reply, handling.route
        call = handling.call = self._call(incoming, reply, route, handling.request_id, handling.started)
        # The call holds what it needs of the request: the edge's header and query maps are not
        # kept alive while the request waits (issue 14, held requests).
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
        if self.master is not None and not handling.cluster_call:
            return ensureDeferred(self._routed(call)).addCallback(handling.routed)
        if borrowed is None and self._nothing_to_embed_with(call):
            return ensureDeferred(self.local.serve_unmodelled(call))
        own = None if borrowed is not None else self._own_recipe(call)
        if own is not None:
            public_id, model = own
        else:
            model = self._borrowed_model(call) if borrowed is not None else self._local_model(call)
            public_id = self._public_id(route, model)
        handling.model_label = model.local_id
        return ensureDeferred(self._serve_local(call, model, public_id, borrowed))

    def _end(self, handling: _Handling, outcome: bytes | Failure) -> bytes | Failure:
        """The request's end: the one answer to a failure, then its bookkeeping."""
        try:
            if not isinstance(outcome, Failure):
                return outcome
            exc = outcome.value
            if not isinstance(exc, Exception):
                return outcome
            reply, call, request_id = handling.reply, handling.call, handling.request_id
            if isinstance(exc, CancelledError) or reply.gone:
                # A client that leaves is a normal event: everything it held is released by the
                # cancellation (backend call aborted, slot and reservation freed).
                if call is not None:
                    call.outcome.status = "client_disconnected"
                    call.outcome.http_status = 499
                if reply.gone:
                    log.info("client disconnected before the answer to {request_id} was complete",
                             request_id=request_id)
                    return b""
                return Failure(CancelledError())
            return self._failed(reply, handling.route, call, request_id, exc)
        finally:
            self._account(handling)

    def _account(self, handling: _Handling) -> None:
        """Metrics, key limits, analytics and the in-flight count of a request that ended."""
        call, route, started = handling.call, handling.route, handling.started
        model_label, lane, timed = handling.model_label, route.runtime, handling.timed
        metrics = self.metrics
        if call is not None:
            self._count_key(call, handling.cluster_call, started)
        if handling.limited:
            assert call is not None
            self.limiter.done(handling.limited, self.clock.seconds(), _tokens(call))
        self.active_calls -= 1
        self.trimmer.left(self.active_calls)
        handling.in_flight.dec()
        status = call.outcome.status if call is not None else "bad_request"
        metrics.child(metrics.requests, model_label, lane, route.kind, status).inc()
        metrics.child(metrics.request_duration, model_label, lane).observe(self.clock.seconds() - started)
        if timed is not None and timed.first_write_at is not None and status == "ok":
            metrics.child(metrics.first_token, model_label, lane).observe(timed.first_write_at - started)
        analytics = self.analytics
        if analytics is not None and analytics.enabled:
            row = request_row(call, route, node_id=self.node_id, model_label=model_label, status=status,
                              started=started, finished=self.clock.seconds(),
                              first_write=timed.first_write_at if timed is not None else None)
            if row is not None:
                analytics.request(row)

    def _count_key(self, call: Call, cluster_call: bool, started: float) -> None:
        """/metrics per key name and class: the requests and tokens of the node the client called,
        the queue wait of the node that served it."""
        metrics, key = self.metrics, call.key_name or "-"
        if call.serving_since is not None:
            metrics.child(metrics.key_queue_wait, key, call.priority).observe(call.serving_since - started)
        if cluster_call:
            return
        metrics.child(metrics.key_requests, key, call.priority, call.outcome.status).inc()
        tokens = _tokens(call)
        if tokens:
            metrics.child(metrics.key_tokens, key, call.priority).inc(tokens)

    def _failed(self, reply: Reply, route: Route, call: Call | None, request_id: str,
                exc: Exception) -> bytes:
        """The one answer to a request that failed (the client is still there)."""
        if isinstance(exc, StatusError):
            if call is not None:
                call.outcome.status = exc.code
                call.outcome.http_status = exc.status
            return self._error(reply, route, exc)
        if isinstance(exc, StreamBroken):
            if call is not None:
                call.outcome.status = "stream_broken"
            log.warn("answer to {request_id} broke off mid-stream: {reason}", request_id=request_id,
                     reason=str(exc))
            reply.abort()
            return b""

        reason = upstream_gone(exc)
        if reason is not None:
            # An expected network event (the backend or node crashed, refused, reset): one line.
            if call is not None:
                call.outcome.status = "backend_error"
            log.warn("upstream failed while answering {request_id}: {reason}", request_id=request_id,
                     reason=reason)
            if reply.started:
                reply.abort()
                return b""
            return self._error(reply, route, HTTPError(502, f"the backend failed: {reason}",
                                                         "backend_error", "backend_error"))
        log.failure("request {request_id} failed", failure=Failure(exc), request_id=request_id)
        if call is not None:
            call.outcome.status = "internal_error"
        return self._error(reply, route, HTTPError(502, f"request failed: {exc}",
                                                     "backend_error", "backend_error"))

    def _serve_local(self, call: Call, model: ModelConfig, public_id: str,
                     borrowed: Borrowed | None) -> Served:
        """Serve on this node, or on its guardian when the request carries an image the model
        cannot read (spec "Guardian models"): a text-only model's guardian on this node answers
        at once, sharing the runtime (the text model is loaded back when the node is quiet); a
        model whose backend refuses the image hands the request to the guardian.

        Not a coroutine itself (nor is :meth:`_serve_model`): the caller awaits the serving one
        directly, so a request held in a queue keeps no frame of these two (issue 14)."""
        entry = None if borrowed is not None else self._guardian_entry(call, self.node_id, model.local_id)
        if entry is None:
            return self._serve_model(call, model, public_id, borrowed)
        return self._serve_guarded(call, model, public_id, entry)

    async def _serve_guarded(self, call: Call, model: ModelConfig, public_id: str, entry: Guardian) -> bytes:
        """:meth:`_serve_local` for a request its guardian setting applies to."""
        if _text_only(model.capabilities) and entry.guardian.node_id == self.node_id:
            answer = await self._to_guardian(call, self.node_id, model.local_id, entry, public_id, STRUCTURE)
            if answer is not None:
                return answer
            return await self._serve_model(call, model, public_id, None)
        # a guardian elsewhere is the master's to reach (a slave cannot): only the master falls back
        call.guardian_fallback = entry.guardian.node_id == self.node_id or self.master is not None
        try:
            return await self._serve_model(call, model, public_id, None)
        except ImageRefused as refused:
            return await self._refused(call, self.node_id, model.local_id, entry, public_id, refused)

    def _serve_model(self, call: Call, model: ModelConfig, public_id: str,
                     borrowed: Borrowed | None) -> Served:
        """Serve on this node: through the lane's router queue (every own request of a lane, linked
        or not, waits there in one class order: issue 23), as borrowed work, or straight to the
        backend (a route with no lane)."""
        call.model_id = model.local_id  # as its loads are keyed: one analytics row per model
        lane = call.route.lane
        lending = self.lending
        if borrowed is not None:
            if lane is None or lending is None:
                raise offload_returned("this route is never lent")
            if not borrowed.load_allowed and self.loaded_config(call.route.runtime) != model.filename:
                raise offload_returned("the linked model is not loaded and the link forbids loading it")
            return lending.serve(call, model, lane, self._serve_here, borrowed, public_id=public_id)
        if lane is not None and lending is not None:
            return lending.serve(call, model, lane, self._serve_here, None, public_id=public_id)
        return self.local.serve(call, model, public_id)

    # -- guardian models (spec "Guardian models") ------------------------------

    def _guardian_entry(self, call: Call, node_id: str, model_id: str) -> Guardian | None:
        """The guardian setting for a text request carrying an image (read from the body's
        structure) addressed to ``model_id`` on ``node_id``; None for anything else."""
        if self.lending is None or not self.lending.guardians or call.route.lane != "text":
            return None
        if not has_image(call.parsed):
            return None
        return self.lending.guardians.resolve(node_id, model_id)

    async def _to_guardian(self, call: Call, node_id: str, model_id: str, entry: Guardian,
                           public_id: str, reason: str) -> bytes | None:
        """Answer ``call`` with its guardian, under the name the client gave (``public_id``).
        None when the guardian cannot answer here (not in this catalog or the registry, not a
        multimodal text model, or on another node and this node is not the master)."""
        target = entry.guardian
        if target.node_id == self.node_id:
            model = self.catalog().get(target.model_id)
            if model is None or not _multimodal_text(model.capabilities):
                log.warn("guardian {guardian} is not a multimodal text model of this node; request"
                         " {request_id} is not redirected", guardian=entry.label, request_id=call.request_id)
                return None
            self._mark_guardian(call, node_id, model_id, entry, reason)
            call.guardian_fallback = False
            # the guardian shares this node's runtime with the model it stands in for: that
            # model is loaded back once the node is quiet (lending.restore)
            call.guardian_restore = node_id == self.node_id
            return await self._serve_model(call, model, public_id, None)
        if self.master is None or self.forwarder is None:
            return None
        registry = self.master.registry
        record = registry.find(target.node_id, local_id=target.model_id)
        if record is None or record.disabled or not record.available \
                or not _multimodal_text(record.capabilities):
            log.warn("guardian {guardian} is not an available multimodal text model; request"
                     " {request_id} is not redirected", guardian=entry.label, request_id=call.request_id)
            return None
        self._mark_guardian(call, node_id, model_id, entry, reason)
        reservation = registry.reserve(record, call.route.runtime)
        try:
            call.forwarded_to = record.node_id
            return await self.forwarder.forward(call, record, public_id)
        finally:
            reservation.release()

    async def _refused(self, call: Call, node_id: str, model_id: str, entry: Guardian, public_id: str,
                       refused: ImageRefused) -> bytes:
        """A backend refused the image: the guardian answers, or the refusal is answered."""
        answer = await self._to_guardian(call, node_id, model_id, entry, public_id, BACKEND_REFUSED)
        if answer is not None:
            return answer
        kind = "invalid_request_error" if refused.status == 400 else "server_error"
        raise HTTPError(refused.status, refused.message, kind, "image_not_supported")

    def _mark_guardian(self, call: Call, node_id: str, model_id: str, entry: Guardian,
                       reason: str) -> None:
        call.reply.set_header(GUARDIAN_HEADER, entry.label.encode())
        call.guardian = True
        log.info("request {request_id} for {node}/{model} goes to guardian {guardian} ({reason})",
                 request_id=call.request_id, node=node_id, model=model_id, guardian=entry.label,
                 reason=reason)
        decisions = self.lending.decisions if self.lending is not None else None
        if decisions is not None:
            decisions.record("dispatch", "guardian", lane="text", owner_node_id=node_id,
                             owner_model_id=model_id, helper_node_id=entry.guardian.node_id,
                             helper_model_id=entry.guardian.model_id, reason=reason,
                             request_id=call.request_id)

    # -- selection ------------------------------------------------------------

    def _call(self, incoming: Incoming, reply: Reply, route: Route, request_id: str,
              started: float) -> Call:
        content_type = incoming.content_type
        body = incoming.body
        try:
            result = select_model(route, body, content_type, incoming.query, incoming.headers)
            parsed = result.payload
            if route.runtime != "stt" and parsed is None:
                parsed = parse_json_object(body)
        except (SelectorError, MultipartError) as exc:
            raise HTTPError(400, str(exc)) from None
        if result.model is None and route.model_required:
            raise HTTPError(400, "model is required")
        stream = wants_stream(route, parsed) if parsed is not None else False
        # a request held in a lending queue is shaped for memory there (lending.waiting)
        return Call(reply=reply, route=route, path=incoming.path, body=body, content_type=content_type,
                    parsed=parsed, stream=stream, request_id=request_id, started=started,
                    selector=result.model,
                    query=incoming.query or _NO_QUERY, priority=request_class(incoming),
                    key_name=incoming.key_name)

    def _borrowed_model(self, call: Call) -> ModelConfig:
        """The model a borrowed request names, in this node's own catalog only.

        A helper that no longer has it (removed, or not serving this kind of request) hands the
        request back (409 ``offload_returned``) so its owner runs it: never a 404, never forwarded
        (reference §7 "Arrival", scenario 53).
        """
        try:
            return self._local_model(call)
        except StatusError as err:
            if err.status in (404, 503):
                raise offload_returned(f"cannot serve the borrowed request: {err.message}") from None
            raise

    def _own_recipe(self, call: Call) -> tuple[str, ModelConfig] | None:
        """``(public name, component config)`` when a standalone node's request names one of its
        split recipes (reference §9.3, checked before its own models as on a master); else None.
        A site of one holds its own records only, so every component is in this catalog."""
        if self.recipes is None or call.selector is None:
            return None
        picked = self.recipes.route(call.selector, call.route.runtime, self._need(call.route))
        if picked is None:
            return None
        name, record = picked
        model = self.catalog().get(record.local_id)
        if model is None:
            raise HTTPError(404, f"model {call.selector!r} was not found", "not_found", "model_not_found")
        return name, model

    def _need(self, route: Route) -> str:
        return NEEDS[SECTIONS[route.kind]]

    def _local_model(self, call: Call) -> ModelConfig:
        catalog = self.catalog()
        need = self._need(call.route)
        name = call.selector
        if name is None:
            return self._default_local(catalog, call.route, need)
        found = catalog.resolve(name)
        if found is None:
            raise HTTPError(404, f"model {name!r} was not found", "not_found", "model_not_found")
        if not getattr(found.capabilities, need):
            raise HTTPError(404, f"model {name!r} does not serve {need} requests", "not_found",
                            "model_not_found")
        return found

    def _default_local(self, catalog: Catalog, route: Route, need: str) -> ModelConfig:
        capable = [m for m in catalog.models if getattr(m.capabilities, need)]
        if not capable:
            raise HTTPError(503, f"no model on this node serves {need} requests",
                            "backend_error", "no_capable_model")
        loaded = self.loaded_config(route.runtime)
        for model in capable:
            if model.filename == loaded:
                return model
        return capable[0]

    @staticmethod
    def _public_id(route: Route, model: ModelConfig) -> str:
        if route.runtime == "image" and model.image_id:
            return model.image_id
        return model.local_id

    # -- the master's routing ---------------------------------------------------

    async def _routed(self, call: Call) -> tuple[str, bytes]:
        assert self.master is not None
        registry = self.master.registry
        route = call.route
        need = self._need(route)
        name = call.selector
        if name is None:
            embeddings = None if SECTIONS[route.kind] != "embeddings" else self._reserve_embeddings()
            if route.runtime == "stt":
                record = await self.master.choose_stt()  # NoSTT is a 503 StatusError
                reservation = registry.reserve(record, "stt")
                name = record.public_id
            elif embeddings is not None:
                reservation = embeddings
                name = embeddings.record.public_id
            elif SECTIONS[route.kind] == "embeddings":
                # nothing loaded: to the running backend without a model, loading nothing (§6.7)
                return "-", await self.local.serve_unmodelled(call)
            else:
                name = self._default_public(route, need)
                reservation = registry.acquire(name, route.runtime)
        elif (picked := self.recipes.route(name, route.runtime, need) if self.recipes else None):
            # a split recipe's component, checked before the registry (reference §9.3)
            name, component = picked
            reservation = registry.reserve_exact(component.node_id, component.filename, route.runtime)
        else:
            self._check_known(name, route, need)
            reservation = registry.acquire(name, route.runtime)  # NoReplica is a 502 StatusError
        try:
            record = reservation.record
            entry = self._guardian_entry(call, record.node_id, record.local_id)
            if entry is not None and entry.guardian.node_id != record.node_id \
                    and _text_only(record.capabilities):
                # a guardian on another node answers: the text model's node never sees the image
                reservation.release()
                answer = await self._to_guardian(call, record.node_id, record.local_id, entry, name,
                                                 STRUCTURE)
                if answer is not None:
                    return record.public_id, answer
                reservation = registry.reserve(record, route.runtime)
            if reservation.local:
                model = self.catalog().get(record.local_id)
                if model is None:
                    raise HTTPError(404, f"model {name!r} was not found", "not_found", "model_not_found")
                return record.public_id, await self._serve_local(call, model, name, None)
            assert self.forwarder is not None
            call.model_id = record.local_id
            call.forwarded_to = record.node_id
            try:
                answer = await self.forwarder.forward(call, record, name,
                                                      image_refusal_raises=entry is not None)
                if route.kind == "sd_vid_gen" and self.local.jobs is not None:
                    self.local.jobs.forwarded(call, answer, record.node_id, name)  # its polls go there
                return record.public_id, answer
            except ImageRefused as refused:
                assert entry is not None
                reservation.release()
                return record.public_id, await self._refused(call, record.node_id, record.local_id, entry,
                                                             name, refused)
        finally:
            reservation.release()

    def _reserve_embeddings(self) -> Reservation | None:
        """Selector-less embeddings (reference §6.7): a loaded embeddings config, round-robin."""
        assert self.master is not None
        registry = self.master.registry
        loaded = self.loaded_config("text")
        candidates = embeddings_candidates(registry.records(), self.node_id, lambda f: f == loaded)
        start, self._embeddings_turn = self._embeddings_turn, self._embeddings_turn + 1
        for record in rotated(candidates, start):
            try:
                return registry.reserve_exact(record.node_id, record.filename, "text")
            except NoReplica:
                continue  # went stale since the listing: try the next
        return None

    def _nothing_to_embed_with(self, call: Call) -> bool:
        """Catalog mode of selector-less embeddings (reference §6.7): no selector and no
        embeddings-capable config loaded here, so the request passes through without a model."""
        if call.selector is not None or SECTIONS[call.route.kind] != "embeddings":
            return False
        loaded = self.loaded_config("text")
        return not any(m.filename == loaded and m.capabilities.embeddings for m in self.catalog().models)

    def _records_named(self, name: str) -> list[ModelRecord]:
        assert self.master is not None
        return [r for r in self.master.registry.named(name) if not r.disabled]

    def _check_known(self, name: str, route: Route, need: str) -> None:
        records = self._records_named(name)
        if not records:
            raise HTTPError(404, f"model {name!r} was not found", "not_found", "model_not_found")
        if not any(getattr(r.capabilities, need) for r in records):
            raise HTTPError(404, f"model {name!r} does not serve {need} requests", "not_found",
                            "model_not_found")

    def _default_public(self, route: Route, need: str) -> str:
        assert self.master is not None
        loaded = self.loaded_config(route.runtime)
        capable = [r for r in self.master.registry.records()
                   if getattr(r.capabilities, need) and r.available and not r.disabled]
        if not capable:
            raise HTTPError(503, f"no model in the cluster serves {need} requests",
                            "backend_error", "no_capable_model")
        for record in capable:
            if record.node_id == self.node_id and record.filename == loaded:
                break
        else:
            record = capable[0]
        if route.runtime == "image" and record.public_image_id:
            return record.public_image_id
        return record.public_id

    # -- errors -------------------------------------------------------------------

    def _error(self, reply: Reply, route: Route, err: StatusError) -> bytes:
        if reply.started:
            log.warn("error after the answer started: {message}", message=err.message)
            reply.abort()
            return b""
        reply.set_status(err.status)
        reply.set_header(b"content-type", b"application/json")
        if isinstance(err, Saturated):
            reply.set_header(b"retry-after", str(err.retry_after).encode())
        return error_body(route.error_style, err.message, err.type, err.code)


class _Handling:
    """One request in :meth:`InferenceFront.handle`, from its arrival to its end: what the end
    reads (issue 24: a request held in a queue keeps this record, its call and its queue's, not a
    suspended coroutine).  Called with the outcome of what served it."""

    __slots__ = ("front", "reply", "route", "request_id", "cluster_call", "in_flight", "started", "call",
                 "limited", "timed", "model_label")

    def __init__(self, front: InferenceFront, reply: Reply, route: Route, request_id: str,
                 cluster_call: bool, in_flight: Any) -> None:
        self.front = front
        self.reply = reply
        self.route = route
        self.request_id = request_id
        self.cluster_call = cluster_call
        self.in_flight = in_flight
        self.started = 0.0
        self.call: Call | None = None
        self.limited = ""  # the key name the limiter counted this request against
        self.timed: FirstWrite | None = None
        self.model_label = "-"

    def routed(self, labelled: tuple[str, bytes]) -> bytes:
        """A master's answer: the model label it routed to, and the bytes."""
        self.model_label, answer = labelled
        return answer

    def __call__(self, outcome: bytes | Failure) -> bytes | Failure:
        return self.front._end(self, outcome)


def _tokens(call: Call) -> int:
    """The tokens a finished text request used, where this node knows them (0 otherwise)."""
    if call.route.runtime != "text":
        return 0
    return int(sum(call.outcome.work[:2]))


def _text_only(caps: Capabilities) -> bool:
    """A text model that cannot read images (no multimodal projector)."""
    return caps.llm and not caps.multimodal


def _multimodal_text(caps: Capabilities) -> bool:
    """What a guardian must be: a text model that reads images."""
    return caps.llm and caps.multimodal
