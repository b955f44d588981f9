"""Benchmarks across the site (contract §7, §9): a run goes to the node holding the model, the
history is every node's merged.

``POST /router/v1/benchmarks/run {"model", "node_id"?}``: ``model`` is a public ID (or image ID) the
site knows, or, with ``node_id``, that node's local ID.  A model on this node runs here; one on
another node is run there through ``/router/v1/node/benchmarks/run`` (the master then re-reads the
node's snapshot, so its record carries the new ``benchmark``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlencode

from routerd.errors import HTTPError
from routerd.paths import NODE_BENCH_LIST, NODE_BENCH_RUN
from routerd.registry.records import NodeInfo
from routerd.site.analytics import merged_lists
from routerd.site.names import SiteNames
from routerd.site.service import SiteService
from routerd.wire.records import ModelRecord


def target(records: Sequence[ModelRecord], own_id: str, name: str) -> ModelRecord | None:
    """The record a site-wide ``model`` names: this node's first, else the first available one."""
    named = [r for r in records if not r.disabled and name in (r.public_id, r.public_image_id)]
    named.sort(key=lambda r: (r.node_id != own_id, not r.available, r.node_id))
    return named[0] if named else None


async def site_run(site: SiteService, run_here: Callable[[str], Awaitable[dict[str, Any]]],
                   name: str, node_id: str | None) -> dict[str, Any]:
    """Run the benchmark of ``name`` where the model is (see the module docstring)."""
    own_id = site.node_id
    if node_id is None or node_id == own_id:
        record = target(site.registry.records(), own_id, name) if node_id is None else None
        if record is None or record.node_id == own_id:
            return await run_here(record.local_id if record is not None else name)
        node_id, name = record.node_id, record.local_id

    def there(info: NodeInfo) -> Awaitable[Any]:
        return site.client.post_json(info.node_url, NODE_BENCH_RUN, {"model": name},
                                     timeout=site.client.operation_timeout)

    result = await site.on_node(node_id, lambda: run_here(name), there)
    await site.require().poll_all()  # the node's records now carry the result: the registry reads them again
    if not isinstance(result, dict):
        raise HTTPError(502, f"node {node_id!r} answered no benchmark", "backend_error", "backend_error")
    return result


async def site_history(site: SiteService, own: list[dict[str, Any]], model: str | None,
                       node_id: str | None) -> dict[str, Any]:
    """Every selected node's results, newest first."""
    path = NODE_BENCH_LIST + ("?" + urlencode({"model": model}) if model else "")
    found = await merged_lists(site, own, node_id, path, "benchmarks", "benchmarks", None)
    names = SiteNames(site.registry.records())
    for row in found["benchmarks"]:  # the site's name of the model first (its local ID is ``model``)
        row["public_id"] = names.public(str(row.get("node_id", "")), str(row.get("model", "")))
    return found


__all__ = ["site_history", "site_run", "target"]
