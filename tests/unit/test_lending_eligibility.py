"""Remote text eligibility (spec "LLM lending" → Eligibility; reference §6): model records carry
``parallel`` / ``max_number_sequences``, the picker marks a concurrent remote model ineligible with
the reason, linking it is refused, and every plan re-checks eligibility."""

from __future__ import annotations

from typing import Any

import attrs

from routerd.catalog.model import Capabilities, ModelConfig
from routerd.wire.records import parse_record, record_from_config, record_to_json, text_ineligibility
from tests.unit.lending_api_support import Client, Parts, record
from tests.unit.test_lending_coordinator import A_TO_H, Cluster, helper_status, owner_status

TEXT = "/router/v1/site/text-routing-groups"


def config(**changes: Any) -> ModelConfig:
    return ModelConfig(local_id="m", filename="m.kcpps", path="/models/m.kcpps", backend_mode="llama_sdcpp",
                       capabilities=Capabilities(llm=True, context=4096), config_hash="c", **changes)


def test_unset_eligibility_fields_stay_off_the_wire() -> None:
    wire = record_to_json(record_from_config(config(), node_id="n", node_url="http://n"))
    assert "parallel" not in wire and "max_number_sequences" not in wire


def test_a_record_carries_parallel_and_max_number_sequences_from_its_config() -> None:
    rec = record_from_config(config(parallel=4, vllm_max_sequences=2), node_id="n", node_url="http://n")
    wire = record_to_json(rec)
    assert wire["parallel"] == 4 and wire["max_number_sequences"] == 2
    assert wire["capabilities"]["context"] == 4096
    assert parse_record(wire) == rec


def test_a_record_from_an_older_peer_without_the_fields_parses_as_unset() -> None:
    wire = record_to_json(record_from_config(config(parallel=1, vllm_max_sequences=1), node_id="n",
                                             node_url="http://n"))
    del wire["parallel"], wire["max_number_sequences"]
    rec = parse_record(wire)
    assert rec.parallel is None and rec.max_number_sequences is None
    assert text_ineligibility(rec) is None


def test_record_eligibility_applies_the_local_rule() -> None:
    base = record("s", "m")
    assert text_ineligibility(base) is None
    assert "parallel 4" in (text_ineligibility(attrs.evolve(base, parallel=4)) or "")
    assert "max_number_sequences 2" in (text_ineligibility(attrs.evolve(base, max_number_sequences=2)) or "")
    assert text_ineligibility(attrs.evolve(base, parallel=1, max_number_sequences=1)) is None


def picker() -> Parts:
    node = Parts()
    node.add(record("master", "llama", model_hash="H1"),
             attrs.evolve(record("slave-a", "busy", model_hash="H1"), parallel=4),
             attrs.evolve(record("slave-b", "vbusy", model_hash="H1"), max_number_sequences=8),
             record("slave-b", "fine", model_hash="H1"))
    return node


def test_the_picker_marks_a_concurrent_remote_model_ineligible_with_the_reason() -> None:
    _code, body = Client(picker()).get(TEXT, node_id="master", model_id="llama")
    cands = {f"{c['node_id']}/{c['model_id']}": c for c in body["candidates"]}
    assert cands["slave-a/busy"]["eligible"] is False
    assert "parallel 4" in cands["slave-a/busy"]["ineligible_reason"]
    assert cands["slave-b/vbusy"]["eligible"] is False
    assert "max_number_sequences 8" in cands["slave-b/vbusy"]["ineligible_reason"]
    assert cands["slave-b/fine"]["eligible"] is True


def test_linking_a_concurrent_remote_model_is_refused_with_the_reason() -> None:
    node = picker()
    code, body = Client(node).post(TEXT, {"anchor": {"node_id": "master", "model_id": "llama"},
                                          "lends_to": [{"node_id": "slave-a", "model_id": "busy"}]})
    assert code == 400
    assert "parallel 4" in body["error"]["message"]
    code, _ = Client(node).post(TEXT, {"anchor": {"node_id": "slave-a", "model_id": "busy"},
                                       "lends_to": [{"node_id": "master", "model_id": "llama"}]})
    assert code == 400


# -- every plan re-checks eligibility (Coordinator._facts → planner) -----------------------------------


def _reconfigure(cluster: Cluster, node_id: str, model_id: str, **changes: Any) -> None:
    models = cluster.master.registry.models
    for index, rec in enumerate(models):
        if (rec.node_id, rec.local_id) == (node_id, model_id):
            models[index] = attrs.evolve(rec, **changes)


def test_a_linked_helper_that_became_concurrent_is_skipped_at_the_next_plan_with_its_reason() -> None:
    cluster = Cluster(links=(A_TO_H,))
    cluster.master.status = {"s1": owner_status("s1", "A"), "s2": helper_status("s2", "H")}
    cluster.plan()
    assert [x["helper_node_id"] for x in cluster.coordinator.live_leases()] == ["s2"]
    assert [r["outcome"] for r in cluster.rows(kind="plan")] == ["granted"]

    _reconfigure(cluster, "s2", "H", parallel=4)  # the helper's config changed after the link was made
    cluster.plan()
    rows = cluster.rows(kind="plan")
    assert [(r["outcome"], r["reason"]) for r in rows[1:]] == [("skipped", "model_ineligible")]
    assert cluster.coordinator.live_leases() == []

    _reconfigure(cluster, "s2", "H", parallel=1)  # eligible again: lent to again
    cluster.plan()
    assert cluster.rows(kind="plan")[-1]["outcome"] == "granted"


def test_an_owner_that_became_ineligible_lends_nothing_and_says_why() -> None:
    cluster = Cluster(links=(A_TO_H,))
    cluster.master.status = {"s1": owner_status("s1", "A"), "s2": helper_status("s2", "H")}
    _reconfigure(cluster, "s1", "A", max_number_sequences=4)
    cluster.plan()
    rows = cluster.rows(kind="plan")
    assert [(r["outcome"], r["reason"]) for r in rows] == [("skipped", "model_ineligible")]
    assert cluster.coordinator.live_leases() == []


def test_a_helper_that_lost_its_context_window_is_skipped_as_ineligible() -> None:
    cluster = Cluster(links=(A_TO_H,))
    cluster.master.status = {"s1": owner_status("s1", "A"), "s2": helper_status("s2", "H")}
    _reconfigure(cluster, "s2", "H", capabilities=Capabilities(llm=True, context=0))
    cluster.plan()
    assert [r["reason"] for r in cluster.rows(kind="plan")] == ["model_ineligible"]
