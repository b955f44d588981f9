"""The configs of ``routerd-cluster`` and ``routerd demo``, prepared purely: the example configs found,
copied with their ports moved and their paths anchored, and the plan of nodes that results."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import attrs
import yaml

from routerd.config.schema import ModelsConfig
from routerd.families import binary_sections

SLAVE_FILES = ("slave-a.yaml", "slave-b.yaml")
MASTER_FILE = "master.yaml"
ROUTING_ONLY_FILE = "routing-only-master.yaml"


class DemoError(Exception):
    """The cluster cannot be prepared or started; the message says why."""


def default_config_dir(cwd: Path | None = None, prefix: str | None = None,
                       package_root: Path | None = None) -> Path | None:
    """The example configs: a checkout's ``etc/cluster``, else the installed copy."""
    here = package_root or Path(__file__).resolve().parents[2]
    candidates = [
        (cwd or Path.cwd()) / "etc" / "cluster",  # run from a checkout
        here / "etc" / "cluster",  # the checkout of an editable install
        Path(prefix or sys.prefix) / "share" / "routerd" / "cluster",  # setup.cfg data_files
    ]
    for candidate in candidates:
        if (candidate / MASTER_FILE).is_file():
            return candidate
    return None


def bind_port(bind: str) -> int:
    host, sep, port = bind.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise DemoError(f"server.bind must be host:port, got {bind!r}")
    return int(port)


def rewrite_url(url: str, ports: Mapping[int, int]) -> str:
    """``url`` with its port replaced when ``ports`` maps it; other URLs unchanged."""
    parts = urlsplit(url)
    if parts.port is None or parts.port not in ports or parts.hostname is None:
        return url
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return urlunsplit(parts._replace(netloc=f"{host}:{ports[parts.port]}"))


def rewrite_ports(data: Mapping[str, Any], ports: Mapping[int, int]) -> dict[str, Any]:
    """A copy of a parsed config with ``server.bind`` and every cluster URL moved by ``ports``.

    ``ports`` maps an example port to the port to use (8080 → 9080 …); binds and
    URLs on other ports are left alone.
    """
    out = _sections(data)
    server = out.setdefault("server", {})
    if "bind" in server:
        host, _, port = str(server["bind"]).rpartition(":")
        if port.isdigit() and int(port) in ports:
            server["bind"] = f"{host}:{ports[int(port)]}"
    cluster = out.get("cluster", {})
    for key in ("master_url", "public_url"):
        if isinstance(cluster.get(key), str):
            cluster[key] = rewrite_url(cluster[key], ports)
    urls = cluster.get("slave_urls")
    if isinstance(urls, str):
        urls = [urls]
    if isinstance(urls, list):
        cluster["slave_urls"] = [rewrite_url(u, ports) if isinstance(u, str) else u for u in urls]
    return out


def anchor_paths(data: Mapping[str, Any], source_dir: Path, store_name: str) -> dict[str, Any]:
    """A copy of a parsed config that still works when written to another folder.

    Model paths and binaries with a directory part become absolute (against
    ``source_dir``, the way routerd resolves them); a relative
    ``cluster.store_dir`` stays relative so the store lands next to the copy,
    and a missing one becomes ``./routerd-data/<store_name>``.
    """
    out = _sections(data)

    def absolute(value: str) -> str:
        return os.path.normpath(os.path.join(source_dir, os.path.expanduser(value)))

    models = out.setdefault("models", {})
    models["config_dir"] = absolute(str(models.get("config_dir") or ModelsConfig().config_dir))
    if models.get("shared_dir"):
        models["shared_dir"] = absolute(str(models["shared_dir"]))
    roots = models.get("file_roots")
    if isinstance(roots, str):
        roots = [roots]
    if isinstance(roots, list):
        models["file_roots"] = [absolute(r) if isinstance(r, str) and r else r for r in roots]
    for name in binary_sections():
        section = out.get(name)
        if not isinstance(section, dict):
            continue
        command = section.get("binary_path")
        if isinstance(command, str):
            section["binary_path"] = _anchor_program(command, absolute)
        elif isinstance(command, list) and command and isinstance(command[0], str):
            section["binary_path"] = [_anchor_program(command[0], absolute), *command[1:]]
    cluster = out.setdefault("cluster", {})
    if not cluster.get("store_dir"):
        cluster["store_dir"] = f"./routerd-data/{store_name}"
    return out


def _anchor_program(program: str, absolute: Callable[[str], str]) -> str:
    # Same rule as the config loader: a bare name is looked up on PATH.
    if os.sep in program or program.startswith("."):
        return absolute(program)
    return program


def _sections(data: Mapping[str, Any]) -> dict[str, Any]:
    """A two-level copy: sections are fresh dicts, so edits never reach ``data``."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        out[key] = dict(value) if isinstance(value, dict) else value
    return out


# -- the plan -------------------------------------------------------------------


@attrs.define
class NodeSpec:
    """One node of the demo: its written config, URL and log file."""

    name: str
    node_id: str
    role: str
    port: int
    config: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def prepare(config_dir: Path, run_dir: Path, base_port: int, routing_only: bool) -> list[NodeSpec]:
    """Write the master's and the slaves' configs into ``run_dir``; master first."""
    files = [ROUTING_ONLY_FILE if routing_only else MASTER_FILE, *SLAVE_FILES]
    parsed: list[tuple[str, dict[str, Any]]] = []
    for file_name in files:
        path = config_dir / file_name
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise DemoError(f"cannot read {path}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise DemoError(f"{path} is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise DemoError(f"{path} must hold a mapping of sections")
        parsed.append((file_name, data))
    ports = {bind_port(str(data.get("server", {}).get("bind", ""))): base_port + index
             for index, (_, data) in enumerate(parsed)}
    if len(ports) != len(parsed):
        raise DemoError(f"the configs in {config_dir} must bind three different ports")
    run_dir.mkdir(parents=True, exist_ok=True)
    nodes: list[NodeSpec] = []
    for index, (file_name, data) in enumerate(parsed):
        stem = file_name.removesuffix(".yaml")
        written = anchor_paths(rewrite_ports(data, ports), config_dir.resolve(), stem)
        config = run_dir / file_name
        config.write_text(f"# written by routerd-cluster from {config_dir / file_name}\n"
                          + yaml.safe_dump(written, sort_keys=False), encoding="utf-8")
        cluster = written.get("cluster", {})
        nodes.append(NodeSpec(name=stem, node_id=str(cluster.get("node_id", "local")),
                              role=str(cluster.get("role", "standalone")), port=base_port + index,
                              config=config, log=run_dir / f"{stem}.log"))
    return nodes
