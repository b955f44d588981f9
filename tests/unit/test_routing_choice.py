"""The routing choice on hand-made views: one test per target kind, and the guardian rule (spec
"Guardian models"): before any backend, or kept for a backend that refuses the image."""

from __future__ import annotations

import json
from typing import Any

from routerd.catalog.catalog import Catalog
from routerd.catalog.model import Capabilities, ModelConfig
from routerd.registry.identity import MemoryPublicIdStore
from routerd.registry.registry import Registry
from routerd.routing.call import Call
from routerd.routing.choice import (
    BACKEND_REFUSED,
    STRUCTURE,
    Forward,
    Guard,
    Guardian,
    Local,
    Refuse,
    RoutingView,
    Unmodelled,
    choose,
    needs_statuses,
)
from routerd.routing.classify import classify
from routerd.routing.guardians import Guardian as GuardianSetting
from routerd.routing.guardians import GuardianSet
from routerd.wire.lending import Endpoint
from routerd.wire.records import Snapshot, record_from_config

TEXT = Capabilities(llm=True, context=4096)
VISION = Capabilities(llm=True, multimodal=True, context=4096)
EMBEDDINGS = Capabilities(embeddings=True)
IMAGE = [{"type": "text", "text": "what is this?"},
         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]


def config(local_id: str, caps: Capabilities) -> ModelConfig:
    return ModelConfig(local_id=local_id, filename=f"{local_id}.kcpps", path=f"/m/{local_id}.kcpps",
                       backend_mode="llama", capabilities=caps, config_hash="c" * 64)


# the master "m" holds these; the slave "s" holds its own
OWN = Catalog([config("plain", TEXT), config("eyes", VISION), config("embed", EMBEDDINGS)])
SLAVE = [config("far", TEXT), config("far-eyes", VISION)]


def registry() -> Registry:
    reg = Registry("m", "http://m:8080", MemoryPublicIdStore())
    reg.update_local(record_from_config(c, node_id="m", node_url="") for c in OWN.models)
    reg.update_node(Snapshot(node_id="s", node_url="http://s:8080", build_version="x", protocol_version=2,
                             models=tuple(record_from_config(c, node_id="s", node_url="http://s:8080")
                                          for c in SLAVE)), "http://s:8080")
    return reg


def guardians(*settings: tuple[str, str, str]) -> GuardianSet:
    """Model-scoped settings: ``(node, text model, guardian node/model)``."""
    return GuardianSet(GuardianSetting(scope="model", node_id=node, model_id=model,
                                       guardian=Endpoint(*target.split("/")))
                       for node, model, target in settings)


def view(*, node_id: str = "m", reg: Registry | None = None, routes: bool = False,
         catalog: Catalog = OWN, loaded: str | None = None, set_: GuardianSet | None = None) -> RoutingView:
    return RoutingView(node_id=node_id, catalog=lambda: catalog, loaded_config=lambda _kind: loaded,
                       guardians=lambda: set_, registry=reg, routes=routes)


def call(model: str | None, *, path: str = "/v1/chat/completions", image: bool = False,
         borrowed: bool = False) -> Call:
    route = classify("POST", path)
    assert route is not None
    parsed: dict[str, Any]
    if path.endswith("embeddings"):
        parsed = {"input": "hello"}
    else:
        parsed = {"messages": [{"role": "user", "content": IMAGE if image else "hi"}]}
    if model is not None:
        parsed["model"] = model
    made = Call(reply=None, route=route, path=path, body=json.dumps(parsed).encode(),  # type: ignore[arg-type]
                content_type="application/json", parsed=parsed, stream=False, request_id="r1",
                started=0.0, selector=model)
    made.borrowed = borrowed
    return made


# -- one per target kind -------------------------------------------------------------------

def test_a_node_serves_a_model_of_its_own_catalog_locally() -> None:
    target = choose(call("plain"), view())
    assert target == Local(OWN.get("plain"), "plain", "plain")  # type: ignore[arg-type]


def test_a_master_forwards_a_model_only_another_node_holds_and_labels_it_with_the_public_id() -> None:
    reg = registry()
    target = choose(call("far"), view(reg=reg, routes=True))
    assert isinstance(target, Forward)
    assert (target.record.node_id, target.record.local_id, target.public_id, target.label) == \
        ("s", "far", "far", "far")
    assert target.reserve is target.record and target.guard is None


def test_a_master_serves_its_own_replica_locally_holding_its_record() -> None:
    target = choose(call("plain"), view(reg=registry(), routes=True))
    assert isinstance(target, Local)
    assert target.model == OWN.get("plain")
    assert target.reserve is not None and (target.reserve.node_id, target.reserve.local_id) == ("m", "plain")


def test_selector_less_embeddings_with_nothing_loaded_go_to_the_backend_without_a_model() -> None:
    assert isinstance(choose(call(None, path="/v1/embeddings"), view()), Unmodelled)
    assert isinstance(choose(call(None, path="/v1/embeddings"), view(reg=registry(), routes=True)),
                      Unmodelled)
    # with the embeddings config loaded, that config serves it
    loaded = choose(call(None, path="/v1/embeddings"), view(loaded="embed.kcpps"))
    assert isinstance(loaded, Local) and loaded.model.local_id == "embed"


def test_an_unknown_model_is_refused_and_a_borrowed_one_is_handed_back() -> None:
    refused = choose(call("nope"), view())
    assert isinstance(refused, Refuse) and not refused.returned
    assert (refused.error.status, refused.error.code) == (404, "model_not_found")
    handed_back = choose(call("nope", borrowed=True), view())
    assert isinstance(handed_back, Refuse) and handed_back.returned
    on_master = choose(call("nope"), view(reg=registry(), routes=True))
    assert isinstance(on_master, Refuse) and on_master.error.status == 404


def test_a_master_needs_runtime_statuses_only_for_selector_less_transcriptions() -> None:
    stt = call(None, path="/v1/audio/transcriptions")
    assert needs_statuses(stt, view(reg=registry(), routes=True))
    assert not needs_statuses(stt, view())
    assert not needs_statuses(call("plain"), view(reg=registry(), routes=True))


# -- the guardian rule -------------------------------------------------------------------------

def test_a_text_only_model_with_an_image_goes_to_its_guardian_on_the_same_node_before_any_backend() -> None:
    target = choose(call("plain", image=True), view(set_=guardians(("m", "plain", "m/eyes"))))
    assert isinstance(target, Guardian)
    assert (target.reason, target.origin) == (STRUCTURE, Endpoint("m", "plain"))
    assert target.model == OWN.get("eyes") and target.record is None and target.reserve is None
    assert (target.public_id, target.label) == ("plain", "plain")  # the name the client gave


def test_without_an_image_the_guardian_setting_is_not_read() -> None:
    target = choose(call("plain"), view(set_=guardians(("m", "plain", "m/eyes"))))
    assert target == Local(OWN.get("plain"), "plain", "plain")  # type: ignore[arg-type]


def test_a_guardian_that_cannot_read_images_is_skipped_and_the_model_serves() -> None:
    target = choose(call("plain", image=True), view(set_=guardians(("m", "plain", "m/embed"))))
    assert isinstance(target, Local) and target.model.local_id == "plain"
    assert target.guard is not None and target.guard.skipped
    assert not target.guard.raises and target.guard.fallback is None


def test_a_model_that_reads_images_is_tried_first_and_keeps_its_guardian_for_a_refusal() -> None:
    setting = guardians(("m", "eyes", "m/plain"), ("m", "embed", "m/eyes"))
    target = choose(call("eyes", image=True), view(set_=guardians(("m", "eyes", "m/eyes"))))
    assert isinstance(target, Local) and target.guard is not None and target.guard.raises
    fallback = target.guard.fallback
    assert isinstance(fallback, Guardian) and fallback.reason == BACKEND_REFUSED
    assert fallback.model == OWN.get("eyes")
    # a guardian that is no multimodal text model leaves the refusal to be answered as it is
    unusable = choose(call("eyes", image=True), view(set_=setting))
    assert isinstance(unusable, Local) and unusable.guard == Guard(
        setting.resolve("m", "eyes"), raises=True, fallback=None)  # type: ignore[arg-type]


def test_a_slave_does_not_reach_a_guardian_on_another_node() -> None:
    slave = Catalog(SLAVE)
    target = choose(call("far", image=True),
                    view(node_id="s", catalog=slave, set_=guardians(("s", "far", "m/eyes"))))
    assert isinstance(target, Local) and target.model.local_id == "far"
    assert target.guard is not None and not target.guard.raises and target.guard.fallback is None


def test_a_master_sends_a_remote_text_only_models_image_request_to_its_own_guardian() -> None:
    target = choose(call("far", image=True),
                    view(reg=registry(), routes=True, set_=guardians(("s", "far", "m/eyes"))))
    assert isinstance(target, Guardian) and target.model == OWN.get("eyes")
    assert (target.origin, target.label) == (Endpoint("s", "far"), "far")
    assert target.reserve is None  # the text model's node never sees the image


def test_a_master_forwards_to_a_guardian_on_another_node_holding_the_guardians_replica() -> None:
    target = choose(call("plain", image=True),
                    view(reg=registry(), routes=True, set_=guardians(("m", "plain", "s/far-eyes"))))
    assert isinstance(target, Guardian) and target.model is None
    assert target.record is not None and (target.record.node_id, target.record.local_id) == ("s", "far-eyes")
    assert target.reserve is target.record


def test_a_master_keeps_the_guardian_of_a_forwarded_model_for_a_refusal() -> None:
    reg = registry()
    target = choose(call("far-eyes", image=True),
                    view(reg=reg, routes=True, set_=guardians(("s", "far-eyes", "m/eyes"))))
    assert isinstance(target, Forward) and target.guard is not None and target.guard.raises
    assert isinstance(target.guard.fallback, Guardian) and target.guard.fallback.model == OWN.get("eyes")


def test_a_same_node_guardian_reached_through_the_master_holds_the_text_models_replica() -> None:
    reg = registry()
    target = choose(call("plain", image=True),
                    view(reg=reg, routes=True, set_=guardians(("m", "plain", "m/eyes"))))
    assert isinstance(target, Guardian) and target.model == OWN.get("eyes")
    assert target.reserve is not None and target.reserve.local_id == "plain"
