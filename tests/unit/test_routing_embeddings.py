"""Selector-less embeddings scheduling (reference §6.7): which loaded configs are candidates."""

from __future__ import annotations

from routerd.catalog.model import Capabilities
from routerd.routing.embeddings import embeddings_candidates, rotated
from routerd.wire.records import ModelRecord


def record(node: str, local_id: str, *, public_id: str | None = None, loaded: bool = True,
           embeddings: bool = True, available: bool = True, disabled: bool = False) -> ModelRecord:
    return ModelRecord(public_id=public_id or local_id, local_id=local_id, node_id=node,
                       node_url=f"http://{node}", backend_mode="llama_sdcpp", filename=f"{local_id}.kcpps",
                       capabilities=Capabilities(embeddings=embeddings), loaded=loaded,
                       available=available, disabled=disabled)


def test_only_loaded_available_enabled_embeddings_configs_are_candidates() -> None:
    records = [record("b", "e5"), record("a", "e5"), record("a", "cold", loaded=False),
               record("a", "chat", embeddings=False), record("c", "gone", available=False),
               record("c", "off", disabled=True), record("me", "mine", loaded=False)]
    chosen = embeddings_candidates(records, "me", lambda filename: filename == "mine.kcpps")
    assert [(r.node_id, r.local_id) for r in chosen] == [("a", "e5"), ("b", "e5"), ("me", "mine")]


def test_a_local_config_counts_only_when_this_node_holds_it() -> None:
    records = [record("me", "mine", loaded=True)]
    assert embeddings_candidates(records, "me", lambda filename: False) == []


def test_duplicates_prefer_the_record_named_by_its_local_id() -> None:
    records = [record("a", "e5", public_id="e5-2"), record("a", "e5")]
    assert [r.public_id for r in embeddings_candidates(records, "me", lambda f: False)] == ["e5"]


def test_rotation_starts_at_the_turn_modulo_the_count() -> None:
    records = [record("a", "x"), record("b", "y"), record("c", "z")]
    assert [r.node_id for r in rotated(records, 4)] == ["b", "c", "a"]
    assert rotated([], 3) == []
