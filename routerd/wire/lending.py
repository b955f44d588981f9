"""Wire types of backlog lending (contract §6 lane status and costs, Lease, Link, Held; §8 plan rows).

Every class is a frozen attrs class whose field names are exactly the contract's
JSON keys; :data:`converter` turns them into and out of plain JSON values.
Enumerations are ``Literal`` types so mypy and the converter both check them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar, get_args

import attrs
import cattrs
from cattrs.gen import make_dict_unstructure_fn

from routerd.catalog.model import ModelConfig
from routerd.lanes import LANES, Lane
from routerd.wire.records import ModelRecord, strict_scalars, structure_strictly

#: What :func:`lane_model_id` reads: a local model config or a model record.
_LaneServer = ModelConfig | ModelRecord


def lane_model_id(lane: Lane, model: _LaneServer) -> str | None:
    """The ID a model has in ``lane``'s links (image lane: its image ID; text lane: its local ID),
    or None when it does not serve the lane."""
    if lane == "image":
        return model.image_id if model.capabilities.image and model.image_id else None
    return model.local_id if model.capabilities.llm else None


def lane_key(lane: Lane | None, model: _LaneServer) -> str:
    """The one ID lending knows ``model`` by in ``lane``: its :func:`lane_model_id`, else (a route
    with no lane, a model that does not serve the lane) its local ID.

    Links, queue entries and stats, request samples and the cost fits made of them, token
    profiles and the master's model facts are all keyed by it, so an image model's samples,
    fits and queue stats meet its image-lane links under its image ID.
    """
    if lane is None:
        return model.local_id
    return lane_model_id(lane, model) or model.local_id


def section_key(section: str, model: _LaneServer) -> str:
    """The ID a request sample of analytics ``section`` is recorded (and its fit published) under:
    :func:`lane_key` of the lane the section prices (the local ID for unpriced sections; a video
    job, never priced, under its model's image ID as the image requests of that model)."""
    return lane_key("image" if section == "video" else SECTION_LANE.get(section), model)


#: What made the master plan (spec "Decision log", plan rows).
Trigger = Literal["enqueued", "completed", "borrowed_completed", "probe_due", "tick"]
TRIGGERS: tuple[Trigger, ...] = get_args(Trigger)

#: Outcome of one (owner, helper) evaluation in a plan.
Outcome = Literal["granted", "probe", "skipped"]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)

#: Why a helper was skipped (or, with outcome ``probe``, why the cost rule did not choose it).
Reason = Literal[
    "owner_unpriced",
    "switch_unpriced",
    "restore_unpriced",
    "service_unpriced",
    "cost_rejected",
    "outranked",
    "helper_not_accepting",
    "helper_claimed",
    "load_forbidden",
    "context_too_small",
    "helper_recently_busy",
    # the owner or helper model no longer meets text-lending eligibility (spec "LLM lending")
    "model_ineligible",
    # the owner's / helper's node is unreachable, or its model disabled or gone
    "owner_unavailable",
    "helper_unavailable",
]
REASONS: tuple[Reason, ...] = get_args(Reason)

#: Where a helper's service time came from.
ServiceSource = Literal["helper", "owner_fallback"]

#: A router-held request as the Nodes page lists it.
HeldState = Literal["queued", "held", "lent"]

#: Cost-fit section of each lane (the analytics section its samples are recorded under).
LANE_SECTION: Mapping[Lane, str] = {"image": "image", "text": "llm"}
#: The lane whose costs an analytics section's samples price (other sections are never priced).
SECTION_LANE: Mapping[str, Lane] = {section: lane for lane, section in LANE_SECTION.items()}


def _floats(values: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


def _opt_floats(values: Any) -> tuple[float, ...] | None:
    return None if values is None else _floats(values)


# -- links -------------------------------------------------------------------------------------------


@attrs.frozen(order=True, cache_hash=True)
class Endpoint:
    """One model on one node (``model_id`` is lane-specific: image ID or local ID)."""

    node_id: str
    model_id: str


@attrs.frozen
class Link:
    """One-way routing link: ``owner`` may lend queued work to ``helper``."""

    owner: Endpoint
    helper: Endpoint
    load_if_unloaded: bool = True
    restore_after_borrow: bool = False


# -- leases ------------------------------------------------------------------------------------------


@attrs.frozen
class Lease:
    """The master's permission for an owner to keep ``helper_slots`` requests lent to one helper.

    ``ttl_ms`` is the lifetime the owner times on its own clock.  The three predictions are the
    planner's per-job figures (0 when unmeasured; always 0 on a probe).  ``helper_context`` (the
    helper model's context window, 0 = not stated) and ``helper_multimodal`` (it reads images) gate
    each request at withdrawal (reference §6/§7); a lease from a master that sends neither lends
    no request carrying an image and applies no size gate.
    """

    lane: Lane
    owner_node_id: str
    owner_model_id: str
    helper_node_id: str
    helper_model_id: str
    load_helper_model: bool
    restore_helper_model: bool
    helper_slots: int
    probe: bool
    ttl_ms: int
    owner_job_ms: float = 0.0
    helper_switch_ms: float = 0.0
    helper_service_ms: float = 0.0
    helper_context: int = 0
    helper_multimodal: bool = False

    def slots(self) -> int:
        """Slots to honour: ``helper_slots``, at least 1."""
        return max(self.helper_slots, 1)

    def key(self) -> tuple[Lane, str, str]:
        """Lease-book key: lane, owner node, owner model."""
        return (self.lane, self.owner_node_id, self.owner_model_id)

    def has_speeds(self) -> bool:
        """Whether both per-job figures are measured (probes never are)."""
        return not self.probe and self.owner_job_ms > 0 and self.helper_service_ms > 0


# -- node status -------------------------------------------------------------------------------------


@attrs.frozen
class QueueStat:
    """Native queued work of one model in one lane queue (borrowed work is never counted).

    ``pending`` = waiting in the router (lendable or not); ``backlog`` = pending + admitted.
    Work values are per-term sums (text: prompt and output tokens; image: one term).
    """

    model_id: str
    pending_count: int = 0
    pending_work: tuple[float, ...] = attrs.field(default=(), converter=_floats)
    pending_context: int = 0
    backlog_count: int = 0
    backlog_work: tuple[float, ...] = attrs.field(default=(), converter=_floats)


@attrs.frozen
class LaneStatus:
    accepting_borrowed: bool = False
    active_config: str = ""
    queue: tuple[QueueStat, ...] = ()

    def stat(self, model_id: str) -> QueueStat | None:
        for stat in self.queue:
            if stat.model_id == model_id:
                return stat
        return None


@attrs.frozen
class ModelCost:
    """A fitted model: ``duration_ms = base_ms + Σ slopes_ms[i]·work[i]``.

    With ``uniform_work`` set, each term whose entry is positive had no spread in the samples: its
    slope is zero and the fit prices only work within ±10 % of that entry; an entry of 0 marks a
    fitted term (a node that predates those entries reads such a fit as unpriced).  All entries
    positive: a uniform estimate (every sample did the same work), all slopes zero.
    """

    model_id: str
    section: str
    base_ms: float
    slopes_ms: tuple[float, ...] = attrs.field(converter=_floats)
    samples: int
    uniform_work: tuple[float, ...] | None = attrs.field(default=None, converter=_opt_floats)


@attrs.frozen
class LoadCost:
    """Mean measured load time of one config file on the node that published it."""

    config_filename: str
    load_ms: float
    samples: int = 0


@attrs.frozen
class TokenProfile:
    """A text model's measured request size: body bytes per prompt token and output length.

    ``conservative_bytes_per_token`` leans to more tokens (lending's size: a request thought too big
    stays with its owner).  ``overhead_bytes`` + ``marginal_bytes_per_token`` × tokens is a body's
    size leaning to fewer tokens (the context gate's: a request is refused only when even that many
    overflow the window); a marginal ratio of 0 (a node that predates it) gives no such size.
    """

    model_id: str
    conservative_bytes_per_token: float
    reserved_output_tokens: int
    samples: int
    overhead_bytes: float = 0.0
    marginal_bytes_per_token: float = 0.0


@attrs.frozen
class Costs:
    """The cost coefficients a node fitted from its own samples."""

    models: tuple[ModelCost, ...] = ()
    loads: tuple[LoadCost, ...] = ()
    tokens: tuple[TokenProfile, ...] = ()

    def model(self, model_id: str, section: str) -> ModelCost | None:
        return next((c for c in self.models if c.model_id == model_id and c.section == section), None)

    def load_ms(self, config_filename: str) -> float | None:
        return next((load.load_ms for load in self.loads if load.config_filename == config_filename), None)

    def token_profile(self, model_id: str) -> TokenProfile | None:
        return next((profile for profile in self.tokens if profile.model_id == model_id), None)


# -- decision rows and listings ----------------------------------------------------------------------


# Built once per owner/helper pair per plan (thousands per plan on a big site): a mutable slotted
# class builds in a third of the time of a frozen one (0.37 vs 1.1 us; frozen classes set each field
# through object.__setattr__).  Treat it as a value: nothing changes a row once the planner made it.
@attrs.define(slots=True)
class PlanRow:
    """One ``offload_decisions`` row of kind ``plan``: one owner/helper pair in one decision.

    ``switch_ms`` excludes the restore cost, which has its own column; ``keep_ms`` is the owner's
    drain time alone.  ``slots`` is set only for the chosen helper.  Unpriced figures are 0.
    """

    trigger: Trigger
    lane: Lane
    owner_node_id: str
    owner_model_id: str
    helper_node_id: str
    helper_model_id: str
    outcome: Outcome
    reason: Reason | None = None
    pending_count: int = 0
    backlog_count: int = 0
    keep_ms: float = 0.0
    switch_ms: float = 0.0
    restore_ms: float = 0.0
    service_ms: float = 0.0
    owner_job_ms: float = 0.0
    service_source: ServiceSource | None = None
    helper_idle_ms: int = 0
    slots: int = 0

    def columns(self) -> dict[str, object]:
        """The ``offload_decisions`` columns this row fills (``kind`` included; ``''`` for none)."""
        out: dict[str, object] = {"kind": "plan"}
        for field in attrs.fields(PlanRow):
            value = getattr(self, field.name)
            out[field.name] = "" if value is None else value
        return out


@attrs.frozen
class HeldRequest:
    """A request the router holds (contract "Held"); helper ids only when lent."""

    request_id: str
    lane: Lane
    model_id: str
    state: HeldState
    waiting_ms: int
    helper_node_id: str | None = None
    helper_model_id: str | None = None
    #: The request's class (``interactive``/``standard``/``batch``) and its key's name.
    priority: str | None = None
    key_name: str | None = None


# -- JSON --------------------------------------------------------------------------------------------

#: Converter for every type above: JSON snake_case, tuples as lists, ``None`` optionals omitted on
#: output and accepted missing or ``null`` on input; unknown keys are ignored (fields may be added).
converter = cattrs.Converter(omit_if_default=False)

_OMIT_NONE: tuple[type, ...] = (Lease, ModelCost, PlanRow, HeldRequest)


def _omit_none_hook(cls: type) -> Any:
    base: Callable[[Any], dict[str, Any]] = make_dict_unstructure_fn(cls, converter)

    def unstructure(obj: Any) -> dict[str, Any]:
        return {k: v for k, v in base(obj).items() if v is not None}

    return unstructure


for _cls in _OMIT_NONE:
    converter.register_unstructure_hook(_cls, _omit_none_hook(_cls))

converter.register_unstructure_hook(tuple, lambda value: [converter.unstructure(v) for v in value])

T = TypeVar("T")


def to_json(obj: object) -> Any:
    """Plain JSON-ready value (dicts, lists, numbers, strings) of a lending type."""
    return converter.unstructure(obj)


def from_json(data: Any, cls: type[T]) -> T:
    """Structure ``data`` into ``cls``; raises ``cattrs`` errors on a bad shape or enum value."""
    return converter.structure(data, cls)


#: The same types, parsed strictly from another node (a string is never a number or a boolean).
strict_converter: cattrs.Converter = strict_scalars(converter.copy())


def parse_strictly(data: Any, cls: type[T], what: str) -> T:
    """``data`` from another node as ``cls``; ``WireError`` (400) naming the bad field under ``what``."""
    parsed: T = structure_strictly(strict_converter, data, cls, what)
    return parsed


__all__ = [
    "LANES",
    "LANE_SECTION",
    "SECTION_LANE",
    "OUTCOMES",
    "REASONS",
    "TRIGGERS",
    "Costs",
    "Endpoint",
    "HeldRequest",
    "HeldState",
    "Lane",
    "LaneStatus",
    "Lease",
    "Link",
    "LoadCost",
    "ModelCost",
    "Outcome",
    "PlanRow",
    "QueueStat",
    "Reason",
    "ServiceSource",
    "Trigger",
    "TokenProfile",
    "converter",
    "from_json",
    "lane_key",
    "parse_strictly",
    "strict_converter",
    "lane_model_id",
    "section_key",
    "to_json",
]
