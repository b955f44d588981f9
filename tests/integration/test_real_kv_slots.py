"""KV slots kept across swaps on real ``llama-server`` processes (``models.slot_keep_count``).

A long conversation's first turn runs on one model, a swap to another model stops its llama-server, and
the conversation's second turn comes back: with slots kept, llama-server's answer says the whole first
turn's prompt came from its cache (``usage.prompt_tokens_details.cached_tokens``, restored from the file
routerd had it save before the stop); without, it evaluates everything again.  Another weight file (an
f16 copy of the same model, whose llama-server would take the file without a complaint) never gets the
session's slot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import treq

from tests.integration.nodes import RunningNode, post, start_node, wait_until
from tests.integration.real_backends import RealServers, TinyModels, real_node_config
from tests.support_models import write_tiny_llama

pytestmark = [pytest.mark.slow, pytest.mark.real]

#: A system prompt of about 580 tokens for the tiny model (its vocabulary's words).
SYSTEM = " ".join(["hello tiny test model"] * 60)


def opening(session: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Say hello {session}"}]


async def ask(node: RunningNode, model: str, messages: list[dict[str, str]], session: str) -> dict[str, Any]:
    status, body, _ = await post(node.url + "/v1/chat/completions",
                                 {"model": model, "messages": messages, "max_tokens": 8},
                                 headers={"X-Session-Id": session})
    assert status == 200, body
    assert isinstance(body, dict)
    return body


def cached(answer: dict[str, Any]) -> int:
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


async def metrics(node: RunningNode) -> str:
    response = await treq.get(node.url + "/metrics")
    return str((await response.content()).decode())


def sample(text: str, line_start: str) -> float:
    [value] = [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(line_start)]
    return float(value)


BYTES = 'routerd_kv_slot_bytes_total{{direction="{}",model="chat",runtime="text"}}'


async def warm(node: RunningNode) -> dict[str, Any]:
    """The node's ``warm`` counts (its ``/state``, as the site API answers it: the Models page)."""
    response = await treq.get(node.url + "/router/v1/site/nodes/state?node_id=" + node.node.node_id)
    assert response.code == 200
    return dict((await response.json())["warm"])


async def start(root: Path, servers: RealServers, tiny: TinyModels, keep: int) -> RunningNode:
    root.mkdir(parents=True, exist_ok=True)
    other = str(write_tiny_llama(root / "tiny-f16.gguf", f16=True))
    models = {"chat": {"model": tiny.tiny, "contextsize": 2048, "parallel": 1},
              "other": {"model": other, "contextsize": 2048, "parallel": 1}}
    config = real_node_config(root, servers, models, extra={"models": {"slot_keep_count": keep}})
    node = await start_node(config)
    await wait_until(lambda: node.node.catalog.fully_hashed, timeout=20)
    return node


async def interrupted(node: RunningNode) -> tuple[dict[str, Any], dict[str, Any]]:
    """The first turn, a swap to the other model and back, the second turn."""
    first = await ask(node, "chat", opening("s1"), "s1")
    await ask(node, "other", opening("s2"), "s2")  # the swap: chat's llama-server is stopped
    reply = first["choices"][0]["message"]["content"]
    second = await ask(node, "chat", [*opening("s1"), {"role": "assistant", "content": reply},
                                      {"role": "user", "content": "Say hello again"}], "s1")
    return first, second


async def test_a_conversation_interrupted_by_a_swap_resumes_from_its_kept_slot_and_not_without(
        tmp_path: Path, real_servers: RealServers, tiny_models: TinyModels) -> None:
    """With slots kept the second turn after the swap finds its whole first turn cached (restored from the
    file saved before the stop: counted in /metrics and in the node state's ``warm``, the same
    numbers); without, it pays the whole prefix again."""
    kept = await start(tmp_path / "kept", real_servers, tiny_models, keep=4)
    try:
        first, second = await interrupted(kept)
        text = await metrics(kept)
        counts = await warm(kept)
    finally:
        await kept.stop()
    prefix = first["usage"]["prompt_tokens"]
    assert prefix > 500
    assert cached(second) >= 0.9 * prefix, (first["usage"], second["usage"])
    assert sample(text, 'routerd_kv_slots_saved_total{model="chat",runtime="text"}') == 1
    assert sample(text, 'routerd_kv_slots_restored_total{model="chat",runtime="text"}') == 1
    assert sample(text, 'routerd_kv_slot_bytes_total{direction="restored",model="chat",runtime="text"}') > 0
    assert counts["chat"] == {
        "swap_batch_served": 0, "swaps_avoided": 0, "kv_slots_saved": 1, "kv_slots_restored": 1,
        "kv_bytes_saved": sample(text, BYTES.format("saved")),
        "kv_bytes_restored": sample(text, BYTES.format("restored"))}

    plain = await start(tmp_path / "plain", real_servers, tiny_models, keep=0)
    try:
        _, again = await interrupted(plain)
    finally:
        await plain.stop()
    assert cached(again) < 0.1 * prefix, again["usage"]


async def test_another_weight_file_never_gets_the_sessions_slot(
        tmp_path: Path, real_servers: RealServers, tiny_models: TinyModels) -> None:
    """The same session on another GGUF (an f16 copy: llama-server itself would restore the f32 model's
    file into it) starts cold; back on its own model, its slot is restored."""
    node = await start(tmp_path, real_servers, tiny_models, keep=4)
    try:
        first = await ask(node, "chat", opening("s1"), "s1")
        elsewhere = await ask(node, "other", opening("s1"), "s1")  # a swap: chat's slot saved
        back = await ask(node, "chat", opening("s1"), "s1")  # a swap: other's slot saved, chat's restored
        text = await metrics(node)
    finally:
        await node.stop()
    assert cached(elsewhere) == 0, elsewhere["usage"]
    assert cached(back) >= first["usage"]["prompt_tokens"] - 1, back["usage"]
    assert sample(text, 'routerd_kv_slots_restored_total{model="chat",runtime="text"}') == 1
    assert sample(text, 'routerd_kv_slots_restored_total{model="other",runtime="text"}') == 0
    assert sample(text, 'routerd_kv_slots_saved_total{model="other",runtime="text"}') == 1
