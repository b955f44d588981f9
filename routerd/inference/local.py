"""Serving one client inference request on this node's own backends.

The local half of "A request's path" (architecture): plan the backend call →
acquire the runtime slot (loading or switching the config, timed) → proxy to
the backend process, streaming the answer back with model IDs rewritten to the
public ID → release the slot, record a sample.  Which model serves the call is
decided before (``inference.front``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal, Protocol

import attrs
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.interfaces import IReactorTime
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent

from routerd.assets.service import assets_unresolved
from routerd.backends.errors import BackendMissing, LoadFailed
from routerd.backends.kv_slots import SlotKeeper
from routerd.backends.slot import outlived
from routerd.catalog.model import ModelConfig
from routerd.clients.backend_headers import content_type_headers
from routerd.counts import count_down
from routerd.errors import HTTPError, StatusError, draining, queue_full
from routerd.inference.answers import convert_answer, loads_answer, translated_stream
from routerd.inference.backend_trace import backend_call, loading
from routerd.inference.context_gate import ContextGate
from routerd.inference.video import VideoJobs
from routerd.lending.offload import OFFLOAD_RETURNED, offload_returned
from routerd.routing import work
from routerd.routing.adapters import AdapterError, ollama
from routerd.routing.body import BytesProducer
from routerd.routing.call import ActiveRequest, Call
from routerd.routing.guardians import REFUSAL_STATUSES, ImageRefused, refusal_message
from routerd.routing.multipart import MultipartError
from routerd.routing.plan import SECTIONS, BackendPlan, plan_backend_call
from routerd.routing.relay import (
    FirstByteTimeout,
    StreamBroken,
    StreamIdle,
    Timeouts,
    collect,
    relay,
    response_header,
    stream_idle,
)
from routerd.routing.rewrite import make_rewriter
from routerd.store.samples import RequestSample
from routerd.wire.lending import section_key


class RuntimePool(Protocol):
    def acquire(self, kind: Any, model: ModelConfig, *, yields: bool = False) -> Deferred[Any]: ...

    def loaded_config(self, kind: Any) -> str | None: ...

    def status(self) -> list[Any]: ...

    def lease_current(self, kind: Any) -> Any: ...


class SampleSink(Protocol):
    def record_request_sample(self, sample: RequestSample) -> None: ...

    def finished(self, call: Call) -> None: ...


@attrs.define(kw_only=True, eq=False, slots=False)  # tests replace a method on one instance
class LocalInference:
    """Serves inference calls with this node's own backend runtimes."""

    node_id: str
    clock: IReactorTime
    runtimes: RuntimePool
    # The backend is a loopback child process: a plain pooled Agent (no
    # cookies, redirects or URL re-parsing) keeps the proxy cheap.
    agent: IAgent
    samples: SampleSink
    #: Told before every runtime acquire (restore after borrow).
    on_acquire: Callable[[Call, ModelConfig], None] | None = None
    #: Told after it: the runtime is the call's (True) or never was.
    on_claimed: Callable[[Call, bool], None] | None = None
    timeouts: Timeouts | None = None
    #: Requests per model waiting for the backend slot (a load, or the slot busy); 0 = unbounded.
    max_queued_per_model: int = 0
    #: Why a config may not load yet (unresolved portable assets), or None.
    blocked: Callable[[ModelConfig], str | None] = lambda _model: None
    context_gate: ContextGate | None = None  # refuses a text request too big for its backend slot; None: none
    kv_slots: SlotKeeper | None = None  # KV slots kept across swaps: restored before a session's request
    queued: dict[str, int] = attrs.field(init=False, factory=dict)
    #: Set when the node drains: nothing new starts, waiting requests are refused (503).
    draining: bool = attrs.field(init=False, default=False)
    #: Request id -> its slot acquisition.
    _waiting: dict[str, Deferred[Any]] = attrs.field(init=False, factory=dict)
    _refused: set[str] = attrs.field(init=False, factory=set)
    active: dict[str, ActiveRequest] = attrs.field(init=False, factory=dict)
    #: Borrowed requests waiting for the runtime.
    _acquiring: dict[str, Deferred[Any]] = attrs.field(init=False, factory=dict)
    _taken_back: set[str] = attrs.field(init=False, factory=set)
    #: Video jobs (``inference.video``): set by the node; None serves no job route.
    jobs: VideoJobs | None = attrs.field(init=False, default=None)
    #: Video jobs accepted by a backend here and not ended: each holds its runtime.
    jobs_running: int = attrs.field(init=False, default=0)

    def now_ms(self) -> int:
        return int(self.clock.seconds() * 1000)

    async def serve(self, call: Call, model: ModelConfig, public_id: str) -> bytes:
        """Serve ``call`` with ``model``; returns the final bytes (the caller finishes the request).
        Its ``x-routerd-node`` is the front's (no returned forward nor refused image wrote another's)."""
        taken = False  # a video job the backend accepted: its end gives the runtime back (_job_ended)
        try:
            try:
                plan = plan_backend_call(call.route, call.path, call.parsed, call.body, call.content_type,
                                         model.local_id, call.stream, model.backend_mode)
            except (AdapterError, MultipartError) as exc:
                raise HTTPError(400, str(exc)) from None
            call.outcome.work = work.request_work(call.route, call.parsed, call.body, call.content_type)
            if self.context_gate is not None:
                self.context_gate.refuse_known(call, model, public_id)
            self._admit(call, model, public_id)
            entry = ActiveRequest(call.request_id, public_id, call.path, call.route.runtime,
                                  int(call.started * 1000), borrowed=call.borrowed)
            self.active[call.request_id] = entry
            waiting = True
            self.queued[model.local_id] = self.queued.get(model.local_id, 0) + 1
            try:
                if self.on_acquire is not None:
                    self.on_acquire(call, model)
                held = self.runtimes.loaded_config(call.route.runtime)
                lease = await loading(call.trace, self._lease_for(call, model), model, held)
                entry.state = "running"
                waiting = False
                count_down(self.queued, model.local_id)
                if self.on_claimed is not None:
                    self.on_claimed(call, True)
                call.serving_since = self.clock.seconds()
                load_ns = 0 if held == model.filename else self._load_ns(call.route.runtime, model)
                try:
                    if self.context_gate is not None:
                        await self.context_gate.check(call, model, lease.base_url, public_id)
                    if self.kv_slots is not None and call.route.runtime == "text":
                        await self.kv_slots.before_request(lease.port, model, self.kv_slots.session_of(call))
                    if plan.answer_format == "job":
                        answer, running = await self._submit_job(call, lease.base_url, plan, public_id)
                        if running is not None:
                            taken = True
                            self.jobs_running += 1
                            running.addCallback(self._job_ended, call, model, lease)
                        return answer
                    try:
                        proxied = self._proxy(call, lease.base_url, plan, public_id, load_ns)
                        return await backend_call(call.trace, proxied)
                    except ConnectionRefusedError:
                        if not await outlived(lease, self.clock):
                            raise
                    # its backend died before the request reached it (nothing was sent): once more,
                    # on the backend the node starts in its place (one cut mid-answer stays a 502)
                    lease.release()
                    lease = await self._lease_for(call, model)
                    return await self._proxy(call, lease.base_url, plan, public_id,
                                             self._load_ns(call.route.runtime, model))
                except FirstByteTimeout as exc:
                    raise HTTPError(504, f"the backend of {model.local_id!r} on node {self.node_id!r} did "
                                    f"not answer within {exc.seconds:g} s", "timeout",
                                    "backend_timeout") from None
                except StreamIdle as exc:
                    if call.reply.started:
                        raise
                    raise HTTPError(504, f"the backend of {model.local_id!r} on node {self.node_id!r} went "
                                    f"silent mid-answer: {exc}", "timeout", "backend_timeout") from None
                finally:
                    if not taken:
                        lease.release()
            finally:
                if waiting:
                    count_down(self.queued, model.local_id)
                    if self.on_claimed is not None:
                        self.on_claimed(call, False)
                if not taken:
                    del self.active[call.request_id]
        except Exception as exc:
            if isinstance(exc, CancelledError) or call.reply.gone:
                # The client left: whatever the backend call failed with, that is why.
                call.outcome.status = "client_disconnected"
                call.outcome.http_status = 499
                if isinstance(exc, CancelledError):
                    raise
                raise CancelledError() from None
            if isinstance(exc, StreamBroken):
                call.outcome.status = "stream_broken"
            elif isinstance(exc, StatusError):
                call.outcome.status = exc.code
                call.outcome.http_status = exc.status
            raise
        finally:
            if not taken:
                self._record(call, model)

    def _submit_job(self, call: Call, base_url: str, plan: BackendPlan,
                    public_id: str) -> Deferred[tuple[bytes, Deferred[str] | None]]:
        if self.jobs is None:
            raise HTTPError(501, f"{call.path} is not served by this node", "unsupported_backend",
                            "unsupported_backend")
        return Deferred.fromCoroutine(self.jobs.submit(call, base_url, plan, public_id))

    def _job_ended(self, status: str, call: Call, model: ModelConfig, lease: Any) -> None:
        """A video job ended: the runtime is given back, and its duration (from the runtime being
        the job's to the end the watcher saw) is recorded as the request's sample."""
        lease.release()
        self.jobs_running -= 1
        self.active.pop(call.request_id, None)
        call.outcome.status = _JOB_OUTCOMES.get(status, f"job_{status}")
        call.outcome.http_status = 200
        self._record(call, model)

    def _admit(self, call: Call, model: ModelConfig, public_id: str) -> None:
        """Refuse (429) a request that would queue past ``max_queued_per_model``; otherwise tell
        the client its place in the queue (1 = next for the backend)."""
        if self.draining:  # admitted from the router queue after the drain began
            raise offload_returned("the helper node is draining") if call.borrowed else draining()
        depth = self.queued.get(model.local_id, 0)
        if self.max_queued_per_model and depth >= self.max_queued_per_model:
            raise queue_full(public_id, depth, self.max_queued_per_model)
        position = call.queue_position or depth + 1  # the router queue's class order, if it waited there
        call.reply.set_header(b"x-routerd-queue-position", str(position).encode())

    def drain(self) -> int:
        """Stop starting requests: every request still waiting for a backend slot is answered
        503 with ``Retry-After`` (its slot wait cancelled); returns how many were refused."""
        self.draining = True
        waiting = list(self._waiting.items())
        for request_id, acquiring in waiting:
            self._refused.add(request_id)
            acquiring.cancel()
        return len(waiting)

    async def serve_unmodelled(self, call: Call) -> bytes:
        """Selector-less embeddings with no embeddings config loaded (reference §6.7): the request
        goes to the running text-side backend as the client sent it, without a model and without
        loading one; 503 when no backend runs.  The answer's ``model`` is the backend's own."""
        lease = self.runtimes.lease_current(call.route.runtime)
        if lease is None:
            raise HTTPError(503, "no embeddings model is loaded and no backend runs to take the request",
                            "backend_error", "no_loaded_model")
        try:
            parsed = dict(call.parsed or {})
            parsed.pop("model", None)
            ollama_style = call.route.kind == "ollama_embed"
            if ollama_style:
                try:
                    # the adapter wants a model; the backend gets none
                    path, body = ollama.ollama_embed_to_openai({**parsed, "model": "-"})
                except AdapterError as exc:
                    raise HTTPError(400, str(exc)) from None
                body.pop("model", None)
            else:
                path, body = call.path, parsed
            call.outcome.work = work.request_work(call.route, call.parsed, call.body, call.content_type)
            call.serving_since = self.clock.seconds()
            response = await self.agent.request(
                b"POST", (lease.base_url + path).encode(),
                Headers({b"content-type": [b"application/json"]}), BytesProducer(json.dumps(body).encode()))
            code = int(response.code)
            call.outcome.http_status = code
            call.outcome.status = "ok" if 200 <= code < 300 else f"http_{code}"
            ctype = response_header(response, b"content-type") or "application/json"
            raw = await collect(response)
            call.reply.set_status(code)
            if ollama_style:
                if 200 <= code < 300:
                    data = loads_answer(raw)
                    named = data.get("model")
                    out = ollama.openai_embeddings_to_ollama_embed(
                        data, named if isinstance(named, str) else "")
                    raw = json.dumps(out).encode()
                else:
                    raw = ollama.openai_error_to_ollama(code, raw)
                ctype = "application/json"
            call.reply.set_header(b"content-type", ctype.encode())
            return raw
        finally:
            lease.release()
            self.samples.finished(call)

    async def _lease_for(self, call: Call, model: ModelConfig) -> Any:
        """:meth:`_acquire`, a failed load answered 502 ``load_failed`` (a missing binary
        ``backend_missing``)."""
        try:
            return await self._acquire(call, model)
        except LoadFailed as exc:
            raise HTTPError(502, f"model {model.local_id!r} failed to load: {exc}",
                            "backend_error", "load_failed") from None
        except BackendMissing as exc:
            raise HTTPError(502, str(exc), "backend_error", "backend_missing") from None

    async def _acquire(self, call: Call, model: ModelConfig) -> Any:
        """The runtime lease; a borrowed request's wait for it can be taken back (:meth:`take_back`).
        A config whose portable assets are unresolved never reaches the backend (503)."""
        reason = self.blocked(model)
        if reason is not None:
            raise assets_unresolved(model.local_id, reason)
        acquiring = self.runtimes.acquire(call.route.runtime, model, yields=call.borrowed)
        rid = call.request_id
        self._waiting[rid] = acquiring  # a drain refuses it (503; a borrowed one goes back)
        if call.borrowed:
            self._acquiring[rid] = acquiring
        try:
            return await acquiring
        except CancelledError:
            if rid in self._taken_back:
                raise offload_returned("own work arrived while it waited for the runtime") from None
            if rid in self._refused:
                if call.borrowed:
                    raise offload_returned("the helper node is draining") from None
                raise draining() from None
            raise
        finally:
            self._waiting.pop(rid, None)
            # only a borrowed request is taken back, and only a drain refuses
            if call.borrowed:
                self._acquiring.pop(rid, None)
            if self._taken_back:
                self._taken_back.discard(rid)
            if self._refused:
                self._refused.discard(rid)

    def waiting_for_runtime(self, request_id: str) -> bool:
        """Whether borrowed request ``request_id`` waits for a free runtime or a model load."""
        return request_id in self._acquiring

    def take_back(self, request_id: str) -> bool:
        """Stop a borrowed request's wait for the runtime: its run fails with 409
        ``offload_returned`` and nothing more is loaded for it (a load already under way carries
        on only for whoever else wants it, else it is stopped: ``RuntimeSlot.acquire``).  False when
        it is not waiting (it holds the runtime)."""
        acquiring = self._acquiring.get(request_id)
        if acquiring is None:
            return False
        self._taken_back.add(request_id)
        acquiring.cancel()
        return True

    def _load_ns(self, kind: Any, model: ModelConfig) -> int:
        """The load of ``model`` a request that found another config loaded waited for (ns)."""
        for status in self.runtimes.status():
            if status.kind == kind and status.model_id == model.local_id and status.last_load_ms:
                return int(status.last_load_ms) * 1_000_000
        return 0

    async def _proxy(self, call: Call, base_url: str, plan: BackendPlan, public_id: str,
                     load_ns: int = 0) -> bytes:
        reply = call.reply
        pending = self.agent.request(
            b"POST", (base_url + plan.path).encode(),
            content_type_headers(plan.content_type), BytesProducer(plan.body))
        response = await (self.timeouts.answer(pending) if self.timeouts is not None else pending)
        code = int(response.code)
        call.outcome.http_status = code
        call.outcome.status = "ok" if 200 <= code < 300 else f"http_{code}"
        ctype = response_header(response, b"content-type") or "application/json"
        raw: bytes | None = None
        if call.guardian_fallback and code in REFUSAL_STATUSES:
            # spec "Guardian models": a backend refusing the image hands the request to the
            # guardian (inference.front) before anything is written to the client
            raw = await collect(response)
            refused = refusal_message(code, raw)
            if refused is not None:
                call.outcome.status = "image_refused"
                raise ImageRefused(code, refused)
        reply.set_status(code)
        if ctype.startswith("text/event-stream") and 200 <= code < 300:
            return await self._stream(call, response, plan, public_id, ctype, load_ns)
        if raw is None:
            raw = await collect(response, stream_idle(self.timeouts))
        now = self.clock.seconds()
        converted_type, converted = convert_answer(call, plan, public_id, code, ctype, raw, now, load_ns)
        if not 200 <= code < 300:  # the backend's own reason, for the request log
            call.outcome.reason = ollama.error_message_from_body(code, raw)[:500]
        elif len(call.outcome.work) == 2 and call.route.runtime == "text":
            call.outcome.cached_tokens = work.cached_tokens(raw)
        reply.set_header(b"content-type", converted_type.encode())
        return converted

    async def _stream(self, call: Call, response: Any, plan: BackendPlan, public_id: str,
                      ctype: str, load_ns: int) -> bytes:
        reply = call.reply
        translating = translated_stream(plan, call, public_id, self.clock.seconds())
        if plan.answer_format in ("ollama_chat", "ollama_generate"):
            mode: Literal["chat", "generate"] = "chat" if plan.answer_format == "ollama_chat" else "generate"
            converter: Any = ollama.SSEToNDJSON(mode, public_id, self.clock.seconds, started=call.started,
                                                load_ns=load_ns)
            reply.set_header(b"content-type", b"application/x-ndjson")
            reply.set_header(b"x-content-type-options", b"nosniff")
        elif translating is not None:  # Messages or Responses over chat: the client's API's events
            converter = translating
            reply.set_header(b"content-type", b"text/event-stream")
            reply.set_header(b"cache-control", b"no-cache")
        else:
            converter = make_rewriter(ctype, lambda _old: public_id)
            reply.set_header(b"content-type", ctype.encode())
            reply.set_header(b"cache-control", b"no-cache")
        # a Messages stream passed through reports its input tokens in its first event; a translated
        # one is read as the chat stream it was (the relay keeps the backend's bytes)
        head = call.route.kind == "messages" and translating is None
        counts = work.StreamCounts(converter.feed, head=head)
        tail = await relay(response, reply, counts.feed, converter.flush, stream_idle(self.timeouts))
        if (usage := counts.usage(tail)) is not None:
            call.outcome.work = (float(usage[0]), float(usage[1]))
            call.outcome.cached_tokens = work.cached_tokens(counts.seen)
        return b""

    def own_busy(self) -> bool:
        """Whether any of this node's own (not borrowed) requests is in a backend."""
        return any(not a.borrowed for a in self.active.values())

    def _record(self, call: Call, model: ModelConfig) -> None:
        if call.outcome.status == OFFLOAD_RETURNED:
            return  # handed back before it ran: the owner runs it, nothing failed here
        # The service time, from the backend slot being ours to the last byte: a
        # wait for a load (timed separately as a load sample) or in a queue is
        # not part of what the request cost.
        now = self.clock.seconds()
        duration = now - (call.serving_since or call.started)
        self.samples.finished(call)
        section = SECTIONS[call.route.kind]
        # Keyed as lending keys the model in the section's lane (an image model by its image ID),
        # so the fit made of it meets the model's links and queue stats.
        sample = RequestSample(
            model_id=section_key(section, model), section=section, work=call.outcome.work,
            duration_ms=duration * 1000.0, status=call.outcome.status,
            finished_at_ms=int(now * 1000), http_status=call.outcome.http_status,
            request_bytes=len(call.body), node_id=self.node_id)
        self.samples.record_request_sample(sample)


#: A video job's final status as its request's outcome (metrics and sample status).
_JOB_OUTCOMES = {"completed": "ok", "failed": "job_failed", "cancelled": "cancelled"}


__all__ = ["LocalInference"]
