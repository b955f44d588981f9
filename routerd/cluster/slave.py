"""A slave's registration loop: register the local snapshot with the master at
startup and every ``sync_interval`` (a child ``IntervalService``).

A transient failure (master down, timeout, 5xx) is logged and retried on the
next tick; an identity clash (409 ``duplicate_node``) or an incompatible master
is terminal: the slave stops with a clear error rather than serve under an
identity the cluster refuses.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.application.service import MultiService
from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from routerd.clients.node_client import ClusterError, IncompatibleMaster, NodeClient, RemoteError
from routerd.services import IntervalService
from routerd.wire.records import Snapshot

log = Logger()


class RegistrationRefused(Exception):
    """The master refused this node for good (duplicate identity or protocol)."""


def is_terminal(exc: BaseException) -> bool:
    if isinstance(exc, IncompatibleMaster):
        return True
    return isinstance(exc, RemoteError) and (exc.is_duplicate_node or exc.is_incompatible_protocol)


class SlaveAgent(MultiService):
    def __init__(self, *, master_url: str, client: NodeClient, snapshot: Callable[[], Snapshot],
                 clock: IReactorTime, sync_interval: float,
                 on_terminal: Callable[[RegistrationRefused], None]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.master_url = master_url
        self.client = client
        self.snapshot = snapshot
        self.clock = clock
        self.sync_interval = sync_interval
        self.on_terminal = on_terminal
        self.registered = False
        IntervalService("registration", self._tick, sync_interval, clock).setServiceParent(self)  # type: ignore[no-untyped-call]

    async def start(self) -> None:
        """Register once (a terminal refusal raises); the service then keeps re-registering."""
        await self.register_once()

    def stop(self) -> None:
        """Stop re-registering (a terminal refusal, or the node stopping)."""
        if self.running:
            self.stopService()  # type: ignore[no-untyped-call]

    async def register_once(self) -> bool:
        try:
            await self.client.register(self.master_url, self.snapshot())
        except ClusterError as exc:
            if is_terminal(exc):
                raise RegistrationRefused(f"master {self.master_url} refused this node: {exc}") from exc
            self.registered = False
            log.warn("registration with {master} failed, retrying in {interval}s: {reason}",
                     master=self.master_url, interval=self.sync_interval, reason=str(exc))
            return False
        if not self.registered:
            log.info("registered with master {master}", master=self.master_url)
        self.registered = True
        return True

    def _tick(self) -> defer.Deferred[None]:
        def terminal(failure: Failure) -> None:
            failure.trap(RegistrationRefused)
            self.stop()
            self.on_terminal(failure.value)  # type: ignore[arg-type]

        d = defer.ensureDeferred(self.register_once())
        return d.addCallback(lambda _ok: None).addErrback(terminal)
