"""Cook: a ``.kcpps`` built from the files a node's ``models.file_roots`` expose.

The decisions (:mod:`routerd.assets.cook`) on their own, then the API on real nodes in memory: a
standalone node cooking for itself, and a master cooking on its slave through the node route."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from routerd.assets.cook import MARK, CookError, CookOrder, CookShelf, cook, model_files, parse_order
from routerd.config.load import load_config
from routerd.node import Node
from tests.unit.node_fixture import TEXT, World, master_cluster, slave_cluster


def roots(tmp_path: Path) -> Path:
    root = tmp_path / "files"
    (root / "llm").mkdir(parents=True)
    (root / "llm" / "cooked.sim.json").write_text(json.dumps({"kind": "text", "weights": "cooked"}))
    (root / "llm" / "proj.gguf").write_bytes(b"projector")
    (tmp_path / "secret.gguf").write_bytes(b"outside")
    return root


def node_config(tmp_path: Path, binary: list[str] | None = None) -> Any:
    (tmp_path / "models").mkdir(exist_ok=True)
    data = {"models": {"config_dir": str(tmp_path / "models")},
            "llama": {"binary_path": binary if binary is not None else ["/bin/true"]}}
    (tmp_path / "routerd.yaml").write_text(json.dumps(data))
    return load_config(str(tmp_path / "routerd.yaml"), env={})


@pytest.mark.parametrize(("body", "fragment"), [
    ({"files": {"model": "a.gguf"}}, "id must be"),
    ({"id": "../x", "files": {"model": "a.gguf"}}, "id must be"),
    ({"id": "x.kcpps", "files": {"model": "a.gguf"}}, "id must be"),
    ({"id": "x"}, "files must name"),
    ({"id": "x", "files": {"weights": "a.gguf"}}, "unknown field 'weights'"),
    ({"id": "x", "files": {"model": 3}}, "files.model must be"),
    ({"id": "x", "files": {"model": "a"}, "contextsize": "4096"}, "contextsize must be an integer"),
    ({"id": "x", "files": {"model": "a"}, "parallel": 0}, "parallel must be an integer"),
    ({"id": "x", "files": {"model": "a"}, "extra_args": "--flash"}, "extra_args must be a list"),
    ({"id": "x", "files": {"model": "a"}, "backend_mode": "gpu"}, "backend_mode must be"),
    ({"id": "x", "files": {"model": "a"}, "colour": 1}, "unknown field 'colour'"),
])
def test_a_bad_order_is_refused_with_the_field_it_breaks(body: dict[str, Any], fragment: str) -> None:
    with pytest.raises(CookError, match=fragment):
        parse_order(body)


@pytest.mark.parametrize("path", ["../secret.gguf", "/etc/passwd", "llm/../../secret.gguf", "nope.gguf"])
def test_paths_never_leave_the_file_roots(tmp_path: Path, path: str) -> None:
    root = roots(tmp_path)
    with pytest.raises(CookError) as caught:
        cook(CookOrder("x", {"model": path}), [str(root)], str(tmp_path / "models"), node_config(tmp_path))
    assert caught.value.code == "unsafe_path"


def test_a_symlink_out_of_the_root_is_refused(tmp_path: Path) -> None:
    root = roots(tmp_path)
    os.symlink(tmp_path / "secret.gguf", root / "llm" / "link.gguf")
    with pytest.raises(CookError, match="not a file under"):
        cook(CookOrder("x", {"model": "llm/link.gguf"}), [str(root)], str(tmp_path / "models"),
             node_config(tmp_path))
    assert "llm/link.gguf" not in {f["path"] for f in model_files([str(root)])}


def test_the_config_names_the_real_files_and_settings_and_parses_to_a_multimodal_model(
        tmp_path: Path) -> None:
    root = roots(tmp_path)
    order = parse_order({"id": "vision", "files": {"model": "llm/cooked.sim.json", "mmproj": "llm/proj.gguf"},
                         "contextsize": 8192, "parallel": 2, "gpulayers": 99,
                         "extra_args": ["--flashattention"]})
    cooked = cook(order, [str(root)], str(tmp_path / "models"), node_config(tmp_path))
    assert cooked.filename == "vision.kcpps" and not cooked.exists
    assert cooked.config["model"] == str((root / "llm" / "cooked.sim.json").resolve())
    assert cooked.config["mmproj"] == str((root / "llm" / "proj.gguf").resolve())
    assert [cooked.config[k] for k in ("contextsize", "parallel", "gpulayers")] == [8192, 2, 99]
    assert cooked.config[MARK]["files"] == {"model": "llm/cooked.sim.json", "mmproj": "llm/proj.gguf"}
    doc = cooked.to_json()
    assert doc["check"] == {"ok": True, "errors": []}
    assert doc["model"]["capabilities"] == ["llm", "multimodal"] and doc["model"]["context"] == 8192


def test_the_preview_says_what_routerd_check_says_of_a_missing_backend_binary(tmp_path: Path) -> None:
    root = roots(tmp_path)
    cooked = cook(CookOrder("x", {"model": "llm/cooked.sim.json"}), [str(root)], str(tmp_path / "models"),
                  node_config(tmp_path, ["/nonexistent/llama-server"]))
    assert cooked.problems and "llama.binary_path" in cooked.problems[0]
    assert cooked.to_json()["check"]["ok"] is False


def test_the_shelf_writes_whole_refuses_overwrites_and_never_removes_a_hand_written_config(
        tmp_path: Path) -> None:
    root = roots(tmp_path)
    config = node_config(tmp_path)
    shelf = CookShelf(str(tmp_path / "models"))
    made = cook(CookOrder("x", {"model": "llm/cooked.sim.json"}), [str(root)], shelf.config_dir, config)
    path = shelf.write(made)
    assert json.loads(Path(path).read_text()) == made.config
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["x.kcpps"]  # no temporary left
    with pytest.raises(CookError, match="replace"):
        shelf.write(made)
    again = cook(CookOrder("x", {"model": "llm/cooked.sim.json"}, contextsize=4096, replace=True),
                 [str(root)], shelf.config_dir, config)
    assert again.exists
    shelf.write(again)
    assert json.loads(Path(path).read_text())["contextsize"] == 4096
    (tmp_path / "models" / "hand.kcpps").write_text(json.dumps({"model": "/w.gguf"}))
    with pytest.raises(CookError) as caught:
        shelf.remove("hand")
    assert caught.value.code == "not_cooked" and (tmp_path / "models" / "hand.kcpps").exists()
    shelf.remove("x")
    assert not Path(path).exists()


# -- the API on real nodes in memory ----------------------------------------------------------------


def call(world: World, node: Node, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    kwargs: dict[str, Any] = {} if body is None else {"json": body}
    response, content = world.call(method, node, path, **kwargs)
    return int(response.code), json.loads(content) if content else None


def cluster(tmp_path: Path) -> tuple[World, Node, Node]:
    world = World(tmp_path)
    root = roots(tmp_path)
    slave = world.node("slave", {"far": TEXT},
                       cluster=slave_cluster(),
                       models={"file_roots": [str(root)]})
    master = world.node("master", {"chat": TEXT},
                        cluster=master_cluster())
    world.start(slave, master)
    return world, master, slave


def test_a_master_cooks_on_its_slave_through_the_node_route_and_the_model_appears_in_the_inventory(
        tmp_path: Path) -> None:
    world, master, slave = cluster(tmp_path)
    order = {"node_id": "slave", "id": "cooked", "files": {"model": "llm/cooked.sim.json"},
             "contextsize": 4096}
    code, files = call(world, master, "GET", "/router/v1/site/cook/files?node_id=slave")
    assert code == 200 and "llm/cooked.sim.json" in {f["path"] for f in files["files"]}
    code, preview = call(world, master, "POST", "/router/v1/site/cook/preview", order)
    assert code == 200, preview
    assert preview["node_id"] == "slave" and preview["check"]["ok"]
    assert preview["config"]["contextsize"] == 4096
    assert not (tmp_path / "slave" / "models" / "cooked.kcpps").exists()  # a preview writes nothing

    code, applied = call(world, master, "POST", "/router/v1/site/cook/apply", order)
    assert code == 200, applied
    code, files = call(world, master, "GET", "/router/v1/site/cook/files?node_id=slave")
    assert files["cooked"] == [{"id": "cooked", "files": {"model": "llm/cooked.sim.json"}}]  # not "far"
    assert "cooked" in applied["reload"]["models"]["added"]
    assert (tmp_path / "slave" / "models" / "cooked.kcpps").exists()
    world.clock.advance(60)
    world.network.flush()
    code, inventory = call(world, master, "GET", "/router/v1/site/inventory")
    assert ("slave", "cooked") in {(m["node_id"], m["local_id"]) for m in inventory["models"]}

    code, again = call(world, master, "POST", "/router/v1/site/cook/apply", order)
    assert code == 409 and again["error"]["code"] == "exists"
    code, refused = call(world, master, "DELETE", "/router/v1/site/cook/far?node_id=slave")
    assert code == 409 and refused["error"]["code"] == "not_cooked"
    code, deleted = call(world, master, "DELETE", "/router/v1/site/cook/cooked?node_id=slave")
    assert code == 200 and deleted["deleted"] and "cooked" in deleted["reload"]["models"]["removed"]
    assert not (tmp_path / "slave" / "models" / "cooked.kcpps").exists()


def test_bad_input_answers_400_with_a_reason_and_writes_nothing(tmp_path: Path) -> None:
    world, master, _slave = cluster(tmp_path)
    code, body = call(world, master, "POST", "/router/v1/site/cook/apply",
                      {"node_id": "slave", "id": "x", "files": {"model": "../secret.gguf"}})
    assert code == 400 and body["error"]["code"] == "unsafe_path"
    code, body = call(world, master, "POST", "/router/v1/site/cook/preview",
                      {"node_id": "ghost", "id": "x", "files": {"model": "a"}})
    assert code == 404 and body["error"]["code"] == "node_not_found"
    code, body = call(world, master, "POST", "/router/v1/site/cook/preview",
                      {"id": "x", "files": {"model": "llm/cooked.sim.json"}})  # the master has no file roots
    assert code == 403 and body["error"]["code"] == "no_file_roots"
    assert sorted(p.name for p in (tmp_path / "slave" / "models").iterdir()) == ["far.kcpps"]


def test_a_split_recipe_across_nodes_is_previewed_without_saving_and_applied_into_the_recipe_book(
        tmp_path: Path) -> None:
    world, master, _slave = cluster(tmp_path)
    recipe = {"id": "duo", "text": {"node_id": "slave", "model_id": "far"}}
    code, preview = call(world, master, "POST", "/router/v1/site/cook/preview", {"recipe": recipe})
    assert code == 200 and preview["kind"] == "recipe" and preview["applied"] is False, preview
    assert call(world, master, "GET", "/router/v1/site/recipes")[1]["recipes"] == []
    code, bad = call(world, master, "POST", "/router/v1/site/cook/preview",
                     {"recipe": {"id": "duo", "text": {"node_id": "slave", "model_id": "ghost"}}})
    assert code == 400 and bad["error"]["code"] == "component_not_found"
    code, mixed = call(world, master, "POST", "/router/v1/site/cook/apply", {"recipe": recipe, "id": "x"})
    assert code == 400 and mixed["error"]["code"] == "invalid_cook"
    code, applied = call(world, master, "POST", "/router/v1/site/cook/apply", {"recipe": recipe})
    assert code == 200 and applied["applied"] is True
    assert [r["id"] for r in call(world, master, "GET", "/router/v1/site/recipes")[1]["recipes"]] == ["duo"]
