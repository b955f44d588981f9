"""Issue 33 item 4, the documents the Models page reads: each node's ``/state`` carries ``warm`` (per
local model: requests served ahead of a switch, switches avoided, KV slots saved and restored with
their bytes) and a master's site inventory carries ``replica_choices`` (per public ID and node:
affinity hits and misses, choices by load, keys moved by the load bound).  Both read the tallies
``/metrics`` reads, never a count of their own."""

from __future__ import annotations

import json
from pathlib import Path

from routerd.documents import replica_choice_counts, warm_counts
from tests.unit.test_kv_slots import model, served_then_stopped, world
from tests.unit.test_replica_choice_node import body, metrics, served_by, site
from tests.unit.test_swap_batch_node import _trace

ZERO = {"swap_batch_served": 0, "swaps_avoided": 0, "kv_slots_saved": 0, "kv_slots_restored": 0,
        "kv_bytes_saved": 0, "kv_bytes_restored": 0}


def test_warm_counts_sum_each_models_swap_tallies_over_lanes_and_add_its_kv_slot_rows() -> None:
    got = warm_counts([("text", "alpha", 2, 1), ("image", "alpha", 1, 1), ("text", "bravo", 0, 0)],
                      [("text", "alpha", 3, 2, 3000, 2000, 1), ("text", "chat", 1, 0, 500, 0, 0)])
    assert got == {
        "alpha": {**ZERO, "swap_batch_served": 3, "swaps_avoided": 2, "kv_slots_saved": 3,
                  "kv_slots_restored": 2, "kv_bytes_saved": 3000, "kv_bytes_restored": 2000},
        "bravo": ZERO,
        "chat": {**ZERO, "kv_slots_saved": 1, "kv_bytes_saved": 500}}
    assert warm_counts([], []) == {}


def test_replica_choice_counts_split_hits_misses_choices_by_load_and_bound_moves_per_replica() -> None:
    got = replica_choice_counts(
        [(("chat", "sa", "affinity", "affinity_hit"), 12.0),
         (("chat", "sa", "affinity", "affinity_new"), 2.0),
         (("chat", "sa", "affinity", "affinity_moved"), 1.0),
         (("chat", "sb", "affinity", "affinity_gone"), 1.0),
         (("chat", "sb", "affinity", "tie_rotation"), 4.0),
         (("code", "sa", "least_loaded", "least_loaded"), 5.0)],
        [(("chat", "sb"), 1.0)])
    assert got == [
        {"public_id": "chat", "node_id": "sa", "affinity_hits": 12, "affinity_misses": 3, "least_loaded": 0,
         "bound_moves": 0},
        {"public_id": "chat", "node_id": "sb", "affinity_hits": 0, "affinity_misses": 1, "least_loaded": 4,
         "bound_moves": 1},
        {"public_id": "code", "node_id": "sa", "affinity_hits": 0, "affinity_misses": 0, "least_loaded": 5,
         "bound_moves": 0}]


def test_a_nodes_state_shows_the_switches_its_swap_order_avoided_per_model(tmp_path: Path) -> None:
    """``alpha bravo alpha alpha charlie`` with ``scheduling.swap_batch`` 2 (the node test's trace):
    the node's ``/state`` says alpha was served twice ahead of a switch and one switch was avoided, the
    numbers ``/metrics`` shows."""
    world, node, _rows = _trace(tmp_path, 2)
    response, answer = world.call("GET", node, "/router/v1/site/nodes/state?node_id=solo")
    assert response.code == 200
    assert json.loads(answer)["warm"] == {"alpha": {**ZERO, "swap_batch_served": 2, "swaps_avoided": 1}}


def test_a_nodes_state_has_an_empty_warm_without_swap_batch(tmp_path: Path) -> None:
    world, node, _rows = _trace(tmp_path, 0)
    _response, answer = world.call("GET", node, "/router/v1/site/nodes/state?node_id=solo")
    assert json.loads(answer)["warm"] == {}


def test_the_kv_slot_keepers_rows_become_the_models_warm_counts() -> None:
    """A slot saved before its process stopped and restored for the session's next request: the
    keeper's rows (what ``/metrics`` reads) give the model 1 saved and 1 restored, 1000 bytes each."""
    w, chat = world(), model()
    served_then_stopped(w, chat, "header:s1")
    w.run(w.keeper.before_request(41002, chat, "header:s1"))
    assert warm_counts([], w.keeper.rows()) == {"chat": {**ZERO, "kv_slots_saved": 1, "kv_slots_restored": 1,
                                                         "kv_bytes_saved": 1000, "kv_bytes_restored": 1000}}


def test_the_site_inventory_counts_affinity_hits_and_misses_per_replica(tmp_path: Path) -> None:
    """Three sessions of four turns on a master with ``routing.replica_choice: affinity`` over two
    replicas: the inventory's ``replica_choices`` has a miss (the first turn) and three hits per
    session on that session's node, as ``routerd_replica_choices_total`` does."""
    world, master = site(tmp_path, "affinity")
    homes = {}
    for turn in range(4):
        for session in ("s1", "s2", "s3"):
            homes[session] = served_by(world, master, body(turn), X_Session_Id=session)
    response, answer = world.call("GET", master, "/router/v1/site/inventory")
    assert response.code == 200
    got = {(c["public_id"], c["node_id"]): c for c in json.loads(answer)["replica_choices"]}
    for node in set(homes.values()):
        sessions = sum(1 for home in homes.values() if home == node)
        assert got[("chat", node)] == {"public_id": "chat", "node_id": node, "affinity_hits": 3 * sessions,
                                       "affinity_misses": sessions, "least_loaded": 0, "bound_moves": 0}
    hits = sum(float(line.rsplit(" ", 1)[1]) for line in metrics(world, master).splitlines()
               if line.startswith("routerd_replica_choices_total{") and 'reason="affinity_hit"' in line)
    assert hits == sum(c["affinity_hits"] for c in got.values()) == 9


def test_a_site_with_rotation_lists_no_replica_choices(tmp_path: Path) -> None:
    world, master = site(tmp_path, "rotation")
    for turn in range(3):
        served_by(world, master, body(turn), X_Session_Id="s1")
    _response, answer = world.call("GET", master, "/router/v1/site/inventory")
    assert json.loads(answer)["replica_choices"] == []
