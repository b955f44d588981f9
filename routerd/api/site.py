"""The HTTP front door of a node: body limits, access control, then the Klein app."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from twisted.internet.address import IPv4Address, IPv6Address
from twisted.logger import LogLevel
from twisted.web import resource, server
from twisted.web.http import Request
from twisted.web.iweb import IRequest

from routerd.api.cors import CorsPolicy
from routerd.api.errors import answer_error
from routerd.api.reply import BODY_ATTRIBUTE, MODEL_ATTRIBUTE
from routerd.api.webui import is_ui_path
from routerd.cluster.auth import AuthPolicy
from routerd.config.schema import Config
from routerd.errors import HTTPError, Saturated
from routerd.lending.offload import offload_returned
from routerd.lending.transport import RELAY_PATH
from routerd.logs import ACCESS_FORMAT, QuickLogger, gate, literal, request_model

#: Paths answered while the node is starting or draining (the rest get 503 + Retry-After).
_ALWAYS_SERVED = frozenset({"/health", "/metrics", "/openapi.json"})

#: The request attribute the guard sets: whether the caller may see node details on ``/health``.
AUTHENTICATED = "routerd_authenticated"


def authenticated(request: IRequest) -> bool:
    """Whether the guard found the caller authenticated for inference (False if unguarded)."""
    return bool(getattr(request, AUTHENTICATED, False))


class _Discard:
    """Stands in for the request body buffer once the body is over the limit."""

    def write(self, data: bytes) -> None:
        pass

    def seek(self, *args: Any) -> None:
        pass

    def read(self, *args: Any) -> bytes:
        return b""

    def tell(self) -> int:
        return 0

    def truncate(self, *args: Any) -> int:
        return 0

    def close(self) -> None:
        pass


class BufferBudget:
    """The bytes every live request's buffered body may hold together (``limits.replay_buffer_mb``)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def fits(self, size: int) -> bool:
        return self.used + size <= self.limit

    def take(self, size: int) -> bool:
        if not self.fits(size):
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        self.used = max(0, self.used - size)


class LimitedRequest(server.Request):
    """A request that stops buffering a body larger than the site's limit, or one that would take
    the node's buffered bodies past its replay buffer (refused 503, never dropped silently)."""

    too_large = False
    over_buffer = False
    _received = 0
    _held = 0

    def __init__(self, channel: Any, queued: Any = None) -> None:
        clock = getattr(getattr(channel, "site", None), "reactor", None)
        self.started_at: float | None = clock.seconds() if clock is not None else None
        # routerd reads request bodies itself (bounded, replayable): twisted's
        # form parsing would parse every multipart upload a second time.
        if queued is None:
            super().__init__(channel, parsePOSTFormSubmission=False)  # type: ignore[no-untyped-call]
        else:
            super().__init__(channel, queued, parsePOSTFormSubmission=False)  # type: ignore[no-untyped-call]

    def _budget(self) -> BufferBudget | None:
        return getattr(getattr(self.channel, "site", None), "buffer", None)

    def gotLength(self, length: int | None) -> None:
        limit = getattr(getattr(self.channel, "site", None), "max_body_bytes", None)
        if limit is not None and length is not None and length > limit:
            self.too_large = True
            self.content = _Discard()
            return
        budget = self._budget()
        if budget is not None and length is not None and not budget.fits(length):
            self.over_buffer = True
            self.content = _Discard()
            return
        super().gotLength(length)  # type: ignore[no-untyped-call]

    def handleContentChunk(self, data: bytes) -> None:
        if self.too_large or self.over_buffer:
            return
        limit = getattr(getattr(self.channel, "site", None), "max_body_bytes", None)
        self._received += len(data)
        if limit is not None and self._received > limit:
            self.too_large = True
            self._discard()
            return
        budget = self._budget()
        if budget is not None:
            if not budget.take(len(data)):
                self.over_buffer = True
                self._discard()
                return
            self._held += len(data)
        super().handleContentChunk(data)  # type: ignore[no-untyped-call]

    def _discard(self) -> None:
        self.content = _Discard()
        self._release()

    def _release(self) -> None:
        held, self._held = self._held, 0
        budget = self._budget()
        if held and budget is not None:
            budget.give(held)

    def finish(self) -> None:
        self._release()
        super().finish()  # type: ignore[no-untyped-call]

    def connectionLost(self, reason: Any) -> None:
        self._release()
        super().connectionLost(reason)  # type: ignore[no-untyped-call]


class GuardResource(resource.Resource):
    """Refuses oversized bodies and unauthorised callers before the app sees them."""

    isLeaf = True

    def __init__(self, inner: resource.IResource, policy: AuthPolicy, max_body_bytes: int,
                 cors_origins: tuple[str, ...] = (), phase: Callable[[], str] = lambda: "ready") -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.inner = inner
        self.policy = policy
        self.max_body_bytes = max_body_bytes
        self.phase = phase
        self.cors = CorsPolicy.build(cors_origins)

    def update(self, policy: AuthPolicy, site: NodeSite, config: Config) -> None:
        """A reload: new keys and networks, body limit and CORS origins from now on."""
        self.policy = policy
        self.max_body_bytes = site.max_body_bytes = config.limits.max_body_bytes
        if site.buffer is not None:
            site.buffer.limit = config.limits.replay_buffer_bytes
        self.cors = CorsPolicy.build(config.server.cors_origins)

    def render(self, request: Request) -> bytes | int:
        path = request.path.decode("utf-8", "replace")
        origin = _text_header(request, b"origin")
        try:
            if self.cors.enabled and request.method == b"OPTIONS" and origin is not None \
                    and request.getHeader(b"access-control-request-method") is not None:
                return self._preflight(request, origin)
            if self.cors.allows(origin):
                assert origin is not None
                for name, value in self.cors.response_headers(origin).items():
                    request.setHeader(name, value)
            if getattr(request, "too_large", False):
                raise HTTPError(413, f"request body is larger than {self.max_body_bytes} bytes",
                                "request_too_large", "request_too_large")
            if getattr(request, "over_buffer", False):
                request.setHeader(b"retry-after", b"1")
                raise Saturated(503, "this node's request buffer (limits.replay_buffer_mb) is full; "
                                     "retry later", "buffer_full")
            forwarded = request.getHeader(b"x-forwarded-for")
            ok = self.admit(path, _client_host(request), forwarded.decode("latin-1") if forwarded else None,
                            request.getHeader(b"authorization"))
            setattr(request, AUTHENTICATED, ok)
            phase = self.phase()
            if phase != "ready" and path not in _ALWAYS_SERVED:
                if request.getHeader(b"x-routerd-offload") == b"1" or path == RELAY_PATH:
                    # A borrowed request goes back to its owner, who serves it itself; so does
                    # one an owner relays through a master that is starting or draining.
                    raise offload_returned(f"helper node is {phase}")
                request.setHeader(b"retry-after", b"1")
                raise Saturated(503, f"this node is {phase}; retry later", phase)
        except HTTPError as err:
            return answer_error(cast(IRequest, request), err)
        return self.inner.render(request)  # type: ignore[no-any-return]

    def admit(self, path: str, peer: str, forwarded_for: str | None, authorization: bytes | None) -> bool:
        """Raise ``HTTPError`` (401/403) unless the caller at ``peer`` may use ``path``; returns
        whether it is authenticated.  Both HTTP edges ask this (the lean channel too)."""
        host = self.policy.client_host(peer, forwarded_for)
        if is_ui_path(path):
            # the WebUI's static files: allowed networks only, but no key (the pages ask for it)
            if not self.policy.client_allowed(host):
                raise HTTPError(403, "client address is not allowed", "forbidden", "forbidden")
            return False
        return self.policy.check(path, host, authorization)

    def _preflight(self, request: Request, origin: str) -> bytes:
        """A CORS preflight: 204 for a listed origin on an allowed network, else 403."""
        if not self.policy.client_allowed(_client_host(request)):
            raise HTTPError(403, "client address is not allowed", "forbidden", "forbidden")
        if not self.cors.allows(origin):
            raise HTTPError(403, f"origin {origin} is not in server.cors_origins", "forbidden", "forbidden")
        for name, value in self.cors.preflight_headers(
                origin, _text_header(request, b"access-control-request-headers")).items():
            request.setHeader(name, value)
        request.setResponseCode(204)
        return b""


def _text_header(request: Request, name: bytes) -> str | None:
    value = request.getHeader(name)
    return value.decode("latin-1") if value is not None else None


def _client_host(request: Request) -> str:
    peer = request.getClientAddress()
    if isinstance(peer, IPv4Address | IPv6Address):
        return peer.host
    return "127.0.0.1"  # in-memory transports in tests


class NodeSite(server.Site):
    requestFactory = LimitedRequest  # type: ignore[assignment]

    def __init__(self, root: resource.IResource, max_body_bytes: int,
                 replay_buffer_bytes: int | None = None) -> None:
        super().__init__(root)  # type: ignore[no-untyped-call]
        self.max_body_bytes = max_body_bytes
        self.buffer = BufferBudget(replay_buffer_bytes) if replay_buffer_bytes is not None else None
        self.displayTracebacks = False

    def log(self, request: Any) -> None:
        """One access line per answered request (namespace ``routerd.access``)."""
        access_line(request, self.reactor.seconds())


access_log = QuickLogger(namespace="routerd.access")


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
               client=_client_host(request))


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


def log_access(**fields: Any) -> None:
    """Logs one access line (both HTTP edges): ``method path status bytes ms model node lent_to
    request_id client``.  Rendered here by str.format (C): an observer then formats a literal, not
    ten fields through twisted's Python-level formatter (issue 14)."""
    access_log.info(literal(ACCESS_FORMAT.format(**fields)), **fields)


def access_logged() -> bool:
    """Whether access lines are written at all (info enabled): else nothing is gathered for them."""
    return gate.enabled(LogLevel.info)
