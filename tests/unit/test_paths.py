"""The node API's paths are spelled in one module, ``routerd/paths.py``: its route declarations and
every client that calls another node take them from there."""

from __future__ import annotations

import ast
from pathlib import Path

import routerd
from routerd import paths
from routerd.api.dispatch import Dispatch
from routerd.edge import build_site

from .node_fixture import TEXT, World

ROOT = Path(routerd.__file__).parent


def _spelled_paths(source: Path) -> list[tuple[int, str]]:
    """String constants in ``source`` that are (or start) a node-API path, docstrings aside."""
    tree = ast.parse(source.read_text())
    docstrings = {
        id(node.body[0].value) for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            and node.value.startswith(paths.NODE_PREFIX)]


def test_no_module_but_paths_spells_a_node_api_path() -> None:
    spelled = {str(source.relative_to(ROOT)): found for source in sorted(ROOT.rglob("*.py"))
               if source.name != "paths.py" and (found := _spelled_paths(source))}
    assert spelled == {}


def test_every_declared_node_route_is_a_path_of_the_module(tmp_path: Path) -> None:
    dispatch = build_site(World(tmp_path).node("solo", {"chat": TEXT})).resource.inner
    assert isinstance(dispatch, Dispatch)
    names = {value for name, value in vars(paths).items() if name.isupper() and isinstance(value, str)}
    assert len([d for d in dispatch.routes.routes if d.path.startswith(paths.NODE_PREFIX)]) > 30
    for declared in dispatch.routes.routes:
        if declared.path.startswith(paths.NODE_PREFIX):
            assert declared.path in names or any(
                declared.path.startswith(name) for name in names if name != paths.NODE_PREFIX), declared


def test_the_lean_node_paths_the_peer_client_knows_are_the_declared_lean_node_routes(tmp_path: Path) -> None:
    dispatch = build_site(World(tmp_path).node("solo", {"chat": TEXT})).resource.inner
    assert isinstance(dispatch, Dispatch)
    declared = {d.path for d in dispatch.routes.routes if d.lean and d.path.startswith(paths.NODE_PREFIX)}
    assert declared == set(paths.LEAN_PATHS)
