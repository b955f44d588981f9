"""The replay budget and the request that holds bytes of it.

:class:`BufferBudget` is the bytes every live request's buffered body may hold together
(``limits.replay_buffer_mb``).  :class:`LimitedRequest` is twisted.web's request under it: admitted
at head time by its channel, it reserves its body's bytes (all of a ``Content-Length`` at once, a
chunked body as it arrives) and gives them back exactly once, when it finishes or its connection is
lost; a chunked body past the body limit or the budget is discarded, and answered 413 / 503 by the
guard (:class:`~routerd.api.site.GuardResource`).
"""

from __future__ import annotations

from typing import Any

from twisted.web import server

from routerd.api.admission import Verdict
from routerd.api.head import RequestHead
from routerd.api.reply import HEAD_ATTRIBUTE, VERDICT_ATTRIBUTE


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
    """The bytes every live request's buffered body may hold together (``limits.replay_buffer_mb``),
    and what each holder holds of them.

    A holder is who a request is counted to (admission's :attr:`~routerd.api.admission.Verdict.holder`:
    its inference key, else its client address; "" for none, a master's forwarded requests).  One
    holder may hold at most ``share`` of the budget, or one body of ``floor`` bytes
    (``limits.max_body_mb``) when that is more: one client's slow bodies cannot take every byte
    from the others.  :meth:`arriving` counts a holder's requests admitted whose bodies are still
    arriving: what a key's ``max_concurrent`` is checked against at their heads (once a body is
    whole, the request is the inference front's to count)."""

    def __init__(self, limit: int, share: float = 1.0, floor: int = 0) -> None:
        self.limit = limit
        self.used = 0
        self.share = share
        self.floor = floor
        self._held: dict[str, tuple[int, int]] = {}  # holder -> (bytes, requests whose bodies arrive)

    @property
    def free(self) -> int:
        return max(0, self.limit - self.used)

    def free_for(self, holder: str) -> int:
        """The bytes ``holder`` may still take."""
        free = self.free
        if not holder:
            return free
        cap = max(int(self.limit * self.share), self.floor)
        return max(0, min(free, cap - self._held.get(holder, (0, 0))[0]))

    def arriving(self, holder: str) -> int:
        """How many of ``holder``'s requests are admitted with their bodies still arriving."""
        return self._held.get(holder, (0, 0))[1] if holder else 0

    def fits(self, size: int) -> bool:
        return self.used + size <= self.limit

    def take(self, size: int, holder: str = "", arriving: bool = True) -> bool:
        """Reserve ``size`` bytes for a body counted to ``holder``: about to arrive, or whole already
        (not ``arriving``: it came with its head, and no :meth:`arrived` follows)."""
        if not self.fits(size):
            return False
        self.used += size
        if holder:
            held, count = self._held.get(holder, (0, 0))
            self._held[holder] = (held + size, count + 1 if arriving else count)
        return True

    def arrived(self, holder: str) -> None:
        """A body :meth:`take` reserved for has arrived whole (its bytes stay held)."""
        if holder in self._held:
            held, arriving = self._held[holder]
            self._held[holder] = (held, max(0, arriving - 1))

    def give(self, size: int, holder: str = "", arriving: bool = False) -> None:
        """Give back ``size`` bytes ``holder`` held (for a body still ``arriving``, or one that arrived)."""
        self.used = max(0, self.used - size)
        if holder and holder in self._held:
            held, count = self._held[holder]
            held, count = held - size, count - 1 if arriving else count
            if held <= 0 and count <= 0:
                del self._held[holder]
            else:
                self._held[holder] = (max(0, held), max(0, count))


class LimitedRequest(server.Request):
    """A request admitted at head time (see the module docstring): its body's bytes are reserved
    from the replay budget (all of a ``Content-Length`` at once, a chunked body as it arrives) and
    given back once; a chunked body past the body limit or the budget is discarded, and answered
    413 / 503 by the guard."""

    too_large = False
    over_buffer = False
    _received = 0
    _held = 0
    _holder = ""  # who the reserved bytes are counted to (chunked bytes are counted to no one)
    _arriving = False  # the reserved body is still arriving
    _reserved = False

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

    def admitted(self, head: RequestHead, verdict: Verdict) -> None:
        """The channel admitted this request: keep the verdict and reserve its body's bytes."""
        setattr(self, HEAD_ATTRIBUTE, head)
        setattr(self, VERDICT_ATTRIBUTE, verdict)
        if verdict.reserve:
            budget = self._budget()
            if budget is not None and budget.take(verdict.reserve, verdict.holder):
                self._held, self._holder, self._arriving = verdict.reserve, verdict.holder, True
        self._reserved = head.length is not None

    def handleContentChunk(self, data: bytes) -> None:
        if self.too_large or self.over_buffer:
            return
        if not self._reserved:  # a chunked body: the limit and the budget as it arrives
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

    def body_arrived(self) -> None:
        """The whole body is here (its bytes stay held until the answer)."""
        budget = self._budget()
        if self._arriving and budget is not None:
            budget.arrived(self._holder)
        self._arriving = False

    def _release(self) -> None:
        held, self._held = self._held, 0
        budget = self._budget()
        if held and budget is not None:
            budget.give(held, self._holder, self._arriving)
        self._arriving = False

    def finish(self) -> None:
        self._release()
        super().finish()  # type: ignore[no-untyped-call]

    def connectionLost(self, reason: Any) -> None:
        self._release()
        super().connectionLost(reason)  # type: ignore[no-untyped-call]


__all__ = ["BufferBudget", "LimitedRequest"]
