"""``/metrics`` after traffic (issue 13): process and platform collectors, runtime state and queue
depth, node health (a master: per slave), time to first token and tokens per second by model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.unit.node_fixture import TEXT, World, master_cluster, slave_cluster

MESSAGES = [{"role": "user", "content": "count to ten"}]
#: The simulator on the world's clock (time scale 1), so requests take measurable time.
TIMED = {"extra_args": ["--sim-time-scale", "1"]}
SLOW_TEXT = {**TEXT, "load_ms": 200, "prompt_tokens_per_s": 100, "gen_tokens_per_s": 20}


def scrape(world: World, node: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response, body = world.call("GET", node, "/metrics")
    assert response.code == 200
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_after_traffic_cover_process_runtimes_first_token_and_token_rate(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"chat": SLOW_TEXT}, llama=TIMED)
    world.start(node)
    for stream in (True, False):
        response, _ = world.call("POST", node, "/v1/chat/completions", json={
            "model": "chat", "messages": MESSAGES, "max_tokens": 10, "stream": stream})
        assert response.code == 200

    got = scrape(world, node)

    assert ("process_resident_memory_bytes", ()) in got and ("process_cpu_seconds_total", ()) in got
    assert any(name == "python_info" for name, _labels in got)
    text = (("backend", "llama-server"), ("runtime", "text"))
    image = (("backend", "sd-server"), ("runtime", "image"))
    assert got[("routerd_runtime_state", (*text, ("state", "ready")))] == 1.0
    assert got[("routerd_runtime_state", (*text, ("state", "loading")))] == 0.0
    assert got[("routerd_runtime_state", (*image, ("state", "empty")))] == 1.0
    assert got[("routerd_runtime_model", (text[0], ("model", "chat"), text[1]))] == 1.0
    assert got[("routerd_queue_depth", text)] == 0.0
    assert got[("routerd_node_healthy", (("node_id", "solo"),))] == 1.0
    # only the streamed request has a first token apart from its last byte; the first one also
    # waited for the 200 ms load
    first = (("lane", "text"), ("model", "chat"))
    assert got[("routerd_time_to_first_token_seconds_count", first)] == 1.0
    assert got[("routerd_time_to_first_token_seconds_sum", first)] >= 0.2
    rate = (("model", "chat"),)
    assert got[("routerd_generation_tokens_per_second_count", rate)] == 2.0
    assert 5 < got[("routerd_generation_tokens_per_second_sum", rate)] / 2 <= 20
    assert got[("routerd_generated_tokens_total", rate)] == 20.0
    assert got[("routerd_model_load_duration_seconds_count", (("model", "chat"), ("runtime", "text")))] == 1


def test_queue_depth_counts_requests_waiting_for_a_runtime(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"chat": SLOW_TEXT, "other": SLOW_TEXT}, llama=TIMED)
    world.start(node)
    slot = node.runtimes.slot("text")
    lease = world.run(slot.acquire(node.catalog.get("chat")))
    waiting = slot.acquire(node.catalog.get("other"))  # a switch waits for the lease
    text = (("backend", "llama-server"), ("runtime", "text"))
    assert scrape(world, node)[("routerd_queue_depth", text)] == 1.0
    assert scrape(world, node)[("routerd_runtime_requests", text)] == 1.0
    lease.release()
    world.run(waiting).release()
    assert scrape(world, node)[("routerd_queue_depth", text)] == 0.0


def test_a_master_reports_each_slaves_health(tmp_path: Path) -> None:
    world = World(tmp_path)
    slave = world.node("slave", {"far": TEXT}, cluster=slave_cluster())
    master = world.node("master", {"chat": TEXT}, cluster=master_cluster())
    world.start(slave, master)
    assert scrape(world, master)[("routerd_node_healthy", (("node_id", "slave"),))] == 1.0
    world.network.unplug("slave.test:8080")
    world.run(master.master.poll_all())  # type: ignore[union-attr]
    got = scrape(world, master)
    assert got[("routerd_node_healthy", (("node_id", "slave"),))] == 0.0
    assert got[("routerd_node_healthy", (("node_id", "master"),))] == 1.0


def test_the_grafana_dashboard_uses_only_metrics_a_node_exports(tmp_path: Path) -> None:
    """Every series a panel of ``etc/grafana/routerd-dashboard.json`` queries is one a node's
    ``/metrics`` declares (a renamed metric breaks this test, not a dashboard in production)."""
    import json
    import re

    dashboard = json.loads((Path(__file__).parents[2] / "etc/grafana/routerd-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {re.sub(r"_(bucket|sum|count)$", "", name)
            for expr in exprs for name in re.findall(r"\b(?:routerd|process)_[a-z_]+", expr)}
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT})
    world.start(node)
    _response, body = world.call("GET", node, "/metrics")
    declared = set(re.findall(r"^# TYPE (\S+) ", body.decode(), re.MULTILINE))
    assert len(used) >= 15
    assert used - declared == set()
