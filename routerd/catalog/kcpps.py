"""Parse one ``.kcpps`` model config into a :class:`ModelConfig` (contract §3).

A ``.kcpps`` file is a koboldcpp-style JSON object; the file stem is the local
model ID.  :func:`parse_kcpps` reads the one file and never raises for bad
content: anything it cannot use becomes an :class:`InvalidConfig` whose reason
names the offending key.

Rules kept deliberately simple (and relied on by the rest of routerd):

* A weight key (``model``/``model_param``, ``mmproj``, ``embeddingsmodel``,
  ``sdmodel``, ``whispermodel``, ``ttsmodel``, and KoboldCpp's music keys
  ``musicllm``, ``musicembeddings``, ``musicdiffusion``, ``musicvae``) holds a path string; ``""``,
  ``null`` and ``[]`` mean "unset" (koboldcpp writes empty strings for unused
  slots).  A list of strings (koboldcpp's multi-file ``--model``) counts as its
  first non-empty entry.  ``model`` wins over ``model_param`` when both are set.
* Relative weight paths resolve against the ``.kcpps`` file's directory; ``~``
  expands.  Stored paths are absolute and normalised.
* Capabilities: ``llm`` iff a text model is set; ``image`` iff ``sdmodel``;
  ``embeddings`` iff ``embeddingsmodel``, or ``"embeddings": true`` together with
  a text model; ``multimodal`` iff ``llm`` and ``mmproj``; ``stt`` iff
  ``whispermodel``; ``tts`` iff ``ttsmodel``; ``music`` iff ``musicllm`` or
  ``musicdiffusion`` (what KoboldCpp needs to load music).  ``context`` is ``contextsize``;
  a config of a family whose program runs with it (vLLM) prefers
  ``vllm.settings.max_model_length``; either one fills in when the other is
  absent; 0 when neither is stated.
* Portable configs (cluster reference §8.5): ``<field>_hash`` (64 lowercase hex)
  and optionally ``<field>_filename`` (a bare file name) name a weight file by
  sha256.  A hash with no path still makes the field *set* for capabilities (a
  portable text hash gives ``llm``); its path stays ``None`` until the node binds
  it to a verified file (:meth:`ModelConfig.unbound_fields`).
* Integers must be JSON integers (``true``/``4096.0``/``"4096"`` are refused):
  ``contextsize`` ≥ 0 (0 = not stated), ``parallel`` and the two vLLM settings
  ≥ 1; ``null`` means unset.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from collections.abc import Mapping
from typing import Any, cast

from routerd.catalog.model import MUSIC_FIELDS, Capabilities, InvalidConfig, ModelConfig
from routerd.families import declared, is_declared, modes_phrase
from routerd.replica_modes import MODES, Mode

KCPPS_SUFFIX = ".kcpps"
NO_MODEL_FILE = "config names no model file"

# Endings stripped from a weights file name to form an image ID (contract §3),
# longest first so ``x.sim.json`` loses the whole ``.sim.json``.
IMAGE_ID_ENDINGS: tuple[str, ...] = (".sim.json", ".safetensors", ".gguf", ".ckpt")
# A string ending with one of these is treated as a path by the config hash.
WEIGHT_EXTENSIONS: tuple[str, ...] = IMAGE_ID_ENDINGS + (".bin", ".pt", ".pth", ".onnx")
# Top-level keys whose (non-empty) value is always a path.
PATH_KEYS: frozenset[str] = frozenset(
    {"model", "model_param", "mmproj", "embeddingsmodel", "sdmodel", "whispermodel", "ttsmodel",
     *MUSIC_FIELDS}
)
PATH_MARKER = "<path>"
# Weight keys that may be given portably as ``<key>_hash`` (+ ``<key>_filename``).
PORTABLE_KEYS: tuple[str, ...] = ("model", "mmproj", "embeddingsmodel", "sdmodel", "whispermodel", "ttsmodel",
                                  *MUSIC_FIELDS)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# Raw keys not carried in ``ModelConfig.options`` (cluster.md §3.3).
OPTION_EXCLUDED_KEYS: frozenset[str] = frozenset({"mcp_servers", "mcp_enabled", "mcpfile"})


def bad_backend_mode() -> str:
    """Why a ``backend_mode`` naming no declared family is refused."""
    return "backend_mode must be " + modes_phrase()


class _Invalid(Exception):
    """Internal: carries an InvalidConfig reason out of the field readers."""


def local_id_of(path: str) -> str:
    """The local model ID of a ``.kcpps`` path: its file name minus ``.kcpps``."""
    name = os.path.basename(path)
    if name.endswith(KCPPS_SUFFIX) and len(name) > len(KCPPS_SUFFIX):
        return name[: -len(KCPPS_SUFFIX)]
    return os.path.splitext(name)[0]


def weights_file_name(value: str) -> str:
    """The last path component, splitting on both ``/`` and ``\\``."""
    return value.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]


def strip_weights_ending(name: str) -> str:
    """``name`` without a ``.gguf``/``.safetensors``/``.ckpt``/``.sim.json`` ending
    (case-insensitive); any other name is returned unchanged."""
    lowered = name.lower()
    for ending in IMAGE_ID_ENDINGS:
        if lowered.endswith(ending) and len(name) > len(ending):
            return name[: -len(ending)]
    return name


def image_id_for(local_id: str, sd_model: str) -> str:
    """``<local_id>-<sdmodel file name without its weights ending>``."""
    return f"{local_id}-{strip_weights_ending(weights_file_name(sd_model))}"


def looks_like_path(value: str) -> bool:
    lowered = value.lower()
    return "/" in value or "\\" in value or any(lowered.endswith(ext) for ext in WEIGHT_EXTENSIONS)


def _normalise(value: Any) -> Any:
    if isinstance(value, str):
        return PATH_MARKER if looks_like_path(value) else value
    if isinstance(value, Mapping):
        return {str(k): _normalise(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normalise(v) for v in value]
    return value


def _is_set(value: Any) -> bool:
    return value is not None and value != "" and value != []


def normalise_config(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The machine-independent form of a raw config: every set weight key and any
    path-looking string (contains ``/`` or ``\\``, or ends with a weights
    extension), at any depth, becomes ``"<path>"``.  Key order is left to the
    serialiser (``sort_keys``)."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key in PATH_KEYS and _is_set(value):
            out[key] = PATH_MARKER
        else:
            out[key] = _normalise(value)
    return out


def config_hash(raw: Mapping[str, Any]) -> str:
    """sha256 hex of the normalised config as compact JSON with sorted keys."""
    text = json.dumps(
        normalise_config(raw), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# -- field readers -----------------------------------------------------------


def _path_value(raw: Mapping[str, Any], key: str) -> str | None:
    value = raw.get(key)
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        for item in value:
            if item:
                return str(item)
        return None
    raise _Invalid(f"{key} must be a file path string")


def _resolve(base_dir: str, value: str | None) -> str | None:
    if value is None:
        return None
    expanded = os.path.expanduser(value)
    if not os.path.isabs(expanded):
        expanded = os.path.join(base_dir, expanded)
    return os.path.normpath(expanded)


def _describe(value: Any) -> str:
    if isinstance(value, bool | int | float) or value is None:
        return json.dumps(value)
    if isinstance(value, str):
        text = json.dumps(value)
        return text if len(text) <= 40 else text[:37] + '..."'
    return "a list" if isinstance(value, list) else "an object"


def _int_value(value: Any, key: str, minimum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        qualifier = "a positive integer" if minimum >= 1 else "a non-negative integer"
        raise _Invalid(f"{key} must be {qualifier}, not {_describe(value)}")
    return value


def _portable(raw: Mapping[str, Any], key: str) -> tuple[str, str] | None:
    """``(sha256, filename)`` of a portable weight key, None when it has no ``<key>_hash``."""
    sha = raw.get(f"{key}_hash")
    if sha is None or sha == "":
        return None
    if not isinstance(sha, str) or _SHA256.fullmatch(sha) is None:
        raise _Invalid(f"{key}_hash must be a sha256 of 64 lowercase hex characters")
    name = raw.get(f"{key}_filename")
    if name is None or name == "":
        return sha, ""
    if (not isinstance(name, str) or "/" in name or "\\" in name or "\x00" in name
            or name.startswith(".") or len(name) > 255):
        raise _Invalid(f"{key}_filename must be a bare file name")
    return sha, name


def _vllm_settings(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    vllm = raw.get("vllm")
    if vllm is None:
        return {}
    if not isinstance(vllm, Mapping):
        raise _Invalid("vllm must be a JSON object")
    settings = vllm.get("settings")
    if settings is None:
        return {}
    if not isinstance(settings, Mapping):
        raise _Invalid("vllm.settings must be a JSON object")
    return settings


def _extra_args(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        try:
            return tuple(shlex.split(value))
        except ValueError as exc:
            raise _Invalid(f"extra_args cannot be split: {exc}") from None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise _Invalid("extra_args must be a list of strings or a string")


def _replica_choice(value: Any) -> Mode | None:
    """``router_replica_choice``: this model's replica choice on a master (None: the site's)."""
    if value is None:
        return None
    if value not in MODES:
        raise _Invalid(f"router_replica_choice must be one of {', '.join(MODES)}, not {_describe(value)}")
    return cast(Mode, value)


def _backend_mode(raw: Mapping[str, Any], default: str) -> str:
    value = raw.get("backend_mode")
    if value is None or value == "":
        return default
    if not is_declared(value):
        raise _Invalid(bad_backend_mode())
    return value


def _flag(raw: Mapping[str, Any], key: str) -> bool:
    """A true/false key (``embeddings``, ``reranking``); absent or null is false."""
    value = raw.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _Invalid(f"{key} must be true or false")
    return value


# -- entry points ------------------------------------------------------------


def config_from_mapping(raw: Mapping[str, Any], path: str, default_backend_mode: str) -> ModelConfig:
    """Build a ModelConfig from an already decoded object; raises ``ValueError``
    (with the InvalidConfig reason) when the content is unusable."""
    try:
        return _build(raw, path, default_backend_mode)
    except _Invalid as exc:
        raise ValueError(str(exc)) from None


def _build(raw: Mapping[str, Any], path: str, default_backend_mode: str) -> ModelConfig:
    abs_path = os.path.abspath(path)
    base_dir = os.path.dirname(abs_path)
    local_id = local_id_of(abs_path)

    backend_mode = _backend_mode(raw, default_backend_mode)
    text_raw = _path_value(raw, "model")
    if text_raw is None:
        text_raw = _path_value(raw, "model_param")
    else:
        _path_value(raw, "model_param")  # still type-checked
    mmproj_raw = _path_value(raw, "mmproj")
    embed_raw = _path_value(raw, "embeddingsmodel")
    sd_raw = _path_value(raw, "sdmodel")
    whisper_raw = _path_value(raw, "whispermodel")
    tts_raw = _path_value(raw, "ttsmodel")
    music_raw = {key: _path_value(raw, key) for key in MUSIC_FIELDS}

    context_size = _int_value(raw.get("contextsize"), "contextsize", 0)
    parallel = _int_value(raw.get("parallel"), "parallel", 1)
    settings = _vllm_settings(raw)
    max_len = _int_value(settings.get("max_model_length"), "vllm.settings.max_model_length", 1)
    max_seqs = _int_value(settings.get("max_number_sequences"), "vllm.settings.max_number_sequences", 1)
    extra_args = _extra_args(raw.get("extra_args"))
    replica_choice = _replica_choice(raw.get("router_replica_choice"))
    embeddings_flag = _flag(raw, "embeddings")

    portable = {key: _portable(raw, key) for key in PORTABLE_KEYS}
    has = {key: portable[key] is not None for key in PORTABLE_KEYS}
    has["model"] = has["model"] or text_raw is not None
    has["mmproj"] = has["mmproj"] or mmproj_raw is not None
    has["embeddingsmodel"] = has["embeddingsmodel"] or embed_raw is not None
    has["sdmodel"] = has["sdmodel"] or sd_raw is not None
    has["whispermodel"] = has["whispermodel"] or whisper_raw is not None
    has["ttsmodel"] = has["ttsmodel"] or tts_raw is not None
    for key, value in music_raw.items():
        has[key] = has[key] or value is not None
    # KoboldCpp loads music when a music LM or a music diffusion model is given.
    music = has["musicllm"] or has["musicdiffusion"]
    if not music and not any(has[k] for k in ("model", "sdmodel", "whispermodel", "embeddingsmodel",
                                                 "ttsmodel")):
        raise _Invalid(NO_MODEL_FILE)

    llm = has["model"]
    if declared(backend_mode).context_from_settings:
        context = max_len or context_size or 0
    else:
        context = context_size or max_len or 0
    capabilities = Capabilities(
        llm=llm,
        image=has["sdmodel"],
        embeddings=has["embeddingsmodel"] or (embeddings_flag and llm),
        multimodal=llm and has["mmproj"],
        stt=has["whispermodel"],
        tts=has["ttsmodel"],
        context=context,
        music=music,
    )
    options = {k: v for k, v in raw.items() if k not in OPTION_EXCLUDED_KEYS}
    return ModelConfig(
        local_id=local_id,
        filename=os.path.basename(abs_path),
        path=abs_path,
        backend_mode=backend_mode,
        capabilities=capabilities,
        config_hash=config_hash(raw),
        text_model=_resolve(base_dir, text_raw),
        mmproj=_resolve(base_dir, mmproj_raw),
        embeddings_model=_resolve(base_dir, embed_raw),
        sd_model=_resolve(base_dir, sd_raw),
        whisper_model=_resolve(base_dir, whisper_raw),
        tts_model=_resolve(base_dir, tts_raw),
        music_llm=_resolve(base_dir, music_raw["musicllm"]),
        music_embeddings=_resolve(base_dir, music_raw["musicembeddings"]),
        music_diffusion=_resolve(base_dir, music_raw["musicdiffusion"]),
        music_vae=_resolve(base_dir, music_raw["musicvae"]),
        context_size=context_size,
        parallel=parallel,
        vllm_max_model_length=max_len,
        vllm_max_sequences=max_seqs,
        extra_args=extra_args,
        reranking=_flag(raw, "reranking"),
        replica_choice=replica_choice,
        image_id=_image_id(local_id, sd_raw, portable["sdmodel"]),
        options=options,
    )


def _image_id(local_id: str, sd_raw: str | None, portable: tuple[str, str] | None) -> str | None:
    if sd_raw is not None:
        return image_id_for(local_id, sd_raw)
    if portable is not None:  # hash-only: the portable file name, else the hash
        return image_id_for(local_id, portable[1] or portable[0])
    return None


def parse_kcpps(path: str, default_backend_mode: str) -> ModelConfig | InvalidConfig:
    """Read and parse one ``.kcpps`` file; never raises for bad content.

    ``default_backend_mode`` (the node's ``backend.mode``) applies when the file
    has no ``backend_mode`` (or an empty one).
    """
    abs_path = os.path.abspath(path)
    filename = os.path.basename(abs_path)

    def invalid(reason: str) -> InvalidConfig:
        return InvalidConfig(filename=filename, path=abs_path, reason=reason)

    try:
        with open(abs_path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        return invalid(f"cannot read config: {exc.strerror or exc}")
    try:
        raw = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError:
        return invalid("config is not UTF-8 text")
    except ValueError as exc:
        return invalid(f"config is not valid JSON: {exc}")
    if not isinstance(raw, dict):
        return invalid("config must be a JSON object")
    try:
        return _build(raw, abs_path, default_backend_mode)
    except _Invalid as exc:
        return invalid(str(exc))


__all__ = [
    "bad_backend_mode",
    "NO_MODEL_FILE",
    "PATH_MARKER",
    "config_from_mapping",
    "config_hash",
    "image_id_for",
    "local_id_of",
    "looks_like_path",
    "normalise_config",
    "parse_kcpps",
    "strip_weights_ending",
    "weights_file_name",
]
