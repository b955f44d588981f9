"""What parts read of this node's local side and current config, as bound methods instead of
closures: for lending, the config a lane has loaded, the queue bound and depth of local inference
and the queue's aging; for the front, the form-part limit (both read from the current config: a
reload replaces it)."""

from __future__ import annotations

from collections.abc import Callable

from routerd.backends.runtimes import Runtimes
from routerd.catalog.model import ModelConfig
from routerd.config.schema import Config
from routerd.inference.local import LocalInference
from routerd.lanes import Lane


class LocalSide:
    def __init__(self, runtimes: Runtimes, local: LocalInference, config: Callable[[], Config]) -> None:
        self.runtimes, self.local, self.config = runtimes, local, config

    def active_config(self, lane: Lane) -> str:
        return self.runtimes.loaded_config(lane) or ""

    def max_queued(self) -> int:
        return self.local.max_queued_per_model

    def queued_in_backend(self, model: ModelConfig) -> int:
        return self.local.queued.get(model.local_id, 0)

    def aging(self) -> float:
        return self.config().queue.aging

    def max_form_parts(self) -> int:
        return self.config().limits.max_form_parts
