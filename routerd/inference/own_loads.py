"""Model loads a node makes for itself on an operator's word (spec "A helper's own work", "Probes"):
``POST /router/v1/load`` and the node and site load routes, an Ollama preload, the
startup model, a reload of a changed config.

Each is the node's own work while it runs: the node is busy (not idle for probes, not accepting
borrowed work), borrowed work that has not claimed the runtime the load takes goes back first, and
the end of the load restarts the node's own-idle clock, as the end of an own request does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from twisted.internet.defer import Deferred

from routerd.catalog.model import ModelConfig, RuntimeKind

T = TypeVar("T")


class OwnLoads:
    """Counts the explicit loads under way (``running``) and tells the node when one starts/ends."""

    def __init__(self, load: Callable[[ModelConfig, RuntimeKind | None], Deferred[None]], *,
                 starting: Callable[[ModelConfig, RuntimeKind | None], None],
                 done: Callable[[], None]) -> None:
        self._load = load
        self.starting = starting  # own work arrived: borrowed work on that runtime gives way
        self.done = done  # own work ended: the idle clock starts again
        self.running = 0

    def load(self, model: ModelConfig, kind: RuntimeKind | None = None) -> Deferred[None]:
        """Load ``model`` (into ``kind``, or every runtime it serves) as the node's own work."""
        return self.run(model, kind, lambda: self._load(model, kind))

    def run(self, model: ModelConfig, kind: RuntimeKind | None,
            start: Callable[[], Deferred[T]]) -> Deferred[T]:
        """Run ``start()`` (a load of ``model``) as the node's own work until it fires."""
        self.running += 1
        try:
            self.starting(model, kind)
            loading = start()
        except BaseException:
            self._ended()
            raise

        def ended(result: T) -> T:
            self._ended()
            return result

        return loading.addBoth(ended)

    def _ended(self) -> None:
        self.running -= 1
        self.done()


__all__ = ["OwnLoads"]
