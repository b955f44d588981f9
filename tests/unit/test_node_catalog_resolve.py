"""A node's asset resolution never puts back a catalog that was replaced while it ran.

``AssetService.resolve`` binds the catalog it read at its start and hands the result to the node;
a catalog replaced meanwhile (a reload, or a test rescanning it) must stand, not be overwritten
with a result computed from the old one (the cause of a rare integration-test failure where a
helper "lost" a model and then served it anyway).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, ensureDeferred

from routerd.catalog.catalog import Catalog
from tests.unit.node_fixture import TEXT, World


def test_a_catalog_replaced_while_its_assets_resolve_is_not_overwritten_with_the_old_one(
        tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("helper", {"chat": TEXT, "beta": TEXT})
    world.start(node)
    resolver = node.assets.resolver
    real = resolver.resolve
    old_result = world.run(real(node.catalog))  # what the resolve under way will come back with
    held: Deferred[Any] = Deferred()
    calls: list[Catalog] = []

    def resolve(catalog: Catalog, *args: Any) -> Any:
        calls.append(catalog)
        return held if len(calls) == 1 else real(catalog, *args)

    resolver.resolve = resolve  # type: ignore[method-assign]
    under_way = ensureDeferred(node.assets.resolve())
    (tmp_path / "helper" / "models" / "beta.kcpps").unlink()
    node.catalog = Catalog.scan(node.config.models.config_dir, node.config.backend.mode)
    held.callback(old_result)
    world.run(under_way)

    assert node.catalog.get("beta") is None
    assert node.catalog.get("chat") is not None
    assert [c.get("beta") is None for c in calls] == [False, True]  # resolved again, the new one


def test_a_catalog_replaced_while_the_bound_one_is_hashed_stands(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("helper", {"chat": TEXT, "beta": TEXT})
    world.start(node)
    bound = node.catalog
    hashing: Deferred[Any] = Deferred()
    node._run_in_thread = lambda *_a, **_k: hashing  # the hash of the bound catalog is under way
    (tmp_path / "helper" / "models" / "beta.kcpps").unlink()
    newer = Catalog.scan(node.config.models.config_dir, node.config.backend.mode)
    binding = ensureDeferred(node._assets_bound(bound))
    node.catalog = newer
    hashing.callback(bound)
    world.run(binding)

    assert node.catalog is newer
