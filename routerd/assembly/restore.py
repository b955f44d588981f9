"""The node's restore-after-borrow hooks (``lending.restore`` decides): which config each runtime has
loaded, whether borrowed work is still in flight and how to load a config back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from routerd.backends.errors import LoadFailed
from routerd.backends.runtimes import Runtimes
from routerd.catalog.catalog import Catalog
from routerd.catalog.model import RUNTIME_KINDS
from routerd.inference.local import LocalInference
from routerd.lending.restore import Restorer
from routerd.lending.service import LendingService


def build_restorer(clock: Any, *, runtimes: Runtimes, local: LocalInference,
                   lending: LendingService, catalog: Callable[[], Catalog],
                   own_busy: Callable[[], bool], on_loaded: Callable[[], None]) -> Restorer:
    """A restorer over this node's runtimes (``catalog`` reads the current one); ``own_busy`` is
    the node's whole own work (requests and explicit loads), checked when the restore is due."""

    def loaded_config(kind: str) -> str | None:
        for known in RUNTIME_KINDS:
            if known == kind:
                return runtimes.loaded_config(known)
        return None

    def borrowed_in_flight() -> bool:
        return any(a.borrowed for a in local.active.values()) or bool(lending.borrowed_requests())

    async def restore_load(kind: str, config: str) -> None:
        model = next((m for m in catalog().models if m.filename == config), None)
        runtime = next((k for k in RUNTIME_KINDS if k == kind), None)
        if model is None or runtime is None:
            raise LoadFailed(f"{config} is no longer in the catalog")
        await runtimes.load(model, runtime)

    def delay() -> float:
        return lending.settings.offload_restore_delay

    return Restorer(clock=clock, delay=delay,
                    loaded_config=loaded_config, borrowed_in_flight=borrowed_in_flight,
                    own_busy=own_busy, load=restore_load, on_loaded=on_loaded)

