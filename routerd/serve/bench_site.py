"""Benchmarks across the site (contract §7, §9): a run goes to the node holding the model, the
history is every node's merged.

``POST /router/v1/benchmarks/run {"model", "node_id"?}``: ``model`` is a public ID (or image ID) the
site knows, or, with ``node_id``, that node's local ID.  A model on this node runs here; one on
another node is run there through ``/router/v1/node/benchmarks/run`` (the master then re-reads the
node's snapshot, so its record carries the new ``benchmark``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import urlencode

from twisted.internet import defer
from twisted.python.failure import Failure

from routerd.clients.node_client import ClusterError, RemoteError
from routerd.cluster.fanout import failure_text, fan_out
from routerd.errors import HTTPError
from routerd.lending.reports import FANOUT, NODE_TIMEOUT_S, select_nodes
from routerd.registry.records import NodeInfo
from routerd.wire.records import ModelRecord

NODE_BENCH_RUN = "/router/v1/node/benchmarks/run"
NODE_BENCH_LIST = "/router/v1/node/benchmarks"


class _Registry(Protocol):
    def nodes(self) -> Sequence[NodeInfo]: ...

    def node(self, node_id: str) -> NodeInfo | None: ...

    def records(self) -> Sequence[ModelRecord]: ...


class _Client(Protocol):
    @property
    def operation_timeout(self) -> float: ...

    def get_json(self, base: str, path: str, *, timeout: float | None = None) -> defer.Deferred[Any]: ...

    def post_json(self, base: str, path: str, body: Any, *,
                  timeout: float | None = None) -> defer.Deferred[Any]: ...


class BenchSite(Protocol):
    @property
    def registry(self) -> _Registry: ...

    @property
    def client(self) -> _Client: ...

    def poll_all(self) -> defer.Deferred[None]: ...


def target(records: Sequence[ModelRecord], own_id: str, name: str) -> ModelRecord | None:
    """The record a site-wide ``model`` names: this node's first, else the first available one."""
    named = [r for r in records if not r.disabled and name in (r.public_id, r.public_image_id)]
    named.sort(key=lambda r: (r.node_id != own_id, not r.available, r.node_id))
    return named[0] if named else None


async def site_run(site: BenchSite, own_id: str, run_here: Callable[[str], Awaitable[dict[str, Any]]],
                   name: str, node_id: str | None) -> dict[str, Any]:
    """Run the benchmark of ``name`` where the model is (see the module docstring)."""
    if node_id is None or node_id == own_id:
        record = target(site.registry.records(), own_id, name) if node_id is None else None
        if record is None or record.node_id == own_id:
            return await run_here(record.local_id if record is not None else name)
        node_id, name = record.node_id, record.local_id
    info = site.registry.node(node_id)
    if info is None:
        raise HTTPError(404, f"node {node_id!r} is not known", "not_found", "node_not_found")
    try:
        result = await site.client.post_json(info.node_url, NODE_BENCH_RUN, {"model": name},
                                             timeout=site.client.operation_timeout)
    except RemoteError as exc:
        raise HTTPError(exc.status, exc.message, exc.type, exc.code) from None
    except ClusterError as exc:
        raise HTTPError(502, f"node {node_id!r} did not answer: {exc.reason}", "backend_error",
                        "node_unreachable") from None
    await site.poll_all()  # the node's records now carry the result: the registry reads them again
    if not isinstance(result, dict):
        raise HTTPError(502, f"node {node_id!r} answered no benchmark", "backend_error", "backend_error")
    return result


async def site_history(site: BenchSite, own_id: str, own: list[dict[str, Any]], model: str | None,
                       node_id: str | None) -> dict[str, Any]:
    """Every selected node's results, newest first."""
    include_self, remotes, errors = select_nodes(site, None if node_id is None else [node_id], own_id)
    path = NODE_BENCH_LIST + ("?" + urlencode({"model": model}) if model else "")

    def ask(info: NodeInfo) -> defer.Deferred[Any]:
        return site.client.get_json(info.node_url, path, timeout=NODE_TIMEOUT_S)

    rows = list(own) if include_self else []
    for info, answer in await fan_out(remotes, ask, FANOUT):
        listed = answer.get("benchmarks") if isinstance(answer, dict) else None
        if isinstance(answer, Failure):
            errors.append({"node_id": info.node_id, "error": failure_text(answer)})
        elif not isinstance(listed, list):
            errors.append({"node_id": info.node_id, "error": "benchmarks answer has no benchmarks list"})
        else:
            rows.extend({**r, "node_id": info.node_id} for r in listed if isinstance(r, dict))
    rows.sort(key=_newest_first)
    return {"benchmarks": rows, "node_errors": sorted(errors, key=lambda e: e["node_id"])}


def _newest_first(row: Mapping[str, Any]) -> int:
    at = row.get("at_ms")
    return -at if isinstance(at, int) else 0


__all__ = ["NODE_BENCH_LIST", "NODE_BENCH_RUN", "BenchSite", "site_history", "site_run", "target"]
