"""What parts read of this node's local side and current config, as bound methods instead of
closures: for lending, the config a lane has loaded; for the front, the form-part limit; for the
key limiter and the router queue, the named keys' limits and weights; for the swap-avoiding order,
the model each lane's runtime holds and its settings.  What comes from the config
is read once per config (at start, then by each reload's :meth:`reload`), not once per request."""

from __future__ import annotations

from collections.abc import Mapping

from routerd.backends.runtimes import Runtimes
from routerd.config.keys import KeyLimits
from routerd.config.schema import Config
from routerd.lanes import Lane
from routerd.lending.queue import LaneQueue
from routerd.wire.lending import lane_key


class LocalSide:
    def __init__(self, runtimes: Runtimes, config: Config) -> None:
        self.runtimes = runtimes
        self._max_form_parts = config.limits.max_form_parts

    def reload(self, config: Config) -> None:
        self._max_form_parts = config.limits.max_form_parts

    def active_config(self, lane: Lane) -> str:
        return self.runtimes.loaded_config(lane) or ""

    def max_form_parts(self) -> int:
        return self._max_form_parts


class KeyBook:
    """The named inference keys' limits and fair-share weights, from the current config."""

    def __init__(self, config: Config) -> None:
        self._limits: dict[str, KeyLimits] = {}
        #: The fair-share weight of each named inference key (an unknown name weighs 1).
        self.weights: dict[str, float] = {}
        self.reload(config)

    def reload(self, config: Config) -> None:
        entries = config.auth.inference_entries()  # each name once (the config refuses a name twice)
        self._limits = {key.name: key.limits for key in entries}
        self.weights = {key.name: key.limits.weight for key in entries}

    def limits(self, key_name: str) -> KeyLimits | None:
        """The limits of the inference key named ``key_name`` (None for an unknown name)."""
        return self._limits.get(key_name)


class RuntimeModels:
    """Tells each lane queue the model its runtime holds or is loading, at every change of a
    runtime, and the swap-avoiding order's settings (``scheduling``) from the current config: the
    queue reads both as data (:mod:`routerd.lending.swap_batch`)."""

    def __init__(self, runtimes: Runtimes, queues: Mapping[Lane, LaneQueue], config: Config) -> None:
        self.runtimes, self.queues = runtimes, queues
        self.reload(config)
        runtimes.watch(self.changed)
        self.changed()

    def reload(self, config: Config) -> None:
        scheduling = config.scheduling
        for queue in self.queues.values():
            queue.swap.configure(scheduling.swap_batch, int(scheduling.swap_max_wait * 1000))

    def changed(self) -> None:
        for lane, queue in self.queues.items():
            config = self.runtimes.held_config(lane)
            queue.swap.loaded = None if config is None else lane_key(lane, config)
