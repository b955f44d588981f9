"""The Docker demo cluster's files are consistent: every node config ``compose.yaml`` runs exists
under ``etc/docker`` (as the image lays it out), validates, and names the other nodes by service."""

from __future__ import annotations

from pathlib import Path

import yaml

from routerd.catalog.catalog import Catalog
from routerd.config.load import load_config

ROOT = Path(__file__).parents[2]


def test_compose_runs_valid_node_configs_that_find_each_other_by_service_name() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    token = compose["x-node"]["environment"]["ROUTERD_CLUSTER_TOKEN"]
    services = compose["services"]
    configs = {}
    for name, service in services.items():
        image_path = service["command"][service["command"].index("--config") + 1]
        assert image_path.startswith("/srv/routerd/etc/")  # the Dockerfile copies etc/ there
        config = load_config(str(ROOT / image_path.removeprefix("/srv/routerd/")),
                             env={"ROUTERD_CLUSTER_TOKEN": token})
        assert config.cluster.node_id == name and config.cluster.public_url == f"http://{name}:8080"
        assert len(Catalog.scan(config.models.config_dir, config.backend.mode).models) >= 2
        configs[name] = config
    master = configs["master"].cluster
    assert set(master.slave_urls) == {f"http://{n}:8080" for n in services if n != "master"}
    assert all(c.cluster.master_url == "http://master:8080" for n, c in configs.items() if n != "master")
