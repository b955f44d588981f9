"""One client inference request as it moves through a node, and the answer it is owed.

:class:`Incoming` is what the HTTP edge read off the wire; :class:`Call` is that request once
classified and parsed (route, body, parsed JSON, stream flag, request id, selector).  Neither holds
the Twisted request: the answer goes out through :class:`Reply`, a small interface the edge
implements (``routerd.api.reply``) and tests fake, so routing and lending never see ``IRequest``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Protocol

import attrs

from routerd.config.keys import DEFAULT_CLASS, PRIORITY_CLASSES, PriorityClass, PriorityError, requested_class
from routerd.errors import HTTPError
from routerd.routing.classify import Route
from routerd.tracing import NO_SPAN, Span

#: What a master tells the node it forwards a request to: the name and class of the key that
#: admitted it (read only on the cluster's paths, where the cluster token vouches for them).
KEY_NAME_HEADER = "x-routerd-key-name"
KEY_CLASS_HEADER = "x-routerd-key-class"
#: A client's request to run in a lower class than its key's (never a higher one).
PRIORITY_HEADER = "x-routerd-priority"
#: A client's session, the first key ``routing.replica_choice: affinity`` reads (never logged as is).
SESSION_HEADER = "x-session-id"

#: What a master (or a lending relay) tells the node that serves a request, for its analytics row:
#: the public ID the client asked for, and that a guardian answers it in that model's place
#: (read only on the cluster's paths, as the key's name).
PUBLIC_MODEL_HEADER = "x-routerd-public-model"
AS_GUARDIAN_HEADER = "x-routerd-as-guardian"


def sent_public_model(value: str) -> str:
    """The public ID a cluster caller's :data:`PUBLIC_MODEL_HEADER` names: "" unless it is 1 to 256
    printable characters."""
    return value if value and len(value) <= 256 and value.isprintable() else ""


def new_request_id() -> str:
    return os.urandom(8).hex()


class Reply(Protocol):
    """The answer to one client request: status and headers first, then body bytes."""

    @property
    def started(self) -> bool:
        """Whether any of the answer has gone out (status and headers can no longer change)."""

    def set_status(self, code: int) -> None: ...

    def set_header(self, name: bytes, value: bytes) -> None: ...

    def write(self, data: bytes) -> None: ...

    def name_model(self, name: str) -> None:
        """The model the request named, for its access line (read once by routing)."""

    @property
    def gone(self) -> bool:
        """Whether the client has disconnected (nothing more can reach it)."""


@attrs.frozen(weakref_slot=False)
class Incoming:
    """What the HTTP edge read of a request: path, body and the headers and query routing reads."""

    path: str
    body: bytes
    content_type: str = ""
    query: Mapping[str, list[str]] = attrs.field(factory=dict)
    headers: Mapping[str, str] = attrs.field(factory=dict)  # lower-case names, list fields joined
    #: The name of the API key that admitted the request ("" when none or keys are unnamed); the
    #: key itself never travels past the edge.
    key_name: str = ""
    #: The class of that key (``interactive``/``standard``/``batch``; "" = the default).
    key_class: str = ""

    def header(self, name: str) -> str:
        return self.headers.get(name, "")


def request_class(incoming: Incoming) -> PriorityClass:
    """The class ``incoming`` runs in: its key's, lowered by ``X-Routerd-Priority`` (never raised);
    400 ``invalid_priority`` for a value that names no class."""
    own = incoming.key_class if incoming.key_class in PRIORITY_CLASSES else DEFAULT_CLASS
    try:
        return requested_class(own, incoming.header(PRIORITY_HEADER))
    except PriorityError as exc:
        raise HTTPError(400, str(exc), "invalid_request_error", "invalid_priority") from None


@attrs.define(weakref_slot=False)
class Outcome:
    """What happened, for metrics and samples."""

    status: str = "ok"
    http_status: int = 200
    work: tuple[float, ...] = ()
    reason: str = ""  # a failure's message, as answered (the request log's reason)
    cached_tokens: int = 0  # prompt tokens the backend's cache served, where it reports them


@attrs.define(weakref_slot=False)  # slotted, no weak references: one per held request
class Call:
    reply: Reply
    route: Route
    path: str
    body: bytes
    content_type: str
    parsed: dict[str, Any] | None
    stream: bool
    request_id: str
    started: float
    selector: str | None
    query: Mapping[str, list[str]] = attrs.field(factory=dict)
    outcome: Outcome = attrs.Factory(Outcome)
    borrowed: bool = False  # lent to this node by another owner
    restore_after_borrow: bool = False  # borrowed, and the lease asks to restore the displaced model
    guardian_restore: bool = False  # a same-node guardian answers: load the displaced model back
    guardian_fallback: bool = False  # a guardian applies: a backend refusing the image raises ImageRefused
    serving_since: float | None = None  # when the backend slot was acquired
    priority: PriorityClass = DEFAULT_CLASS  # its class (key's class, maybe lowered by X-Routerd-Priority)
    key_name: str = ""  # the name of the key that admitted it (never the key)
    session: str = ""  # its X-Session-Id header (replica affinity reads it; "" = none)
    queue_position: int = 0  # its place in the router queue's class order on arrival (0: none)
    # What analytics records of the call (contract §9), set where it happens:
    model_id: str = ""  # the local ID of the model that served or lent it on this node
    public_model: str = ""  # the public ID the client asked for (a master's label, or its header)
    lent_from: str = ""  # "owner_node/owner_model" of a borrowed request
    forwarded_to: str = ""  # the node the master forwarded it to (that node records it)
    lent_to: str = ""  # "helper_node/helper_model" when this owner lent it away
    guardian: bool = False  # a guardian model answered it
    trace: Span = NO_SPAN  # its span on this node (routerd.tracing; the no-op when tracing is off)


@attrs.define
class ActiveRequest:
    request_id: str
    model_id: str
    route: str
    runtime: str
    started_ms: int
    state: str = "waiting"
    borrowed: bool = False

    def to_json(self, now_ms: int) -> dict[str, Any]:
        return {"request_id": self.request_id, "model_id": self.model_id, "route": self.route,
                "runtime": self.runtime, "state": self.state, "started_ms": self.started_ms,
                "borrowed": self.borrowed,
                "elapsed_ms": max(0, now_ms - self.started_ms)}
