"""Sending a client's request on to another node and streaming its answer back.

Used for the master's forwarding (public ID → the replica's local ID, and
back), for an owner lending a request through the master's relay, and for the
relay sending it to the helper.  The answer streams chunk by chunk; model IDs
are rewritten to the public value where the caller asks for it.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlencode

import attrs
from twisted.internet.error import ConnectError, DNSLookupError, TimeoutError
from twisted.web.client import ResponseFailed, ResponseNeverReceived
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent

from routerd.errors import HTTPError
from routerd.paths import INFERENCE_PREFIX
from routerd.routing.body import BytesProducer
from routerd.routing.call import (
    AS_GUARDIAN_HEADER,
    KEY_CLASS_HEADER,
    KEY_NAME_HEADER,
    PUBLIC_MODEL_HEADER,
    Call,
    Reply,
)
from routerd.routing.guardians import REFUSAL_STATUSES, ImageRefused, refusal_message
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
from routerd.routing.rewrite import make_rewriter, rewrite_json_model
from routerd.routing.selector import replace_model
from routerd.routing.work import StreamCounts, usage_of_answer
from routerd.tracing import NO_SPAN, Span
from routerd.urls import AllowList
from routerd.wire.records import ModelRecord

#: The span of a request sent to another node (contract §2 "Tracing").
FORWARD_SPAN = "routerd.forward"
_PASSED_HEADERS = (b"x-routerd-node", b"x-routerd-lent-to", b"x-routerd-guardian", b"cache-control",
                   b"x-content-type-options")
_STREAMING_TYPES = ("text/event-stream", "application/x-ndjson", "application/ndjson")
TRANSPORT_ERRORS = (ConnectError, DNSLookupError, TimeoutError, ResponseNeverReceived, ResponseFailed)


class Unreachable(Exception):
    """The other node could not be reached (nothing was written to the client)."""


class CameBack(Exception):
    """The other node answered 409 ``offload_returned`` (nothing was written to the client)."""


@attrs.frozen
class Outbound:
    """One request to send to another node."""

    url: str
    body: bytes
    content_type: str
    request_id: str
    headers: tuple[tuple[bytes, bytes], ...] = ()
    rewrite_to: str | None = None  # public ID for answers' ``model`` fields; None leaves them
    rewrite_errors: bool = True  # also rewrite non-2xx answers
    returns_raise: bool = False  # a 409 offload_returned raises CameBack instead of being passed on
    #: Called once the other node has started answering (headers received, not a return).
    on_answer: Callable[[], None] | None = attrs.field(default=None, eq=False)
    #: A 400/500 refusing the request's image raises ImageRefused instead of being passed on
    #: (spec "Guardian models": the guardian answers instead).
    image_refusal_raises: bool = False
    #: ``GET`` for a video job's poll (``routerd.inference.video``); a GET sends no body.
    method: bytes = b"POST"
    #: Called with the answer's content type and its last bytes (a stream's tail, or the whole body)
    #: once it ended: where its usage report is.
    on_end: Callable[[str, bytes], None] | None = attrs.field(default=None, eq=False)
    #: The span of the request it is sent for: the send is its child, and carries its trace context.
    trace: Span = attrs.field(default=NO_SPAN, eq=False)
    #: A stream's first bytes are passed to ``on_end`` too (Anthropic's Messages: its input tokens are
    #: in the first event, :class:`~routerd.routing.work.StreamCounts`).
    keep_head: bool = False


class Forwarder:
    def __init__(self, agent: IAgent, token: str, allowed: AllowList,
                 timeouts: Timeouts | None = None) -> None:
        self.agent = agent
        self.token = token
        self.allowed = allowed
        self.timeouts = timeouts

    async def send(self, reply: Reply, out: Outbound) -> tuple[int, bytes]:
        """Send ``out`` and stream the answer into ``reply``; returns (status, last bytes).

        Raises ``Unreachable`` on a transport failure and ``CameBack`` on a 409
        ``offload_returned`` when asked to, in both cases before writing anything.
        """
        if not self.allowed.permits(out.url):
            raise Unreachable(f"{out.url} is not an allowed cluster target")
        if out.trace is NO_SPAN:
            return await self._send(reply, out)
        span = out.trace.child(FORWARD_SPAN, {"url.full": out.url, "routerd.request_id": out.request_id})
        out = attrs.evolve(out, headers=(*out.headers, *span.headers()))
        try:
            code, last = await self._send(reply, out)
        except BaseException as exc:
            span.end(exc.__class__.__name__)
            raise
        span.set("http.response.status_code", code)
        span.end("" if code < 500 else f"http_{code}")
        return code, last

    async def _send(self, reply: Reply, out: Outbound) -> tuple[int, bytes]:
        headers = Headers({
            b"authorization": [b"Bearer " + self.token.encode()],
            b"content-type": [out.content_type.encode() or b"application/json"],
            b"x-routerd-request-id": [out.request_id.encode()],
        })
        for name, value in out.headers:
            headers.addRawHeader(name, value)
        idle = stream_idle(self.timeouts)
        try:
            body = BytesProducer(out.body) if out.method != b"GET" else None
            pending = self.agent.request(out.method, out.url.encode(), headers, body)
            response = await (self.timeouts.answer(pending) if self.timeouts is not None else pending)
        except TRANSPORT_ERRORS as exc:
            raise Unreachable(f"{exc.__class__.__name__}: {exc}") from None
        code = int(response.code)
        ctype = response_header(response, b"content-type") or "application/json"
        if code == 409 and out.returns_raise:
            raw = await collect(response, idle)
            if b"offload_returned" in raw:
                raise CameBack(raw.decode("utf-8", "replace")[:200])
            if out.on_answer is not None:
                out.on_answer()
            return self._whole(reply, response, code, ctype, raw, out)
        if out.image_refusal_raises and code in REFUSAL_STATUSES:
            raw = await collect(response)
            refused = refusal_message(code, raw)
            if refused is not None:
                raise ImageRefused(code, refused)
            if out.on_answer is not None:
                out.on_answer()
            return self._whole(reply, response, code, ctype, raw, out)
        if out.on_answer is not None:
            out.on_answer()
        if ctype.startswith(_STREAMING_TYPES):
            self._head(reply, response, code, ctype)
            rewrite = out.rewrite_to is not None and (out.rewrite_errors or 200 <= code < 300)
            if rewrite:
                public = out.rewrite_to
                converter = make_rewriter(ctype, lambda _old: public)
                counts = StreamCounts(converter.feed, head=out.keep_head)
                tail = await relay(response, reply, counts.feed, converter.flush, idle)
            else:
                counts = StreamCounts(_same, head=out.keep_head)
                tail = await relay(response, reply, counts.feed, _nothing, idle)
            if out.on_end is not None:
                out.on_end(ctype, counts.ends(tail))
            return code, b""
        return self._whole(reply, response, code, ctype, await collect(response, idle), out)

    def _head(self, reply: Reply, response: object, code: int, ctype: str) -> None:
        reply.set_status(code)
        for name in _PASSED_HEADERS:
            values = response.headers.getRawHeaders(name)  # type: ignore[attr-defined]
            if values:
                reply.set_header(name, values[0])
        reply.set_header(b"content-type", ctype.encode())

    def _whole(self, reply: Reply, response: object, code: int, ctype: str, raw: bytes,
               out: Outbound) -> tuple[int, bytes]:
        self._head(reply, response, code, ctype)
        if out.on_end is not None:
            out.on_end(ctype, raw)
        rewrite = out.rewrite_to is not None and (out.rewrite_errors or 200 <= code < 300)
        if rewrite and ctype.startswith("application/json"):
            public = out.rewrite_to
            raw = rewrite_json_model(raw, lambda _old: public)
        return code, raw

    async def forward(self, call: Call, record: ModelRecord, public_id: str, *,
                      image_refusal_raises: bool = False) -> bytes:
        """The master's forwarding of a client request to the node holding ``record``
        (``image_refusal_raises``: a backend refusing the image raises ``ImageRefused``)."""
        base = record.node_url.rstrip("/")
        local = local_selector(call, record)
        body = call.body
        if call.selector is not None and call.selector != local:
            body = replace_model(call.route, body, call.content_type, local, old_model=call.selector)
        query = _query(call, local)
        url = base + INFERENCE_PREFIX + call.path + (f"?{query}" if query else "")
        stt = call.route.runtime == "stt"  # audio answers carry no model ID (reference §5.5)
        text = call.route.runtime == "text"
        ends: list[tuple[str, bytes]] = []
        out = Outbound(url=url, body=body, content_type=call.content_type, request_id=call.request_id,
                       headers=key_headers(call), rewrite_to=None if stt else public_id, trace=call.trace,
                       rewrite_errors=call.route.runtime != "image",
                       image_refusal_raises=image_refusal_raises, keep_head=call.route.kind == "messages",
                       on_end=(lambda ctype, last: ends.append((ctype, last))) if text else None)
        try:
            code, result = await self.send(call.reply, out)
        except Unreachable as exc:
            raise HTTPError(502, f"node {record.node_id!r} is unreachable: {exc}", "backend_error",
                            "node_unreachable") from None
        except FirstByteTimeout as exc:
            raise HTTPError(504, f"node {record.node_id!r} did not answer within {exc.seconds:g} s",
                            "timeout", "node_timeout") from None
        except StreamIdle as exc:
            if call.reply.started:
                raise StreamBroken(f"node {record.node_id!r}: {exc}") from None
            raise HTTPError(504, f"node {record.node_id!r} went silent mid-answer: {exc}",
                            "timeout", "node_timeout") from None
        except StreamBroken as exc:  # the node's answer broke off (it died, or dropped the connection)
            raise StreamBroken(f"node {record.node_id!r}: {exc}") from None
        call.outcome.http_status = code
        call.outcome.status = "ok" if 200 <= code < 300 else f"http_{code}"
        if ends and 200 <= code < 300:
            # the tokens the answer reports: what the key limits of the node the client called charge
            usage = usage_of_answer(*ends[-1])
            if usage is not None:
                call.outcome.work = (float(usage[0]), float(usage[1]))
        return result


def key_headers(call: Call) -> tuple[tuple[bytes, bytes], ...]:
    """What the node a request is forwarded to reads of it: its key's class, and what
    :func:`record_headers` names."""
    return ((KEY_CLASS_HEADER.encode(), call.priority.encode()), *record_headers(call))


def record_headers(call: Call) -> tuple[tuple[bytes, bytes], ...]:
    """What the node that serves a forwarded or lent request records of it (its analytics row): the
    name of the key that admitted it (never the key), the public ID the client asked for, and
    whether a guardian answers it."""
    out = []
    if call.key_name:
        out.append((KEY_NAME_HEADER.encode(), call.key_name.encode()))
    if call.public_model:
        out.append((PUBLIC_MODEL_HEADER.encode(), call.public_model.encode()))
    if call.guardian:
        out.append((AS_GUARDIAN_HEADER.encode(), b"1"))
    return tuple(out)


def local_selector(call: Call, record: ModelRecord) -> str:
    if call.route.runtime == "image" and record.image_id:
        return record.image_id
    return record.local_id


def _query(call: Call, local: str) -> str:
    args = {k: list(v) for k, v in call.query.items()}
    if not args:
        return ""
    for key in ("model", "sd_model_checkpoint"):
        if key in args:
            args[key] = [local if v == call.selector else v for v in args[key]]
    return urlencode([(k, v) for k, vs in args.items() for v in vs])


def _same(data: bytes) -> bytes:
    return data


def _nothing() -> bytes:
    return b""
