"""Guardian models (spec "Guardian models"; contract §7 ``/router/v1/site/guardians``): the pure part.

A guardian is a multimodal text model that answers a request carrying an image (``routing.images``)
addressed to a text-only model.  It is set per model, per node or for the whole cluster;
:meth:`GuardianSet.resolve` applies the most specific setting (model, then node, then cluster).

* :class:`Guardian` is one setting; its wire form is ``{scope, node_id?, model_id?, guardian:
  {node_id, model_id}}`` (``model_id`` is the model's local ID on its node).
* :func:`image_refused` is the backend-refusal matcher: an HTTP 400 or 500 whose error message says an
  image (vision, multimodal input) is not supported — llama-server's "image input is not supported"
  is the case it must match.
* :func:`sync_fingerprint` folds the guardians into the settings fingerprint every node reports, so
  "in sync" covers them (unchanged when there are none).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal, cast

import attrs

from routerd.wire.lending import Endpoint

Scope = Literal["model", "node", "cluster"]
SCOPES: tuple[Scope, ...] = ("model", "node", "cluster")

#: The decision-log reasons of a ``guardian`` dispatch row.
STRUCTURE = "structure"
BACKEND_REFUSED = "backend_refused"

#: Response header naming the guardian that answered (``<node>/<model>``).
GUARDIAN_HEADER = b"x-routerd-guardian"


class GuardianError(ValueError):
    """A malformed guardian setting (the message names the field)."""


class ImageRefused(Exception):  # noqa: N818 - it is an event, not an error of ours
    """A backend refused a request's image (nothing was written to the client)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"backend refused the image ({status}): {message}")
        self.status = status
        self.message = message


@attrs.frozen
class Guardian:
    """One setting: requests with an image for a text-only model within the scope go to ``guardian``."""

    scope: Scope
    guardian: Endpoint
    node_id: str = ""  # the node of a model or node scope
    model_id: str = ""  # the local ID of a model scope

    def key(self) -> tuple[str, str, str]:
        return (self.scope, self.node_id, self.model_id)

    @property
    def label(self) -> str:
        return f"{self.guardian.node_id}/{self.guardian.model_id}"

    def describe(self) -> str:
        if self.scope == "model":
            return f"model {self.node_id}/{self.model_id}"
        if self.scope == "node":
            return f"node {self.node_id}"
        return "the cluster"


def guardian_to_json(entry: Guardian) -> dict[str, Any]:
    out: dict[str, Any] = {"scope": entry.scope}
    if entry.scope in ("model", "node"):
        out["node_id"] = entry.node_id
    if entry.scope == "model":
        out["model_id"] = entry.model_id
    out["guardian"] = {"node_id": entry.guardian.node_id, "model_id": entry.guardian.model_id}
    return out


def _text(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise GuardianError(f"{where} must be a string")
    return value.strip()


def parse_scope_key(scope: Any, node_id: Any, model_id: Any, where: str = "") -> tuple[Scope, str, str]:
    """A validated ``(scope, node_id, model_id)``: the model scope names both, the node scope only the
    node, the cluster scope neither."""
    at = f"{where}." if where else ""
    if scope not in SCOPES:
        raise GuardianError(f"{at}scope must be one of {', '.join(SCOPES)}")
    node = _text(node_id, f"{at}node_id")
    model = _text(model_id, f"{at}model_id")
    if scope == "model" and (not node or not model):
        raise GuardianError(f"{at}node_id and {at}model_id are required for the model scope")
    if scope == "node":
        if not node:
            raise GuardianError(f"{at}node_id is required for the node scope")
        if model:
            raise GuardianError(f"{at}model_id is only for the model scope")
    if scope == "cluster" and (node or model):
        raise GuardianError(f"{at}node_id and {at}model_id are not allowed for the cluster scope")
    return cast(Scope, scope), node, model


def parse_guardian(data: Any, where: str = "guardian setting") -> Guardian:
    """One setting in its wire form; :class:`GuardianError` naming the field when malformed."""
    if not isinstance(data, dict):
        raise GuardianError(f"{where} must be an object")
    unknown = sorted(set(data) - {"scope", "node_id", "model_id", "guardian"})
    if unknown:
        raise GuardianError(f"{where}: unknown field(s) {', '.join(unknown)}")
    scope, node, model = parse_scope_key(data.get("scope"), data.get("node_id"), data.get("model_id"), where)
    target = data.get("guardian")
    if not isinstance(target, dict):
        raise GuardianError(f"{where}.guardian must be an object with node_id and model_id")
    g_node = _text(target.get("node_id"), f"{where}.guardian.node_id")
    g_model = _text(target.get("model_id"), f"{where}.guardian.model_id")
    if not g_node or not g_model:
        raise GuardianError(f"{where}.guardian.node_id and .model_id must not be empty")
    return Guardian(scope=scope, guardian=Endpoint(g_node, g_model), node_id=node, model_id=model)


class GuardianSet:
    """Every guardian setting, one per scope key (a later duplicate replaces an earlier one)."""

    def __init__(self, entries: Iterable[Guardian] = ()) -> None:
        by_key: dict[tuple[str, str, str], Guardian] = {}
        for entry in entries:
            by_key[entry.key()] = entry
        order = {scope: index for index, scope in enumerate(SCOPES)}
        self.entries: tuple[Guardian, ...] = tuple(
            sorted(by_key.values(), key=lambda e: (order[e.scope], e.node_id, e.model_id)))
        self._by_key = by_key

    @classmethod
    def parse(cls, data: Any, where: str = "guardians") -> GuardianSet:
        if not isinstance(data, list):
            raise GuardianError(f"{where} must be a list")
        return cls(parse_guardian(item, f"{where}[{index}]") for index, item in enumerate(data))

    def __len__(self) -> int:
        return len(self.entries)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GuardianSet) and self.entries == other.entries

    __hash__ = None  # type: ignore[assignment]

    def get(self, scope: Scope, node_id: str = "", model_id: str = "") -> Guardian | None:
        return self._by_key.get((scope, node_id, model_id))

    def resolve(self, node_id: str, model_id: str) -> Guardian | None:
        """The setting for text model ``model_id`` on ``node_id``: model, then node, then cluster."""
        return (self._by_key.get(("model", node_id, model_id))
                or self._by_key.get(("node", node_id, ""))
                or self._by_key.get(("cluster", "", "")))

    def to_json(self) -> list[dict[str, Any]]:
        return [guardian_to_json(entry) for entry in self.entries]


def sync_fingerprint(settings_fingerprint: str, guardians: GuardianSet) -> str:
    """The fingerprint a node reports: the settings' own when no guardian is set, else 12 hex
    characters of sha256 over it and the guardians' canonical JSON."""
    if not guardians:
        return settings_fingerprint
    blob = settings_fingerprint + "\n" + json.dumps(guardians.to_json(), sort_keys=True,
                                                    separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


# -- the backend-refusal matcher ----------------------------------------------------------------

REFUSAL_STATUSES = frozenset({400, 500})
_NOT_SUPPORTED = re.compile(r"not\s+supported|does\s+not\s+support|unsupported|not\s+a\s+multimodal", re.I)
_IMAGE_WORDS = re.compile(r"image|vision|multimodal|multi-modal|mmproj", re.I)


def _messages(data: Any) -> list[str]:
    """The error message texts of a backend's JSON error (OpenAI ``{error: {message}}``, llama.cpp,
    Ollama ``{error: "..."}``, vLLM ``{message}``/``{detail}``)."""
    out: list[str] = []
    if isinstance(data, str):
        out.append(data)
    elif isinstance(data, Mapping):
        for key in ("error", "message", "detail", "msg"):
            if key in data:
                out.extend(_messages(data[key]))
    elif isinstance(data, list):
        for item in data[:8]:
            out.extend(_messages(item))
    return out


def refusal_message(status: int, body: bytes) -> str | None:
    """The message of a backend's refusal of an image (HTTP 400/500 saying an image is not
    supported), or None when ``status``/``body`` is anything else."""
    if status not in REFUSAL_STATUSES:
        return None
    text = body[:65536].decode("utf-8", "replace")
    try:
        messages = _messages(json.loads(text))
    except ValueError:
        messages = [text]
    for message in messages:
        if _NOT_SUPPORTED.search(message) and _IMAGE_WORDS.search(message):
            return message[:300]
    return None


def image_refused(status: int, body: bytes) -> bool:
    """Whether the answer ``status``/``body`` is a backend refusing a request's image."""
    return refusal_message(status, body) is not None


__all__ = [
    "BACKEND_REFUSED",
    "GUARDIAN_HEADER",
    "REFUSAL_STATUSES",
    "SCOPES",
    "STRUCTURE",
    "Guardian",
    "GuardianError",
    "GuardianSet",
    "ImageRefused",
    "Scope",
    "guardian_to_json",
    "image_refused",
    "parse_guardian",
    "parse_scope_key",
    "refusal_message",
    "sync_fingerprint",
]
