"""The node's model catalog: every ``.kcpps`` file in ``models.config_dir``.

A :class:`Catalog` is immutable; a rescan builds a new one.  Scanning is
synchronous and cheap (it reads only the small config files); the weight-file
hashes are filled in afterwards, off the reactor thread, by :meth:`Catalog.hashed`
(or :func:`routerd.catalog.hashing.hash_models` plus :meth:`Catalog.with_hashes`).

Which files are configs: regular (or unreadable) entries whose name ends with
``.kcpps`` and does not start with ``.`` (editor lock and backup files), in
file-name order.  A bad file never aborts the scan; it is listed in
:attr:`Catalog.invalid` with its reason.

Lookups: :meth:`get` by local ID; :meth:`by_image_id` by image ID;
:meth:`resolve` tries the local ID first, then the image ID.  Should two
configs share an image ID the first in file-name order answers.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

import attrs
from twisted.internet.defer import Deferred

from routerd.catalog.hashing import FileHashCache, RunInThread, hash_models
from routerd.catalog.kcpps import KCPPS_SUFFIX, parse_kcpps
from routerd.catalog.model import InvalidConfig, ModelConfig, RuntimeKind


class CatalogError(Exception):
    """The config directory itself cannot be scanned (missing, not a directory, unreadable)."""


def _is_config_name(name: str) -> bool:
    return name.endswith(KCPPS_SUFFIX) and not name.startswith(".") and len(name) > len(KCPPS_SUFFIX)


def _same_config(a: ModelConfig, b: ModelConfig) -> bool:
    """Equal apart from ``model_hash`` (``options`` is already excluded from equality)."""
    return attrs.evolve(a, model_hash="") == attrs.evolve(b, model_hash="")


class Catalog:
    """An immutable snapshot of the node's model configs."""

    __slots__ = ("_config_dir", "_models", "_invalid", "_by_id", "_by_image_id")

    def __init__(
        self,
        models: Iterable[ModelConfig] = (),
        invalid: Iterable[InvalidConfig] = (),
        config_dir: str = "",
    ) -> None:
        self._config_dir = config_dir
        self._models: tuple[ModelConfig, ...] = tuple(models)
        self._invalid: tuple[InvalidConfig, ...] = tuple(invalid)
        self._by_id: dict[str, ModelConfig] = {}
        self._by_image_id: dict[str, ModelConfig] = {}
        for model in self._models:
            self._by_id.setdefault(model.local_id, model)
            if model.image_id is not None:
                self._by_image_id.setdefault(model.image_id, model)

    @classmethod
    def scan(cls, config_dir: str, default_backend_mode: str) -> Catalog:
        """Parse every ``*.kcpps`` in ``config_dir`` (sorted by file name).

        Raises :class:`CatalogError` only when the directory cannot be listed.
        """
        directory = os.path.abspath(config_dir)
        if not os.path.exists(directory):
            raise CatalogError(f"models.config_dir {directory} does not exist")
        if not os.path.isdir(directory):
            raise CatalogError(f"models.config_dir {directory} is not a directory")
        try:
            with os.scandir(directory) as entries:
                names = sorted(e.name for e in entries if _is_config_name(e.name) and not _is_dir(e))
        except OSError as exc:
            raise CatalogError(
                f"models.config_dir {directory} cannot be read: {exc.strerror or exc}"
            ) from exc
        models: list[ModelConfig] = []
        invalid: list[InvalidConfig] = []
        for name in names:
            parsed = parse_kcpps(os.path.join(directory, name), default_backend_mode)
            if isinstance(parsed, InvalidConfig):
                invalid.append(parsed)
            else:
                models.append(parsed)
        return cls(models, invalid, directory)

    # -- contents -------------------------------------------------------------

    @property
    def config_dir(self) -> str:
        return self._config_dir

    @property
    def models(self) -> tuple[ModelConfig, ...]:
        return self._models

    @property
    def invalid(self) -> tuple[InvalidConfig, ...]:
        return self._invalid

    def __iter__(self) -> Iterator[ModelConfig]:
        return iter(self._models)

    def __len__(self) -> int:
        return len(self._models)

    def __repr__(self) -> str:
        return f"<Catalog {self._config_dir!r}: {len(self._models)} models, {len(self._invalid)} invalid>"

    # -- lookups --------------------------------------------------------------

    def get(self, local_id: str) -> ModelConfig | None:
        return self._by_id.get(local_id)

    def by_image_id(self, image_id: str) -> ModelConfig | None:
        return self._by_image_id.get(image_id)

    def resolve(self, selector: str) -> ModelConfig | None:
        """The config a request's ``model`` names: local ID first, then image ID."""
        return self._by_id.get(selector) or self._by_image_id.get(selector)

    def serving(self, kind: RuntimeKind) -> list[ModelConfig]:
        """Configs a runtime of this kind can serve, in catalog order."""
        return [m for m in self._models if m.capabilities.serves(kind)]

    @property
    def fully_hashed(self) -> bool:
        return all(m.model_hash for m in self._models)

    # -- hashing --------------------------------------------------------------

    def with_hashes(self, hashed: Iterable[ModelConfig]) -> Catalog:
        """A new catalog whose configs take ``model_hash`` from ``hashed``.

        A hashed config replaces the entry with the same local ID only if it is
        otherwise identical (so hashes computed for an older scan never land on
        a changed config); everything else is kept as it is.
        """
        by_id = {h.local_id: h for h in hashed}
        models = []
        for model in self._models:
            candidate = by_id.get(model.local_id)
            if candidate is not None and _same_config(candidate, model):
                model = attrs.evolve(model, model_hash=candidate.model_hash)
            models.append(model)
        return Catalog(models, self._invalid, self._config_dir)

    def hashed(self, cache: FileHashCache, run_in_thread: RunInThread) -> Deferred[Catalog]:
        """Hash every config's weight files off the reactor thread; fires with a
        new, fully hashed catalog."""
        d = hash_models(self._models, cache, run_in_thread)
        return d.addCallback(self.with_hashes)


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


__all__ = ["Catalog", "CatalogError"]
