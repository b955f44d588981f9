"""Peer pull (cluster reference §8.4): fetch a weight file by sha256 from a peer, verified before it
becomes visible.

One transfer per hash at a time (concurrent resolutions share it), at most
``models.concurrent_asset_transfers`` transfers at once, each bounded in rate.  Bytes land in
``<shared_dir>/sha256/<h[0:2]>/<h>/.partial``; a cut transfer resumes from the partial with ``Range``
(accepted only as 206 with a matching ``Content-Range``, else restarted).  The whole file is then
re-hashed off the reactor thread; a mismatch deletes the partial and the next source is tried; a
match is fsynced and renamed to ``…/<h>/<filename>`` and indexed (source ``peer_sha256``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import attrs
from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent

from routerd.assets.index import Asset, AssetIndex
from routerd.assets.paths import partial_path, safe_filename, shared_path
from routerd.assets.ranges import parse_content_range
from routerd.catalog.hashing import sha256_file
from routerd.paths import ASSET_PREFIX

ATTEMPTS_PER_SOURCE = 3
DEFAULT_RATE = 512 * 1024 * 1024  # bytes per second per transfer
DEFAULT_DEADLINE = 15 * 60.0  # seconds a transfer may take in all (reference §8.4)

log = Logger(namespace="routerd.assets.pull")


class PullFailed(Exception):
    """No source gave a file with the wanted hash; the message says what each one did."""


@attrs.define
class Transfer:
    """A transfer's progress (state API)."""

    sha256: str
    filename: str
    source: str = ""
    started: float = 0.0  # clock seconds when the transfer got its slot
    received: int = 0
    total: int | None = None
    state: str = "queued"  # queued | transferring | verifying | done | failed
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


class _Cut(Exception):
    """The body stopped before it was complete (resume with Range)."""


class _Sink(Protocol):
    """Writes a response body to an open file, pausing the transport to keep the rate bound."""

    def __init__(self, handle: Any, clock: IReactorTime, rate: int, on_bytes: Callable[[int], None]) -> None:
        self.handle = handle
        self.clock = clock
        self.rate = rate
        self.on_bytes = on_bytes
        self.done: defer.Deferred[None] = defer.Deferred()
        self._window_start = clock.seconds()
        self._window_bytes = 0

    def dataReceived(self, data: bytes) -> None:
        self.handle.write(data)
        self.on_bytes(len(data))
        now = self.clock.seconds()
        if now - self._window_start >= 1.0:
            self._window_start, self._window_bytes = now, 0
        self._window_bytes += len(data)
        if self._window_bytes >= self.rate and self.transport is not None:
            self.transport.pauseProducing()  # type: ignore[attr-defined]
            wait = max(0.0, self._window_start + 1.0 - now)
            self.clock.callLater(wait, self._resume)

    def _resume(self) -> None:
        self._window_start, self._window_bytes = self.clock.seconds(), 0
        if self.transport is not None:
            try:
                self.transport.resumeProducing()  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - the connection may be gone already
                pass

    def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:  # noqa: B008
        if reason.check(ResponseDone):
            self.done.callback(None)
        elif reason.check(PotentialDataLoss):
            self.done.callback(None)  # no Content-Length: the size check decides
        else:
            self.done.errback(_Cut(reason.getErrorMessage()))


class AssetPuller:
    """Pulls files by hash from peer URLs into the shared dir; see the module docstring."""

    def __init__(self, *, agent: IAgent, token: str, clock: IReactorTime, shared_dir: str,
                 index: AssetIndex, slots: int, run_in_thread: Callable[..., Any],
                 rate: int = DEFAULT_RATE, on_bytes: Callable[[int], None] = lambda _n: None,
                 deadline: float = DEFAULT_DEADLINE) -> None:
        self.agent = agent
        self.token = token
        self.clock = clock
        self.shared_dir = shared_dir
        self.index = index
        self.run_in_thread = run_in_thread
        self.rate = rate
        self.on_bytes = on_bytes
        self.deadline = deadline
        self.slots = defer.DeferredSemaphore(slots)
        self.transfers: dict[str, Transfer] = {}
        self._waiters: dict[str, list[defer.Deferred[Asset]]] = {}

    def pull(self, sha256: str, filename: str, sources: Sequence[str]) -> defer.Deferred[Asset]:
        """The asset once a source gave a verified copy; one transfer per hash at a time."""
        existing = self.index.get(sha256)
        if existing is not None:
            return defer.succeed(existing)
        out: defer.Deferred[Asset] = defer.Deferred()
        waiters = self._waiters.get(sha256)
        if waiters is not None:
            waiters.append(out)  # the transfer under way serves this caller too
            return out
        safe_filename(filename)
        self._waiters[sha256] = [out]
        self.transfers[sha256] = Transfer(sha256=sha256, filename=filename)

        def finish(result: Any) -> None:
            for waiter in self._waiters.pop(sha256, []):
                if isinstance(result, Failure):
                    waiter.errback(result)
                else:
                    waiter.callback(result)

        defer.ensureDeferred(self._pull(sha256, filename, list(sources))).addBoth(finish)
        return out

    async def _pull(self, sha256: str, filename: str, sources: list[str]) -> Asset:
        transfer = self.transfers[sha256]
        await self.slots.acquire()
        transfer.started = self.clock.seconds()
        try:
            problems: list[str] = []
            for source in sources:
                transfer.source = source
                try:
                    asset = await self._from(source, sha256, filename, transfer)
                except PullFailed as exc:
                    problems.append(f"{source}: {exc}")
                    transfer.reason = "; ".join(problems)  # sources refused so far
                    log.warn("pulling {sha256} from {source} failed: {reason}", sha256=sha256,
                             source=source, reason=str(exc))
                    continue
                transfer.state = "done"
                return asset
            transfer.state = "failed"
            transfer.reason = "; ".join(problems) or "no peer holds this file"
            raise PullFailed(transfer.reason)
        finally:
            self.slots.release()

    async def _from(self, source: str, sha256: str, filename: str, transfer: Transfer) -> Asset:
        partial = partial_path(self.shared_dir, sha256)
        os.makedirs(os.path.dirname(partial), exist_ok=True)
        url = source.rstrip("/") + ASSET_PREFIX + sha256
        for attempt in range(1, ATTEMPTS_PER_SOURCE + 1):
            if self._left(transfer) <= 0:
                raise PullFailed(f"the transfer deadline ({self.deadline:g} s) passed")
            have = os.path.getsize(partial) if os.path.exists(partial) else 0
            transfer.state = "transferring"
            try:
                complete = await self._fetch(url, partial, have, transfer)
            except _Cut as exc:
                log.info("transfer of {sha256} from {source} was cut at {received} bytes ({reason}); "
                         "resuming", sha256=sha256, source=source, received=transfer.received,
                         reason=str(exc))
                continue
            if complete:
                break
            if attempt == ATTEMPTS_PER_SOURCE:
                raise PullFailed("the transfer never completed")
        else:
            raise PullFailed("the transfer was cut too often")
        transfer.state = "verifying"
        final = shared_path(self.shared_dir, sha256, filename)
        asset: Asset | None = await self.run_in_thread(_verify_and_publish, partial, final, sha256)
        if asset is None:
            raise PullFailed("the received file does not have the expected sha256")
        self.index.add(asset)
        log.info("pulled {filename} ({sha256}, {size} bytes) from {source}", filename=filename,
                 sha256=sha256, size=asset.size, source=transfer.source)
        return asset

    def _left(self, transfer: Transfer) -> float:
        return transfer.started + self.deadline - self.clock.seconds()

    async def _fetch(self, url: str, partial: str, have: int, transfer: Transfer) -> bool:
        """Fetch into ``partial`` (resuming after ``have`` bytes); True when the body is complete.
        The transfer's deadline cancels a request or a body still under way."""
        expired: list[bool] = []
        current: list[Any] = []

        def expire() -> None:
            expired.append(True)
            for thing in current:
                if isinstance(thing, defer.Deferred):
                    thing.cancel()
                elif thing is not None:
                    thing.stopProducing()

        timer = self.clock.callLater(max(0.0, self._left(transfer)), expire)
        try:
            return await self._fetch_once(url, partial, have, transfer, current)
        except (_Cut, PullFailed, defer.CancelledError):
            if expired:
                raise PullFailed(f"the transfer deadline ({self.deadline:g} s) passed") from None
            raise
        finally:
            if timer.active():
                timer.cancel()

    async def _fetch_once(self, url: str, partial: str, have: int, transfer: Transfer,
                          current: list[Any]) -> bool:
        headers = Headers({b"authorization": [b"Bearer " + self.token.encode()]})
        if have:
            headers.addRawHeader(b"range", f"bytes={have}-".encode())
        requesting = self.agent.request(b"GET", url.encode(), headers)
        current[:] = [requesting]
        try:
            response = await requesting
        except defer.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any transport failure is a failed source
            raise PullFailed(f"unreachable: {exc}") from None
        code = int(response.code)
        total: int | None
        if have and code == 206:
            parsed = parse_content_range(_header(response, b"content-range"))
            if parsed is None or parsed[0] != have:
                response.deliverBody(_Discard())
                os.unlink(partial)
                return False
            total = parsed[2]
            mode = "ab"
        elif code == 200:
            total = response.length if isinstance(response.length, int) else None
            mode = "wb"
            have = 0
        else:
            response.deliverBody(_Discard())
            raise PullFailed(f"answered HTTP {code}")
        transfer.total = total
        transfer.received = have

        def counted(n: int) -> None:
            transfer.received += n
            self.on_bytes(n)

        with open(partial, mode) as handle:
            sink = _Sink(handle, self.clock, self.rate, counted)
            response.deliverBody(sink)
            current[:] = [sink.transport]
            try:
                await sink.done
            finally:
                handle.flush()
        return total is None or os.path.getsize(partial) >= total


class _Discard(Protocol):
    def dataReceived(self, data: bytes) -> None:
        pass


def _header(response: Any, name: bytes) -> str | None:
    values = response.headers.getRawHeaders(name)
    return values[0].decode("latin-1") if values else None


def _verify_and_publish(partial: str, final: str, sha256: str) -> Asset | None:
    """Blocking: hash the partial; on a match fsync and rename it to ``final`` (same folder), else
    delete it.  None on a mismatch."""
    if sha256_file(partial) != sha256:
        os.unlink(partial)
        return None
    with open(partial, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(partial, final)
    directory = os.open(os.path.dirname(final), os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    st = os.stat(final)
    return Asset(sha256=sha256, path=final, filename=os.path.basename(final), size=st.st_size,
                 mtime_ns=st.st_mtime_ns, source="peer_sha256")
