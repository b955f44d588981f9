"""Serving one client inference request on this node's own backends.

The path of a request (architecture "A request's path", local replica):
classify → read the selector → resolve the model in the catalog → plan the
backend call → acquire the runtime slot (loading or switching the config,
timed) → proxy to the backend process, streaming the answer back with model
IDs rewritten to the public ID → release the slot, record a sample.

Every accepted request is answered exactly once: errors before the first byte
become an error envelope; errors after it end the stream.  A client that goes
away cancels the coroutine, which cancels whatever it is waiting on (a slot
waiter or the backend response) and releases everything.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

import attrs
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import Protocol as TxProtocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent, IRequest

from routerd.api.errors import HTTPError, error_body
from routerd.backends.errors import BackendMissing, LoadFailed
from routerd.catalog.catalog import Catalog
from routerd.catalog.model import ModelConfig
from routerd.metrics import NodeMetrics
from routerd.routing import work
from routerd.routing.adapters import AdapterError, kobold, ollama, whisper
from routerd.routing.body import BytesProducer
from routerd.routing.classify import Route, wants_stream
from routerd.routing.multipart import MultipartError, parse_form
from routerd.routing.plan import NEEDS, SECTIONS, BackendPlan, plan_backend_call
from routerd.routing.rewrite import make_rewriter, rewrite_json_model
from routerd.routing.selector import SelectorError, parse_json_object, select_model
from routerd.sim.wav import wav_duration
from routerd.store.samples import RequestSample

log = Logger()

TAIL_KEEP = 8192
_DONE = Failure(ResponseDone())


class RuntimeLease(Protocol):
    base_url: str

    def release(self) -> None: ...


class RuntimePool(Protocol):
    def acquire(self, kind: Any, model: ModelConfig) -> Deferred[Any]: ...

    def loaded_config(self, kind: Any) -> str | None: ...


class SampleSink(Protocol):
    def record_request_sample(self, sample: RequestSample) -> Deferred[None]: ...


@attrs.define
class ActiveRequest:
    request_id: str
    model_id: str
    route: str
    runtime: str
    started_ms: int
    state: str = "waiting"

    def to_json(self, now_ms: int) -> dict[str, Any]:
        return {"request_id": self.request_id, "model_id": self.model_id, "route": self.route,
                "runtime": self.runtime, "state": self.state, "started_ms": self.started_ms,
                "elapsed_ms": max(0, now_ms - self.started_ms)}


def new_request_id() -> str:
    return os.urandom(8).hex()


class _Relay(TxProtocol):
    """Streams a backend body to the client through a converter, chunk by chunk."""

    def __init__(self, request: IRequest, feed: Callable[[bytes], bytes], flush: Callable[[], bytes],
                 done: Deferred[bytes]) -> None:
        self.request = request
        self.feed = feed
        self.flush = flush
        self.done = done
        self.tail = b""

    def dataReceived(self, data: bytes) -> None:
        self.tail = (self.tail + data)[-TAIL_KEEP:]
        out = self.feed(data)
        if out and not self.done.called:
            self.request.write(out)

    def connectionLost(self, reason: Failure = _DONE) -> None:
        if self.done.called:
            return
        if reason.check(ResponseDone, PotentialDataLoss):
            out = self.flush()
            if out:
                self.request.write(out)
            self.done.callback(self.tail)
        else:
            self.done.errback(reason)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.stopProducing()  # type: ignore[attr-defined]


class LocalInference:
    """Serves inference requests with this node's own backend runtimes."""

    def __init__(self, *, node_id: str, clock: IReactorTime, catalog: Callable[[], Catalog],
                 runtimes: RuntimePool, agent: IAgent, samples: SampleSink, metrics: NodeMetrics) -> None:
        self.node_id = node_id
        self.clock = clock
        self.catalog = catalog
        self.runtimes = runtimes
        # The backend is a loopback child process: a plain pooled Agent (no
        # cookies, redirects or URL re-parsing) keeps the proxy cheap.
        self.agent = agent
        self.samples = samples
        self.metrics = metrics
        self.active: dict[str, ActiveRequest] = {}

    def now_ms(self) -> int:
        return int(self.clock.seconds() * 1000)

    async def handle(self, request: IRequest, route: Route, path: str, body: bytes) -> bytes:
        """Serve one request; returns the final bytes to write (Klein finishes the request)."""
        request_id = new_request_id()
        request.setHeader(b"x-routerd-request-id", request_id.encode())
        request.setHeader(b"x-routerd-node", self.node_id.encode())
        started = self.clock.seconds()
        outcome = _Outcome()
        model: ModelConfig | None = None
        try:
            model, parsed, stream = self._resolve(request, route, body)
            public_id = self._public_id(route, model)
            content_type = _header(request, b"content-type")
            try:
                plan = plan_backend_call(route, path, parsed, body, content_type, model.local_id, stream)
            except (AdapterError, MultipartError) as exc:
                raise HTTPError(400, str(exc)) from None
            outcome.section_is_llm = SECTIONS[route.kind] == "llm"
            outcome.work = _request_work(route, parsed, body, content_type)
            entry = ActiveRequest(request_id, public_id, path, route.runtime, int(started * 1000))
            self.active[request_id] = entry
            self.metrics.in_flight.labels(route.runtime).inc()
            try:
                lease = await self.runtimes.acquire(route.runtime, model)
            except LoadFailed as exc:
                raise HTTPError(502, f"model {model.local_id!r} failed to load: {exc}",
                                "backend_error", "load_failed") from None
            except BackendMissing as exc:
                raise HTTPError(502, str(exc), "backend_error", "backend_missing") from None
            entry.state = "running"
            try:
                return await self._proxy(request, lease.base_url, plan, public_id, outcome)
            finally:
                lease.release()
        except HTTPError as err:
            outcome.status = err.code if err.status != 200 else "ok"
            outcome.http_status = err.status
            return self._error(request, route, err)
        except CancelledError:
            outcome.status = "client_disconnected"
            outcome.http_status = 499
            raise
        except Exception as exc:  # noqa: BLE001 - any failure still answers the client once
            log.failure("request {request_id} failed", failure=Failure(), request_id=request_id)
            outcome.status = "backend_error"
            outcome.http_status = 502
            return self._error(request, route, HTTPError(502, f"backend request failed: {exc}",
                                                         "backend_error", "backend_error"))
        finally:
            if request_id in self.active:
                del self.active[request_id]
                self.metrics.in_flight.labels(route.runtime).dec()
            self._finish(route, model, body, started, outcome)

    # -- steps -------------------------------------------------------------

    def _resolve(self, request: IRequest, route: Route,
                 body: bytes) -> tuple[ModelConfig, dict[str, Any] | None, bool]:
        content_type = _header(request, b"content-type")
        try:
            result = select_model(route, body, content_type, _query(request), _headers(request))
            parsed = result.payload
            if route.runtime != "stt" and parsed is None:
                parsed = parse_json_object(body)
        except (SelectorError, MultipartError) as exc:
            raise HTTPError(400, str(exc)) from None
        name = result.model
        need = NEEDS[SECTIONS[route.kind]]
        catalog = self.catalog()
        if name is None:
            if route.model_required:
                raise HTTPError(400, "model is required")
            model = self._default_model(catalog, route, need)
        else:
            found = catalog.resolve(name)
            if found is None:
                raise HTTPError(404, f"model {name!r} was not found", "not_found", "model_not_found")
            model = found
            if not getattr(model.capabilities, need):
                raise HTTPError(404, f"model {name!r} does not serve {need} requests",
                                "not_found", "model_not_found")
        stream = wants_stream(route, parsed) if parsed is not None else False
        return model, parsed, stream

    def _default_model(self, catalog: Catalog, route: Route, need: str) -> ModelConfig:
        capable = [m for m in catalog.models if getattr(m.capabilities, need)]
        if not capable:
            raise HTTPError(503, f"no model on this node serves {need} requests",
                            "backend_error", "no_capable_model")
        loaded = self.runtimes.loaded_config(route.runtime)
        for model in capable:
            if model.filename == loaded:
                return model
        return capable[0]

    def _public_id(self, route: Route, model: ModelConfig) -> str:
        if route.runtime == "image" and model.image_id:
            return model.image_id
        return model.local_id

    async def _proxy(self, request: IRequest, base_url: str, plan: BackendPlan, public_id: str,
                     outcome: _Outcome) -> bytes:
        response = await self.agent.request(
            b"POST", (base_url + plan.path).encode(),
            Headers({b"content-type": [plan.content_type.encode()]}), BytesProducer(plan.body))
        code = int(response.code)
        outcome.http_status = code
        outcome.status = "ok" if 200 <= code < 300 else f"http_{code}"
        ctype = _response_header(response, b"content-type") or "application/json"
        request.setResponseCode(code)
        if ctype.startswith("text/event-stream") and 200 <= code < 300:
            return await self._stream(request, response, plan, public_id, ctype, outcome)
        raw = await _collect(response)
        converted_type, converted = self._convert(plan, public_id, code, ctype, raw, outcome)
        request.setHeader(b"content-type", converted_type.encode())
        return converted

    async def _stream(self, request: IRequest, response: Any, plan: BackendPlan, public_id: str,
                      ctype: str, outcome: _Outcome) -> bytes:
        if plan.mode in ("ollama_chat", "ollama_generate"):
            mode: Literal["chat", "generate"] = "chat" if plan.mode == "ollama_chat" else "generate"
            converter: Any = ollama.SSEToNDJSON(mode, public_id, self.clock.seconds)
            request.setHeader(b"content-type", b"application/x-ndjson")
            request.setHeader(b"x-content-type-options", b"nosniff")
        else:
            converter = make_rewriter(ctype, lambda _old: public_id)
            request.setHeader(b"content-type", ctype.encode())
            request.setHeader(b"cache-control", b"no-cache")
        done: Deferred[bytes] = Deferred(lambda d: relay.abort())
        relay = _Relay(request, converter.feed, converter.flush, done)
        response.deliverBody(relay)
        tail = await done
        usage = work.usage_from_tail(tail)
        if usage is not None:
            outcome.work = (float(usage[0]), float(usage[1]))
        return b""

    def _convert(self, plan: BackendPlan, public_id: str, code: int, ctype: str, raw: bytes,
                 outcome: _Outcome) -> tuple[str, bytes]:
        ok = 200 <= code < 300
        if plan.mode == "whisper":
            if not ok:
                return "application/json", whisper.whisper_error_to_openai(code, raw)
            try:
                return whisper.whisper_to_openai(raw, plan.response_format)
            except whisper.WhisperError as exc:
                raise HTTPError(502, f"speech-to-text backend failed: {exc}",
                                "backend_error", "backend_error") from None
        if plan.mode.startswith("ollama"):
            if not ok:
                return "application/json", ollama.openai_error_to_ollama(code, raw)
            data = _loads(raw)
            usage = work.usage_from_json(data)
            if usage is not None:
                outcome.work = (float(usage[0]), float(usage[1]))
            if plan.mode == "ollama_chat":
                out = ollama.openai_chat_to_ollama(data, public_id, _iso_now(), 0)
            elif plan.mode == "ollama_generate":
                out = ollama.openai_completion_to_ollama_generate(data, public_id, _iso_now(), 0)
            else:
                out = ollama.openai_embeddings_to_ollama_embed(data, public_id)
            return "application/json", json.dumps(out).encode()
        if plan.mode == "kobold" and ok:
            data = _loads(raw)
            usage = work.usage_from_json(data)
            if usage is not None:
                outcome.work = (float(usage[0]), float(usage[1]))
            return "application/json", json.dumps(kobold.llama_completion_to_kobold(data)).encode()
        if ctype.startswith("application/json"):
            if ok and outcome.section_is_llm:
                try:
                    usage = work.usage_from_json(json.loads(raw))
                except ValueError:
                    usage = None
                if usage is not None:
                    outcome.work = (float(usage[0]), float(usage[1]))
            return ctype, rewrite_json_model(raw, lambda _old: public_id)
        return ctype, raw

    def _error(self, request: IRequest, route: Route, err: HTTPError) -> bytes:
        if getattr(request, "startedWriting", False):
            log.warn("error after the answer started: {message}", message=err.message)
            return b""
        request.setResponseCode(err.status)
        request.setHeader(b"content-type", b"application/json")
        return error_body(route.error_style, err.message, err.type, err.code)

    def _finish(self, route: Route, model: ModelConfig | None, body: bytes, started: float,
                outcome: _Outcome) -> None:
        duration = self.clock.seconds() - started
        model_id = model.local_id if model is not None else "-"
        self.metrics.requests.labels(model_id, route.runtime, route.kind, outcome.status).inc()
        self.metrics.request_duration.labels(model_id, route.runtime).observe(duration)
        if model is None:
            return
        sample = RequestSample(
            model_id=model.local_id, section=SECTIONS[route.kind], work=outcome.work,
            duration_ms=duration * 1000.0, status=outcome.status,
            finished_at_ms=self.now_ms(), http_status=outcome.http_status,
            request_bytes=len(body), node_id=self.node_id)
        self.samples.record_request_sample(sample)


@attrs.define
class _Outcome:
    status: str = "ok"
    http_status: int = 200
    work: tuple[float, ...] = ()
    section_is_llm: bool = True


def _request_work(route: Route, parsed: Mapping[str, Any] | None, body: bytes,
                  content_type: str) -> tuple[float, ...]:
    section = SECTIONS[route.kind]
    if section == "image" and parsed is not None:
        return work.image_work("sdapi" if route.family == "sdapi" else "openai", parsed)
    if section == "stt":
        return (_audio_seconds(body, content_type),)
    return ()


def _audio_seconds(body: bytes, content_type: str) -> float:
    """Seconds of audio in the uploaded WAV (0 when it is not a readable WAV)."""
    try:
        parts = parse_form(body, content_type)
    except MultipartError:
        return 0.0
    for part in parts:
        if part.name == "file":
            try:
                return wav_duration(part.data)
            except ValueError:
                return 0.0
    return 0.0


def _loads(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except ValueError:
        raise HTTPError(502, "backend answered with invalid JSON", "backend_error", "backend_error") from None
    if not isinstance(data, dict):
        raise HTTPError(502, "backend answered with unexpected JSON", "backend_error", "backend_error")
    return data


def _iso_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z"


async def _collect(response: Any) -> bytes:
    chunks: list[bytes] = []
    done: Deferred[None] = Deferred(lambda d: relay.abort())
    relay = _Relay(_ListWriter(chunks), lambda b: b, lambda: b"", done)  # type: ignore[arg-type]
    response.deliverBody(relay)
    await done
    return b"".join(chunks)


class _ListWriter:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def write(self, data: bytes) -> None:
        self.chunks.append(data)


def _header(request: IRequest, name: bytes) -> str:
    value = request.getHeader(name)
    return value.decode("latin-1") if isinstance(value, bytes) else (value or "")


def _response_header(response: Any, name: bytes) -> str:
    values = response.headers.getRawHeaders(name)
    return values[0].decode("latin-1") if values else ""


def _query(request: IRequest) -> dict[str, list[str]]:
    args = getattr(request, "args", {}) or {}
    return {k.decode("utf-8", "replace"): [v.decode("utf-8", "replace") for v in vs]
            for k, vs in args.items()}


def _headers(request: IRequest) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, values in request.requestHeaders.getAllRawHeaders():
        out[name.decode("latin-1").lower()] = values[0].decode("latin-1")
    return out
