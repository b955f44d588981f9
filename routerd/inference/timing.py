"""A client answer that notes when its first body bytes went out (time to first token)."""

from __future__ import annotations

from twisted.internet.interfaces import IReactorTime

from routerd.routing.call import Reply


class FirstWrite:
    """Wraps a :class:`~routerd.routing.call.Reply`; ``first_write_at`` is the clock's time of the
    first non-empty ``write`` (``None`` until then)."""

    __slots__ = ("inner", "clock", "first_write_at")

    def __init__(self, inner: Reply, clock: IReactorTime) -> None:
        self.inner = inner
        self.clock = clock
        self.first_write_at: float | None = None

    @property
    def started(self) -> bool:
        return self.inner.started

    def set_status(self, code: int) -> None:
        self.inner.set_status(code)

    def set_header(self, name: bytes, value: bytes) -> None:
        self.inner.set_header(name, value)

    def write(self, data: bytes) -> None:
        if data and self.first_write_at is None:
            self.first_write_at = self.clock.seconds()
        self.inner.write(data)

    def name_model(self, name: str) -> None:
        self.inner.name_model(name)

    @property
    def gone(self) -> bool:
        return self.inner.gone


__all__ = ["FirstWrite"]
