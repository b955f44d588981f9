"""Holders for what a node replaces while it runs: the catalog (a reload, a bound portable config),
the store (opened at start) and the config (a reload).  Parts built once read the current value
through a holder's bound :meth:`Current.get`, so nothing needs a late-binding closure over the node;
:class:`Held` makes the node's own attribute read through the holder, and :class:`Late` holds a
part built after the ones that reach it (the master's coordinator)."""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Current(Generic[T]):
    """The current value of something replaced while the node runs."""

    def __init__(self, value: T) -> None:
        self._value = value

    def get(self) -> T:
        return self._value

    def set(self, value: T) -> None:
        self._value = value


class Late(Generic[T]):
    """A part set once by the wiring, after the parts that call :meth:`get` were built."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._value: T | None = None

    def get(self) -> T:
        if self._value is None:
            raise RuntimeError(f"{self._what} is read before the node was wired")
        return self._value

    def set(self, value: T) -> None:
        self._value = value


class Held(Generic[T]):
    """A node attribute read and replaced through its holder, the attribute ``current_<name>``
    (so ``node.catalog = hashed`` reaches every part given ``node.current_catalog.get``)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._holder = f"current_{name}"

    def __get__(self, node: object, owner: type | None = None) -> T:
        holder: Current[T] = getattr(node, self._holder)
        return holder.get()

    def __set__(self, node: object, value: T) -> None:
        holder: Current[T] = getattr(node, self._holder)
        holder.set(value)
