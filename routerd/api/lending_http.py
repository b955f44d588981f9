"""What the lending routes (links, settings, push receipt) share: the node they need and JSON helpers.

The routes see the node through :class:`LendingNode`, a read-only protocol that
``routerd.node.Node`` satisfies and a small fake can too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from routerd.api.errors import master_only
from routerd.catalog.model import ModelConfig
from routerd.config.lending import LendingSettings
from routerd.errors import HTTPError
from routerd.lending.links import LinkSet
from routerd.routing.guardians import GuardianSet
from routerd.store.store import Store
from routerd.wire.records import ModelRecord


class RegistryView(Protocol):
    def records(self) -> Sequence[ModelRecord]: ...


class MasterView(Protocol):
    @property
    def registry(self) -> RegistryView: ...


class CatalogView(Protocol):
    def get(self, local_id: str) -> ModelConfig | None: ...


class LendingView(Protocol):
    """The seams of ``routerd.lending.service.LendingService`` these routes call."""

    @property
    def config_settings(self) -> LendingSettings: ...

    @property
    def settings(self) -> LendingSettings: ...

    def install_links(self, image: LinkSet, text: LinkSet) -> None: ...

    def install_guardians(self, guardians: GuardianSet) -> None: ...

    def apply_settings(self, settings: LendingSettings) -> None: ...

    async def push(self) -> None: ...


class LendingNode(Protocol):
    @property
    def node_id(self) -> str: ...

    @property
    def store(self) -> Store | None: ...

    @property
    def site(self) -> MasterView | None: ...

    @property
    def catalog(self) -> CatalogView: ...

    @property
    def lending(self) -> LendingView: ...






def require_site(node: LendingNode) -> MasterView:
    """The node's site (the master's, or a standalone node's site of one), or 404 on a slave."""
    if node.site is None:
        raise master_only()
    return node.site


def want_bool(value: Any, where: str, default: bool) -> bool:
    """A JSON boolean field (missing or null → ``default``); 400 naming ``where`` otherwise."""
    if value is None:
        return default
    if not isinstance(value, bool):
        raise HTTPError(400, f"{where} must be true or false")
    return value


def want_str(value: Any, where: str) -> str:
    """A JSON string field, trimmed; 400 naming ``where`` when it is missing or not a string."""
    if not isinstance(value, str):
        raise HTTPError(400, f"{where} is required and must be a string")
    return value.strip()


__all__ = [
    "CatalogView",
    "LendingNode",
    "LendingView",
    "MasterView",
    "RegistryView",
    "require_site",
    "want_bool",
    "want_str",
]
