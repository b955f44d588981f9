"""The swap-avoiding order on a real in-memory node (issue 33 item 2): three text models share the
node's one llama-server (the simulator on the world's clock, so a load takes simulated time), and
``A B A A C`` arrives while A is loaded.  With ``scheduling.swap_batch`` 2 the runtime loads A, B,
C (three loads) where FIFO loads A, B, A, C; the decision log names the request passed over and
``/metrics`` counts the requests served first and the switch avoided."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, gatherResults

from tests.unit.node_fixture import TEXT, World
from tests.unit.test_metrics_node import scrape

TIMED = {"extra_args": ["--sim-time-scale", "1"]}
#: A 2 s load and a job of about a second: a switch costs two jobs.
SLOW = {**TEXT, "load_ms": 2000, "prompt_tokens_per_s": 1000, "gen_tokens_per_s": 10}
MODELS = {"alpha": SLOW, "bravo": SLOW, "charlie": SLOW}


def _ask(world: World, node: Any, model: str) -> Deferred[Any]:
    http = world.network.client(world.clock)
    d: Deferred[Any] = http.request("POST", f"http://{world.netlocs[node]}/v1/chat/completions", json={
        "model": model, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})
    return d


def _trace(tmp_path: Path, swap_batch: int) -> tuple[World, Any, list[dict[str, Any]]]:
    """``alpha`` loaded; then ``alpha bravo alpha alpha charlie`` (one client each, in that order);
    answers the decision-log rows written meanwhile."""
    world = World(tmp_path)
    node = world.node("solo", MODELS, llama=TIMED, scheduling={"swap_batch": swap_batch},
                      cluster={"scheduling_backend_depth": 1})
    world.start(node)
    rows: list[dict[str, Any]] = []
    assert node.lending.decisions is not None
    node.lending.decisions.observe(lambda row, _count: rows.append(dict(row)))
    response, _ = world.call("POST", node, "/v1/chat/completions", json={
        "model": "alpha", "max_tokens": 1, "messages": [{"role": "user", "content": "warm"}]})
    assert response.code == 200
    sent = []
    for model in ("alpha", "bravo", "alpha", "alpha", "charlie"):
        sent.append(_ask(world, node, model))
        while world.network.flush():  # each arrives (and the first is admitted) before the next
            pass
    responses = world.run(gatherResults(sent))
    assert [r.code for r in responses] == [200] * 5
    for r in responses:
        world.run(r.content())
    return world, node, rows


def _loads(got: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> float:
    return sum(v for (name, labels), v in got.items() if name == "routerd_model_loads_total"
               and dict(labels).get("status") == "ok")


def test_a_shared_runtime_loads_once_per_model_with_swap_batch(tmp_path: Path) -> None:
    world, node, rows = _trace(tmp_path / "on", 2)
    got = scrape(world, node)
    assert _loads(got) == 3  # alpha (warm-up), bravo, charlie
    kept = (("model", "alpha"), ("runtime", "text"))
    assert got[("routerd_swap_batch_served_total", kept)] == 2
    assert got[("routerd_swaps_avoided_total", kept)] == 1
    passes = [row for row in rows if row["kind"] == "queue"]
    assert [(r["outcome"], r["reason"], r["lane"], r["owner_model_id"], r["helper_model_id"])
            for r in passes] == [("passed_over", "swap_avoided", "text", "bravo", "alpha")] * 2
    assert all(r["wait_ms"] > 0 and r["priority"] == "standard" for r in passes)
    assert passes[0]["request_id"] == passes[1]["request_id"]  # bravo's request, passed over twice


def test_off_the_shared_runtime_switches_back_and_forth_as_before(tmp_path: Path) -> None:
    world, node, rows = _trace(tmp_path / "off", 0)
    got = scrape(world, node)
    assert _loads(got) == 4  # alpha, bravo, alpha again, charlie
    assert not [row for row in rows if row["kind"] == "queue"]
    assert not [name for name, _ in got if name == "routerd_swaps_avoided_total"]


def test_the_scheduling_section_is_read_checked_and_live(tmp_path: Path) -> None:
    """``scheduling.swap_batch`` and ``swap_max_wait`` parse (off and 10 s by default), bad values are
    refused naming the key, and a reload applies them at once (each lane queue's order)."""
    from routerd.config.load import ConfigError, parse_config
    from routerd.process.reload import is_live

    def parse(section: dict[str, Any]) -> Any:
        return parse_config({"models": {"config_dir": str(tmp_path)}, "scheduling": section},
                            base_dir=str(tmp_path), env={})

    assert (parse({}).scheduling.swap_batch, parse({}).scheduling.swap_max_wait) == (0, 10.0)
    assert (parse({"swap_batch": 4, "swap_max_wait": "1m"}).scheduling.swap_max_wait) == 60.0
    refused = [({"swap_batch": -1}, "scheduling.swap_batch"), ({"swap_batch": "x"}, "scheduling.swap_batch"),
               ({"swap_max_wait": "soon"}, "scheduling.swap_max_wait"), ({"swap_bach": 2}, "swap_bach")]
    for bad, key in refused:
        try:
            parse(bad)
        except ConfigError as exc:
            assert any(key in str(item) for item in exc.errors), (bad, exc.errors)
        else:
            raise AssertionError(f"{bad} was accepted")
    assert is_live("scheduling.swap_batch") and is_live("scheduling.swap_max_wait")
    world = World(tmp_path / "live")
    node = world.node("solo", MODELS, scheduling={"swap_batch": 3, "swap_max_wait": "2s"})
    world.start(node)
    assert {(q.swap.limit, q.swap.max_wait_ms) for q in node.lending.queues.values()} == {(3, 2000)}
    yaml_path = tmp_path / "live" / "solo" / "routerd.yaml"
    data = json.loads(yaml_path.read_text())
    data["scheduling"] = {"swap_batch": 0}
    yaml_path.write_text(json.dumps(data))
    response, body = world.call("POST", node, "/router/v1/reload")
    assert response.code == 200, body
    assert {(q.swap.limit, q.swap.max_wait_ms) for q in node.lending.queues.values()} == {(0, 10_000)}
