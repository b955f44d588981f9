"""How an owner's lending reaches the master: in-process on the master, over HTTP on a slave.

:class:`LendingTransport` is what :class:`~routerd.lending.service.LendingService` is built with:
report a queue event (answered with the owner's lease, or none), send a lent request to the
helper the lease names (through the master's relay), and push links and settings (the master
only).  ``InProcess`` calls the master's side directly: :class:`MasterSide` declares the calls it
makes, which the coordinator (:mod:`routerd.lending.coordinator`) answers, so this module needs
nothing of it.  ``ViaMaster`` posts to the master's node API with the offload headers of
:mod:`routerd.lending.offload`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import urlencode

from routerd.lending.offload import RelayRequest, Returned, relay_headers
from routerd.paths import EVENT_PATH, RELAY_PATH
from routerd.routing.call import Call, Reply
from routerd.routing.forward import CameBack, Forwarder, Outbound, Unreachable, record_headers
from routerd.wire.lending import Lane, Lease, Trigger, from_json


class LendingTransport(Protocol):
    async def event(self, lane: Lane, model_id: str, trigger: Trigger) -> Lease | None: ...

    async def lend(self, call: Call, lease: Lease, model_id: str, *,
                   answering: Callable[[], None] | None = None) -> bytes:
        """Send ``call`` to the helper; its answer streams into ``call.reply``.  Raises
        :class:`Returned` when it comes back before anything was written.  ``answering`` is called
        once the helper has started answering (its response headers arrived, and it is not a
        return): from then on the lent cut-off no longer applies."""

    async def push(self) -> None:
        """Push links and settings to the slaves (a no-op off the master)."""

    async def refresh(self) -> None:
        """The site's links or settings changed: push them, then plan at once (a no-op off the
        master)."""


class MasterSide(Protocol):
    """The master's calls an owner on the master itself makes in process (the coordinator)."""

    async def event(self, lane: Lane, owner_node_id: str, model_id: str, trigger: Trigger) -> Lease | None:
        """Plan now for an owner's queue event; that owner's lease, or None."""

    async def relay(self, reply: Reply, relay: RelayRequest, call: Call, *,
                    rewrite_to: str | None, returns_raise: bool,
                    answering: Callable[[], None] | None = None) -> bytes:
        """Send a lent request to the helper the live lease names; its answer goes into ``reply``
        (a 409 raises ``CameBack`` when ``returns_raise``)."""

    async def push(self) -> None:
        """Push links and settings to every healthy slave."""

    async def refresh(self) -> None:
        """Push links and settings, then plan (what the refresh tick does), now."""


class NoMaster:
    """A standalone node: no master to report to, nothing is ever lent."""

    async def event(self, lane: Lane, model_id: str, trigger: Trigger) -> Lease | None:
        return None

    async def lend(self, call: Call, lease: Lease, model_id: str, *,
                   answering: Callable[[], None] | None = None) -> bytes:
        raise Returned("this node has no master")

    async def push(self) -> None:
        return None

    async def refresh(self) -> None:
        return None


class InProcess:
    """The master's own models: events, relays and pushes are calls on its coordinator."""

    def __init__(self, node_id: str, coordinator: Callable[[], MasterSide]) -> None:
        self.node_id = node_id
        # The coordinator is built after the lending service this transport belongs to: read late.
        self._coordinator = coordinator

    async def event(self, lane: Lane, model_id: str, trigger: Trigger) -> Lease | None:
        return await self._coordinator().event(lane, self.node_id, model_id, trigger)

    async def lend(self, call: Call, lease: Lease, model_id: str, *,
                   answering: Callable[[], None] | None = None) -> bytes:
        relay = RelayRequest.lent_under(lease, model_id, call.path)
        try:
            return await self._coordinator().relay(call.reply, relay, call,
                                                   rewrite_to=call.selector or model_id, returns_raise=True,
                                                   answering=answering)
        except CameBack as exc:
            raise Returned(str(exc)) from None

    async def push(self) -> None:
        await self._coordinator().push()

    async def refresh(self) -> None:
        await self._coordinator().refresh()


class _MasterClient(Protocol):
    def post_json(self, base: str, path: str, body: Any) -> Any: ...


class ViaMaster:
    """A slave: events are posted to the master, lent requests go through its relay."""

    def __init__(self, node_id: str, master_url: str, client: _MasterClient, forwarder: Forwarder) -> None:
        self.node_id = node_id
        self.master_url = master_url
        self.client = client
        self.forwarder = forwarder

    async def event(self, lane: Lane, model_id: str, trigger: Trigger) -> Lease | None:
        body = {"lane": lane, "owner_node_id": self.node_id, "model_id": model_id, "trigger": trigger}
        answer = await self.client.post_json(self.master_url, EVENT_PATH, body)
        lease = answer.get("lease") if isinstance(answer, dict) else None
        return None if lease is None else from_json(lease, Lease)

    async def lend(self, call: Call, lease: Lease, model_id: str, *,
                   answering: Callable[[], None] | None = None) -> bytes:
        query = urlencode([(k, v) for k, vs in call.query.items() for v in vs])
        url = self.master_url.rstrip("/") + RELAY_PATH
        relay = RelayRequest.lent_under(lease, model_id, call.path)
        out = Outbound(url=url + (f"?{query}" if query else ""), body=call.body,
                       content_type=call.content_type, request_id=call.request_id,
                       headers=(*relay_headers(relay), *record_headers(call)),
                       rewrite_to=call.selector or model_id, returns_raise=True,
                       on_answer=answering, trace=call.trace)
        try:
            _code, result = await self.forwarder.send(call.reply, out)
        except (CameBack, Unreachable) as exc:
            raise Returned(str(exc)) from None
        return result

    async def push(self) -> None:
        return None

    async def refresh(self) -> None:
        return None
