"""Reload without a restart (``SIGHUP``, ``POST /router/v1/reload``).

A reload re-reads the YAML and rescans ``models.config_dir``:

* **Config.** :func:`config_changes` compares the running config with the new one key by key
  (dotted names such as ``auth.admin_keys``). Keys in :data:`LIVE_KEYS` (keys, CIDRs, CORS origins,
  the models folder, keep-alive, intervals and timeouts, lending settings, limits, analytics) take effect at
  once; any other changed key (bind address, role, node ID, token, URLs, store, binaries, ...)
  needs a restart and is named in the answer and the log, its running value kept.
  :func:`live_config` builds the config the node runs with from then on.
* **Models.** :func:`catalog_diff` names the added, removed and changed configs (a change is a
  different file name or content hash). :func:`slot_actions` decides what each runtime does: one
  holding a removed model unloads it, one holding a changed model loads the new config. Both are
  queued on the runtime's slot, which waits for the requests it is serving to finish first, so a
  model is never swapped or stopped mid-request.
* **Cluster.** A master refreshes its own records and re-polls its slaves; a slave re-registers.

:class:`Reloader` performs a reload on the running config, catalog and runtimes it is given (never
the node); the decisions above are pure functions.  Reloads never overlap: a second one waits for the first.
"""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Generic, Literal, Protocol, TypeVar

import attrs
from twisted.internet.defer import Deferred, DeferredLock, ensureDeferred
from twisted.logger import Logger

from routerd.backends.runtimes import Runtimes
from routerd.backends.slot import RuntimeSlot
from routerd.catalog.catalog import Catalog, CatalogError
from routerd.catalog.model import ModelConfig
from routerd.config.load import ConfigError
from routerd.config.schema import Config
from routerd.inference.own_loads import OwnLoads

log = Logger()
S = TypeVar("S")
R = TypeVar("R")

#: Config keys (dotted; a trailing dot covers a whole section) a reload applies at once.
LIVE_KEYS: tuple[str, ...] = (
    "auth.",
    "server.allowed_cidrs",
    "server.cors_origins",
    "server.allowed_hosts",
    "server.trusted_proxies",
    "server.drain_timeout",
    "models.config_dir",
    "models.keep_alive",
    "cluster.sync_interval",
    "cluster.health_interval",
    "cluster.control_timeout",
    "cluster.lending.",
    "limits.",
    "queue.",
    "scheduling.",
    "analytics.",
)


def is_live(key: str) -> bool:
    return any(key.startswith(live) if live.endswith(".") else key == live for live in LIVE_KEYS)


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"server.bind": ..., "cluster.lending.scheduling_min_samples": ...}`` of an attrs tree."""
    out: dict[str, Any] = {}
    for field in attrs.fields(type(value)):
        item = getattr(value, field.name)
        key = f"{prefix}{field.name}"
        if attrs.has(type(item)):
            out.update(flatten(item, key + "."))
        else:
            out[key] = item
    return out


@attrs.frozen
class ConfigChanges:
    applied: tuple[str, ...]  # changed keys that take effect now
    restart_required: tuple[str, ...]  # changed keys that keep their running value until a restart


def config_changes(old: Config, new: Config) -> ConfigChanges:
    before, after = flatten(old), flatten(new)
    changed = sorted(k for k in before.keys() | after.keys()
                     if k != "source" and before.get(k) != after.get(k))
    return ConfigChanges(tuple(k for k in changed if is_live(k)),
                         tuple(k for k in changed if not is_live(k)))


def _evolve_live(old: Any, new: Any, prefix: str) -> Any:
    """``old`` with every live key under ``prefix`` taken from ``new``."""
    changes: dict[str, Any] = {}
    for field in attrs.fields(type(old)):
        key = f"{prefix}{field.name}"
        before, after = getattr(old, field.name), getattr(new, field.name)
        if before == after:
            continue
        if is_live(key) or is_live(key + "."):
            changes[field.name] = after
        elif attrs.has(type(before)):
            changes[field.name] = _evolve_live(before, after, key + ".")
    return attrs.evolve(old, **changes) if changes else old


def live_config(old: Config, new: Config) -> Config:
    """The config to run with after a reload: ``new``'s live keys, ``old``'s everything else."""
    return _evolve_live(old, new, "")  # type: ignore[no-any-return]


@attrs.frozen
class CatalogDiff:
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]


def _key(model: ModelConfig) -> tuple[str, str]:
    return (model.filename, model.config_hash)


def catalog_diff(old: Catalog, new: Catalog) -> CatalogDiff:
    before = {m.local_id: m for m in old.models}
    after = {m.local_id: m for m in new.models}
    return CatalogDiff(
        added=tuple(sorted(after.keys() - before.keys())),
        removed=tuple(sorted(before.keys() - after.keys())),
        changed=tuple(sorted(i for i in before.keys() & after.keys() if _key(before[i]) != _key(after[i]))))


@attrs.frozen
class SlotAction(Generic[S]):
    slot: S
    name: str  # the runtime's name (``llama-server``, ``koboldcpp``, ...)
    model_id: str
    action: Literal["reload", "unload"]
    config: ModelConfig | None = None  # the new config to load (``reload``)


def slot_actions(loaded: Iterable[tuple[S, str, ModelConfig]], catalog: Catalog,
                 places: Callable[[S, ModelConfig], bool]) -> list[SlotAction[S]]:
    """What each runtime (``slot``, its name, the config it holds) does about the new catalog:
    nothing when its model is unchanged, ``unload`` when its model is gone (or would now run
    elsewhere: ``places`` says whether a slot is where a model runs), ``reload`` with the new config
    when the model's config changed."""
    actions: list[SlotAction[S]] = []
    for slot, name, held in loaded:
        current = catalog.get(held.local_id)
        if current is None or not places(slot, current):
            actions.append(SlotAction(slot, name, held.local_id, "unload"))
        elif _key(current) != _key(held):
            actions.append(SlotAction(slot, name, held.local_id, "reload", current))
    return actions


@attrs.frozen
class ReloadReport:
    config: ConfigChanges
    models: CatalogDiff
    actions: tuple[SlotAction[Any], ...]
    invalid: tuple[tuple[str, str], ...]  # (file name, reason) of configs that did not parse

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": True,
            "applied": list(self.config.applied),
            "restart_required": list(self.config.restart_required),
            "models": {"added": list(self.models.added), "removed": list(self.models.removed),
                       "changed": list(self.models.changed),
                       "reloading": self._named("reload"), "unloading": self._named("unload"),
                       "invalid": [{"filename": f, "reason": r} for f, r in self.invalid]},
        }


    def _named(self, action: str) -> list[dict[str, str]]:
        return [{"model": a.model_id, "runtime": a.name} for a in self.actions if a.action == action]


class ReloadFailed(Exception):
    """The new config or models folder cannot be used; nothing was changed."""

    def __init__(self, errors: Iterable[str]) -> None:
        self.errors = list(errors)
        super().__init__("; ".join(self.errors))


class Replaceable(Protocol[R]):
    """Something a reload replaces: the running config, the catalog."""

    def get(self) -> R: ...

    def set(self, value: R) -> None: ...


class Reloader:
    """Performs reloads on the running config and catalog (``config``, ``catalog``) and the
    runtimes; ``apply_live_config(old, new)`` makes the live keys take effect and ``announce()``
    tells the cluster about the new models (master: refresh and re-poll; slave: register)."""

    def __init__(self, *, config: Replaceable[Config], catalog: Replaceable[Catalog], runtimes: Runtimes,
                 apply_live_config: Callable[[Config, Config], Awaitable[None]],
                 announce: Callable[[], Awaitable[None]], read_config: Callable[[], Config],
                 hash_catalog: Callable[[Catalog], Deferred[Catalog]],
                 own_loads: OwnLoads | None = None) -> None:
        self.config, self.catalog, self.runtimes = config, catalog, runtimes
        self.apply_live_config, self.announce = apply_live_config, announce
        self.own_loads = own_loads  # a changed config's reload is the node's own work while it runs
        self.read_config = read_config
        self.hash_catalog = hash_catalog
        self.on_applied: list[Callable[[Config], None]] = []
        self._lock = DeferredLock()

    def reload(self) -> Deferred[ReloadReport]:
        """Reload (after any reload under way); fails with :class:`ReloadFailed`, changing nothing."""
        return self._lock.run(lambda: ensureDeferred(self._reload()))

    async def _reload(self) -> ReloadReport:
        try:
            new = self.read_config()
        except ConfigError as exc:
            raise ReloadFailed(exc.errors) from None
        old = self.config.get()
        changes = config_changes(old, new)
        running = live_config(old, new)
        try:
            scanned = Catalog.scan(running.models.config_dir, running.backend.mode)
        except CatalogError as exc:
            raise ReloadFailed([str(exc)]) from None
        catalog = await self.hash_catalog(scanned)
        diff = catalog_diff(self.catalog.get(), catalog)
        runtimes = self.runtimes
        loaded = [(slot, slot.name, held) for slot in runtimes.slots()
                  if (held := slot.loaded_config()) is not None]
        actions = slot_actions(loaded, catalog, runtimes.places)
        self.config.set(running)
        self.catalog.set(catalog)
        await self.apply_live_config(old, running)
        for hook in self.on_applied:
            hook(running)
        for action in actions:
            self._perform(action)
        report = ReloadReport(changes, diff, tuple(actions),
                              tuple((bad.filename, bad.reason) for bad in catalog.invalid))
        log.info("reloaded: models added {added}, removed {removed}, changed {changed}; config applied "
                 "{applied}; needs a restart: {restart_required}", added=list(diff.added),
                 removed=list(diff.removed), changed=list(diff.changed), applied=list(changes.applied),
                 restart_required=list(changes.restart_required))
        if changes.restart_required:
            log.warn("config keys changed that need a restart to take effect: {keys}",
                     keys=", ".join(changes.restart_required))
        for bad in catalog.invalid:
            log.warn("model config {filename} is invalid: {reason}", filename=bad.filename, reason=bad.reason)
        await self.announce()
        return report

    def _perform(self, action: SlotAction[RuntimeSlot]) -> None:
        """Queue the action on the runtime's slot: it runs once the slot's current users finish."""
        slot = action.slot
        if action.action == "unload":
            log.info("{model} was removed: unloading it from {runtime} when idle",
                     model=action.model_id, runtime=action.name)
            done = slot.unload()
        else:
            assert action.config is not None
            log.info("{model}'s config changed: reloading it on {runtime} when idle",
                     model=action.model_id, runtime=action.name)
            config = action.config
            done = slot.load(config) if self.own_loads is None else \
                self.own_loads.run(config, slot.kind, lambda: slot.load(config))
        done.addErrback(lambda failure: log.warn("{action} of {model} after a reload failed: {reason}",
                                                 action=action.action, model=action.model_id,
                                                 reason=failure.getErrorMessage()))

    def reload_logged(self) -> None:
        """Reload, logging the outcome (``SIGHUP``)."""
        def failed(failure: Any) -> None:
            if failure.check(ReloadFailed):
                for line in failure.value.errors:
                    log.error("reload refused, nothing changed: {error}", error=line)
            else:
                log.failure("reload failed", failure=failure)

        self.reload().addCallback(lambda _report: None).addErrback(failed)


def install_sighup(reactor: Any, reloader: Reloader) -> None:
    """Reload on ``SIGHUP`` (whose default action would end the process)."""
    signal.signal(signal.SIGHUP, lambda _signum, _frame: reactor.callFromThread(reloader.reload_logged))


__all__ = ["LIVE_KEYS", "CatalogDiff", "ConfigChanges", "ReloadFailed", "ReloadReport", "Replaceable",
           "Reloader", "SlotAction", "catalog_diff", "config_changes", "install_sighup", "live_config",
           "slot_actions"]
