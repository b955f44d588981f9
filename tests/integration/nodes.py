"""Build real routerd nodes on 127.0.0.1 ephemeral ports with simulator backends."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
from twisted.internet import reactor

from routerd.config.load import parse_config
from routerd.config.schema import Config
from routerd.node import Node
from routerd.tap import NodeService
from tests.ports import free_port

SIM = [sys.executable, "-m", "routerd.sim"]

# A fast text model: 1 ms per prompt word, 5 ms per generated token.
FAST_TEXT = {"kind": "text", "load_ms": 40, "prompt_tokens_per_s": 1000, "gen_tokens_per_s": 200,
             "context": 4096}


def sim_model(weights: str, **extra: Any) -> dict[str, Any]:
    """A text model's ``.kcpps`` on ``../weights/<weights>.sim.json`` with 4096 tokens of context."""
    return {"model": f"../weights/{weights}.sim.json", "contextsize": 4096, **extra}


def write_models(root: Path, models: Mapping[str, Mapping[str, Any]],
                 weights: Mapping[str, Mapping[str, Any]]) -> Path:
    """Write ``<root>/models/<id>.kcpps`` and ``<root>/weights/<name>.sim.json``."""
    model_dir = root / "models"
    weight_dir = root / "weights"
    model_dir.mkdir(parents=True, exist_ok=True)
    weight_dir.mkdir(parents=True, exist_ok=True)
    for name, spec in weights.items():
        body = {"weights": name, **spec}
        (weight_dir / f"{name}.sim.json").write_text(json.dumps(body))
    for model_id, kcpps in models.items():
        (model_dir / f"{model_id}.kcpps").write_text(json.dumps(kcpps))
    return model_dir


def node_config(root: Path, extra: Mapping[str, Any] | None = None,
                env: Mapping[str, str] | None = None) -> Config:
    data: dict[str, Any] = {
        "server": {"bind": "127.0.0.1:0"},
        "models": {"config_dir": str(root / "models")},
        "backend": {"mode": "llama_sdcpp"},
        "llama": {"binary_path": [*SIM, "llama-server"]},
        "sdcpp": {"binary_path": [*SIM, "sd-server"]},
        "whispercpp": {"binary_path": [*SIM, "whisper-server"]},
        "cluster": {"store_dir": str(root / "store")},
    }
    for section, values in (extra or {}).items():
        data.setdefault(section, {})
        data[section] = {**data[section], **values}
    return parse_config(data, base_dir=str(root), env=env or {})


@attrs.define
class RunningNode:
    node: Node
    service: NodeService

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.service.port.getHost().port}"

    async def stop(self) -> None:
        await self.service.stopService()


async def kill(running: RunningNode) -> None:
    """The node dies as its peers see it: nothing listens any more and every open connection is
    dropped with no answer (no drain, no goodbye).  Its :meth:`RunningNode.stop` still cleans up."""
    port, running.service.port = running.service.port, None
    await port.stopListening()
    assert running.service.connections is not None
    for channel in list(running.service.connections.protocols):
        channel.abort()


async def start_node(config: Config) -> RunningNode:
    node = Node(config, reactor)
    service = NodeService(node, reactor)
    service.startService()
    try:
        await service.ready
    except BaseException:
        # A start that failed part-way (its store open, so its worker thread running; a backend
        # started) is stopped: nothing it started may live on into the tests that run after it.
        await service.stopService()
        raise
    return RunningNode(node, service)


async def start_standalone(root: Path, models: Mapping[str, Mapping[str, Any]],
                           weights: Mapping[str, Mapping[str, Any]],
                           extra: Mapping[str, Any] | None = None) -> RunningNode:
    """Write ``models`` and ``weights`` under ``root`` and start a standalone node serving them."""
    write_models(root, models, weights)
    return await start_node(node_config(root, extra))


async def post(url: str, body: Any, **kwargs: Any) -> tuple[int, Any, Any]:
    """POST ``body`` as JSON: the status, the answer (parsed when it is JSON, else its bytes) and the
    response."""
    import treq

    response = await treq.post(url, json=body, **kwargs)
    raw = await response.content()
    try:
        return response.code, json.loads(raw), response
    except ValueError:
        return response.code, raw, response


def sim_env() -> dict[str, str]:
    return dict(os.environ)


TOKEN = "integration-cluster-token-0123"


@attrs.define
class ClusterPlan:
    """Ports and configs for a master and its slaves on loopback."""

    root: Path
    master_port: int
    slave_ports: dict[str, int]

    def url(self, port: int) -> str:
        return f"http://127.0.0.1:{port}"

    @property
    def master_url(self) -> str:
        return self.url(self.master_port)

    def slave_url(self, name: str) -> str:
        return self.url(self.slave_ports[name])

    def master_config(self, extra_cluster: Mapping[str, Any] | None = None,
                      listed: list[str] | None = None, limits: Mapping[str, Any] | None = None,
                      sections: Mapping[str, Mapping[str, Any]] | None = None) -> Config:
        """The master's config; ``sections`` adds other top-level sections (``auth``, ``queue``)."""
        names = list(self.slave_ports) if listed is None else listed
        root = self.root / "master"
        return node_config(root, {
            **(sections or {}),
            "limits": dict(limits or {}),
            "server": {"bind": f"127.0.0.1:{self.master_port}"},
            "cluster": {"role": "master", "node_id": "master", "token": TOKEN,
                        "slave_urls": [self.slave_url(n) for n in names],
                        "health_interval": "200ms", **(extra_cluster or {})},
        })

    def slave_config(self, name: str, token: str = TOKEN,
                     extra_cluster: Mapping[str, Any] | None = None,
                     sections: Mapping[str, Mapping[str, Any]] | None = None) -> Config:
        """A slave's config; ``sections`` adds other top-level sections (``backend``, ``kobold``)."""
        return node_config(self.root / name, self.slave_sections(name, token, extra_cluster, sections))

    def slave_sections(self, name: str, token: str = TOKEN,
                       extra_cluster: Mapping[str, Any] | None = None,
                       sections: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
        """The config sections that make a node the slave ``name`` of this plan (its bind address and
        ``cluster``), with ``sections`` added: what :meth:`slave_config` and a real-backend node use."""
        return {
            **(sections or {}),
            "server": {"bind": f"127.0.0.1:{self.slave_ports[name]}"},
            "cluster": {"role": "slave", "node_id": name, "token": token,
                        "master_url": self.master_url, "public_url": self.slave_url(name),
                        "sync_interval": "200ms", **(extra_cluster or {})},
        }


def plan_cluster(root: Path, slaves: list[str]) -> ClusterPlan:
    """Ports for a master and ``slaves``: outside the kernel's ephemeral range (``tests/ports.py``),
    so a node stopped and started again finds its port still free."""
    return ClusterPlan(root, free_port(), {name: free_port() for name in slaves})


async def wait_until(predicate: Any, timeout: float = 5.0) -> None:
    """Poll ``predicate`` every 50 ms until it holds; fail after ``timeout`` seconds."""
    from twisted.internet import task

    for _ in range(int(timeout / 0.05)):
        if predicate():
            return
        await task.deferLater(reactor, 0.05, lambda: None)
    raise AssertionError("condition not reached in time")


@attrs.define
class Pair:
    """A master and one slave (``slave-a``), each with a text model ``chat``."""

    plan: ClusterPlan
    master: RunningNode
    slave: RunningNode | None  # None once a test has stopped it

    async def stop(self) -> None:
        if self.slave is not None:
            await self.slave.stop()
        await self.master.stop()


async def start_pair(root: Path) -> Pair:
    """Start the pair and wait until the master has accepted the slave's ``chat`` model."""
    plan = plan_cluster(root, ["slave-a"])
    for name in ("master", "slave-a"):
        write_models(plan.root / name, {"chat": sim_model("chat")},
                     {"chat": FAST_TEXT})
    cluster = await start_cluster(plan, ready=lambda r: knows(r, **{"slave-a": "chat"}) and all_healthy(r))
    return Pair(plan, cluster.master, cluster.slaves["slave-a"])


def registry_of(master: RunningNode) -> Any:
    """The master's merged registry (what the cluster fixtures wait on)."""
    return master.node.master.registry  # type: ignore[union-attr]


def knows(registry: Any, **models: str) -> bool:
    """Whether the registry holds each ``node=model`` given, e.g. ``knows(r, left="shy")``."""
    return all(registry.find(node, local_id=model) is not None for node, model in models.items())


def all_healthy(registry: Any) -> bool:
    return all(n.healthy for n in registry.nodes())


def slave(name: str) -> Any:
    """A read-only attribute naming one slave of a :class:`Cluster` (``owner = slave("owner")``)."""
    return property(lambda cluster: cluster.slaves[name], doc=f"The slave {name!r}.")


@attrs.define
class Cluster:
    """A running master and its slaves (by name); :meth:`stop` stops the slaves, last started
    first, then the master."""

    plan: ClusterPlan
    master: RunningNode
    slaves: dict[str, RunningNode]

    @property
    def registry(self) -> Any:
        return registry_of(self.master)

    async def stop(self) -> None:
        for running in reversed(list(self.slaves.values())):
            await running.stop()
        await self.master.stop()


async def start_cluster(plan: ClusterPlan, master: Config | None = None,
                        slaves: Mapping[str, Config] | None = None,
                        ready: Callable[[Any], bool] | None = None) -> Cluster:
    """Start the master (``plan.master_config()`` unless given), then each slave of the plan (its
    ``plan.slave_config(name)`` unless ``slaves`` gives one), and wait until ``ready(registry)``
    holds (by default: the master has seen every slave, all healthy)."""
    started_master = await start_node(master if master is not None else plan.master_config())
    configs = slaves if slaves is not None else {name: plan.slave_config(name) for name in plan.slave_ports}
    running = {name: await start_node(config) for name, config in configs.items()}
    cluster = Cluster(plan, started_master, running)
    registry = cluster.registry
    try:
        if ready is None:
            await wait_until(lambda: len([n for n in registry.nodes() if n.healthy]) == len(configs))
        else:
            await wait_until(lambda: ready(registry))
    except BaseException:
        await cluster.stop()
        raise
    return cluster
