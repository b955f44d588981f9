"""Public-ID assignment: merge identical models, stable persisted suffixes (spec "Model identity").

Reference §5.1 and scenario 3, with routerd's improvement: suffixes are persisted through the
``PublicIdStore`` so they never move when nodes leave and come back.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routerd.registry.identity import (
    MemoryPublicIdStore,
    PublicIdTaken,
    assign_public_ids,
    public_image_id,
)
from routerd.wire.records import ModelRecord

MASTER = "master"


def rec(node_id: str, local_id: str, mhash: str = "m", chash: str = "c",
        image_id: str | None = None) -> ModelRecord:
    return ModelRecord(local_id=local_id, public_id=local_id, node_id=node_id,
                       model_hash=mhash, config_hash=chash, image_id=image_id,
                       public_image_id=image_id)


def ids(records: list[ModelRecord]) -> list[tuple[str, str, str]]:
    return [(r.node_id, r.local_id, r.public_id) for r in records]


def test_identical_hashes_merge_and_different_model_hash_gets_a_suffix() -> None:
    """Scenario 3: master `same`, slave-a `same` (same hashes) and `same` (model hash `other`)."""
    out = assign_public_ids([rec(MASTER, "same"), rec("slave-a", "same"),
                             rec("slave-a", "same", mhash="other")], MASTER, MemoryPublicIdStore())
    assert [r.public_id for r in out] == ["same", "same", "same-2"]


def test_different_config_hash_alone_also_splits() -> None:
    out = assign_public_ids([rec(MASTER, "x"), rec("s", "x", chash="c2")], MASTER,
                            MemoryPublicIdStore())
    assert [r.public_id for r in out] == ["x", "x-2"]


def test_the_masters_own_record_owns_the_bare_id_whatever_the_sort_order() -> None:
    out = assign_public_ids([rec("aaa", "llm", mhash="1"), rec("zzz", "llm", mhash="2"),
                             rec(MASTER, "llm", mhash="3")], MASTER, MemoryPublicIdStore())
    assert ids(out) == [("aaa", "llm", "llm-2"), ("zzz", "llm", "llm-3"), (MASTER, "llm", "llm")]


def test_without_a_local_copy_the_first_remote_in_order_gets_the_bare_id() -> None:
    out = assign_public_ids([rec("slave-b", "llm", mhash="2"), rec("slave-a", "llm", mhash="1")],
                            MASTER, MemoryPublicIdStore())
    assert ids(out) == [("slave-b", "llm", "llm-2"), ("slave-a", "llm", "llm")]


def test_suffix_never_moves_when_nodes_leave_and_come_back() -> None:
    store = MemoryPublicIdStore()
    master = rec(MASTER, "same")
    b = rec("slave-b", "same", mhash="b")
    c = rec("slave-c", "same", mhash="c")
    assert ids(assign_public_ids([master, b, c], MASTER, store))[1:] == [
        ("slave-b", "same", "same-2"), ("slave-c", "same", "same-3")]
    # slave-b leaves; a new node with a smaller node_id and yet another identity appears.
    a = rec("slave-a", "same", mhash="a")
    assert ids(assign_public_ids([master, a, c], MASTER, store))[1:] == [
        ("slave-a", "same", "same-4"), ("slave-c", "same", "same-3")]
    # slave-b comes back: it keeps same-2.
    out = assign_public_ids([master, a, b, c], MASTER, store)
    assert [r.public_id for r in out] == ["same", "same-4", "same-2", "same-3"]


def test_persisted_ids_survive_a_restart_with_nodes_arriving_in_another_order() -> None:
    store = MemoryPublicIdStore()
    first = assign_public_ids([rec("slave-a", "llm", mhash="a"), rec("slave-b", "llm", mhash="b")],
                              MASTER, store)
    assert [r.public_id for r in first] == ["llm", "llm-2"]
    restarted = MemoryPublicIdStore(rows=store.items())
    # After the restart slave-b registers first, then slave-a.
    assert [r.public_id for r in assign_public_ids([rec("slave-b", "llm", mhash="b")], MASTER,
                                                   restarted)] == ["llm-2"]
    out = assign_public_ids([rec("slave-b", "llm", mhash="b"), rec("slave-a", "llm", mhash="a")],
                            MASTER, restarted)
    assert [r.public_id for r in out] == ["llm-2", "llm"]


def test_a_remote_bare_id_is_kept_when_a_node_sorting_earlier_appears() -> None:
    store = MemoryPublicIdStore()
    assign_public_ids([rec("slave-m", "llm", mhash="m")], MASTER, store)
    out = assign_public_ids([rec("slave-a", "llm", mhash="a"), rec("slave-m", "llm", mhash="m")],
                            MASTER, store)
    assert ids(out) == [("slave-a", "llm", "llm-2"), ("slave-m", "llm", "llm")]


def test_never_hands_out_a_suffix_that_is_a_real_local_id() -> None:
    out = assign_public_ids([rec(MASTER, "same"), rec("slave-a", "same", mhash="x"),
                             rec("slave-b", "same-2", mhash="y")], MASTER, MemoryPublicIdStore())
    assert ids(out) == [(MASTER, "same", "same"), ("slave-a", "same", "same-3"),
                        ("slave-b", "same-2", "same-2")]


def test_a_later_remote_config_named_like_a_persisted_suffix_is_suffixed_itself() -> None:
    store = MemoryPublicIdStore()
    assign_public_ids([rec(MASTER, "same"), rec("slave-a", "same", mhash="x")], MASTER, store)
    out = assign_public_ids([rec(MASTER, "same"), rec("slave-a", "same", mhash="x"),
                             rec("slave-b", "same-2", mhash="y")], MASTER, store)
    assert ids(out) == [(MASTER, "same", "same"), ("slave-a", "same", "same-2"),
                        ("slave-b", "same-2", "same-2-2")]


def test_a_new_local_config_takes_the_bare_id_and_the_remote_moves_once() -> None:
    store = MemoryPublicIdStore()
    assign_public_ids([rec("slave-a", "llm", mhash="a")], MASTER, store)
    assert store.get("a:c", "llm") == "llm"
    out = assign_public_ids([rec(MASTER, "llm", mhash="local"), rec("slave-a", "llm", mhash="a")],
                            MASTER, store)
    assert [r.public_id for r in out] == ["llm", "llm-2"]
    assert store.get("a:c", "llm") == "llm-2"
    assert store.holder("llm") is None, "a local-only bare ID is implicit, not persisted"


def test_remote_replicas_of_the_masters_model_keep_its_id_when_the_master_drops_it() -> None:
    store = MemoryPublicIdStore()
    assign_public_ids([rec(MASTER, "m"), rec("slave-b", "m")], MASTER, store)
    assert store.get("m:c", "m") == "m"
    out = assign_public_ids([rec("slave-a", "m", chash="other"), rec("slave-b", "m")], MASTER, store)
    assert ids(out) == [("slave-a", "m", "m-2"), ("slave-b", "m", "m")]


def test_a_local_config_identical_to_a_suffixed_remote_model_merges_under_the_bare_id() -> None:
    store = MemoryPublicIdStore()
    assign_public_ids([rec("slave-a", "m", mhash="a"), rec("slave-b", "m", mhash="b")], MASTER, store)
    assert store.get("b:c", "m") == "m-2"
    out = assign_public_ids([rec(MASTER, "m", mhash="b"), rec("slave-a", "m", mhash="a"),
                             rec("slave-b", "m", mhash="b")], MASTER, store)
    assert ids(out) == [(MASTER, "m", "m"), ("slave-a", "m", "m-3"), ("slave-b", "m", "m")]
    assert store.get("a:c", "m") == "m-3"


def test_a_local_config_named_like_a_persisted_suffix_takes_it() -> None:
    store = MemoryPublicIdStore()
    assign_public_ids([rec(MASTER, "same"), rec("slave-a", "same", mhash="x")], MASTER, store)
    out = assign_public_ids([rec(MASTER, "same"), rec(MASTER, "same-2", mhash="q"),
                             rec("slave-a", "same", mhash="x")], MASTER, store)
    assert ids(out) == [(MASTER, "same", "same"), (MASTER, "same-2", "same-2"),
                        ("slave-a", "same", "same-3")]


def test_unhashed_records_get_ids_but_are_not_persisted() -> None:
    store = MemoryPublicIdStore()
    out = assign_public_ids([rec("slave-a", "llm", mhash="")], MASTER, store)
    assert out[0].public_id == "llm"
    assert store.items() == []
    # Once the slave has hashed its weights, the real identity is free to take the bare ID.
    out = assign_public_ids([rec("slave-a", "llm", mhash="h")], MASTER, store)
    assert out[0].public_id == "llm"
    assert store.items() == [("h:c", "llm", "llm")]


def test_same_identity_under_two_bases_is_two_models() -> None:
    out = assign_public_ids([rec(MASTER, "a"), rec(MASTER, "b")], MASTER, MemoryPublicIdStore())
    assert [r.public_id for r in out] == ["a", "b"]


@pytest.mark.parametrize("local_id, public_id, image_id, expected", [
    ("same", "same-2", "same-dream", "same-2-dream"),
    ("same", "same", "same-dream", "same-dream"),
    ("same", "same", "dream", "dream"),
    ("same", "same-2", "dream", "same-2-dream"),
    ("same", "same-2", None, None),
    ("same", "same-2", "", None),
])
def test_public_image_id_follows_the_public_id(local_id: str, public_id: str,
                                               image_id: str | None, expected: str | None) -> None:
    assert public_image_id(local_id, public_id, image_id) == expected


def test_assigned_records_carry_their_public_image_id() -> None:
    out = assign_public_ids([rec(MASTER, "same", image_id="same-dream"),
                             rec("slave-a", "same", mhash="x", image_id="same-dream")],
                            MASTER, MemoryPublicIdStore())
    assert [r.public_image_id for r in out] == ["same-dream", "same-2-dream"]


def test_memory_store_enforces_unique_public_ids_and_reports_writes() -> None:
    written: list[tuple[str, str, str]] = []
    store = MemoryPublicIdStore(rows=[("i1", "x", "x-2")], on_assign=lambda *row: written.append(row))
    assert store.get("i1", "x") == "x-2"
    assert store.holder("x-2") == ("i1", "x")
    with pytest.raises(PublicIdTaken):
        store.assign("i2", "x", "x-2")
    store.assign("i1", "x", "x-2")  # unchanged: no write
    store.assign("i1", "x", "x-5")
    assert store.holder("x-2") is None
    assert written == [("i1", "x", "x-5")]


def test_seeding_a_memory_store_with_a_duplicate_public_id_is_refused() -> None:
    with pytest.raises(PublicIdTaken):
        MemoryPublicIdStore(rows=[("i1", "x", "x-2"), ("i2", "x", "x-2")])


_NODES = ["master", "slave-a", "slave-b", "slave-c"]
_record = st.builds(rec, node_id=st.sampled_from(_NODES), local_id=st.sampled_from(["m", "m-2", "n"]),
                    mhash=st.sampled_from(["h1", "h2", "h3"]), chash=st.sampled_from(["c1", "c2"]))


def _unique_per_node(records: list[ModelRecord]) -> list[ModelRecord]:
    seen: set[tuple[str, str]] = set()
    out = []
    for r in records:
        if (r.node_id, r.local_id) not in seen:
            seen.add((r.node_id, r.local_id))
            out.append(r)
    return out


@settings(max_examples=200, deadline=None)
@given(rounds=st.lists(st.lists(_record, max_size=8), min_size=1, max_size=5))
def test_public_ids_are_unique_per_model_and_remote_ids_only_move_for_a_local_takeover(
        rounds: list[list[ModelRecord]]) -> None:
    store = MemoryPublicIdStore()
    seen: dict[tuple[str, str], str] = {}
    ever_local: set[str] = set()
    for records in rounds:
        records = _unique_per_node(records)
        out = assign_public_ids(records, MASTER, store)
        by_public: dict[str, tuple[str, str]] = {}
        ever_local.update(r.local_id for r in out if r.node_id == MASTER)
        master_groups = {(r.identity, r.local_id) for r in out if r.node_id == MASTER}
        for r in out:
            group = (r.identity, r.local_id)
            assert by_public.setdefault(r.public_id, group) == group, "one public ID, one model"
            if r.node_id == MASTER:
                assert r.public_id == r.local_id
            elif group in seen and seen[group] != r.public_id:
                # The only permitted moves: a local config took the ID it had (now or while it
                # was away), or the master now holds the same model, so its replicas join the
                # master's bare ID.
                merged = (r.identity, r.local_id) in master_groups
                assert seen[group] in ever_local or merged
            if r.node_id != MASTER:
                seen[group] = r.public_id
