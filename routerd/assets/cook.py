"""Cook: a model config (``.kcpps``) built from the model files a node's ``models.file_roots`` expose.

An operator names the files by path *relative to a file root* (weights, mmproj, image, whisper,
embeddings, TTS models) and the settings (context, parallel, GPU layers, extra args);
:func:`parse_order` checks the request, :func:`cook` resolves each path inside the roots (never
outside them: :func:`routerd.assets.paths.resolve_in_roots`) and builds the config, and says what
``routerd check`` would say of it (:mod:`routerd.catalog.problems` and the backend family check).
Those are decisions; :class:`CookShelf` performs them on the node's ``models.config_dir``: it writes
a config whole or not at all, and removes only configs Cook wrote (they carry :data:`MARK`), never a
hand-written one.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from routerd.assets.paths import UnsafePath, resolve_in_roots, walk_files
from routerd.backends.check import check_families
from routerd.catalog.backend_args import unsafe_arg
from routerd.catalog.kcpps import KCPPS_SUFFIX, config_from_mapping
from routerd.catalog.model import ModelConfig
from routerd.catalog.problems import near_miss_keys, weight_problems
from routerd.catalog.weight_kinds import file_kind, fits
from routerd.config.schema import Config
from routerd.families import backend_modes, is_declared
from routerd.files import write_json_atomically

#: The weight fields Cook fills (the ``.kcpps`` keys), in the order a form shows them.
FILE_FIELDS: tuple[str, ...] = ("model", "mmproj", "embeddingsmodel", "sdmodel", "whispermodel", "ttsmodel")
#: The key marking a config as Cook's: ``{"id", "files"}`` (the relative paths it was cooked from).
MARK = "routerd_cook"
#: A local model ID Cook accepts: it becomes the file name ``<id>.kcpps``.
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: Bounds of the numeric settings (a config outside them is refused, not clamped).
MAX_CONTEXT = 4_194_304
MAX_PARALLEL = 1024
MAX_GPU_LAYERS = 100_000
MAX_EXTRA_ARGS = 64


class CookError(ValueError):
    """A cook order that cannot be built; ``code`` names the rule it broke."""

    def __init__(self, message: str, code: str = "invalid_cook") -> None:
        super().__init__(message)
        self.code = code


@attrs.frozen
class CookOrder:
    """What to cook: the ID, the files (field → path relative to a file root) and the settings."""

    model_id: str
    files: Mapping[str, str]
    contextsize: int | None = None
    parallel: int | None = None
    gpulayers: int | None = None
    extra_args: tuple[str, ...] = ()
    backend_mode: str | None = None
    replace: bool = False


@attrs.frozen
class Cooked:
    """A built config: its file name, content, the model it parses to and what the check says."""

    order: CookOrder
    filename: str
    config: dict[str, Any]
    model: ModelConfig
    problems: tuple[str, ...]
    exists: bool

    def to_json(self) -> dict[str, Any]:
        caps = self.model.capabilities
        return {"id": self.order.model_id, "filename": self.filename, "config": self.config,
                "exists": self.exists,
                "model": {"local_id": self.model.local_id, "backend_mode": self.model.backend_mode,
                          "context": caps.context, "parallel": self.model.parallel,
                          "image_id": self.model.image_id,
                          "capabilities": sorted(k for k, v in attrs.asdict(caps).items() if v is True)},
                "check": {"ok": not self.problems, "errors": list(self.problems)}}


def valid_id(value: Any) -> str:
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value) or value.endswith(KCPPS_SUFFIX):
        raise CookError("id must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or "
                        "digit (it becomes <id>.kcpps)")
    return value


def _int(body: Mapping[str, Any], key: str, low: int, high: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CookError(f"{key} must be an integer from {low} to {high}")
    return value


def _extra_args(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if (not isinstance(value, list) or len(value) > MAX_EXTRA_ARGS
            or not all(isinstance(a, str) and a and "\x00" not in a for a in value)):
        raise CookError(f"extra_args must be a list of at most {MAX_EXTRA_ARGS} non-empty strings")
    problem = unsafe_arg(value)
    if problem is not None:
        raise CookError(problem, "unsafe_extra_arg")
    return tuple(value)


def parse_order(body: Mapping[str, Any]) -> CookOrder:
    """A :class:`CookOrder` from a request body; :class:`CookError` naming the first bad field."""
    known = {"node_id", "id", "files", "contextsize", "parallel", "gpulayers", "extra_args",
             "backend_mode", "replace"}
    unknown = sorted(set(body) - known)
    if unknown:
        raise CookError(f"unknown field {unknown[0][:60]!r} (known: {', '.join(sorted(known))})")
    files = body.get("files")
    if not isinstance(files, dict) or not files:
        raise CookError("files must name at least one model file: {field: path relative to a file root}")
    for field, path in files.items():
        if field not in FILE_FIELDS:
            raise CookError(f"files: unknown field {str(field)[:40]!r} (one of {', '.join(FILE_FIELDS)})")
        if not isinstance(path, str) or not path:
            raise CookError(f"files.{field} must be a path relative to a file root")
    mode = body.get("backend_mode")
    if mode is not None and not is_declared(mode):
        raise CookError("backend_mode must be one of " + ", ".join(backend_modes()))
    replace = body.get("replace", False)
    if not isinstance(replace, bool):
        raise CookError("replace must be true or false")
    return CookOrder(model_id=valid_id(body.get("id")), files=dict(files),
                     contextsize=_int(body, "contextsize", 0, MAX_CONTEXT),
                     parallel=_int(body, "parallel", 1, MAX_PARALLEL),
                     gpulayers=_int(body, "gpulayers", -1, MAX_GPU_LAYERS),
                     extra_args=_extra_args(body.get("extra_args")), backend_mode=mode, replace=replace)


def cook(order: CookOrder, roots: Sequence[str], config_dir: str, node_config: Config,
         exists: Callable[[str], bool] = os.path.exists) -> Cooked:
    """Resolve ``order``'s files inside ``roots`` and build its config; :class:`CookError` when a
    path leaves the roots or the config does not parse.  Problems ``routerd check`` would report
    (a missing backend binary, a misspelt key) are in :attr:`Cooked.problems`, not raised."""
    if not roots:
        raise CookError("no models.file_roots are configured on this node", "no_file_roots")
    config: dict[str, Any] = {}
    for field in FILE_FIELDS:
        if field in order.files:
            try:
                config[field] = resolve_in_roots(order.files[field], roots)
            except UnsafePath as exc:
                raise CookError(f"files.{field}: {exc}", "unsafe_path") from None
    for key in ("contextsize", "parallel", "gpulayers", "backend_mode"):
        value = getattr(order, key)
        if value is not None:
            config[key] = value
    if order.extra_args:
        config["extra_args"] = list(order.extra_args)
    config[MARK] = {"id": order.model_id, "files": dict(order.files)}
    filename = order.model_id + KCPPS_SUFFIX
    path = os.path.join(config_dir, filename)
    try:
        model = config_from_mapping(config, path, node_config.backend.mode)
    except ValueError as exc:
        raise CookError(f"the config would not load: {exc}", "invalid_config") from None
    problems = (weight_problems(model) + near_miss_keys(filename, config)
                + check_families(node_config, [model])[0])
    return Cooked(order=order, filename=filename, config=config, model=model, problems=tuple(problems),
                  exists=exists(path))


def model_files(roots: Sequence[str]) -> list[dict[str, Any]]:
    """Every file under the roots, named relative to its root, with its kind as read from the file
    (:mod:`routerd.catalog.weight_kinds`; ``null`` when it cannot be told) and the ``fields`` it may
    fill: what a Cook form offers in each slot (a whisper file is not offered as the text model)."""
    out: list[dict[str, Any]] = []
    for index, root in enumerate(roots):
        real_root = os.path.realpath(root)
        for real in walk_files(root):
            try:
                size = os.path.getsize(real)
            except OSError:
                continue
            found = file_kind(real)
            out.append({"path": os.path.relpath(real, real_root), "root": index, "size": size,
                        "kind": found.kind, "detail": found.detail,
                        "fields": [f for f in FILE_FIELDS if fits(f, found.kind)]})
    return out


@attrs.define
class CookShelf:
    """Performs Cook's decisions on one folder (the node's ``models.config_dir``)."""

    config_dir: str

    def _path(self, model_id: str) -> str:
        return os.path.join(self.config_dir, valid_id(model_id) + KCPPS_SUFFIX)

    def write(self, cooked: Cooked) -> str:
        """Write ``cooked`` whole (temporary file, fsync, rename); refuse to overwrite an existing
        config unless the order says ``replace`` (and then only one Cook wrote)."""
        path = self._path(cooked.order.model_id)
        if os.path.exists(path):
            if not cooked.order.replace:
                raise CookError(f"{cooked.filename} exists; send replace: true to overwrite it", "exists")
            self._cooked_or_refuse(path)
        write_json_atomically(path, cooked.config, mode=0o644)
        return path

    def remove(self, model_id: str) -> str:
        """Remove the config Cook wrote as ``model_id``; a hand-written one is refused."""
        path = self._path(model_id)
        if not os.path.isfile(path):
            raise CookError(f"no config {model_id}.kcpps on this node", "not_found")
        self._cooked_or_refuse(path)
        os.unlink(path)
        return path

    def cooked(self) -> list[dict[str, Any]]:
        """The configs of the folder Cook wrote: ``{id, files}`` each, by ID."""
        out = []
        for name in sorted(os.listdir(self.config_dir)) if os.path.isdir(self.config_dir) else ():
            if name.endswith(KCPPS_SUFFIX) and ID_PATTERN.fullmatch(name[:-len(KCPPS_SUFFIX)]):
                mark = _mark(os.path.join(self.config_dir, name))
                if mark is not None:
                    out.append({"id": name[:-len(KCPPS_SUFFIX)], "files": mark.get("files", {})})
        return out

    @staticmethod
    def _cooked_or_refuse(path: str) -> None:
        if _mark(path) is None:
            raise CookError(f"{os.path.basename(path)} was not written by Cook; it is left as it is",
                            "not_cooked")


def _mark(path: str) -> dict[str, Any] | None:
    """The :data:`MARK` of the config at ``path``, or None when it has none or cannot be read."""
    try:
        with open(path, encoding="utf-8-sig") as handle:
            raw = json.load(handle)
    except (OSError, ValueError):
        return None
    mark = raw.get(MARK) if isinstance(raw, dict) else None
    return mark if isinstance(mark, dict) else None


__all__ = ["FILE_FIELDS", "MARK", "CookError", "CookOrder", "CookShelf", "Cooked", "cook", "model_files",
           "parse_order", "valid_id"]
