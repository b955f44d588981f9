"""Issue 33 item 2 on a real standalone node: three text models share its one llama-server (the
simulator, a real process per load, so every switch stops a process and starts another), and
``alpha bravo alpha alpha charlie`` arrives while ``alpha`` runs.  Before (and with
``scheduling.swap_batch`` 0) the runtime loaded alpha, bravo, alpha again and charlie; with a batch
of 2 it loads alpha, bravo and charlie, and ``/metrics`` counts the switch avoided."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest_twisted
import treq
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import defer

from tests.integration.nodes import FAST_TEXT, RunningNode, sim_model, start_standalone, wait_until

#: A 0.2 s load; a job of 0.3 s (60 tokens at 200/s), the first one of the trace 2 s: it runs while the
#: others arrive.
SLOW = {**FAST_TEXT, "load_ms": 200, "gen_tokens_per_s": 200}
MODELS = {name: sim_model(name) for name in ("alpha", "bravo", "charlie")}
WEIGHTS = {name: SLOW for name in MODELS}


async def _chat(node: RunningNode, model: str, tokens: int = 60) -> tuple[int, float]:
    from twisted.internet import reactor

    response = await treq.post(node.url + "/v1/chat/completions", json={
        "model": model, "max_tokens": tokens, "messages": [{"role": "user", "content": "hi"}]})
    await response.content()
    return response.code, reactor.seconds()


async def _metrics(node: RunningNode) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = await treq.get(node.url + "/metrics")
    text = (await response.content()).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def swap_config(swap_batch: int) -> dict[str, Any]:
    """The node's config sections: ``scheduling.swap_batch`` and one request in the backend at a time."""
    return {"scheduling": {"swap_batch": swap_batch}, "cluster": {"scheduling_backend_depth": 1}}


async def send_trace(node: RunningNode) -> list[str]:
    """Warm alpha, then send ``alpha bravo alpha alpha charlie`` in that order while the first runs;
    the models in the order their answers ended."""
    assert (await _chat(node, "alpha", 1))[0] == 200  # alpha loaded
    queue = node.node.lending.queues["text"]
    sent = []
    for n, model in enumerate(("alpha", "bravo", "alpha", "alpha", "charlie")):
        sent.append((model, defer.Deferred.fromCoroutine(_chat(node, model, 400 if n == 0 else 60))))
        # each waits in the router queue (the first runs) before the next is sent: arrival order
        await wait_until(lambda n=n: len(queue.admitted()) + len(queue.pending()) == n + 1)
    ended = []
    for model, d in sent:
        code, at = await d
        assert code == 200
        ended.append((at, model))
    return [model for _, model in sorted(ended)]


async def _trace(root: Path, swap_batch: int) -> tuple[float, dict[str, Any], list[str]]:
    """Loads (ok) after warming alpha and sending the trace; the /metrics samples; the models in the
    order their answers ended."""
    node = await start_standalone(root, MODELS, WEIGHTS, extra=swap_config(swap_batch))
    try:
        order = await send_trace(node)
        got = await _metrics(node)
    finally:
        await node.stop()
    loads = sum(v for (name, labels), v in got.items()
                if name == "routerd_model_loads_total" and dict(labels).get("status") == "ok")
    return loads, got, order


@pytest_twisted.ensureDeferred
async def test_a_runtime_shared_by_three_models_loads_each_once_with_swap_batch(tmp_path: Path) -> None:
    loads, got, order = await _trace(tmp_path, 2)
    assert order == ["alpha", "alpha", "alpha", "bravo", "charlie"]
    assert loads == 3  # alpha, bravo, charlie
    kept = (("model", "alpha"), ("runtime", "text"))
    assert got[("routerd_swap_batch_served_total", kept)] == 2
    assert got[("routerd_swaps_avoided_total", kept)] == 1


@pytest_twisted.ensureDeferred
async def test_without_swap_batch_the_runtime_switches_back_and_forth(tmp_path: Path) -> None:
    """The same trace with swap_batch 0: today's order, one load more."""
    loads, got, order = await _trace(tmp_path, 0)
    assert order == ["alpha", "bravo", "alpha", "alpha", "charlie"]
    assert loads == 4
    assert not [name for name, _ in got if name.startswith("routerd_swap")]
