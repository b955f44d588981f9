"""A slave keeps what its master pushed (links, lending settings, guardians) in its router database:
restarted while the master is down it serves with them; the master's push at the next registration
wins.  A real master and slave on loopback with simulator backends; ``left`` has a text-only
``text`` and a multimodal ``vision``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest_twisted
import treq

from tests.integration.nodes import (
    FAST_TEXT,
    RunningNode,
    plan_cluster,
    registry_of,
    sim_model,
    start_node,
    wait_until,
    write_models,
)

GUARDIANS = "/router/v1/site/guardians"
TEXT_GROUPS = "/router/v1/site/text-routing-groups"
SETTINGS = "/router/v1/site/offload/settings"
PNG = "data:image/png;base64,iVBORw0KGgo="
JOB = {**FAST_TEXT, "load_ms": 30}
GUARDIAN = {"scope": "model", "node_id": "left", "model_id": "text",
            "guardian": {"node_id": "left", "model_id": "vision"}}
LINK = {"anchor": {"node_id": "master", "model_id": "chat"}, "acknowledge_different_weights": True,
        "lends_to": [{"node_id": "left", "model_id": "text", "restore_after_borrow": True}]}


async def _json(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    response = await treq.request(method, url, data=None if body is None else json.dumps(body).encode(),
                                  headers={"content-type": "application/json"})
    return response.code, json.loads(await response.content())


async def _image_for_text(node: RunningNode) -> tuple[int, dict[str, str], bytes]:
    content = [{"type": "text", "text": "what is in this picture"},
               {"type": "image_url", "image_url": {"url": PNG}}]
    body = {"model": "text", "max_tokens": 8, "messages": [{"role": "user", "content": content}]}
    response = await treq.post(node.url + "/v1/chat/completions", json=body)
    answer = await response.content()
    headers = {k.decode().lower(): v[0].decode() for k, v in response.headers.getAllRawHeaders()}
    return response.code, headers, answer


@pytest_twisted.ensureDeferred
async def test_a_slave_restarted_while_its_master_is_down_serves_with_what_the_master_pushed(
        tmp_path: Path) -> None:
    plan = plan_cluster(tmp_path, ["left"])
    write_models(plan.root / "master", {"chat": sim_model("chat")}, {"chat": JOB})
    write_models(plan.root / "left", {"text": sim_model("text"),
                                      "vision": sim_model("vision", mmproj="../weights/proj.gguf")},
                 {"text": JOB, "vision": JOB})
    (plan.root / "left" / "weights" / "proj.gguf").write_bytes(b"projector")
    master_config, left_config = plan.master_config(), plan.slave_config("left")
    master = await start_node(master_config)
    left: RunningNode | None = await start_node(left_config)
    try:
        registry = registry_of(master)
        await wait_until(lambda: registry.find("left", local_id="vision") is not None
                         and all(n.healthy for n in registry.nodes()))
        for path, body in ((GUARDIANS, GUARDIAN), (TEXT_GROUPS, LINK),
                           (SETTINGS, {"values": {"scheduling_backend_depth": 3}})):
            code, answer = await _json("POST", master.url + path, body)
            assert code == 200, answer
        lending = left.node.lending
        await wait_until(lambda: len(lending.guardians) == 1 and len(lending.links["text"]) == 1
                         and lending.settings.scheduling_backend_depth == 3)
        pushed_fingerprint = lending.sync_fingerprint()

        await left.stop()
        left = None
        # while the slave is down the master drops the guardian: its next push will say so
        code, answer = await _json("DELETE", master.url + GUARDIANS + "?scope=model&node_id=left"
                                                                      "&model_id=text")
        assert code == 200, answer
        await master.stop()

        left = await start_node(left_config)  # the master is down
        lending = left.node.lending
        assert len(lending.guardians) == 1 and len(lending.links["text"]) == 1
        assert lending.settings.scheduling_backend_depth == 3
        assert lending.sync_fingerprint() == pushed_fingerprint
        code, headers, content = await _image_for_text(left)
        assert code == 200, content
        assert headers["x-routerd-guardian"] == "left/vision"

        master = await start_node(master_config)  # the slave registers; the master's push wins
        await wait_until(lambda: len(lending.guardians) == 0, timeout=10)
        assert len(lending.links["text"]) == 1 and lending.settings.scheduling_backend_depth == 3
        store = left.node.store
        assert store is not None and await store.guardians() == []
    finally:
        if left is not None:
            await left.stop()
        await master.stop()
