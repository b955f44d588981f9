"""What travels with a lent request, and the one encoding of it as HTTP headers.

An owner lends through the master's relay (:class:`RelayRequest`: lane, owner, owner's model and
the inference path); the relay passes it to the helper as borrowed work (:class:`Borrowed`: who
owns it and whether the helper may load or must restore its model).  Both ride as
``X-Routerd-Offload-*`` headers: :func:`relay_headers`/:func:`relay_from_headers` and
:func:`borrowed_headers`/:func:`borrowed_from_headers` are the only writers and readers.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from routerd.errors import HTTPError
from routerd.wire.lending import LANES, Lane, Lease

OFFLOAD_RETURNED = "offload_returned"

Headers = tuple[tuple[bytes, bytes], ...]
#: Reads one request header by lower-case name ("" when absent).
HeaderGetter = Callable[[str], str]

_BORROWED = "x-routerd-offload"
_LOAD = "x-routerd-offload-load"
_RESTORE = "x-routerd-offload-restore"
_OWNER = "x-routerd-offload-owner"
_OWNER_MODEL = "x-routerd-offload-owner-model"
_LANE = "x-routerd-offload-lane"
_PATH = "x-routerd-offload-path"
_HELPER = "x-routerd-offload-helper"
_HELPER_MODEL = "x-routerd-offload-helper-model"


class Returned(Exception):
    """A lent request came back (409 ``offload_returned``, or the relay failed)."""


def offload_returned(message: str = "borrowed request handed back to its owner") -> HTTPError:
    return HTTPError(409, message, OFFLOAD_RETURNED, OFFLOAD_RETURNED)


@attrs.frozen
class Borrowed:
    """What the master's relay said about a borrowed request."""

    load_allowed: bool
    restore: bool
    owner_node_id: str = ""
    owner_model_id: str = ""


@attrs.frozen
class RelayRequest:
    """An owner's lent request, as the master's relay receives it: with the helper named by the
    lease the owner lent it under (empty from an owner of an older build), which the relay follows
    so the owner's ``lent`` row, held list and ``X-Routerd-Lent-To`` name the helper that serves it."""

    lane: Lane
    owner_node_id: str
    owner_model_id: str
    path: str
    helper_node_id: str = ""
    helper_model_id: str = ""

    @classmethod
    def lent_under(cls, lease: Lease, owner_model_id: str, path: str) -> RelayRequest:
        """The relay request of one request the owner lends under ``lease``."""
        return cls(lease.lane, lease.owner_node_id, owner_model_id, path, lease.helper_node_id,
                   lease.helper_model_id)


def relay_headers(relay: RelayRequest) -> Headers:
    out = [(_OWNER.encode(), relay.owner_node_id.encode()),
           (_OWNER_MODEL.encode(), relay.owner_model_id.encode()),
           (_LANE.encode(), relay.lane.encode()),
           (_PATH.encode(), relay.path.encode())]
    if relay.helper_node_id and relay.helper_model_id:
        out += [(_HELPER.encode(), relay.helper_node_id.encode()),
                (_HELPER_MODEL.encode(), relay.helper_model_id.encode())]
    return tuple(out)


def relay_from_headers(get: HeaderGetter) -> RelayRequest | None:
    """The relay request the headers describe; None when one is missing or the lane is unknown."""
    owner, model, lane, path = (get(name).strip() for name in (_OWNER, _OWNER_MODEL, _LANE, _PATH))
    if not owner or not model or not path:
        return None
    helper, helper_model = get(_HELPER).strip(), get(_HELPER_MODEL).strip()
    if not helper or not helper_model:
        helper = helper_model = ""
    for known in LANES:
        if lane == known:
            return RelayRequest(known, owner, model, path, helper, helper_model)
    return None


def borrowed_headers(borrowed: Borrowed) -> Headers:
    out = [(_BORROWED.encode(), b"1"), (_OWNER.encode(), borrowed.owner_node_id.encode()),
           (_OWNER_MODEL.encode(), borrowed.owner_model_id.encode())]
    if borrowed.load_allowed:
        out.append((_LOAD.encode(), b"1"))
    if borrowed.restore:
        out.append((_RESTORE.encode(), b"1"))
    return tuple(out)


def borrowed_from_headers(get: HeaderGetter) -> Borrowed | None:
    """The borrowed-work marks of a forwarded request; None for an ordinary forwarded call."""
    if get(_BORROWED) != "1":
        return None
    return Borrowed(load_allowed=get(_LOAD) == "1", restore=get(_RESTORE) == "1",
                    owner_node_id=get(_OWNER), owner_model_id=get(_OWNER_MODEL))
