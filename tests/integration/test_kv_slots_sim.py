"""KV slots kept across swaps on the simulator's llama-server, which has no slot routes (404): a node keeping
slots swaps and answers as one that does not, saves nothing and counts no failure."""

from __future__ import annotations

from pathlib import Path

import treq

from tests.integration import nodes
from tests.integration.nodes import FAST_TEXT, post, wait_until

MODELS = {"alpha": {"model": "../weights/alpha.sim.json", "contextsize": 4096},
          "beta": {"model": "../weights/beta.sim.json", "contextsize": 4096}}
WEIGHTS = {"alpha": FAST_TEXT, "beta": FAST_TEXT}


async def test_a_backend_without_slot_routes_is_skipped_cleanly(tmp_path: Path) -> None:
    node = await nodes.start_standalone(tmp_path, MODELS, WEIGHTS, {"models": {"slot_keep_count": 4}})
    try:
        await wait_until(lambda: node.node.catalog.fully_hashed, timeout=10)
        statuses = []
        for model in ("alpha", "beta", "alpha"):  # two swaps: each tries to save alpha's or beta's slot
            status, body, _ = await post(node.url + "/v1/chat/completions",
                                         {"model": model, "messages": [{"role": "user", "content": "hi"}]},
                                         headers={"X-Session-Id": "s1"})
            statuses.append(status)
        assert statuses == [200, 200, 200]
        text = (await (await treq.get(node.url + "/metrics")).content()).decode()
    finally:
        await node.stop()
    saved = [line for line in text.splitlines() if line.startswith("routerd_kv_slots_saved_total{")]
    failed = [line for line in text.splitlines() if line.startswith("routerd_kv_slot_failures_total{")]
    assert saved and all(line.endswith(" 0.0") for line in saved), saved
    assert failed and all(line.endswith(" 0.0") for line in failed), failed
    assert list((tmp_path / "store" / "kv-slots").iterdir()) == []
