"""What a node's lending starts with and keeps: its links (both lanes), its effective settings and its
guardian models, read from the router database.

A master (and a site of one) keeps there what its operators saved.  A slave keeps there what its
master pushed last (:class:`PushedState`): the same link tables and guardian rows, and the pushed
settings as the whole override set (default < config < override, so the slave runs exactly the
master's values).  So a slave restarted while its master is down serves with its master's last links,
settings and guardians; the master's next push (at every registration) replaces them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

import attrs
from twisted.logger import Logger

from routerd.config.lending import LendingSettings
from routerd.lending.layering import effective
from routerd.lending.links import LinkSet
from routerd.routing.guardians import Guardian, GuardianError, GuardianSet, parse_guardian
from routerd.store.guardians import GuardianRow
from routerd.store.links import LinkRow
from routerd.store.store import Store
from routerd.wire.lending import Link

log = Logger()


class StateTarget(Protocol):
    """The seams of the node's lending service its stored or pushed state takes effect through."""

    def install_links(self, image: LinkSet, text: LinkSet) -> None: ...

    def install_guardians(self, guardians: GuardianSet) -> None: ...

    def apply_settings(self, settings: LendingSettings) -> None: ...


def link_rows(links: Iterable[Link]) -> list[LinkRow]:
    """Links as the store keeps them."""
    return [LinkRow(link.owner.node_id, link.owner.model_id, link.helper.node_id, link.helper.model_id,
                    link.load_if_unloaded, link.restore_after_borrow) for link in links]


def guardian_rows(entries: Iterable[Guardian]) -> list[GuardianRow]:
    """Guardian settings as the store keeps them."""
    return [GuardianRow(e.scope, e.node_id, e.model_id, e.guardian.node_id, e.guardian.model_id)
            for e in entries]


async def stored_guardians(store: Store) -> GuardianSet:
    """The stored guardian settings; a row that does not parse is skipped."""
    entries: list[Guardian] = []
    for row in await store.guardians():
        try:
            entries.append(parse_guardian(
                {"scope": row.scope, "node_id": row.node_id or None, "model_id": row.model_id or None,
                 "guardian": {"node_id": row.guardian_node_id, "model_id": row.guardian_model_id}}))
        except GuardianError:
            continue
    return GuardianSet(entries)


async def load_lending_state(
    store: Store, config_settings: LendingSettings
) -> tuple[LinkSet, LinkSet, LendingSettings]:
    """``(image links, text links, effective settings)`` from the router database.

    Settings are layered default < ``config_settings`` < stored override; an override that does
    not validate is logged and skipped.
    """
    image = LinkSet.from_rows("image", await store.links("image"))
    text = LinkSet.from_rows("text", await store.links("text"))
    settings, entries = effective(config_settings, await store.setting_overrides())
    for entry in entries:
        if "override_error" in entry:
            log.warn("stored lending setting override {key}={value!r} is ignored: {reason}",
                     key=entry["key"], value=entry.get("override"), reason=entry["override_error"])
    return image, text, settings


async def install_lending_state(store: Store, lending: StateTarget, config_settings: LendingSettings, *,
                                links: bool = True) -> None:
    """Install the stored state into the node's lending at start (``links`` False: a site of one,
    which has no other node to link to, keeps none)."""
    image, text, settings = await load_lending_state(store, config_settings)
    if links:
        lending.install_links(image, text)
    lending.apply_settings(settings)
    lending.install_guardians(await stored_guardians(store))


@attrs.define
class PushedState:
    """A slave's receipt of its master's pushes: each takes effect at once and is then kept in the
    router database (read back by :func:`install_lending_state` at the next start).  A write that
    fails is logged; the node runs with the push either way."""

    lending: StateTarget
    store: Callable[[], Store | None]

    async def links(self, image: LinkSet, text: LinkSet, guardians: GuardianSet) -> None:
        self.lending.install_links(image, text)
        self.lending.install_guardians(guardians)
        store = self.store()
        if store is None:
            return
        try:
            await store.replace_links("image", link_rows(image))
            await store.replace_links("text", link_rows(text))
            await store.replace_guardians(guardian_rows(guardians.entries))
        except Exception as exc:  # noqa: BLE001 - serving goes on with the push; only the copy is lost
            log.warn("keeping the master's links in the router database failed: {reason}", reason=str(exc))

    async def settings(self, settings: LendingSettings) -> None:
        self.lending.apply_settings(settings)
        store = self.store()
        if store is None:
            return
        try:
            await store.replace_setting_overrides(settings.texts())
        except Exception as exc:  # noqa: BLE001 - as for links
            log.warn("keeping the master's lending settings in the router database failed: {reason}",
                     reason=str(exc))


__all__ = ["PushedState", "StateTarget", "guardian_rows", "install_lending_state", "link_rows",
           "load_lending_state", "stored_guardians"]
