"""Real ``routerd.node.Node`` objects in memory: one ``task.Clock``, simulator backends, no sockets.

Only the node's stable surface is used: ``Node(config, reactor, launcher=, http=, agent=,
port_allocator=, open_store=, run_in_thread=)``, ``start()``/``stop()`` and ``site()``.

    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT}, models={"startup_model": "chat"})
    world.start(node)
    response, body = world.call("POST", node, "/v1/chat/completions", json={...})
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web.server import Site

from routerd.api.channel import NodeServerFactory
from routerd.backends.testing import FakeLauncher, FakeProcess, PortCounter
from routerd.config.load import load_config
from routerd.edge import build_site
from routerd.node import Node
from routerd.sim.cli import StartupError, make_server
from routerd.store.runner import MEMORY
from routerd.store.store import Store
from tests.unit.memory_http import MemoryNetwork

T = TypeVar("T")
SIM = [sys.executable, "-m", "routerd.sim"]
FAST = ["--sim-time-scale", "0"]  # every simulated duration (load, prompt, tokens) is zero
TOKEN = "unit-test-cluster-token-0123456789"
TEXT: dict[str, Any] = {"kind": "text", "weights": "tiny"}  # a text model's *.sim.json
IMAGE: dict[str, Any] = {"kind": "image", "weights": "paint"}  # an image model's: image ID "<id>-<id>"
#: The kcpps key a simulator weights file of each kind is named under.
WEIGHTS_KEY = {"text": "model", "image": "sdmodel", "stt": "whispermodel"}
#: Where a two-node world's slave and master listen (``MemoryNetwork`` host names).
SLAVE_URL = "http://slave.test:8080"
MASTER_URL = "http://master.test:8080"


def slave_cluster(public_url: str = SLAVE_URL, **extra: Any) -> dict[str, Any]:
    """The ``cluster`` section of a slave of the master at ``MASTER_URL``."""
    return {"role": "slave", "token": TOKEN, "master_url": MASTER_URL, "public_url": public_url, **extra}


def master_cluster(**extra: Any) -> dict[str, Any]:
    """The ``cluster`` section of a master at ``MASTER_URL`` with one slave at ``SLAVE_URL``."""
    return {"role": "master", "token": TOKEN, "slave_urls": [SLAVE_URL], "public_url": MASTER_URL, **extra}


class SimLauncher(FakeLauncher):
    """Each spawned backend is an in-memory simulator served on the network at its port."""

    def __init__(self, clock: Clock, network: MemoryNetwork) -> None:
        super().__init__()
        self.clock, self.network = clock, network
        self.sims: dict[int, Any] = {}  # port -> routerd.sim.cli.SimServer
        self.wrap: Callable[[Any], Any] = lambda resource: resource  # a test may doctor answers

    def spawn(self, argv: list[str], name: str, env: dict[str, str] | None = None) -> FakeProcess:
        process = super().spawn(argv, name, env)
        netloc = f"127.0.0.1:{process.port}"
        try:
            server = make_server(argv[argv.index(name):], clock=self.clock, on_exit=process.exit,
                                 out=io.StringIO(), err=io.StringIO())
        except StartupError as exc:
            self.clock.callLater(0, process.exit, exc.code, str(exc))
            return process
        self.sims[process.port] = server
        self.network.serve(netloc, Site(self.wrap(server.app.resource())))
        process.exited.addCallback(lambda _code: self.network.unplug(netloc))
        server.runtime.start()
        return process


class World:
    """The clock, network and launcher several nodes share; builds nodes and runs them."""

    def __init__(self, root: Path, *, on_disk: bool = False) -> None:
        """``on_disk``: each node's router database is a file in its home, so a node built again
        (:meth:`again`) reads what the one before it wrote."""
        self.root, self.clock, self.network = root, Clock(), MemoryNetwork()
        self.on_disk = on_disk
        self.launcher = SimLauncher(self.clock, self.network)
        self.ports = PortCounter()
        self.stores: dict[str, Store] = {}  # node_id -> the store its start() opened
        self.netlocs: dict[Node, str] = {}

    def node(self, node_id: str, models: dict[str, dict[str, Any]], /, **sections: dict[str, Any]) -> Node:
        """A node with ``models`` (local ID -> weights JSON, plus ``kcpps`` extras; the weights'
        ``kind`` picks the kcpps key: ``model``, ``sdmodel`` or ``whispermodel``), served at
        ``http://<node_id>.test:8080``; ``sections`` extend its config."""
        home = self.root / node_id
        (home / "models").mkdir(parents=True)
        for local_id, spec in models.items():
            weights = {k: v for k, v in spec.items() if k != "kcpps"}
            (home / f"{local_id}.sim.json").write_text(json.dumps(weights))
            weights_key = WEIGHTS_KEY.get(str(weights.get("kind", "text")), "model")
            kcpps = {weights_key: f"../{local_id}.sim.json", **spec.get("kcpps", {})}
            (home / "models" / f"{local_id}.kcpps").write_text(json.dumps(kcpps))
        data: dict[str, Any] = {
            # served under its .test name (server.allowed_hosts: the names a node answers to)
            "server": {"bind": "127.0.0.1:0", "allowed_hosts": [f"{node_id}.test"]},
            "models": {"config_dir": "models"},
            **{section: {"binary_path": [*SIM, family], "extra_args": FAST} for section, family in
               (("llama", "llama-server"), ("sdcpp", "sd-server"), ("whispercpp", "whisper-server"))},
            "cluster": {"node_id": node_id, "store_dir": "store"}}
        for name, values in sections.items():
            data[name] = {**data.get(name, {}), **values}
        (home / "routerd.yaml").write_text(json.dumps(data))  # JSON is YAML
        return self.again(node_id)

    def again(self, node_id: str) -> Node:
        """A node built (again) from ``node_id``'s home, served at its name: a restart, once the
        node before it has stopped."""
        config = load_config(str(self.root / node_id / "routerd.yaml"), env={})
        node = Node(config, self.clock, launcher=self.launcher, http=self.network.client(self.clock),
                    agent=self.network, port_allocator=self.ports, open_store=self._open_store(node_id),
                    run_in_thread=maybeDeferred)
        self.netlocs[node] = f"{node_id}.test:8080"
        # served as a real node listens: the lean channel, handing other requests to the site
        self.network.serve(self.netlocs[node], NodeServerFactory(build_site(node), lambda: node.phase))
        return node

    def _open_store(self, node_id: str) -> Any:
        def open_store(path: str) -> Deferred[Store]:
            where = str(self.root / node_id / "routerd.sqlite") if self.on_disk else MEMORY
            self.stores[node_id] = Store.open_sync(where, clock=self.clock)
            return succeed(self.stores[node_id])
        return open_store

    def run(self, d: Deferred[T] | Coroutine[Any, Any, T], limit: float = 120.0) -> T:
        """Pump the network and advance the clock, timer by timer, until ``d`` fires."""
        d = Deferred.fromCoroutine(d) if not isinstance(d, Deferred) else d
        out: list[T | Failure] = []
        d.addBoth(out.append)
        deadline = self.clock.seconds() + limit
        while not out:
            if self.network.flush():
                continue
            due = [c.getTime() for c in self.clock.getDelayedCalls()]
            if not due or min(due) > deadline:
                raise AssertionError(f"nothing answered within {limit} simulated seconds")
            self.clock.advance(max(0.0, min(due) - self.clock.seconds()))
        if isinstance(out[0], Failure):
            out[0].raiseException()
        return out[0]

    def start(self, *nodes: Node) -> None:
        for node in nodes:
            self.run(node.start())

    def call(self, method: str, node: Node | str, path: str, **kwargs: Any) -> tuple[Any, bytes]:
        """One client request to a node (or a ``host:port``); returns (response, whole body)."""
        netloc = node if isinstance(node, str) else self.netlocs[node]
        http = self.network.client(self.clock)
        response: Any = self.run(http.request(method, f"http://{netloc}{path}", **kwargs))
        return response, self.run(response.content())
