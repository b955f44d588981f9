"""The HTTP front door of a node: body limits, access control, then the Klein app."""

from __future__ import annotations

from typing import Any, cast

from twisted.internet.address import IPv4Address, IPv6Address
from twisted.logger import Logger
from twisted.web import resource, server
from twisted.web.http import Request
from twisted.web.iweb import IRequest

from routerd.api.cors import CorsPolicy
from routerd.api.errors import answer_error
from routerd.api.webui import is_ui_path
from routerd.cluster.auth import AuthPolicy
from routerd.config.schema import Config
from routerd.errors import HTTPError
from routerd.logs import ACCESS_FORMAT, request_model

# Paths anyone on an allowed network may read without a key.
OPEN_PATHS = frozenset({"/health", "/metrics"})


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


class LimitedRequest(server.Request):
    """A request that stops buffering a body larger than the site's limit."""

    too_large = False
    _received = 0

    def __init__(self, channel: Any, queued: Any = None) -> None:
        clock = getattr(getattr(channel, "site", None), "reactor", None)
        self.started_at: float | None = clock.seconds() if clock is not None else None
        # routerd reads request bodies itself (bounded, replayable): twisted's
        # form parsing would parse every multipart upload a second time.
        if queued is None:
            super().__init__(channel, parsePOSTFormSubmission=False)  # type: ignore[no-untyped-call]
        else:
            super().__init__(channel, queued, parsePOSTFormSubmission=False)  # type: ignore[no-untyped-call]

    def gotLength(self, length: int | None) -> None:
        limit = getattr(getattr(self.channel, "site", None), "max_body_bytes", None)
        if limit is not None and length is not None and length > limit:
            self.too_large = True
            self.content = _Discard()
            return
        super().gotLength(length)  # type: ignore[no-untyped-call]

    def handleContentChunk(self, data: bytes) -> None:
        if self.too_large:
            return
        limit = getattr(getattr(self.channel, "site", None), "max_body_bytes", None)
        self._received += len(data)
        if limit is not None and self._received > limit:
            self.too_large = True
            self.content = _Discard()
            return
        super().handleContentChunk(data)  # type: ignore[no-untyped-call]


class GuardResource(resource.Resource):
    """Refuses oversized bodies and unauthorised callers before the app sees them."""

    isLeaf = True

    def __init__(self, inner: resource.IResource, policy: AuthPolicy, max_body_bytes: int,
                 cors_origins: tuple[str, ...] = ()) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.inner = inner
        self.policy = policy
        self.max_body_bytes = max_body_bytes
        self.cors = CorsPolicy.build(cors_origins)

    def update(self, policy: AuthPolicy, site: NodeSite, config: Config) -> None:
        """A reload: new keys and networks, body limit and CORS origins from now on."""
        self.policy = policy
        self.max_body_bytes = site.max_body_bytes = config.limits.max_body_bytes
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
            if is_ui_path(path):
                # the WebUI's static files: allowed networks only, but no key (the pages ask for it)
                if not self.policy.client_allowed(_client_host(request)):
                    raise HTTPError(403, "client address is not allowed", "forbidden", "forbidden")
            elif path not in OPEN_PATHS:
                self.policy.check(path, _client_host(request), request.getHeader(b"authorization"))
        except HTTPError as err:
            return answer_error(cast(IRequest, request), err)
        return self.inner.render(request)  # type: ignore[no-any-return]


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

    def __init__(self, root: resource.IResource, max_body_bytes: int) -> None:
        super().__init__(root)  # type: ignore[no-untyped-call]
        self.max_body_bytes = max_body_bytes
        self.displayTracebacks = False

    def log(self, request: Any) -> None:
        """One access line per answered request (namespace ``routerd.access``)."""
        access_line(request, self.reactor.seconds())


access_log = Logger(namespace="routerd.access")


def _header(request: Any, where: str, name: bytes) -> str | None:
    headers = request.responseHeaders if where == "out" else request.requestHeaders
    value = headers.getRawHeaders(name)
    return value[0].decode("utf-8", "replace") if value else None


def access_line(request: Any, now: float) -> None:
    """Logs ``request``'s access line: request id, method, path, model, node, status, bytes, ms,
    lent-to, client."""
    started = getattr(request, "started_at", None)
    query_model = request.args.get(b"model", [b""])[0].decode("utf-8", "replace") or None
    body: bytes | None = None
    content = getattr(request, "content", None)
    if content is not None and not getattr(request, "too_large", False):
        try:
            content.seek(0)
            body = content.read(65537)
        except (OSError, ValueError):
            body = None
    model = request_model(query_model, _header(request, "in", b"x-routerd-model"),
                          _header(request, "in", b"content-type") or "", body)
    access_log.info(ACCESS_FORMAT, method=request.method.decode("ascii", "replace"),
                    path=request.path.decode("utf-8", "replace"), status=request.code,
                    bytes=request.sentLength, ms=round((now - started) * 1000) if started else None,
                    model=model, node=_header(request, "out", b"x-routerd-node") or "-",
                    lent_to=_header(request, "out", b"x-routerd-lent-to") or "-",
                    request_id=_header(request, "out", b"x-routerd-request-id") or "-",
                    client=_client_host(request))
