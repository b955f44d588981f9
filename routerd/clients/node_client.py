"""The node-to-node HTTP client (cluster reference §2.3; contract §6).

Every call:

* goes only to a URL under an allow-listed base (:class:`AllowList`); anything else fails unsent
  with :class:`NotAllowed`;
* carries ``Authorization: Bearer <cluster token>``;
* follows at most 10 redirects, by hand, and only to targets under an allow-listed base; any other
  redirect is refused (:class:`RedirectRefused`) and nothing, least of all the token, is sent there;
* sends JSON bodies of at most 8 MiB (a larger one is refused before sending) and reads at most
  8 MiB of answer;
* is cancelled after ``control_timeout`` seconds (model load and unload after
  ``operation_timeout``), failing with :class:`ClusterTimeout`;
* turns a non-2xx answer into :class:`RemoteError` with the status and the envelope's ``type``,
  ``code`` and ``message``.

The HTTP client is injected ("treq-like": anything with treq's ``request`` signature, such as the
``treq`` module or ``treq.testing.StubTreq``), and so is the clock.
"""

from __future__ import annotations

import json
from typing import Any, Protocol, TypeVar
from urllib.parse import urldefrag, urljoin

import attrs
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.error import ConnectError, ConnectionClosed, DNSLookupError
from twisted.internet.error import TimeoutError as ConnectTimeout
from twisted.internet.protocol import Protocol as TwistedProtocol
from twisted.internet.protocol import connectionDone
from twisted.python.failure import Failure
from twisted.web.client import (
    RequestTransmissionFailed,
    ResponseDone,
    ResponseFailed,
    ResponseNeverReceived,
)
from twisted.web.http import PotentialDataLoss

from routerd.paths import NODE_LOAD, NODE_MODELS, NODE_REGISTER, NODE_RUNTIME_STATUS, NODE_UNLOAD
from routerd.urls import AllowList, URLError, normalise_url, split_target
from routerd.wire.records import (
    MINIMUM_PROTOCOL_VERSION,
    Snapshot,
    parse_snapshot,
    snapshot_to_json,
)
from routerd.wire.status import RuntimeStatus, parse_status

__all__ = [
    "MAX_JSON_BYTES",
    "MAX_REDIRECTS",
    "OPERATION_TIMEOUT",
    "ClusterError",
    "ClusterTimeout",
    "IncompatibleMaster",
    "InvalidResponse",
    "NodeClient",
    "NotAllowed",
    "RedirectRefused",
    "RegisterReply",
    "RemoteError",
    "RequestTooLarge",
    "ResponseTooLarge",
    "TooManyRedirects",
    "Unreachable",
    "TreqLike",
]

MAX_JSON_BYTES = 8 * 1024 * 1024
MAX_REDIRECTS = 10
# Remote model load/unload is bounded by the receiver's model-operation deadline instead of
# control_timeout (reference §1.2).
OPERATION_TIMEOUT = 15 * 60.0
_REDIRECT_CODES = frozenset({301, 302, 303, 307, 308})

T = TypeVar("T")


class ClusterError(Exception):
    """A cluster call that did not produce an answer; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NotAllowed(ClusterError):
    """The target is not under an allow-listed base URL; nothing was sent."""


class RedirectRefused(NotAllowed):
    """A redirect pointed outside the allow-list; it was not followed."""


class TooManyRedirects(ClusterError):
    pass


class RequestTooLarge(ClusterError):
    """The JSON request body is over the cap; nothing was sent."""


class ResponseTooLarge(ClusterError):
    pass


class ClusterTimeout(ClusterError):
    pass


class Unreachable(ClusterError):
    """The node could not be reached or the connection broke before its answer (refused, reset,
    DNS); a ClusterError like every other failed call, so callers need not know Twisted's errors."""


#: Transport failures a cluster call reports as :class:`Unreachable`.
_TRANSPORT_ERRORS = (ConnectError, ConnectTimeout, DNSLookupError, ConnectionClosed, ResponseFailed,
                     ResponseNeverReceived, RequestTransmissionFailed)


class InvalidResponse(ClusterError):
    """A 2xx answer that is not the JSON the call expects."""


class IncompatibleMaster(ClusterError):
    """The master accepted the registration but speaks too old a protocol (terminal)."""


class RemoteError(ClusterError):
    """A non-2xx answer from a node, decoded from its error envelope."""

    def __init__(self, status: int, type_: str, code: str, message: str, url: str = "") -> None:
        super().__init__(f"{url or 'node'} answered {status}: {message}")
        self.status = status
        self.type = type_
        self.code = code
        self.message = message
        self.url = url

    @property
    def is_duplicate_node(self) -> bool:
        """409 ``cluster_error``/``duplicate_node``: the only terminal registration refusal."""
        return self.status == 409 and self.type == "cluster_error" and self.code == "duplicate_node"

    @property
    def is_incompatible_protocol(self) -> bool:
        return self.status == 409 and self.code == "incompatible_protocol"


def _decode_error(status: int, raw: bytes, url: str) -> RemoteError:
    type_ = code = message = ""
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict):
            type_ = str(err.get("type") or "")
            code = str(err.get("code") or "")
            message = str(err.get("message") or "")
        elif isinstance(err, str):
            message = err
    if not message:
        message = raw[:500].decode("utf-8", "replace").strip() or f"HTTP {status}"
    return RemoteError(status, type_, code, message, url)


class TreqLike(Protocol):
    def request(self, method: str, url: str, **kwargs: Any) -> Deferred[Any]: ...


@attrs.frozen
class RegisterReply:
    ok: bool
    protocol_version: int


class _CappedBody(TwistedProtocol):
    """Collects a response body, failing with :class:`ResponseTooLarge` past ``cap`` bytes."""

    def __init__(self, cap: int, expected: int | None, url: str) -> None:
        self.cap = cap
        self.expected = expected
        self.url = url
        self.size = 0
        self.chunks: list[bytes] = []
        self.finished: Deferred[bytes] | None = Deferred(self._cancel)

    def _too_large(self) -> None:
        finished, self.finished = self.finished, None
        self._abort()
        if finished is not None:
            finished.errback(ResponseTooLarge(
                f"answer from {self.url} is larger than {self.cap} bytes"))

    def _abort(self) -> None:
        transport: Any = self.transport
        if transport is None:
            return
        lose = getattr(transport, "loseConnection", None)
        if lose is not None:
            lose()
        else:
            transport.stopProducing()

    def _cancel(self, _d: Deferred[bytes]) -> None:
        self.finished = None
        self._abort()

    def connectionMade(self) -> None:
        if self.expected is not None and self.expected > self.cap:
            self._too_large()

    def dataReceived(self, data: bytes) -> None:
        if self.finished is None:
            return
        self.size += len(data)
        if self.size > self.cap:
            self._too_large()
            return
        self.chunks.append(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        finished, self.finished = self.finished, None
        if finished is None:
            return
        if isinstance(reason.value, ResponseDone | PotentialDataLoss):
            finished.callback(b"".join(self.chunks))
        else:
            finished.errback(reason)


def _header(response: Any, name: bytes) -> str | None:
    values = response.headers.getRawHeaders(name)
    if not values:
        return None
    value: bytes | str = values[0]
    return value.decode("latin-1") if isinstance(value, bytes) else value


class NodeClient:
    """Authenticated JSON calls to other nodes; every method returns a cancellable Deferred."""

    def __init__(self, http: TreqLike, token: str, allowed: AllowList, control_timeout: float,
                 clock: Any, *, operation_timeout: float = OPERATION_TIMEOUT,
                 max_json_bytes: int = MAX_JSON_BYTES) -> None:
        self._http = http
        self._token = token.strip()
        self.allowed = allowed
        self.control_timeout = control_timeout
        self.operation_timeout = operation_timeout
        self.max_json_bytes = max_json_bytes
        self._clock = clock

    # -- generic calls ------------------------------------------------------------

    def get_json(self, base: str, path: str, *, timeout: float | None = None) -> Deferred[Any]:
        """``GET base+path`` and the decoded JSON answer (``None`` for an empty body)."""
        return self._call("GET", base, path, None, timeout)

    def post_json(self, base: str, path: str, body: Any, *,
                  timeout: float | None = None) -> Deferred[Any]:
        """``POST`` ``body`` as JSON to ``base+path`` and the decoded JSON answer."""
        return self._call("POST", base, path, body, timeout)

    def delete_json(self, base: str, path: str, *, timeout: float | None = None) -> Deferred[Any]:
        """``DELETE base+path`` and the decoded JSON answer."""
        return self._call("DELETE", base, path, None, timeout)

    # -- node API ---------------------------------------------------------------

    def register(self, master_url: str, snapshot: Snapshot) -> Deferred[RegisterReply]:
        """Register ``snapshot`` with the master; :class:`IncompatibleMaster` if the master's
        reported protocol version is below this node's minimum."""
        d = self.post_json(master_url, NODE_REGISTER, snapshot_to_json(snapshot))

        def check(doc: Any) -> RegisterReply:
            if not isinstance(doc, dict):
                raise InvalidResponse(f"registration answer from {master_url} is not an object")
            version = doc.get("protocol_version", 0)
            if isinstance(version, bool) or not isinstance(version, int):
                version = 0
            if version < MINIMUM_PROTOCOL_VERSION:
                raise IncompatibleMaster(
                    f"master {master_url} speaks protocol version {version}, below this node's "
                    f"minimum {MINIMUM_PROTOCOL_VERSION}; update the master")
            return RegisterReply(ok=doc.get("ok") is True, protocol_version=version)

        return d.addCallback(check)

    def models(self, url: str) -> Deferred[Snapshot]:
        """The node's snapshot (``GET /router/v1/node/models``); ``WireError`` if malformed."""
        return self.get_json(url, NODE_MODELS).addCallback(parse_snapshot)

    def runtime_status(self, url: str) -> Deferred[RuntimeStatus]:
        """The node's runtime status; ``WireError`` if malformed."""
        return self.get_json(url, NODE_RUNTIME_STATUS).addCallback(parse_status)

    def load(self, url: str, model: str) -> Deferred[Any]:
        """Ask the node to load its local model ``model``."""
        return self.post_json(url, NODE_LOAD, {"model": model},
                              timeout=self.operation_timeout)

    def unload(self, url: str, model: str | None = None, target: str | None = None) -> Deferred[Any]:
        """Ask the node to unload ``model`` and/or a runtime ``target`` (all when both absent)."""
        body: dict[str, str] = {}
        if model is not None:
            body["model"] = model
        if target is not None:
            body["target"] = target
        return self.post_json(url, NODE_UNLOAD, body, timeout=self.operation_timeout)

    # -- machinery ----------------------------------------------------------------

    def _call(self, method: str, base: str, path: str, body: Any,
              timeout: float | None) -> Deferred[Any]:
        limit = self.control_timeout if timeout is None else timeout
        inner = Deferred.fromCoroutine(self._exchange(method, base, path, body))
        return self._deadline(inner, limit, f"{method} {base}{path}")

    def _deadline(self, inner: Deferred[T], limit: float, what: str) -> Deferred[T]:
        why: list[str] = []

        def cancel(_outer: Deferred[T]) -> None:
            why.append("cancelled")
            inner.cancel()

        outer: Deferred[T] = Deferred(cancel)

        def expire() -> None:
            why.append("timeout")
            inner.cancel()

        call: Any = self._clock.callLater(limit, expire)

        def done(result: T | Failure) -> None:
            if call.active():
                call.cancel()
            if outer.called:
                return
            if isinstance(result, Failure):
                if why and why[0] == "timeout":
                    outer.errback(ClusterTimeout(f"{what} timed out after {limit:g}s"))
                elif why:
                    outer.errback(CancelledError(f"{what} was cancelled"))
                elif result.check(*_TRANSPORT_ERRORS):
                    reason = result.getErrorMessage() or getattr(result.type, "__name__", "error")
                    outer.errback(Unreachable(f"{what} failed: {reason}"))
                else:
                    outer.errback(result)
            else:
                outer.callback(result)

        inner.addBoth(done)
        return outer

    def _target(self, base: str, path: str) -> str:
        try:
            root = normalise_url(base)
        except URLError:
            raise NotAllowed(f'cluster target "{base}" is not allowed') from None
        if path and not path.startswith("/"):
            path = "/" + path
        url = root + path
        if not self.allowed.permits(url):
            raise NotAllowed(f'cluster target "{url}" is not allowed')
        return url

    def _headers(self, with_body: bool) -> dict[bytes, list[bytes]]:
        headers = {b"Authorization": [b"Bearer " + self._token.encode("utf-8")],
                   b"Accept": [b"application/json"]}
        if with_body:
            headers[b"Content-Type"] = [b"application/json"]
        return headers

    async def _read(self, response: Any, url: str) -> bytes:
        length = response.length if isinstance(response.length, int) else None
        reader = _CappedBody(self.max_json_bytes, length, url)
        finished = reader.finished
        assert finished is not None
        response.deliverBody(reader)
        return await finished

    async def _exchange(self, method: str, base: str, path: str, body: Any) -> Any:
        url = self._target(base, path)
        data: bytes | None = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode("utf-8")
            if len(data) > self.max_json_bytes:
                raise RequestTooLarge(
                    f"request body for {url} is {len(data)} bytes, over the "
                    f"{self.max_json_bytes}-byte limit")
        redirects = 0
        while True:
            response = await self._http.request(
                method, url, headers=self._headers(data is not None), data=data,
                allow_redirects=False, unbuffered=True)
            status = int(response.code)
            if status in _REDIRECT_CODES:
                location = _header(response, b"location")
                try:
                    await self._read(response, url)
                except ResponseTooLarge:
                    pass
                if not location:
                    raise InvalidResponse(f"{url} answered {status} without a Location")
                target = urldefrag(urljoin(url, location.strip()))[0]
                if not self._redirect_allowed(target):
                    raise RedirectRefused(
                        f'redirect from {url} to "{target}" is not allowed; not followed')
                if redirects >= MAX_REDIRECTS:
                    raise TooManyRedirects(f"{url}: stopped after {MAX_REDIRECTS} redirects")
                redirects += 1
                if status in (301, 302, 303) and method not in ("GET", "HEAD"):
                    method, data = "GET", None
                url = target
                continue
            raw = await self._read(response, url)
            if not 200 <= status < 300:
                raise _decode_error(status, raw, url)
            if not raw.strip():
                return None
            try:
                return json.loads(raw)
            except ValueError:
                raise InvalidResponse(f"{url} did not answer JSON") from None

    def _redirect_allowed(self, target: str) -> bool:
        try:
            split_target(target)
        except URLError:
            return False
        return self.allowed.permits(target)
