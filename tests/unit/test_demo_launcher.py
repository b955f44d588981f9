"""Pure helpers of ``routerd-cluster`` (routerd/demo/launcher.py)."""

from __future__ import annotations

import os
import wave
from pathlib import Path
from typing import Any

import yaml

from routerd.config.load import load_config
from routerd.demo.configs import (
    NodeSpec,
    anchor_paths,
    default_config_dir,
    prepare,
    rewrite_ports,
    rewrite_url,
)
from routerd.demo.launcher import describe, slaves_healthy

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "etc" / "cluster"
PORTS = {8080: 9080, 8081: 9081, 8082: 9082}


def test_rewrite_url_moves_only_mapped_ports() -> None:
    assert rewrite_url("http://127.0.0.1:8081", PORTS) == "http://127.0.0.1:9081"
    assert rewrite_url("http://127.0.0.1:8081/base/", PORTS) == "http://127.0.0.1:9081/base/"
    assert rewrite_url("http://[::1]:8080", PORTS) == "http://[::1]:9080"
    assert rewrite_url("http://127.0.0.1:7000", PORTS) == "http://127.0.0.1:7000"
    assert rewrite_url("http://example.org", PORTS) == "http://example.org"


def test_rewrite_ports_moves_bind_and_every_cluster_url_without_touching_the_input() -> None:
    data: dict[str, Any] = {"server": {"bind": "127.0.0.1:8080"},
                            "cluster": {"role": "master", "public_url": "http://127.0.0.1:8080",
                                        "slave_urls": ["http://127.0.0.1:8081",
                                                       "http://127.0.0.1:8082"]}}
    out = rewrite_ports(data, PORTS)
    assert out["server"]["bind"] == "127.0.0.1:9080"
    assert out["cluster"]["public_url"] == "http://127.0.0.1:9080"
    assert out["cluster"]["slave_urls"] == ["http://127.0.0.1:9081", "http://127.0.0.1:9082"]
    assert data["server"]["bind"] == "127.0.0.1:8080"  # the parsed example is not edited
    slave = rewrite_ports({"server": {"bind": "0.0.0.0:8082"},
                           "cluster": {"master_url": "http://10.0.0.1:8080"}}, PORTS)
    assert slave["server"]["bind"] == "0.0.0.0:9082"
    assert slave["cluster"]["master_url"] == "http://10.0.0.1:9080"


def test_anchor_paths_makes_model_paths_absolute_and_keeps_the_store_next_to_the_copy() -> None:
    data = {"models": {"config_dir": "models/master", "file_roots": ["~/w", "/abs"]},
            "llama": {"binary_path": ["routerd-sim", "llama-server"]},
            "sdcpp": {"binary_path": "./bin/sd-server"},
            "cluster": {"store_dir": "./routerd-data/master"}}
    out = anchor_paths(data, Path("/srv/examples"), "master")
    assert out["models"]["config_dir"] == "/srv/examples/models/master"
    assert out["models"]["file_roots"] == [os.path.expanduser("~/w"), "/abs"]
    assert out["llama"]["binary_path"] == ["routerd-sim", "llama-server"]  # looked up on PATH
    assert out["sdcpp"]["binary_path"] == "/srv/examples/bin/sd-server"
    assert out["cluster"]["store_dir"] == "./routerd-data/master"
    bare = anchor_paths({}, Path("/srv/examples"), "slave-a")
    assert bare["models"]["config_dir"] == "/srv/examples/models"
    assert bare["cluster"]["store_dir"] == "./routerd-data/slave-a"


def test_prepare_writes_valid_configs_on_the_base_port_into_the_run_dir(tmp_path: Path) -> None:
    nodes = prepare(EXAMPLES, tmp_path, 9100, routing_only=False)
    assert [(n.name, n.node_id, n.role, n.port) for n in nodes] == [
        ("master", "master", "master", 9100), ("slave-a", "slave-a", "slave", 9101),
        ("slave-b", "slave-b", "slave", 9102)]
    master = load_config(str(nodes[0].config), env={})
    assert master.server.bind == "127.0.0.1:9100"
    assert master.cluster.slave_urls == ("http://127.0.0.1:9101", "http://127.0.0.1:9102")
    assert master.models.config_dir == str(EXAMPLES / "models" / "master")
    assert master.cluster.store_dir == str(tmp_path / "routerd-data" / "master")
    slave = load_config(str(nodes[2].config), env={})
    assert slave.cluster.master_url == "http://127.0.0.1:9100"
    assert slave.cluster.public_url == "http://127.0.0.1:9102"
    # the examples themselves are untouched
    assert "127.0.0.1:8080" in (EXAMPLES / "master.yaml").read_text()


def test_prepare_routing_only_uses_the_master_without_models(tmp_path: Path) -> None:
    nodes = prepare(EXAMPLES, tmp_path, 9200, routing_only=True)
    assert nodes[0].name == "routing-only-master" and nodes[0].role == "master"
    config = load_config(str(nodes[0].config), env={})
    assert config.models.startup_model == ""
    assert config.backend.mode == "llama_sdcpp"
    assert not [f for f in os.listdir(config.models.config_dir) if f.endswith(".kcpps")]


def test_every_example_config_validates_and_the_token_is_a_real_shared_secret() -> None:
    tokens = set()
    for path in sorted(EXAMPLES.glob("*.yaml")):
        config = load_config(str(path), env={})
        tokens.add(config.cluster.token)
        assert config.cluster.role in ("master", "slave")
        assert config.cluster.store_dir.startswith(str(EXAMPLES / "routerd-data"))
    assert len(tokens) == 1 and len(next(iter(tokens))) >= 16
    assert "ROUTERD_CLUSTER_TOKEN" in (EXAMPLES / "master.yaml").read_text()


def test_slaves_share_one_identical_model_with_the_master_and_one_with_other_weights() -> None:
    models = EXAMPLES / "models"
    master = (models / "master" / "llama-8b.kcpps").read_text()
    assert master == (models / "slave-a" / "llama-8b.kcpps").read_text()
    assert master != (models / "slave-b" / "llama-8b.kcpps").read_text()
    for slave in ("slave-a", "slave-b"):
        assert "whispermodel" in (models / slave / "whisper-small.kcpps").read_text()


def test_default_config_dir_prefers_a_checkout_then_the_installed_copy(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    installed = tmp_path / "prefix" / "share" / "routerd" / "cluster"
    assert default_config_dir(cwd=elsewhere, prefix=str(tmp_path / "prefix"), package_root=elsewhere) is None
    installed.mkdir(parents=True)
    (installed / "master.yaml").write_text(yaml.safe_dump({}))
    assert default_config_dir(cwd=elsewhere, prefix=str(tmp_path / "prefix"),
                              package_root=elsewhere) == installed
    # run from a checkout (or an editable install of one), the checkout's etc/cluster wins
    assert default_config_dir(cwd=REPO, prefix=str(tmp_path / "prefix"),
                              package_root=elsewhere) == EXAMPLES
    assert default_config_dir(cwd=elsewhere, prefix=str(tmp_path / "prefix"), package_root=REPO) == EXAMPLES


def test_slaves_healthy_needs_every_slave_listed_healthy() -> None:
    inventory = {"nodes": [{"node_id": "master", "healthy": True}, {"node_id": "slave-a", "healthy": True},
                           {"node_id": "slave-b", "healthy": False}]}
    assert slaves_healthy(inventory, ["slave-a"])
    assert not slaves_healthy(inventory, ["slave-a", "slave-b"])
    assert not slaves_healthy({"nodes": []}, ["slave-a"])
    assert not slaves_healthy(None, ["slave-a"])


def test_describe_lists_urls_models_by_node_and_curl_examples(tmp_path: Path) -> None:
    nodes = [NodeSpec("master", "master", "master", 9300, tmp_path / "m.yaml", tmp_path / "master.log"),
             NodeSpec("slave-a", "slave-a", "slave", 9301, tmp_path / "a.yaml", tmp_path / "slave-a.log")]
    llm = {"llm": True, "embeddings": False, "stt": False, "image": False}
    inventory = {"models": [
        {"public_id": "llama-8b", "node_id": "master", "capabilities": llm},
        {"public_id": "llama-8b", "node_id": "slave-a", "capabilities": llm},
        {"public_id": "sketch", "public_image_id": "sketch-dream", "node_id": "slave-a",
         "capabilities": {"image": True}},
        {"public_id": "whisper-small", "node_id": "slave-a", "capabilities": {"stt": True}}]}
    text = describe(nodes, inventory, tmp_path)
    assert "routerd-cluster: ready" in text
    assert "http://127.0.0.1:9300" in text and "http://127.0.0.1:9301" in text
    assert "llama-8b             master, slave-a" in text
    assert '"model": "llama-8b"' in text and "sketch-dream" in text and "model=whisper-small" in text


def test_the_transcription_example_names_an_audio_file_the_launcher_writes(tmp_path: Path) -> None:
    """The hint's ``-F file=@…`` is a WAV in the run folder that exists once the cluster is ready (it
    named a ``speech.wav`` nobody wrote), and the text names the WebUI."""
    from routerd.demo.launcher import write_sample_audio  # new in issue 32

    nodes = [NodeSpec("master", "master", "master", 9300, tmp_path / "m.yaml", tmp_path / "master.log")]
    stt = {"public_id": "whisper-small", "node_id": "master", "capabilities": {"stt": True}}
    inventory = {"models": [stt]}
    text = describe(nodes, inventory, tmp_path)
    written = write_sample_audio(tmp_path)
    assert f"-F file=@{written} -F model=whisper-small" in text
    with wave.open(str(written)) as audio:
        assert audio.getnframes() / audio.getframerate() >= 1.0
    assert "WebUI: http://127.0.0.1:9300/ui/" in text
