"""The routing choice: which target serves one client inference request, decided once.

:func:`choose` reads a :class:`~routerd.routing.call.Call` and a :class:`RoutingView` (this node's
catalog, the registry's read side on a master, the guardian settings, split recipes and the loaded
configs) and returns one :class:`Target`:

* :class:`Local` — this node's own model serves it (reserving ``reserve`` on a master);
* :class:`Forward` — another node's replica serves it (the master forwards, reserving it);
* :class:`Guardian` — the request carries an image its text-only model cannot read, and the
  guardian that setting names answers instead (spec "Guardian models");
* :class:`Unmodelled` — selector-less embeddings with no embeddings config loaded: the running
  backend answers without a model, nothing loads;
* :class:`Refuse` — no target: the error the client is answered with.

The guardian rule lives here only.  A request with an image for a text-only model goes to its
guardian before any backend sees it (the guardian on the model's own node answers there, one on
another node is the master's to reach); where the setting applies but the model itself is tried
first, the target carries a :class:`Guard`: whether a backend refusing the image raises instead of
answering, and the guardian that then answers (resolved now, so the rule is not entered again).

Pure: no Twisted, no I/O (an import-linter contract keeps it so).  The registry's read side moves
its replica rotation on as it picks, as before; reserving and releasing are the front's.  The cost
per request is one small frozen target (two for a guarded one) besides the lookups the front made
before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import attrs

from routerd.catalog.model import Capabilities, ModelConfig, RuntimeKind
from routerd.errors import HTTPError, StatusError
from routerd.routing.call import Call
from routerd.routing.classify import Route
from routerd.routing.embeddings import embeddings_candidates, rotated
from routerd.routing.guardians import BACKEND_REFUSED, STRUCTURE, GuardianSet
from routerd.routing.guardians import Guardian as GuardianSetting
from routerd.routing.images import has_image
from routerd.routing.plan import NEEDS, SECTIONS
from routerd.routing.stt import RoundRobinCounter, choose_stt
from routerd.wire.lending import Endpoint
from routerd.wire.records import ModelRecord
from routerd.wire.status import RuntimeStatus

__all__ = ["BACKEND_REFUSED", "STRUCTURE", "CatalogView", "Forward", "Guard", "Guardian", "Local",
           "RecipeView", "Refuse", "RegistryView", "RoutingView", "Target", "UNMODELLED", "Unmodelled",
           "choose", "multimodal_text", "needs_statuses", "text_only"]


class CatalogView(Protocol):
    """What the choice reads of this node's catalog."""

    @property
    def models(self) -> Sequence[ModelConfig]: ...

    def get(self, local_id: str) -> ModelConfig | None: ...

    def resolve(self, name: str) -> ModelConfig | None: ...


class RegistryView(Protocol):
    """The registry's read side (a master's): records and replica choice, never a reservation."""

    def records(self) -> list[ModelRecord]: ...

    def named(self, name: str) -> list[ModelRecord]: ...

    def find(self, node_id: str, *, local_id: str | None = None,
             filename: str | None = None) -> ModelRecord | None: ...

    def pick(self, public_id: str, lane: RuntimeKind, *, min_context: int = 0) -> ModelRecord: ...

    def exact(self, node_id: str, filename: str, lane: RuntimeKind) -> ModelRecord: ...


class Steered(Protocol):
    """A replica chosen by a mode other than rotation, with the request's predicted seconds there."""

    @property
    def record(self) -> ModelRecord: ...

    @property
    def seconds(self) -> float: ...


#: The master's replica choice beyond rotation (``routing.replica_choice``): the replica for a call
#: naming a public ID on a runtime, or None when the registry's rotation chooses.
Steer = Callable[[Call, str, RuntimeKind], Steered | None]


class RecipeView(Protocol):
    """Split recipes: the component record serving a name, and the public name it answers under."""

    def route(self, name: str, runtime: RuntimeKind, need: str) -> tuple[str, ModelRecord] | None: ...


@attrs.frozen
class RoutingView:
    """What :func:`choose` reads, built once per node (a master builds two: ``routes`` for its
    clients' requests, not for the cluster calls it receives).  Callables read live state: a
    reload replaces the catalog, a guardian edit the settings."""

    node_id: str
    catalog: Callable[[], CatalogView]
    loaded_config: Callable[[RuntimeKind], str | None]
    guardians: Callable[[], GuardianSet | None]
    #: The registry's read side on a master (guardians on other nodes are reached through it);
    #: None on a standalone node or a slave.
    registry: RegistryView | None = None
    #: Whether requests are routed across the site (a master's clients' requests).
    routes: bool = False
    recipes: RecipeView | None = None
    #: The start of the next selector-less embeddings rotation (moves on at each call).
    embeddings_turn: Callable[[], int] = lambda: 0
    stt_counter: RoundRobinCounter = attrs.Factory(RoundRobinCounter)
    #: The master's replica choice beyond rotation (None: rotation only).
    steer: Steer | None = None


@attrs.frozen(weakref_slot=False)
class Guard:
    """A guardian setting that applies while the model itself is tried first."""

    setting: GuardianSetting
    #: A backend refusing the image raises (the front then goes to ``fallback``) instead of
    #: answering the refusal as it is.
    raises: bool
    #: The guardian that answers a refusal (BACKEND_REFUSED), or None when it cannot here.
    fallback: Guardian | None
    #: A redirect before any backend was wanted, but the guardian cannot answer here.
    skipped: bool = False


@attrs.frozen(weakref_slot=False)
class Local:
    model: ModelConfig
    public_id: str  # the name the answer goes back under
    label: str  # the model label of metrics and analytics
    reserve: ModelRecord | None = None  # the replica a master holds while it serves
    guard: Guard | None = None
    seconds: float = 0.0  # the request's predicted seconds there, reserved with it (replica choice)


@attrs.frozen(weakref_slot=False)
class Forward:
    record: ModelRecord
    public_id: str
    label: str
    guard: Guard | None = None
    seconds: float = 0.0  # the request's predicted seconds there, reserved with it (replica choice)

    @property
    def reserve(self) -> ModelRecord:
        return self.record


@attrs.frozen(weakref_slot=False)
class Guardian:
    """The guardian answers: this node's ``model``, or another node's ``record`` (forwarded)."""

    setting: GuardianSetting
    reason: str  # STRUCTURE (before any backend) or BACKEND_REFUSED
    origin: Endpoint  # the text-only model it stands in for
    public_id: str
    label: str
    model: ModelConfig | None = None
    record: ModelRecord | None = None
    reserve: ModelRecord | None = None


@attrs.frozen(weakref_slot=False)
class Unmodelled:
    label: str = "-"
    reserve: None = None


@attrs.frozen(weakref_slot=False)
class Refuse:
    error: StatusError
    #: A borrowed request this helper cannot serve: handed back to its owner (409), not answered.
    returned: bool = False
    label: str = "-"
    reserve: None = None


Target = Local | Forward | Guardian | Unmodelled | Refuse
UNMODELLED = Unmodelled()


def text_only(caps: Capabilities) -> bool:
    """A text model that cannot read images (no multimodal projector)."""
    return caps.llm and not caps.multimodal


def multimodal_text(caps: Capabilities) -> bool:
    """What a guardian must be: a text model that reads images."""
    return caps.llm and caps.multimodal


def needs_statuses(call: Call, view: RoutingView) -> bool:
    """Whether :func:`choose` needs the nodes' runtime statuses (a selector-less transcription a
    master schedules); the front fetches them first."""
    return view.routes and call.selector is None and call.route.runtime == "stt"


def choose(call: Call, view: RoutingView,
           statuses: Mapping[str, RuntimeStatus] | None = None) -> Target:
    """The one target serving ``call`` (see the module docstring)."""
    try:
        if view.routes:
            return _routed(call, view, statuses or {})
        return _own(call, view)
    except StatusError as err:
        if call.borrowed and err.status in (404, 503):
            return Refuse(err, returned=True)
        return Refuse(err)


# -- a node resolving its own catalog (standalone, slave, or a cluster call) ----------------------

def _own(call: Call, view: RoutingView) -> Target:
    route = call.route
    if not call.borrowed and call.selector is None and _nothing_to_embed_with(call, view):
        return UNMODELLED
    need = _need(route)
    own = None if call.borrowed else _own_recipe(call, view, need)
    if own is not None:
        public_id, model = own
    else:
        model = _local_model(call, view, need)
        public_id = model.image_id if route.runtime == "image" and model.image_id else model.local_id
    return _here(call, view, model, public_id, model.local_id, None)


def _here(call: Call, view: RoutingView, model: ModelConfig, public_id: str, label: str,
          reserve: ModelRecord | None, skipped: bool = False, seconds: float = 0.0) -> Target:
    """Serve on this node, or on its guardian when the request carries an image the model cannot
    read: a text-only model's guardian on this node answers at once (sharing the runtime); a model
    tried first keeps the guardian for a backend that refuses the image."""
    node_id = view.node_id
    setting = None if call.borrowed else _setting(call, view, node_id, model.local_id)
    if setting is None:
        return Local(model, public_id, label, reserve, seconds=seconds)
    if text_only(model.capabilities) and setting.guardian.node_id == node_id:
        guardian = _guardian(view, setting, STRUCTURE, node_id, model.local_id, public_id, label)
        if guardian is not None:
            return attrs.evolve(guardian, reserve=reserve)
        return Local(model, public_id, label, reserve, Guard(setting, False, None, skipped=True), seconds)
    # a guardian elsewhere is the master's to reach (a slave cannot): only the master falls back
    raises = setting.guardian.node_id == node_id or view.registry is not None
    fallback = _guardian(view, setting, BACKEND_REFUSED, node_id, model.local_id, public_id, label)
    return Local(model, public_id, label, reserve, Guard(setting, raises, fallback, skipped), seconds)


def _nothing_to_embed_with(call: Call, view: RoutingView) -> bool:
    """Catalog mode of selector-less embeddings (reference §6.7): no selector and no
    embeddings-capable config loaded here, so the request passes through without a model."""
    if call.selector is not None or SECTIONS[call.route.kind] != "embeddings":
        return False
    loaded = view.loaded_config("text")
    return not any(m.filename == loaded and m.capabilities.embeddings for m in view.catalog().models)


def _own_recipe(call: Call, view: RoutingView, need: str) -> tuple[str, ModelConfig] | None:
    """``(public name, component config)`` when a standalone node's request names one of its
    split recipes (reference §9.3, checked before its own models as on a master).  A site of one
    holds its own records only, so every component is in this catalog."""
    if view.recipes is None or call.selector is None:
        return None
    picked = view.recipes.route(call.selector, call.route.runtime, need)
    if picked is None:
        return None
    name, record = picked
    model = view.catalog().get(record.local_id)
    if model is None:
        raise _not_found(call.selector)
    return name, model


def _local_model(call: Call, view: RoutingView, need: str) -> ModelConfig:
    catalog = view.catalog()
    name = call.selector
    if name is None:
        capable = [m for m in catalog.models if getattr(m.capabilities, need)]
        if not capable:
            raise HTTPError(503, f"no model on this node serves {need} requests",
                            "backend_error", "no_capable_model")
        loaded = view.loaded_config(call.route.runtime)
        for model in capable:
            if model.filename == loaded:
                return model
        return capable[0]
    found = catalog.resolve(name)
    if found is None:
        raise _not_found(name)
    if not getattr(found.capabilities, need):
        raise HTTPError(404, f"model {name!r} does not serve {need} requests", "not_found",
                        "model_not_found")
    return found


# -- a master routing across the site ----------------------------------------------------------

def _routed(call: Call, view: RoutingView, statuses: Mapping[str, RuntimeStatus]) -> Target:
    registry = view.registry
    assert registry is not None
    route = call.route
    need = _need(route)
    name = call.selector
    seconds = 0.0
    if name is None:
        if route.runtime == "stt":
            record = choose_stt(registry.records(), statuses, view.node_id, view.stt_counter)
            name = record.public_id
        elif SECTIONS[route.kind] == "embeddings":
            found = _embeddings_record(view, registry)
            if found is None:  # nothing loaded: to the running backend without a model (§6.7)
                return UNMODELLED
            record, name = found, found.public_id
        else:
            name = _default_public(view, registry, route, need)
            record, seconds = _pick(call, view, registry, name, route.runtime)
    elif (picked := view.recipes.route(name, route.runtime, need) if view.recipes else None):
        # a split recipe's component, checked before the registry (reference §9.3)
        name, component = picked
        record = registry.exact(component.node_id, component.filename, route.runtime)
    else:
        _check_known(registry, name, need)
        record, seconds = _pick(call, view, registry, name, route.runtime)  # NoReplica: a 502
    label = record.public_id
    setting = _setting(call, view, record.node_id, record.local_id)
    skipped = False
    if setting is not None and setting.guardian.node_id != record.node_id \
            and text_only(record.capabilities):
        # a guardian on another node answers: the text model's node never sees the image
        guardian = _guardian(view, setting, STRUCTURE, record.node_id, record.local_id, name, label)
        if guardian is not None:
            return guardian
        skipped = True
    if record.node_id == view.node_id:
        model = view.catalog().get(record.local_id)
        if model is None:
            raise _not_found(name)
        return _here(call, view, model, name, label, record, skipped, seconds)
    guard = None
    if setting is not None:
        fallback = _guardian(view, setting, BACKEND_REFUSED, record.node_id, record.local_id, name, label)
        guard = Guard(setting, True, fallback, skipped)
    return Forward(record, name, label, guard, seconds)


def _pick(call: Call, view: RoutingView, registry: RegistryView, name: str,
          runtime: RuntimeKind) -> tuple[ModelRecord, float]:
    """The replica of ``name`` for ``call`` and its predicted seconds there: the master's replica
    choice (``routing.replica_choice``) when its mode is not rotation, else the registry's rotation
    (seconds 0: unpriced)."""
    if view.steer is not None:
        steered = view.steer(call, name, runtime)
        if steered is not None:
            return steered.record, steered.seconds
    return registry.pick(name, runtime), 0.0


def _embeddings_record(view: RoutingView, registry: RegistryView) -> ModelRecord | None:
    """Selector-less embeddings (reference §6.7): a loaded embeddings config, round-robin."""
    loaded = view.loaded_config("text")
    candidates = embeddings_candidates(registry.records(), view.node_id, lambda f: f == loaded)
    for record in rotated(candidates, view.embeddings_turn()):
        try:
            return registry.exact(record.node_id, record.filename, "text")
        except StatusError:  # the registry's NoReplica: went stale since the listing, try the next
            continue
    return None


def _check_known(registry: RegistryView, name: str, need: str) -> None:
    records = [r for r in registry.named(name) if not r.disabled]
    if not records:
        raise _not_found(name)
    if not any(getattr(r.capabilities, need) for r in records):
        raise HTTPError(404, f"model {name!r} does not serve {need} requests", "not_found",
                        "model_not_found")


def _default_public(view: RoutingView, registry: RegistryView, route: Route, need: str) -> str:
    loaded = view.loaded_config(route.runtime)
    capable = [r for r in registry.records()
               if getattr(r.capabilities, need) and r.available and not r.disabled]
    if not capable:
        raise HTTPError(503, f"no model in the cluster serves {need} requests",
                        "backend_error", "no_capable_model")
    for record in capable:
        if record.node_id == view.node_id and record.filename == loaded:
            break
    else:
        record = capable[0]
    if route.runtime == "image" and record.public_image_id:
        return record.public_image_id
    return record.public_id


# -- guardian models (spec "Guardian models") ------------------------------------------------

def _setting(call: Call, view: RoutingView, node_id: str, model_id: str) -> GuardianSetting | None:
    """The guardian setting for a text request carrying an image (read from the body's
    structure) addressed to ``model_id`` on ``node_id``; None for anything else."""
    if call.route.lane != "text":
        return None
    guardians = view.guardians()
    if not guardians or not has_image(call.parsed):
        return None
    return guardians.resolve(node_id, model_id)


def _guardian(view: RoutingView, setting: GuardianSetting, reason: str, origin_node: str,
              origin_model: str, public_id: str, label: str) -> Guardian | None:
    """The guardian target, or None when it cannot answer here: not in this catalog or the
    registry, not an available multimodal text model, or on another node and this node is not
    the master."""
    target = setting.guardian
    if target.node_id == view.node_id:
        model = view.catalog().get(target.model_id)
        if model is None or not multimodal_text(model.capabilities):
            return None
        return Guardian(setting, reason, Endpoint(origin_node, origin_model), public_id, label, model=model)
    registry = view.registry
    if registry is None:
        return None
    record = registry.find(target.node_id, local_id=target.model_id)
    if record is None or record.disabled or not record.available \
            or not multimodal_text(record.capabilities):
        return None
    return Guardian(setting, reason, Endpoint(origin_node, origin_model), public_id, label, record=record,
                    reserve=record)


def _need(route: Route) -> str:
    return NEEDS[SECTIONS[route.kind]]


def _not_found(name: str) -> HTTPError:
    return HTTPError(404, f"model {name!r} was not found", "not_found", "model_not_found")
