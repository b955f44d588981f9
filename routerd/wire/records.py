"""Wire types of the node API (contract §6): model record and snapshot (status: ``wire.status``).

One cattrs converter (:data:`converter`) structures and unstructures them; JSON keys are the
contract's snake_case names.  Parsing is strict about types (a string is never a number, ``"false"``
is never a boolean) and lenient about extra keys (peers may add fields).  Malformed input raises
:class:`WireError` with a readable reason, which the API answers as 400.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import cattrs
from cattrs.errors import IterableValidationNote
from cattrs.gen import make_dict_unstructure_fn
from cattrs.preconf.json import make_converter

from routerd.catalog.eligibility import ineligibility
from routerd.catalog.model import Capabilities, ModelConfig
from routerd.errors import StatusError

__all__ = [
    "MINIMUM_PROTOCOL_VERSION",
    "PROTOCOL_VERSION",
    "ModelRecord",
    "Snapshot",
    "WireError",
    "converter",
    "parse_record",
    "parse_snapshot",
    "record_from_config",
    "record_to_json",
    "require_node_id",
    "snapshot_to_json",
    "strict_scalars",
    "structure_strictly",
    "text_ineligibility",
]

# The node protocol this build speaks, and the oldest peer it accepts (cluster reference §3.1).
PROTOCOL_VERSION = 2
MINIMUM_PROTOCOL_VERSION = 2


class WireError(StatusError):
    """400: a node document that does not match the contract; ``reason`` says what is wrong."""

    def __init__(self, reason: str) -> None:
        super().__init__(400, reason, "invalid_request_error", "invalid_request_error")


@attrs.frozen(kw_only=True)
class ModelRecord:
    """One model config on one node, as the cluster sees it (contract §6 "Record").

    ``public_id``/``public_image_id`` are what clients name; the master assigns them (a slave
    sends its local IDs there).  ``filename`` is the ``.kcpps`` file name (the STT scheduler
    compares it with a node's ``active_stt_config``).  ``parallel`` and ``max_number_sequences``
    (the config's ``parallel`` and ``vllm.settings.max_number_sequences``) and the context window in
    ``capabilities`` are what text-lending eligibility is judged by on the master.
    """

    local_id: str
    public_id: str = ""
    image_id: str | None = None
    public_image_id: str | None = None
    filename: str = ""
    node_id: str = ""
    node_url: str = ""
    source: str = "local"
    backend_mode: str = ""
    config_hash: str = ""
    model_hash: str = ""
    capabilities: Capabilities = attrs.field(factory=Capabilities)
    available: bool = True
    loaded: bool = False
    disabled: bool = False
    # Text-lending eligibility facts (additive: a peer that does not send them parses as unset).
    parallel: int | None = None
    max_number_sequences: int | None = None
    # Portable asset binding (additive): ready, unresolved or failed, and why.
    asset_state: str | None = None
    asset_reason: str | None = None
    # The model's latest benchmark result (contract §9; additive).
    benchmark: dict[str, Any] | None = None
    # The config's ``router_replica_choice`` (additive: unset, or a mode this build does not know,
    # = the master's site-wide mode).
    replica_choice: str | None = None

    @property
    def identity(self) -> str:
        """What makes two records the same model: ``model_hash:config_hash`` (reference §5.1)."""
        return f"{self.model_hash}:{self.config_hash}"


@attrs.frozen(kw_only=True)
class Snapshot:
    """A node's model list (``GET /router/v1/node/models``, ``POST /register`` body)."""

    node_id: str
    node_url: str = ""
    build_version: str = ""
    protocol_version: int = 0
    models: tuple[ModelRecord, ...] = ()
    #: The node's telemetry (``routerd.wire.telemetry``; additive, sent only when set): a plain JSON
    #: object here, so that a telemetry part the master cannot read never refuses the node's models.
    #: Not part of a snapshot's equality: a new reading alone is not a change of the node's models.
    telemetry: dict[str, Any] | None = attrs.field(default=None, eq=False)


def _strict_str(value: Any, _type: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return value


def _strict_bool(value: Any, _type: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected a boolean, got {type(value).__name__}")
    return value


def _strict_int(value: Any, _type: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("expected an integer, got bool")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise ValueError(f"expected an integer, got {type(value).__name__}")


def _json_object(value: Any, _type: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return dict(value)


def _records(value: Any, _type: Any) -> tuple[ModelRecord, ...]:
    if not isinstance(value, list):
        raise ValueError(f"expected a list of model records, got {type(value).__name__}")
    out: list[ModelRecord] = []
    errors: list[Exception] = []
    for index, item in enumerate(value):
        try:
            out.append(converter.structure(item, ModelRecord))
        except Exception as exc:  # noqa: BLE001 - collected into one validation error
            note = IterableValidationNote(f"Structuring models @ index {index}", index, ModelRecord)
            exc.__notes__ = [*getattr(exc, "__notes__", []), note]
            errors.append(exc)
    if errors:
        raise cattrs.IterableValidationError("models are invalid", errors, tuple[ModelRecord, ...])
    return tuple(out)


def strict_scalars(conv: cattrs.Converter) -> cattrs.Converter:
    """Make ``conv`` refuse a string for a number or a boolean (and the reverse); returns it."""
    conv.register_structure_hook(str, _strict_str)
    conv.register_structure_hook(bool, _strict_bool)
    conv.register_structure_hook(int, _strict_int)
    return conv


#: Record fields added after the contract's list: sent only when set, so a record without them is
#: exactly the contract's, and an older peer's record parses with them unset.
_ADDITIVE_RECORD_FIELDS = ("parallel", "max_number_sequences", "asset_state", "asset_reason", "benchmark",
                           "replica_choice")
#: Capability flags added after the contract's list: sent only when true (an older peer ignores
#: the key, and its records parse here with the flag false).
_ADDITIVE_CAPABILITIES = ("music",)


def _make_converter() -> cattrs.Converter:
    conv = strict_scalars(make_converter(detailed_validation=True))
    conv.register_structure_hook_func(lambda t: t == dict[str, Any], _json_object)
    capabilities_base = make_dict_unstructure_fn(Capabilities, conv)

    def unstructure_capabilities(caps: Capabilities) -> dict[str, Any]:
        out: dict[str, Any] = capabilities_base(caps)
        for name in _ADDITIVE_CAPABILITIES:
            if not out.get(name):
                out.pop(name, None)
        return out

    conv.register_unstructure_hook(Capabilities, unstructure_capabilities)
    record_base = make_dict_unstructure_fn(ModelRecord, conv)

    def unstructure_record(record: ModelRecord) -> dict[str, Any]:
        out: dict[str, Any] = record_base(record)
        for name in _ADDITIVE_RECORD_FIELDS:
            if out.get(name) is None:
                out.pop(name, None)
        return out

    conv.register_unstructure_hook(ModelRecord, unstructure_record)
    conv.register_structure_hook_func(lambda t: t == tuple[ModelRecord, ...], _records)
    conv.register_unstructure_hook_func(
        lambda t: t == tuple[ModelRecord, ...],
        lambda models: [conv.unstructure(m, ModelRecord) for m in models])
    snapshot_base = make_dict_unstructure_fn(Snapshot, conv)

    def unstructure_snapshot(snapshot: Snapshot) -> dict[str, Any]:
        out: dict[str, Any] = snapshot_base(snapshot)
        if out.get("telemetry") is None:
            out.pop("telemetry", None)
        return out

    conv.register_unstructure_hook(Snapshot, unstructure_snapshot)
    return conv


converter: cattrs.Converter = _make_converter()


def structure_strictly(conv: cattrs.Converter, obj: Any, cls: type[Any], what: str) -> Any:
    """``obj`` structured as ``cls`` by ``conv``; ``WireError`` naming what is wrong."""
    if not isinstance(obj, Mapping):
        raise WireError(f"{what} must be a JSON object")
    try:
        return conv.structure(dict(obj), cls)
    except Exception as exc:  # noqa: BLE001 - cattrs raises validation groups and plain errors
        messages = cattrs.transform_error(exc, path=what) if isinstance(
            exc, cattrs.BaseValidationError) else [f"{exc} @ {what}"]
        raise WireError(f"invalid {what}: " + "; ".join(messages)) from None


def _structure(obj: Any, cls: type[Any], what: str) -> Any:
    return structure_strictly(converter, obj, cls, what)


def require_node_id(node_id: str, what: str) -> str:
    trimmed = node_id.strip()
    if not trimmed:
        raise WireError(f"invalid {what}: node_id is required")
    return trimmed


def parse_record(obj: Any) -> ModelRecord:
    record: ModelRecord = _structure(obj, ModelRecord, "record")
    if not record.local_id.strip():
        raise WireError("invalid record: local_id is required")
    return record


def parse_snapshot(obj: Any) -> Snapshot:
    """A snapshot from decoded JSON; ``WireError`` when it does not match the contract.

    ``node_id`` is trimmed and must not be empty; every record needs a ``local_id``.
    """
    snapshot: Snapshot = _structure(obj, Snapshot, "snapshot")
    node_id = require_node_id(snapshot.node_id, "snapshot")
    for index, record in enumerate(snapshot.models):
        if not record.local_id.strip():
            raise WireError(f"invalid snapshot: models[{index}].local_id is required")
    return attrs.evolve(snapshot, node_id=node_id)


def record_to_json(record: ModelRecord) -> dict[str, Any]:
    out: dict[str, Any] = converter.unstructure(record, ModelRecord)
    return out


def snapshot_to_json(snapshot: Snapshot) -> dict[str, Any]:
    out: dict[str, Any] = converter.unstructure(snapshot, Snapshot)
    return out


def record_from_config(config: ModelConfig, *, node_id: str, node_url: str, loaded: bool = False,
                       disabled: bool = False, source: str = "local") -> ModelRecord:
    """The record a node advertises for one of its own model configs (public = local IDs)."""
    return ModelRecord(
        local_id=config.local_id,
        public_id=config.local_id,
        image_id=config.image_id,
        public_image_id=config.image_id,
        filename=config.filename,
        node_id=node_id,
        node_url=node_url,
        source=source,
        backend_mode=config.backend_mode,
        config_hash=config.config_hash,
        model_hash=config.model_hash,
        capabilities=config.capabilities,
        available=True,
        loaded=loaded,
        disabled=disabled,
        parallel=config.parallel,
        max_number_sequences=config.vllm_max_sequences,
        replica_choice=config.replica_choice,
    )


def text_ineligibility(record: ModelRecord) -> str | None:
    """Why the model ``record`` describes cannot be linked for text lending, or None if it can."""
    return ineligibility(record.capabilities, record.parallel, record.max_number_sequences)
