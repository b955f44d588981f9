"""Reload (``process.reload``): the pure diff/classify functions, and a reload applied to a node in
memory through ``POST /router/v1/reload``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from routerd.catalog.catalog import Catalog
from routerd.catalog.model import Capabilities, ModelConfig
from routerd.config.load import parse_config
from routerd.config.schema import Config
from routerd.process.reload import catalog_diff, config_changes, live_config, slot_actions
from tests.unit.node_fixture import TEXT, World, master_cluster, slave_cluster

MESSAGES = [{"role": "user", "content": "hello"}]


def _config(**sections: dict[str, Any]) -> Config:
    return parse_config({"server": {"bind": "127.0.0.1:0"}, "models": {"config_dir": "."}, **sections},
                        base_dir="/", env={})


def _model(local_id: str, config_hash: str = "h1", **caps: bool) -> ModelConfig:
    return ModelConfig(local_id=local_id, filename=f"{local_id}.kcpps", path=f"/m/{local_id}.kcpps",
                       backend_mode="llama_sdcpp", capabilities=Capabilities(**(caps or {"llm": True})),
                       config_hash=config_hash)


# -- pure decisions ---------------------------------------------------------------------------


def test_live_keys_are_applied_and_the_others_named_as_needing_a_restart() -> None:
    old = _config()
    new = _config(server={"bind": "127.0.0.1:9999", "allowed_cidrs": ["127.0.0.0/8"]},
                  auth={"admin_keys": ["admin-key-0123456789abcdef"]},
                  cluster={"node_id": "renamed", "health_interval": "5s", "scheduling_min_samples": 7},
                  limits={"max_body_mb": 2})

    changes = config_changes(old, new)

    assert changes.applied == ("auth.admin_keys", "cluster.health_interval",
                               "cluster.lending.scheduling_min_samples", "limits.max_body_mb",
                               "server.allowed_cidrs")
    assert changes.restart_required == ("cluster.node_id", "server.bind")


def test_the_running_config_takes_the_live_keys_and_keeps_the_restart_ones() -> None:
    old = _config()
    new = _config(server={"bind": "127.0.0.1:9999", "allowed_cidrs": ["127.0.0.0/8"]},
                  cluster={"node_id": "renamed", "sync_interval": "7s", "scheduling_min_samples": 7})

    running = live_config(old, new)

    assert running.server.bind == old.server.bind and running.cluster.node_id == old.cluster.node_id
    assert running.server.allowed_cidrs == ("127.0.0.0/8",)
    assert running.cluster.sync_interval == 7.0
    assert running.cluster.lending.scheduling_min_samples == 7
    assert live_config(old, old) is old


def test_catalog_diff_names_added_removed_and_changed_configs() -> None:
    old = Catalog([_model("a"), _model("b"), _model("c")])
    new = Catalog([_model("a"), _model("c", config_hash="h2"), _model("d")])

    diff = catalog_diff(old, new)

    assert (diff.added, diff.removed, diff.changed) == (("d",), ("b",), ("c",))


def test_a_runtime_unloads_a_removed_model_and_reloads_a_changed_one_and_keeps_the_rest() -> None:
    changed = _model("c", config_hash="h2")
    catalog = Catalog([_model("a"), changed, _model("p", image=True)])
    # slot "text" runs models that serve text, slot "image" those that serve images
    places = lambda slot, model: model.capabilities.serves(slot)  # noqa: E731

    assert slot_actions([("text", "llama-server", _model("a"))], catalog, places) == []
    [gone] = slot_actions([("text", "llama-server", _model("b"))], catalog, places)
    assert (gone.slot, gone.name, gone.model_id, gone.action) == ("text", "llama-server", "b", "unload")
    [reload] = slot_actions([("text", "llama-server", _model("c"))], catalog, places)
    assert (reload.action, reload.config) == ("reload", changed)
    # a model that would now run elsewhere is unloaded from the runtime that holds it
    [moved] = slot_actions([("text", "llama-server", _model("p"))], catalog, places)
    assert moved.action == "unload"


# -- a node reloading ---------------------------------------------------------------------------


def _reload(world: World, node: Any) -> tuple[int, dict[str, Any]]:
    response, body = world.call("POST", node, "/router/v1/reload")
    return response.code, json.loads(body)


def _ids(world: World, node: Any) -> list[str]:
    _response, body = world.call("GET", node, "/v1/models")
    return sorted(m["id"] for m in json.loads(body)["data"])


def _write_model(node_home: Path, local_id: str, extra: dict[str, Any] | None = None) -> None:
    (node_home / f"{local_id}.sim.json").write_text(json.dumps(TEXT))
    (node_home / "models" / f"{local_id}.kcpps").write_text(
        json.dumps({"model": f"../{local_id}.sim.json", **(extra or {})}))


def test_reload_adds_and_removes_models_without_a_restart(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT, "old": TEXT})
    world.start(node)
    home = tmp_path / "solo"
    _write_model(home, "fresh")
    (home / "models" / "old.kcpps").unlink()

    code, report = _reload(world, node)

    assert code == 200, report
    assert (report["models"]["added"], report["models"]["removed"]) == (["fresh"], ["old"])
    assert _ids(world, node) == ["chat", "fresh"]
    response, _ = world.call("POST", node, "/v1/chat/completions",
                             json={"model": "fresh", "messages": MESSAGES, "max_tokens": 2})
    assert response.code == 200
    response, _ = world.call("POST", node, "/v1/chat/completions",
                             json={"model": "old", "messages": MESSAGES, "max_tokens": 2})
    assert response.code == 404


def test_a_changed_loaded_model_is_reloaded_only_once_its_request_finished(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT}, models={"startup_model": "chat"})
    world.start(node)
    slot = node.runtimes.slot("text")
    before = slot.loaded_config()
    lease = world.run(slot.acquire(before))  # a request being served
    _write_model(tmp_path / "solo", "chat", {"contextsize": 1024})

    code, report = _reload(world, node)

    assert code == 200 and report["models"]["changed"] == ["chat"]
    assert report["models"]["reloading"] == [{"model": "chat", "runtime": "llama-server"}]
    world.run(_settle(world))
    assert slot.loaded_config() == before and len(world.launcher.spawned) == 1  # never mid-request
    lease.release()
    world.run(_settle(world))
    loaded = slot.loaded_config()
    assert loaded is not None and loaded.context_size == 1024 and len(world.launcher.spawned) == 2


def test_a_removed_loaded_model_is_unloaded_when_idle(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT}, models={"startup_model": "chat"})
    world.start(node)
    slot = node.runtimes.slot("text")
    lease = world.run(slot.acquire(slot.loaded_config()))
    (tmp_path / "solo" / "models" / "chat.kcpps").unlink()

    code, report = _reload(world, node)

    assert code == 200 and report["models"]["unloading"] == [{"model": "chat", "runtime": "llama-server"}]
    assert slot.state.value == "ready"  # still serving its request
    lease.release()
    world.run(_settle(world))
    assert slot.state.value == "empty" and not world.launcher.spawned[0].running


def test_reload_applies_new_keys_at_once_and_names_keys_that_need_a_restart(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT})
    world.start(node)
    yaml_path = tmp_path / "solo" / "routerd.yaml"
    data = json.loads(yaml_path.read_text())
    data["auth"] = {"admin_keys": ["admin-key-0123456789abcdef"]}
    data["cluster"] = {**data["cluster"], "node_id": "renamed", "scheduling_backend_depth": 3}
    yaml_path.write_text(json.dumps(data))

    code, report = _reload(world, node)

    assert code == 200
    assert report["restart_required"] == ["cluster.node_id"]
    assert "auth.admin_keys" in report["applied"]
    assert node.node_id == "solo" and node.config.cluster.node_id == "solo"
    assert node.lending.settings.scheduling_backend_depth == 3
    response, _ = world.call("GET", node, "/router/v1/state")
    assert response.code == 401
    response, _ = world.call("GET", node, "/router/v1/state",
                             headers={"Authorization": "Bearer admin-key-0123456789abcdef"})
    assert response.code == 200


def test_reload_applies_the_limits_the_request_path_reads_once_per_config(tmp_path: Path) -> None:
    """The queue bound and aging, the form-part limit and the named keys' limits and weights are read
    once per config (not per request): a reload gives the parts the new values."""
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT})
    world.start(node)
    before = (node.lending.max_queued, node.local_side.max_form_parts(), node.lending.key_weights)
    assert before == (node.config.limits.max_queued_per_model, node.config.limits.max_form_parts, {})
    yaml_path = tmp_path / "solo" / "routerd.yaml"
    data = json.loads(yaml_path.read_text())
    data["limits"] = {**data.get("limits", {}), "max_queued_per_model": 7, "max_form_parts": 9}
    data["queue"] = {"aging": "5s"}
    data["auth"] = {"inference_keys": [
        {"name": "nightly", "key": "sk-nightly-0123456789", "limits": {"max_concurrent": 2, "weight": 3}},
        {"name": "chat", "key": "sk-chat-0123456789abc", "limits": {"weight": 5}}]}
    yaml_path.write_text(json.dumps(data))

    code, report = _reload(world, node)

    assert code == 200, report
    assert node.lending.max_queued == 7 and node.local_side.max_form_parts() == 9
    assert [q.order.aging_ms for q in node.lending.queues.values()] == [5000, 5000]
    assert node.lending.key_weights == {"nightly": 3.0, "chat": 5.0}
    limits = node.keys.limits("nightly")
    assert limits is not None and limits.max_concurrent == 2 and node.keys.limits("other") is None


def test_an_invalid_config_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT})
    world.start(node)
    before = node.config
    _write_model(tmp_path / "solo", "fresh")
    (tmp_path / "solo" / "routerd.yaml").write_text(json.dumps({"server": {"bind": "nowhere"}}))

    code, answer = _reload(world, node)

    assert code == 400 and "server.bind" in answer["error"]["message"]
    assert node.config is before and _ids(world, node) == ["chat"]


def _settle(world: World) -> Any:
    """A Deferred that fires once the clock has moved on a little (slot work done)."""
    from twisted.internet.task import deferLater

    return deferLater(world.clock, 1.0, lambda: None)



def test_a_reloaded_slave_re_registers_and_a_reloaded_master_re_polls(tmp_path: Path) -> None:

    world = World(tmp_path)
    slave = world.node("slave", {"far": TEXT}, cluster=slave_cluster(sync_interval="1h"))
    master = world.node("master", {"chat": TEXT}, cluster=master_cluster(health_interval="1h"))
    world.start(slave, master)
    world.run(slave.after_listening())
    assert _ids(world, master) == ["chat", "far"]

    _write_model(tmp_path / "slave", "added-on-slave")
    assert _reload(world, slave)[0] == 200  # the slave registers its new model at once
    assert _ids(world, master) == ["added-on-slave", "chat", "far"]

    (tmp_path / "slave" / "models" / "far.kcpps").unlink()
    # the slave's catalog changes without telling the master (as a slave with a sync interval would)
    from twisted.internet.defer import maybeDeferred

    from routerd.catalog.hashing import FileHashCache

    scanned = Catalog.scan(str(tmp_path / "slave" / "models"), "llama_sdcpp")
    slave.catalog = world.run(scanned.hashed(FileHashCache(str(tmp_path / "hashes.json")), maybeDeferred))
    _write_model(tmp_path / "master", "added-on-master")
    assert _reload(world, master)[0] == 200  # the master re-polls: the slave's change shows too
    assert _ids(world, master) == ["added-on-master", "added-on-slave", "chat"]


def test_analytics_settings_apply_at_once(tmp_path: Path) -> None:
    """``analytics.*`` is live: a reload turns recording on and the flush loop follows the
    new interval."""
    assert config_changes(_config(), _config(analytics={"enabled": False})).applied == ("analytics.enabled",)
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT}, analytics={"enabled": False})  # on by default: start it off
    world.start(node)
    assert not node.analytics.enabled
    home = tmp_path / "solo" / "routerd.yaml"
    data = json.loads(home.read_text())
    home.write_text(json.dumps({**data, "analytics": {"enabled": True, "flush_interval": "7s"}}))
    response, body = world.call("POST", node, "/router/v1/reload")
    assert response.code == 200, body
    assert node.analytics.enabled and node._analytics_loop.interval == 7.0
    world.call("POST", node, "/v1/chat/completions", json={"model": "chat", "messages": MESSAGES})
    assert world.run(node.analytics.flush()) == {"requests": 1, "loads": 1}  # the request, its model's load
    world.run(node.stop())
