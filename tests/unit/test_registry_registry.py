"""The master's registry: registration, identity conflicts, health, listings, acquisition.

Reference scenarios 1-4, 6, 8, 11-17, 19-21 and the registry half of 33.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from routerd.catalog.model import Capabilities, RuntimeKind
from routerd.registry.identity import MemoryPublicIdStore
from routerd.registry.records import DuplicateNode, IncompatibleProtocol, InvalidNode
from routerd.registry.registry import Registry
from routerd.registry.replicas import NoReplica, fits_context, replica_order
from routerd.wire.records import ModelRecord, Snapshot

MASTER_URL = "http://master:8080"
LLM = Capabilities(llm=True, context=4096)
ALL_LANES = Capabilities(llm=True, image=True, embeddings=True, stt=True, tts=True)


def rec(local_id: str, *, mhash: str = "m", chash: str = "c", caps: Capabilities = LLM,
        image_id: str | None = None, disabled: bool = False, filename: str | None = None,
        loaded: bool = False) -> ModelRecord:
    return ModelRecord(local_id=local_id, public_id=local_id, image_id=image_id,
                       public_image_id=image_id, filename=filename or f"{local_id}.kcpps",
                       model_hash=mhash, config_hash=chash, capabilities=caps, disabled=disabled,
                       loaded=loaded)


def snap(node_id: str, *models: ModelRecord, version: int | None = 2,
         build: str = "0.1.0") -> Snapshot:
    return Snapshot(node_id=node_id, node_url="http://ignored", build_version=build,
                    protocol_version=0 if version is None else version, models=tuple(models))


def registry(local: Iterable[ModelRecord] = (), ready: bool = True) -> Registry:
    reg = Registry("master", MASTER_URL, MemoryPublicIdStore(),
                   local_ready=lambda _kind, _record: ready)
    reg.update_local(local)
    return reg


def public(reg: Registry, kind: RuntimeKind | None = None) -> list[str]:
    return [r.public_image_id if kind == "image" else r.public_id for r in reg.listing(kind)]


# -- registration ---------------------------------------------------------------------


def test_slave_with_no_models_registers() -> None:
    """Scenario 1."""
    reg = registry()
    reg.update_node(snap("slave-a"), "http://slave-a")
    assert reg.node_urls() == {"master": "http://master:8080", "slave-a": "http://slave-a"}
    (info,) = reg.nodes()
    assert (info.node_id, info.node_url, info.healthy, info.build_version) == (
        "slave-a", "http://slave-a", True, "0.1.0")


def test_remote_records_take_node_identity_from_the_registration() -> None:
    reg = registry()
    reg.update_node(snap("slave-a", rec("llm")), "HTTP://SLAVE-A:80/")
    (record,) = reg.records()
    assert (record.node_id, record.node_url, record.source) == ("slave-a", "http://slave-a", "slave")
    assert reg.node_for_url("http://slave-a/") == "slave-a"


@pytest.mark.parametrize("node_id, url, words", [
    ("master", "http://elsewhere", "own node_id"),
    ("slave-x", "http://MASTER:8080/", "own URL"),
    ("slave-a", "http://slave-new", "already registered at http://slave-a"),
    ("slave-b", "http://slave-a", 'registered to node "slave-a"'),
    ("slave-b", "HTTP://slave-a:80/", 'registered to node "slave-a"'),
])
def test_identity_conflicts_are_duplicate_node_and_change_nothing(
        node_id: str, url: str, words: str) -> None:
    """Scenario 12: master's id, master's URL, slave-a's id elsewhere, a URL slave-a owns."""
    reg = registry([rec("local")])
    reg.update_node(snap("slave-a", rec("llm")), "http://slave-a")
    before = (reg.revision, reg.records(), reg.nodes())
    with pytest.raises(DuplicateNode) as caught:
        reg.update_node(snap(node_id, rec("other")), url)
    assert words in caught.value.reason
    assert (caught.value.status, caught.value.type, caught.value.code) == (
        409, "cluster_error", "duplicate_node")
    assert (reg.revision, reg.records(), reg.nodes()) == before


def test_same_id_at_the_same_normalised_url_is_a_refresh() -> None:
    """Scenario 13: ` slave-a ` at `HTTP://SLAVE:80/`, then `slave-a` at `http://slave`."""
    reg = registry()
    reg.update_node(snap(" slave-a ", rec("old")), "HTTP://SLAVE:80/")
    reg.update_node(snap("slave-a", rec("new")), "http://slave")
    assert [r.local_id for r in reg.records()] == ["new"]
    assert reg.node_urls()["slave-a"] == "http://slave"


def test_two_claims_on_one_url_under_different_ids_exactly_one_wins() -> None:
    """Scenarios 14 and 33: the second node_id at a registered URL is a duplicate."""
    reg = registry()
    reg.update_node(snap("slave", rec("llm")), "http://a")
    revision = reg.revision
    with pytest.raises(DuplicateNode):
        reg.update_node(snap("slave", rec("llm")), "http://b")
    with pytest.raises(DuplicateNode):
        reg.update_node(snap("intruder", rec("llm")), "http://a")
    assert reg.revision == revision
    assert reg.node_urls() == {"master": MASTER_URL, "slave": "http://a"}
    assert reg.node_for_url("http://b") is None


def test_snapshot_without_protocol_version_is_incompatible() -> None:
    """Scenario 15."""
    reg = registry()
    with pytest.raises(IncompatibleProtocol) as caught:
        reg.update_node(snap("slave-a", version=None), "http://slave-a")
    assert caught.value.code == "incompatible_protocol"
    assert caught.value.status == 409
    assert reg.nodes() == []


def test_protocol_below_minimum_refused_newer_accepted() -> None:
    """Scenarios 16, 17: minimum-1 refused naming node and build; current+1 accepted."""
    reg = registry()
    with pytest.raises(IncompatibleProtocol) as caught:
        reg.update_node(snap("slave-a", version=1, build="v0.4.0"), "http://slave-a")
    assert "slave-a" in caught.value.reason and "v0.4.0" in caught.value.reason
    assert "update the peer" in caught.value.reason
    reg.update_node(snap("slave-a", version=3), "http://slave-a")
    assert reg.node("slave-a") is not None


@pytest.mark.parametrize("node_id, url, words", [
    ("  ", "http://slave-a", "node_id is required"),
    ("slave-a", "", "node url is required"),
    ("slave-a", "ftp://slave-a", "node_url is invalid"),
])
def test_unusable_snapshots_are_invalid_node(node_id: str, url: str, words: str) -> None:
    reg = registry()
    with pytest.raises(InvalidNode) as caught:
        reg.update_node(snap(node_id), url)
    assert words in caught.value.reason
    assert caught.value.status == 400


def test_master_without_a_public_url_accepts_any_other_url() -> None:
    reg = Registry("master", "", MemoryPublicIdStore())
    reg.update_node(snap("slave-a"), "http://slave-a")
    assert reg.node_urls() == {"master": "", "slave-a": "http://slave-a"}


# -- health ---------------------------------------------------------------------------


def test_unhealthy_node_records_stay_listed_unavailable_and_are_skipped() -> None:
    """Scenario 11: slave-a unhealthy -> llm routes to slave-b."""
    reg = registry()
    reg.update_node(snap("slave-a", rec("llm")), "http://slave-a")
    reg.update_node(snap("slave-b", rec("llm")), "http://slave-b")
    assert reg.mark_unhealthy("HTTP://SLAVE-A:80/")
    assert [(r.node_id, r.available) for r in reg.records()] == [("slave-a", False),
                                                                  ("slave-b", True)]
    for _ in range(3):
        reservation = reg.acquire("llm", "text")
        assert reservation.record.node_id == "slave-b"
        reservation.release()
    assert not reg.node("slave-a").healthy  # type: ignore[union-attr]


def test_all_copies_unhealthy_is_no_replica_and_nodes_are_never_forgotten() -> None:
    reg = registry()
    reg.update_node(snap("slave-a", rec("llm")), "http://slave-a")
    reg.mark_unhealthy("http://slave-a")
    with pytest.raises(NoReplica):
        reg.acquire("llm", "text")
    assert public(reg) == []
    assert [n.node_id for n in reg.nodes()] == ["slave-a"]
    assert [r.public_id for r in reg.records()] == ["llm"]


def test_successful_poll_or_registration_restores_health() -> None:
    reg = registry()
    reg.update_node(snap("slave-a", rec("llm")), "http://slave-a")
    reg.mark_unhealthy("http://slave-a")
    assert reg.mark_healthy("http://slave-a")
    assert public(reg) == ["llm"]
    reg.mark_unhealthy("http://slave-a")
    reg.update_node(snap("slave-a", rec("llm")), "http://slave-a")
    assert reg.node("slave-a").healthy  # type: ignore[union-attr]


def test_marking_an_unknown_url_changes_nothing() -> None:
    reg = registry()
    revision = reg.revision
    assert not reg.mark_unhealthy("http://nobody")
    assert not reg.mark_healthy("not a url")
    assert reg.revision == revision


def test_health_changes_bump_the_revision_only_when_they_change_something() -> None:
    reg = registry()
    reg.update_node(snap("slave-a"), "http://slave-a")
    revision = reg.revision
    reg.mark_healthy("http://slave-a")
    assert reg.revision == revision
    reg.mark_unhealthy("http://slave-a")
    assert reg.revision == revision + 1


# -- identity and listings -------------------------------------------------------------


def test_differing_hashes_get_a_suffix_and_listing_is_deduplicated() -> None:
    """Scenarios 3 and 34: the master lists `same` and `same-2`, never node IDs."""
    reg = registry([rec("same")])
    reg.update_node(snap("slave-a", rec("same"), rec("other"), rec("same", mhash="x")),
                    "http://slave-a")
    assert public(reg) == ["other", "same", "same-2"]
    assert [(r.node_id, r.public_id) for r in reg.replicas("same", "text")] == [
        ("master", "same"), ("slave-a", "same")]
    assert [(r.node_id, r.local_id) for r in reg.replicas("same-2", "text")] == [
        ("slave-a", "same")]


def test_disabled_local_copy_leaves_the_slave_copy_serving() -> None:
    """Scenario 2: local `shared` disabled, slave copy enabled -> remote; both disabled -> none."""
    reg = registry([rec("shared", caps=ALL_LANES, disabled=True, image_id="shared-img")])
    reg.update_node(snap("slave-a", rec("shared", caps=ALL_LANES, image_id="shared-img")),
                    "http://slave-a")
    reservation = reg.acquire("shared", "text")
    assert reservation.record.node_id == "slave-a"
    assert not reservation.local
    assert public(reg) == ["shared"]
    reg.update_node(snap("slave-a", rec("shared", caps=ALL_LANES, disabled=True,
                                        image_id="shared-img")), "http://slave-a")
    for lane, name in (("text", "shared"), ("image", "shared-img"), ("stt", "shared")):
        with pytest.raises(NoReplica):
            reg.acquire(name, lane)  # type: ignore[arg-type]
    assert public(reg) == []


def test_listing_by_kind_uses_public_image_ids_for_images() -> None:
    """Scenario 37: sd-models lists `same-dream` and `same-2-dream`."""
    image = Capabilities(image=True)
    reg = registry([rec("same", caps=image, image_id="same-dream")])
    reg.update_node(snap("slave-a", rec("same", mhash="x", caps=image, image_id="same-dream"),
                         rec("llm")), "http://slave-a")
    assert public(reg, "image") == ["same-2-dream", "same-dream"]
    assert public(reg, "text") == ["llm"]
    assert public(reg) == ["llm", "same", "same-2"]


def test_listing_shows_a_model_loaded_when_any_replica_is() -> None:
    reg = registry([rec("llm")])
    reg.update_node(snap("slave-a", rec("llm", loaded=True)), "http://slave-a")
    (listed,) = reg.listing()
    assert listed.node_id == "master" and listed.loaded


def test_public_ids_persist_through_the_injected_store() -> None:
    store = MemoryPublicIdStore()
    reg = Registry("master", MASTER_URL, store)
    reg.update_local([rec("same")])
    reg.update_node(snap("slave-b", rec("same", mhash="b")), "http://slave-b")
    assert store.get("b:c", "same") == "same-2"
    # A restarted master with the same store, and another node arriving first.
    again = Registry("master", MASTER_URL, MemoryPublicIdStore(rows=store.items()))
    again.update_local([rec("same")])
    again.update_node(snap("slave-a", rec("same", mhash="a")), "http://slave-a")
    again.update_node(snap("slave-b", rec("same", mhash="b")), "http://slave-b")
    assert {(r.node_id, r.public_id) for r in again.records()} == {
        ("master", "same"), ("slave-a", "same-3"), ("slave-b", "same-2")}


# -- acquisition -----------------------------------------------------------------------


def test_master_preferred_then_slaves_rotate() -> None:
    """Scenario 4 through the registry: hold every pick -> master, slave-a, slave-b."""
    reg = registry([rec("llm")])
    reg.update_node(snap("slave-b", rec("llm")), "http://slave-b")
    reg.update_node(snap("slave-a", rec("llm")), "http://slave-a")
    held = [reg.acquire("llm", "text") for _ in range(3)]
    assert [r.record.node_id for r in held] == ["master", "slave-a", "slave-b"]
    assert reg.busy(held[0].record, "text") == 1
    held[0].release()
    assert reg.acquire("llm", "text").record.node_id == "master"


def test_request_goes_to_the_node_holding_the_named_image_model() -> None:
    """Scenario 19: master `cc-ff`, slave `cc11-ff`; `cc11-ff` goes to the slave though the
    master is idle."""
    image = Capabilities(image=True)
    reg = registry([rec("cc-ff", caps=image, image_id="cc-ff")])
    reg.update_node(snap("slave", rec("cc11-ff", caps=image, image_id="cc11-ff")), "http://slave")
    reservation = reg.acquire("cc11-ff", "image")
    assert (reservation.record.node_id, reservation.record.image_id, reservation.lane) == (
        "slave", "cc11-ff", "image")
    assert not reservation.local


def test_request_goes_to_the_node_holding_the_named_text_model() -> None:
    """Scenario 20: the slave's `llama-alt` is not served by the master's idle `llama`."""
    reg = registry([rec("llama")])
    reg.update_node(snap("slave", rec("llama-alt")), "http://slave")
    for _ in range(3):
        assert reg.acquire("llama-alt", "text").record.node_id == "slave"
    with pytest.raises(NoReplica):
        reg.acquire("llama-beta", "text")


def test_image_lane_accepts_the_config_public_id_too() -> None:
    image = Capabilities(image=True)
    reg = registry([rec("sdxl", caps=image, image_id="sdxl-juggernaut")])
    assert reg.acquire("sdxl-juggernaut", "image").record.local_id == "sdxl"
    assert reg.acquire("sdxl", "image").record.local_id == "sdxl"


def test_image_requests_for_a_suffixed_model_reach_its_node() -> None:
    """Scenario 38: `same-2-dream` goes to the slave, whose local image ID is `same-dream`."""
    image = Capabilities(image=True)
    reg = registry([rec("same", caps=image, image_id="same-dream")])
    reg.update_node(snap("slave-a", rec("same", mhash="x", caps=image, image_id="same-dream")),
                    "http://slave-a")
    record = reg.acquire("same-2-dream", "image").record
    assert (record.node_id, record.image_id, record.public_image_id) == (
        "slave-a", "same-dream", "same-2-dream")


def test_combined_config_serves_an_image_locally_while_its_text_lane_is_busy() -> None:
    """Scenario 6."""
    combo = Capabilities(llm=True, image=True)
    reg = registry([rec("combo", caps=combo, image_id="combo-dream")])
    reg.update_node(snap("slave-a", rec("combo", caps=combo, image_id="combo-dream")),
                    "http://slave-a")
    text = reg.acquire("combo", "text")
    assert text.local
    image = reg.acquire("combo-dream", "image")
    assert (image.local, image.lane) == (True, "image")


def test_lanes_filter_replicas_by_capability() -> None:
    """Scenario 7 (our lanes): an STT request only reaches STT-capable records."""
    reg = registry([rec("audio", caps=Capabilities(llm=True))])
    reg.update_node(snap("slave-a", rec("audio", caps=Capabilities(stt=True))), "http://slave-a")
    reservation = reg.acquire("audio", "stt")
    assert (reservation.record.node_id, reservation.lane) == ("slave-a", "stt")


def test_local_lane_not_ready_routes_remote() -> None:
    reg = registry([rec("llm")], ready=False)
    reg.update_node(snap("slave-a", rec("llm")), "http://slave-a")
    assert reg.acquire("llm", "text").record.node_id == "slave-a"


def test_context_requirement_filters_replicas() -> None:
    """Scenario 21 through the registry."""
    reg = registry([rec("llm", caps=Capabilities(llm=True, context=2048))])
    reg.update_node(snap("slave-a", rec("llm", caps=Capabilities(llm=True, context=8192))),
                    "http://slave-a")
    assert reg.acquire("llm", "text", min_context=4096).record.node_id == "slave-a"
    assert reg.acquire("llm", "text", min_context=2048).record.node_id == "master"
    with pytest.raises(NoReplica):
        reg.acquire("llm", "text", min_context=8193)


def test_reserve_exact_names_node_and_config() -> None:
    """Scenario 8: an exact acquire reaches the named remote; an unknown node fails."""
    stt = Capabilities(stt=True)
    reg = registry()
    reg.update_node(snap("slave-a", rec("audio", caps=stt, filename="audio.kcpps")),
                    "http://slave-a")
    reservation = reg.reserve_exact("slave-a", "audio.kcpps", "stt")
    assert reservation.record.node_id == "slave-a"
    assert reg.busy(reservation.record, "stt") == 1
    reservation.release()
    assert reg.busy(reservation.record, "stt") == 0
    with pytest.raises(NoReplica):
        reg.reserve_exact("slave-x", "audio.kcpps", "stt")
    with pytest.raises(NoReplica):
        reg.reserve_exact("slave-a", "audio.kcpps", "image")


def test_find_by_local_id_or_filename() -> None:
    reg = registry([rec("llm", filename="llm.kcpps")])
    assert reg.find("master", local_id="llm") is not None
    assert reg.find("master", filename="llm.kcpps") is not None
    assert reg.find("master", filename="nope.kcpps") is None


def test_an_unchanged_refresh_recomputes_nothing() -> None:
    reg = registry([rec("shared")])
    reg.update_node(snap("slave-a", rec("shared")), "http://slave-a")
    revision = reg.revision
    reg.update_node(snap("slave-a", rec("shared")), "http://slave-a")
    assert reg.revision == revision
    reg.update_node(snap("slave-a", rec("shared"), rec("other")), "http://slave-a")
    assert reg.revision == revision + 1


# -- a poll cycle as one change (issue 24: the master at scale) ---------------------------------


def test_a_batch_of_node_updates_rebuilds_records_and_public_ids_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A poll cycle over N new slaves used to rebuild every record N times (quadratic: ~0.5 s of
    CPU for 200 slaves); inside ``batch`` it rebuilds once, to the records one by one would give."""
    import routerd.registry.registry as registry_module

    def nodes(reg: Registry) -> None:
        for n in range(40):
            reg.update_node(snap(f"slave-{n:02d}", rec("shared"), rec(f"own-{n}")), f"http://slave-{n}")
        reg.mark_unhealthy("http://slave-3")

    one_by_one = registry()
    nodes(one_by_one)
    calls: list[int] = []
    real = registry_module.assign_public_ids

    def counting(*args: object, **kwargs: object) -> list[ModelRecord]:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    batched = registry()
    monkeypatch.setattr(registry_module, "assign_public_ids", counting)
    before = batched.revision
    with batched.batch():
        nodes(batched)
        assert batched.records() == [] and batched.revision == before  # nothing rebuilt yet
    assert len(calls) == 1 and batched.revision == before + 1
    assert batched.records() == one_by_one.records()
    assert [n.healthy for n in batched.nodes()] == [n.healthy for n in one_by_one.nodes()]


def test_a_batch_that_changes_nothing_rebuilds_nothing() -> None:
    reg = registry()
    reg.update_node(snap("slave-a", rec("chat")), "http://slave-a")
    revision = reg.revision
    with reg.batch():
        reg.update_node(snap("slave-a", rec("chat")), "http://slave-a")  # an unchanged refresh
    assert reg.revision == revision


# -- replicas by name, not by scanning the cluster (issue 24: a master routing for many slaves) -------


def _scan_replicas(reg: Registry, public_id: str, lane: RuntimeKind, min_context: int) -> list[ModelRecord]:
    """The definition ``replicas`` had when it scanned every record per request."""
    serving = [r for r in reg.records() if not r.disabled and r.capabilities.serves(lane)
               and fits_context(r.capabilities.context, min_context)]
    named = [r for r in serving if r.public_image_id == public_id] if lane == "image" else []
    return sorted(named or [r for r in serving if r.public_id == public_id], key=replica_order)


def _mixed_cluster() -> Registry:
    image = Capabilities(image=True)
    reg = registry([rec("chat"), rec("cc-ff", caps=image, image_id="cc-ff"), rec("off", disabled=True)])
    for n in range(6):
        reg.update_node(snap(f"slave-{n}",
                             rec("chat", mhash="m" if n % 2 else "x",
                                 caps=Capabilities(llm=True, context=1024 * n)),
                             rec("cc-ff", caps=image, image_id="cc-ff-dream" if n % 3 else "cc-ff"),
                             rec("both", caps=ALL_LANES, image_id="both-img", disabled=n == 4),
                             rec(f"own-{n}")),
                        f"http://slave-{n}")
    reg.mark_unhealthy("http://slave-2")
    return reg


def test_replicas_by_name_are_the_records_a_scan_of_the_cluster_finds() -> None:
    reg = _mixed_cluster()
    names = {r.public_id for r in reg.records()} | {r.public_image_id or "" for r in reg.records()} | {"nope"}
    for name in sorted(names - {""}):
        for lane in ("text", "image", "embeddings", "stt", "tts"):
            for min_context in (0, 2048):
                assert reg.replicas(name, lane, min_context=min_context) == _scan_replicas(  # type: ignore[arg-type]
                    reg, name, lane, min_context), (name, lane, min_context)  # type: ignore[arg-type]
        assert reg.named(name) == [r for r in reg.records() if name in (r.public_id, r.public_image_id)]


def test_finding_a_models_replicas_reads_only_that_models_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """It used to test every record of the cluster on every request (96 on a 32-slave site with 3
    models each, ~0.12 ms of the master's CPU a request)."""
    reg = registry()
    for n in range(40):
        reg.update_node(snap(f"slave-{n:02d}", rec("shared"), rec(f"own-{n}"), rec(f"other-{n}")),
                        f"http://slave-{n}")
    looked: list[str] = []
    real = Capabilities.serves

    def counting(self: Capabilities, kind: RuntimeKind) -> bool:
        looked.append(kind)
        return real(self, kind)

    monkeypatch.setattr(Capabilities, "serves", counting)
    assert len(reg.replicas("own-7", "text")) == 1 and len(looked) == 1
    assert len(reg.replicas("shared", "text")) == 40
