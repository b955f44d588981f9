"""The HTTP edge's side of :class:`routerd.routing.call.Reply` and :class:`~routerd.routing.call.Incoming`:
the only place the Twisted request meets the request path."""

from __future__ import annotations

from twisted.web.iweb import IRequest

from routerd.errors import ErrorStyle, style_for_path
from routerd.routing.call import Incoming


class RequestReply:
    """A :class:`~routerd.routing.call.Reply` writing into a Twisted request."""

    __slots__ = ("_request", "_gone")

    def __init__(self, request: IRequest) -> None:
        self._request = request
        self._gone = False
        request.notifyFinish().addErrback(self._lost)  # type: ignore[attr-defined]

    def _lost(self, _failure: object) -> None:
        self._gone = True

    @property
    def gone(self) -> bool:
        return self._gone

    @property
    def started(self) -> bool:
        return bool(getattr(self._request, "startedWriting", False))

    def set_status(self, code: int) -> None:
        self._request.setResponseCode(code)

    def set_header(self, name: bytes, value: bytes) -> None:
        self._request.setHeader(name, value)

    def write(self, data: bytes) -> None:
        self._request.write(data)

    def name_model(self, name: str) -> None:
        setattr(self._request, MODEL_ATTRIBUTE, name)

    @property
    def error_family(self) -> ErrorStyle:
        return request_family(self._request)


def request_family(request: IRequest) -> ErrorStyle:
    """The error family of ``request``'s route: admission's verdict, else its path's namespace's."""
    family: ErrorStyle | None = getattr(request, ERRORS_ATTRIBUTE, None)
    return family or style_for_path(request.path.decode("utf-8", "replace"))


def header(request: IRequest, name: bytes) -> str:
    value = request.getHeader(name)
    return value.decode("latin-1") if isinstance(value, bytes) else (value or "")


def query_args(request: IRequest) -> dict[str, list[str]]:
    args = getattr(request, "args", {}) or {}
    return {k.decode("utf-8", "replace"): [v.decode("utf-8", "replace") for v in vs]
            for k, vs in args.items()}


def query_values(request: IRequest, name: str) -> list[str]:
    """Every value of query parameter ``name``, trimmed, in order."""
    values = getattr(request, "args", {}).get(name.encode(), [])
    return [v.decode("utf-8", "replace").strip() for v in values]


def query_arg(request: IRequest, name: str) -> str | None:
    """The first value of query parameter ``name``, trimmed; None when absent."""
    values = query_values(request, name)
    return values[0] if values else None


def header_map(request: IRequest) -> dict[str, str]:
    """The request's fields as its edge admitted them (:class:`~routerd.api.head.RequestHead`:
    list fields joined, singletons once)."""
    head = getattr(request, HEAD_ATTRIBUTE, None)
    if head is not None:
        return dict(head.fields)
    out: dict[str, str] = {}
    for name, values in request.requestHeaders.getAllRawHeaders():
        out[name.decode("latin-1").lower()] = ", ".join(v.decode("latin-1") for v in values)
    return out


def read_body(request: IRequest) -> bytes:
    return request.content.read() if request.content is not None else b""


#: The request attribute holding its body once :func:`incoming` took it (the access line reads it).
BODY_ATTRIBUTE = "routerd_body"
#: The request attribute holding its :class:`~routerd.api.head.RequestHead` (set at admission).
HEAD_ATTRIBUTE = "routerd_head"
#: The request attribute holding the model routing found named (the access line prefers it).
MODEL_ATTRIBUTE = "routerd_model"
#: The request attribute holding the admitting key's (name, class) from the admission verdict.
KEY_ATTRIBUTE = "routerd_key"
#: The request attribute holding its route's error family (admission's verdict).
ERRORS_ATTRIBUTE = "routerd_errors"
#: The request attribute holding the admission verdict its channel reached at head time.
VERDICT_ATTRIBUTE = "routerd_verdict"


class _Emptied:
    """Stands in for a request's body buffer once the body was taken (see :func:`incoming`)."""

    __slots__ = ()

    def read(self, *_args: object) -> bytes:
        return b""

    def seek(self, *_args: object) -> int:
        return 0

    def close(self) -> None:
        pass


def incoming(request: IRequest, path: str) -> Incoming:
    """The request's facts routing reads, with ``path`` as the inference path it names.

    The body is taken out of the request's buffer: the bytes routing keeps are then the only copy
    while the request waits (10,000 held requests), and the access line finds them
    under :data:`BODY_ATTRIBUTE`."""
    body = read_body(request)
    if request.content is not None:
        request.content.close()
        request.content = _Emptied()
    setattr(request, BODY_ATTRIBUTE, body)
    key_name, key_class = getattr(request, KEY_ATTRIBUTE, ("", ""))
    return Incoming(path=path, body=body, content_type=header(request, b"content-type"),
                    query=query_args(request), headers=header_map(request), key_name=key_name,
                    key_class=key_class)
