"""The synthesized model listings: ``/api/tags``, ``/api/ps``, ``/api/show``, ``/v1/models``.

:class:`ListedModel` is one public model as the listings show it;
:func:`ollama_tags`, :func:`ollama_ps`, :func:`ollama_show` and
:func:`openai_models` build the answers.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from datetime import UTC, datetime

import attrs

from routerd.routing.adapters import JSONObject
from routerd.routing.adapters.ollama.responses import ollama_error


@attrs.frozen
class ListedModel:
    """One public model as the Ollama/OpenAI listings show it.

    ``capabilities`` may use routerd words (``llm``, ``multimodal``,
    ``embeddings``, ``image``, ``stt``, ``tts``) or Ollama's (``completion``,
    ``vision``, ``embedding``, ``tools``, ``thinking``, ``insert``, ``audio``,
    ``image``); unknown words are ignored.  ``modified_at`` is an ISO 8601
    timestamp; ``context`` is the context window in tokens, 0 if unknown.
    """

    name: str
    model_hash: str
    size: int
    modified_at: str
    capabilities: tuple[str, ...]
    context: int
    family: str = "unknown"
    loaded: bool = False


# Ollama's /api/ps "until" for models routerd keeps loaded until swapped out.
NEVER_EXPIRES = "9999-12-31T23:59:59Z"
_EPOCH_ISO = "1970-01-01T00:00:00Z"

_CAPABILITY_WORDS: dict[str, str] = {
    "llm": "completion",
    "text": "completion",
    "completion": "completion",
    "multimodal": "vision",
    "vision": "vision",
    "tools": "tools",
    "thinking": "thinking",
    "insert": "insert",
    "stt": "audio",
    "tts": "audio",
    "audio": "audio",
    "image": "image",
    "embeddings": "embedding",
    "embedding": "embedding",
}
_CAPABILITY_ORDER = ("completion", "vision", "tools", "thinking", "insert", "audio", "image", "embedding")
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


def ollama_capabilities(words: Iterable[str]) -> list[str]:
    """Capability words -> Ollama's vocabulary, in a fixed order (vision implies completion)."""
    caps = {_CAPABILITY_WORDS[w.lower()] for w in words if w.lower() in _CAPABILITY_WORDS}
    if "vision" in caps:
        caps.add("completion")
    return [c for c in _CAPABILITY_ORDER if c in caps]


def ollama_digest(name: str, model_hash: str) -> str:
    """``sha256:<model_hash>`` for a sha256 hex hash, else ``sha256:`` + sha256(name NUL hash)."""
    bare = model_hash.removeprefix("sha256:")
    if _HEX64.fullmatch(bare):
        return "sha256:" + bare.lower()
    return "sha256:" + hashlib.sha256(f"{name}\0{model_hash}".encode()).hexdigest()


def _parse_time(value: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _timestamp(value: str) -> str:
    return value if _parse_time(value) is not None else _EPOCH_ISO


def _details(entry: ListedModel) -> JSONObject:
    return {
        "parent_model": "",
        "format": "gguf",
        "family": entry.family,
        "families": [entry.family],
        "parameter_size": "unknown",
        "quantization_level": "unknown",
    }


def _unique(entries: Iterable[ListedModel]) -> list[ListedModel]:
    """One entry per name (the first seen; loaded if any replica is), sorted by name."""
    by_name: dict[str, ListedModel] = {}
    for entry in entries:
        seen = by_name.get(entry.name)
        if seen is None:
            by_name[entry.name] = entry
        elif entry.loaded and not seen.loaded:
            by_name[entry.name] = attrs.evolve(seen, loaded=True)
    return [by_name[name] for name in sorted(by_name)]


def _listing(entry: ListedModel) -> JSONObject:
    return {
        "name": entry.name,
        "model": entry.name,
        "modified_at": _timestamp(entry.modified_at),
        "size": entry.size,
        "digest": ollama_digest(entry.name, entry.model_hash),
        "details": _details(entry),
    }


def ollama_tags(entries: Iterable[ListedModel]) -> JSONObject:
    """``GET /api/tags``: every model once, sorted by name."""
    models = []
    for entry in _unique(entries):
        item = _listing(entry)
        item["capabilities"] = ollama_capabilities(entry.capabilities)
        models.append(item)
    return {"models": models}


def ollama_ps(entries: Iterable[ListedModel], expires_at: str = NEVER_EXPIRES) -> JSONObject:
    """``GET /api/ps``: the loaded models, sorted by name, with ``size_vram`` = size."""
    models = []
    for entry in _unique(entries):
        if not entry.loaded:
            continue
        item = _listing(entry)
        del item["modified_at"]
        item.update(expires_at=expires_at, size_vram=entry.size, context_length=entry.context)
        models.append(item)
    return {"models": models}


def ollama_show(entry: ListedModel) -> JSONObject:
    """``POST /api/show`` for one model, from what the catalog knows."""
    model_info: JSONObject = {"general.architecture": entry.family, "general.basename": entry.name}
    modelfile = f"# Modelfile generated by routerd\nFROM {entry.name}\n"
    parameters = ""
    if entry.context > 0:
        model_info[f"{entry.family}.context_length"] = entry.context
        modelfile += f"PARAMETER num_ctx {entry.context}\n"
        parameters = f"num_ctx {entry.context}"
    return {
        "license": "",
        "modelfile": modelfile,
        "parameters": parameters,
        "template": "{{ .Prompt }}",
        "details": _details(entry),
        "model_info": model_info,
        "capabilities": ollama_capabilities(entry.capabilities),
        "modified_at": _timestamp(entry.modified_at),
    }


def ollama_not_found(name: str) -> bytes:
    """The 404 body for an unknown model on an Ollama path."""
    return ollama_error(f"model '{name}' not found")


def openai_models(entries: Iterable[ListedModel]) -> JSONObject:
    """``GET /v1/models``: every model once, sorted by id; ``created`` from ``modified_at``."""
    data = []
    for entry in _unique(entries):
        parsed = _parse_time(entry.modified_at)
        created = int(parsed.timestamp()) if parsed is not None else 0
        data.append({"id": entry.name, "object": "model", "created": created, "owned_by": "routerd"})
    return {"object": "list", "data": data}
