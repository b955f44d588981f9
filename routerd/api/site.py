"""twisted.web's side of the node's HTTP edge: the channel, the request and the guard.

Requests the lean channel (:mod:`routerd.api.channel`) does not serve itself reach twisted.web's
``HTTPChannel``; :class:`NodeHTTPChannel` holds it to the same rules.  It builds the same
:class:`~routerd.api.head.RequestHead` from what twisted parsed and asks the same
:func:`~routerd.api.admission.decide` as soon as the head is complete, before a byte of body is
buffered; a refusal (and any head twisted's own parser refuses) is written by the same
:func:`~routerd.api.access.refusal` with ``Connection: close``.  An admitted request reserves its
``Content-Length`` from the replay budget at once (a chunked body reserves as it arrives) and gives
it back exactly once when it finishes or its connection is lost (:mod:`routerd.api.budget`).
:class:`GuardResource` then only applies the verdict (CORS headers, a preflight's 204, the chunked
body's 413/503).  ``state``, ``since``, ``blocked_at`` and ``body_by`` of the channel are what the
lean channel's reaper reads after a hand-over (:mod:`routerd.api.deadlines`).

Twisted internals used here (``_command``, ``_path``, ``_version``, ``_receivedHeaderSize``,
``_respondToBadRequestAndDisconnect``, ``_buffer``) are those of the Twisted range pinned in
pyproject.toml; the channel tests (tests/unit/test_edge_parity.py) fail if they move.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from twisted.internet.address import IPv4Address, IPv6Address
from twisted.web import http, resource, server
from twisted.web.iweb import IRequest

from routerd.api.access import access_logged, log_access, refusal
from routerd.api.admission import EdgeRules, Verdict, buffer_full, decide
from routerd.api.browser import BrowserRules, browser_rules
from routerd.api.budget import BufferBudget, LimitedRequest
from routerd.api.chunked import strict_chunked
from routerd.api.cors import CorsPolicy
from routerd.api.deadlines import body_deadline
from routerd.api.errors import answer_error
from routerd.api.facts import RouteFacts, namespace_facts
from routerd.api.head import (
    MAX_FIELDS,
    MAX_HEAD_BYTES,
    RequestHead,
    bad_request,
    build_head,
    check_request_line,
    content_length,
    head_too_large,
    transfer_coding,
)
from routerd.api.reply import (
    BODY_ATTRIBUTE,
    ERRORS_ATTRIBUTE,
    HEAD_ATTRIBUTE,
    KEY_ATTRIBUTE,
    MODEL_ATTRIBUTE,
    VERDICT_ATTRIBUTE,
)
from routerd.cluster.auth import AuthPolicy
from routerd.config.schema import Config, ServerConfig
from routerd.errors import ErrorStyle, HTTPError, StatusError
from routerd.logs import request_model

#: The request attribute the guard sets: whether the caller may see node details on ``/health``.
AUTHENTICATED = "routerd_authenticated"


def authenticated(request: IRequest) -> bool:
    """Whether the guard found the caller authenticated for inference (False if unguarded)."""
    return bool(getattr(request, AUTHENTICATED, False))


class GuardResource(resource.Resource):
    """The node's edge rules (:class:`~routerd.api.admission.EdgeRules`, phase, budget, server
    limits), and the resource that applies a request's verdict before the app sees it."""

    isLeaf = True

    def __init__(self, inner: resource.IResource, policy: AuthPolicy, max_body_bytes: int,
                 cors_origins: tuple[str, ...] = (), phase: Callable[[], str] = lambda: "ready",
                 server_config: ServerConfig | None = None, browser: BrowserRules | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.inner = inner
        self.phase = phase
        #: the facts of a path, from the declared routes of the resource it guards
        self.route_facts: Callable[[str], RouteFacts] = getattr(inner, "route_facts", namespace_facts)
        self.rules = EdgeRules(policy, max_body_bytes, CorsPolicy.build(cors_origins), self.route_facts,
                               browser or BrowserRules())
        self.limits: ServerConfig = server_config or ServerConfig()
        self.budget: BufferBudget | None = None  # the site's (NodeSite sets it)

    @property
    def policy(self) -> AuthPolicy:
        return self.rules.policy

    @property
    def max_body_bytes(self) -> int:
        return self.rules.max_body_bytes

    def update(self, policy: AuthPolicy, site: NodeSite, config: Config) -> None:
        """A reload: new keys and networks, body limit, CORS origins and server limits from now on."""
        self.rules = EdgeRules(policy, config.limits.max_body_bytes,
                               CorsPolicy.build(config.server.cors_origins), self.route_facts,
                               browser_rules(config) if self.rules.browser.enabled else self.rules.browser)
        self.limits = config.server
        site.max_body_bytes = config.limits.max_body_bytes
        if site.buffer is not None:
            site.buffer.limit = config.limits.replay_buffer_bytes
            site.buffer.share, site.buffer.floor = config.server.max_client_buffer_share, site.max_body_bytes

    def decide(self, head: RequestHead, peer: str) -> Verdict:
        """The admission verdict on ``head`` from ``peer`` now (both edges ask this)."""
        return decide(self.rules, head, peer, self.phase(), self.budget)

    def render(self, request: IRequest) -> bytes | int:
        verdict: Verdict | None = getattr(request, VERDICT_ATTRIBUTE, None)
        if verdict is None:
            # A request that did not come through NodeHTTPChannel (in-memory test clients): the
            # same head rules and the same decision, made here.
            try:
                head = head_of(request)
            except StatusError as err:
                path = request.path.decode("utf-8", "replace")
                return answer_error(request, err, self.route_facts(path).errors)
            setattr(request, HEAD_ATTRIBUTE, head)
            verdict = self.decide(head, client_host(request))
            setattr(request, VERDICT_ATTRIBUTE, verdict)
        setattr(request, ERRORS_ATTRIBUTE, verdict.errors)  # what every error answer below is written in
        for name, value in verdict.headers:
            request.setHeader(name, value)
        if verdict.error is not None:
            return answer_error(request, verdict.error)
        if verdict.preflight:
            request.setResponseCode(204)
            return b""
        if getattr(request, "too_large", False):  # a chunked body past the limit
            return answer_error(request, HTTPError(413, f"request body is larger than {self.max_body_bytes} "
                                                   "bytes", "request_too_large", "request_too_large"))
        if getattr(request, "over_buffer", False):  # a chunked body past the budget
            return answer_error(request, buffer_full())
        setattr(request, AUTHENTICATED, verdict.authenticated)
        setattr(request, KEY_ATTRIBUTE, (verdict.key_name, verdict.key_class))
        return self.inner.render(request)  # type: ignore[no-any-return]


def head_of(request: IRequest) -> RequestHead:
    """The :class:`RequestHead` of a request twisted.web parsed (raises 400 & co. like the lean edge)."""
    return build_head(request.method, request.uri, getattr(request, "clientproto", b"HTTP/1.1"),
                      _field_lines(request))


def _field_lines(request: IRequest) -> Iterator[tuple[bytes, bytes]]:
    for name, values in request.requestHeaders.getAllRawHeaders():
        for value in values:
            yield name, value


def client_host(request: IRequest) -> str:
    peer = request.getClientAddress()
    if isinstance(peer, IPv4Address | IPv6Address):
        return peer.host
    return "127.0.0.1"  # in-memory transports in tests


class NodeHTTPChannel(http.HTTPChannel):
    """twisted.web's channel under the node's edge rules (see the module docstring).  ``state``
    and ``since`` tell the lean channel's reaper which deadline applies (``head``, ``body``,
    ``busy``, ``idle``)."""

    totalHeadersSize = MAX_HEAD_BYTES
    MAX_LENGTH = MAX_HEAD_BYTES
    maxHeaders = MAX_FIELDS + 1  # the count is ours (431 at MAX_FIELDS + 1, see headerReceived)

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.refused = False
        self.state = "idle"
        self.since = 0.0
        self.write_blocked = False
        self.blocked_at: float | None = None  # since when the output is backed up
        self.body_by = 0.0  # when the arriving body must be complete (server.min_body_rate)
        self._fields = 0
        self._first_line = True

    site: Any  # set by Site.buildProtocol

    def _now(self) -> float:
        return float(self.site.reactor.seconds())

    def connectionMade(self) -> None:  # noqa: N802 - Twisted's name
        super().connectionMade()  # type: ignore[no-untyped-call]
        self.since = self._now()

    def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted's name
        if self.refused:
            return
        if self.state == "idle":
            self.state, self.since = "head", self._now()
        elif self.state == "body":
            self.since = self._now()
        super().dataReceived(data)  # type: ignore[no-untyped-call]

    def lineReceived(self, line: bytes) -> None:  # noqa: N802 - Twisted's name
        if self.refused:
            return
        if not self._first_line and line[:1] in (b" ", b"\t"):
            # obs-fold (RFC 9112 §5.2): refused, as the lean channel refuses a line whose name is
            # no token, instead of twisted's joining it to the field before
            self.refuse(bad_request("malformed header field name"))
            return
        if self._first_line and line:
            self._first_line = False
            parts = line.split(b" ")
            if len(parts) == 3:  # twisted's parser refuses other shapes, its own way (400)
                try:
                    check_request_line(*parts)
                except StatusError as err:
                    self.refuse(err)
                    return
        super().lineReceived(line)  # type: ignore[no-untyped-call]

    def lineLengthExceeded(self, line: bytes) -> None:  # noqa: N802 - Twisted's name
        self.refuse(head_too_large(f"a head line is longer than {MAX_HEAD_BYTES} bytes"))

    def headerReceived(self, line: bytes) -> bool:  # noqa: N802 - Twisted's name
        self._fields += 1
        if self._fields > MAX_FIELDS:
            self.refuse(head_too_large(f"more than {MAX_FIELDS} header fields"))
            return False
        name, _, value = line.partition(b":")
        lower = name.lower()
        if lower in (b"content-length", b"transfer-encoding"):
            try:  # twisted's int() of thousands of digits raises, and it has its own TE answer
                if lower == b"content-length":
                    content_length(value)
                else:
                    transfer_coding(value)
            except StatusError as err:
                self.refuse(err)
                return False
        return bool(super().headerReceived(line))  # type: ignore[no-untyped-call]

    def allHeadersReceived(self) -> None:  # noqa: N802 - Twisted's name
        self._fields = 0
        request = self.requests[-1]
        try:
            head = build_head(self._command, self._path, self._version, _field_lines(request))
        except StatusError as err:
            self.refuse(err)
            return
        guard = self.site.resource
        verdict = guard.decide(head, _peer(self)) if isinstance(guard, GuardResource) else Verdict()
        if verdict.error is not None:
            self.refuse(verdict.error, verdict.headers, head, verdict.errors, verdict.client)
            return
        request.admitted(head, verdict)
        strict_chunked(self)  # a bare LF in chunked framing is refused, as h11 and nginx read it
        now = self._now()
        self.state, self.since = ("body" if head.length or head.chunked else "busy"), now
        if isinstance(guard, GuardResource):
            self.body_by = body_deadline(guard.limits, now, head.length or 0)
        super().allHeadersReceived()  # type: ignore[no-untyped-call]

    def allContentReceived(self) -> None:  # noqa: N802 - Twisted's name
        if self.refused:
            return
        self.state = "busy"
        request = self.requests[-1] if self.requests else None
        if isinstance(request, LimitedRequest):
            request.body_arrived()
        self._first_line = True
        super().allContentReceived()  # type: ignore[no-untyped-call]

    def rawDataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted's name
        if not self.refused:
            super().rawDataReceived(data)

    def requestDone(self, request: Any) -> None:  # noqa: N802 - Twisted's name
        self.state, self.since = "idle", self._now()
        super().requestDone(request)  # type: ignore[no-untyped-call]
        if self.state == "idle" and getattr(self, "_buffer", None):
            self.state = "head"  # part of the next request is here: its head deadline runs

    def pauseProducing(self) -> None:  # noqa: N802 - Twisted's name
        if not self.write_blocked:
            self.blocked_at = self._now()
        self.write_blocked = True
        self.since = self._now() if self.state == "busy" else self.since
        super().pauseProducing()  # type: ignore[no-untyped-call]

    def resumeProducing(self) -> None:  # noqa: N802 - Twisted's name
        self.write_blocked, self.blocked_at = False, None
        super().resumeProducing()  # type: ignore[no-untyped-call]

    def _respondToBadRequestAndDisconnect(self) -> None:  # noqa: N802 - Twisted's name
        if self._receivedHeaderSize > self.totalHeadersSize:
            self.refuse(head_too_large(f"request head is larger than {MAX_HEAD_BYTES} bytes"))
        else:
            self.refuse(bad_request("malformed request head"))

    def refuse(self, err: StatusError, headers: tuple[tuple[bytes, bytes], ...] = (),
               head: RequestHead | None = None, family: ErrorStyle | None = None, client: str = "") -> None:
        """Answer ``err`` before the body and close: nothing more of this connection is served.
        ``family`` is the route's error family and ``client`` the client (admission's verdict);
        by default the facts of the path say the one, the peer is the other."""
        if self.refused or self.transport is None:
            return
        self.refused = True
        self.state, self.since = "closing", self._now()
        self.setTimeout(None)  # type: ignore[no-untyped-call]
        method = head.method if head is not None else _text(getattr(self, "_command", None))
        path = head.path if head is not None else _text(getattr(self, "_path", None))
        if family is None:
            guard = self.site.resource
            facts_of = guard.route_facts if isinstance(guard, GuardResource) else namespace_facts
            family = facts_of(path.partition("?")[0]).errors
        self.transport.write(refusal(err, family, headers, http.datetimeToString(self._now())))
        log_refusal(method, path, err.status, client or _peer(self), head)
        # a declared body: only the sending side is closed, what still arrives is dropped
        # (LeanChannel.close); a deadline's refusal (no head) closes at once
        body = head is not None and bool(head.length or head.chunked)
        linger = getattr(self.transport, "loseWriteConnection", None) if body else None
        (linger or self.loseConnection)()


def log_refusal(method: str, path: str, status: int, client: str, head: RequestHead | None) -> None:
    """The access line of a request refused at head time (both edges)."""
    if not access_logged():
        return
    model = "-"
    if head is not None:
        model = request_model(None, head.fields.get("x-routerd-model"), "", None)
    log_access(method=method, path=path.partition("?")[0], status=status, bytes=0, ms=0, model=model,
               node="-", lent_to="-", request_id="-", client=client)


def _text(raw: Any) -> str:
    return raw.decode("latin-1") if isinstance(raw, bytes) else "-"


def _peer(channel: http.HTTPChannel) -> str:
    peer = channel.transport.getPeer() if channel.transport is not None else None
    return getattr(peer, "host", "127.0.0.1")


class NodeSite(server.Site):
    requestFactory = LimitedRequest  # type: ignore[assignment]
    protocol = NodeHTTPChannel  # type: ignore[assignment]  # HTTP/1.1 only: no H2 negotiation

    def __init__(self, root: resource.IResource, max_body_bytes: int,
                 replay_buffer_bytes: int | None = None) -> None:
        super().__init__(root)  # type: ignore[no-untyped-call]
        self.max_body_bytes = max_body_bytes
        share = root.limits.max_client_buffer_share if isinstance(root, GuardResource) else 1.0
        self.buffer = BufferBudget(replay_buffer_bytes, share, max_body_bytes) \
            if replay_buffer_bytes is not None else None
        if isinstance(root, GuardResource):
            root.budget = self.buffer
        self.displayTracebacks = False

    def log(self, request: Any) -> None:
        """One access line per answered request (namespace ``routerd.access``)."""
        access_line(request, self.reactor.seconds())


def _header(request: Any, where: str, name: bytes) -> str | None:
    headers = request.responseHeaders if where == "out" else request.requestHeaders
    value = headers.getRawHeaders(name)
    return value[0].decode("utf-8", "replace") if value else None


def access_line(request: Any, now: float) -> None:
    """Logs ``request``'s access line: request id, method, path, model, node, status, bytes, ms,
    lent-to, client."""
    if not access_logged():
        return
    started = getattr(request, "started_at", None)
    model: str | None = getattr(request, MODEL_ATTRIBUTE, None)  # named by routing
    if model is None:
        model = _named_model(request)
    log_access(method=request.method.decode("ascii", "replace"), path=request.path.decode("utf-8", "replace"),
               status=request.code, bytes=request.sentLength,
               ms=round((now - started) * 1000) if started else None, model=model,
               node=_header(request, "out", b"x-routerd-node") or "-",
               lent_to=_header(request, "out", b"x-routerd-lent-to") or "-",
               request_id=_header(request, "out", b"x-routerd-request-id") or "-",
               client=access_client(request))


def access_client(request: Any) -> str:
    """The client the access line names: the one admission decided (behind a trusted proxy the
    forwarded client), else the peer."""
    verdict: Verdict | None = getattr(request, VERDICT_ATTRIBUTE, None)
    return verdict.client if verdict is not None and verdict.client else client_host(request)


def _named_model(request: Any) -> str:
    """The model a request names in its body, query or header (when routing named none)."""
    query_model = request.args.get(b"model", [b""])[0].decode("utf-8", "replace") or None
    body: bytes | None = getattr(request, BODY_ATTRIBUTE, None)
    content = getattr(request, "content", None)
    if body is None and content is not None and not getattr(request, "too_large", False):
        try:
            content.seek(0)
            body = content.read(65537)
        except (OSError, ValueError):
            body = None
    return request_model(query_model, _header(request, "in", b"x-routerd-model"),
                         _header(request, "in", b"content-type") or "", body)
