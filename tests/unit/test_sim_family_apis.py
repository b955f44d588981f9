"""The kobold and vllm simulators serve the APIs their real programs serve, and only those (README
"APIs"): KoboldCpp's ``/api/extra/tokencount`` and no Messages, Responses or rerank route; vLLM's
``/v1/messages``, ``/v1/messages/count_tokens``, ``/v1/responses`` and ``/rerank``, ``/v1/rerank``,
``/v2/rerank``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from routerd.sim.harness import SimHarness
from routerd.sim.weights import write_weights


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    write_weights(tmp_path / "t1.sim.json", "text", "T1", load_ms=10, context=512)
    admin = tmp_path / "admin"
    admin.mkdir()
    (admin / "all.kcpps").write_text(json.dumps({"model": str(tmp_path / "t1.sim.json")}))
    return tmp_path


async def post(sim: SimHarness, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    response = await sim.settle(sim.stub.post(sim.url(path), json=body))
    raw = await sim.settle(response.content())
    try:
        return response.code, json.loads(raw)
    except ValueError:
        return response.code, raw


MESSAGES = {"max_tokens": 3, "messages": [{"role": "user", "content": "one two three"}]}


@pytest_twisted.ensureDeferred
async def test_kobold_sim_counts_a_raw_texts_tokens_and_serves_no_messages_responses_or_rerank(
        weights: Path) -> None:
    sim = SimHarness(["koboldcpp", "--config", str(weights / "admin" / "all.kcpps")])
    sim.start_loaded()
    code, counted = await post(sim, "/api/extra/tokencount", {"prompt": "one two three four"})
    assert code == 200 and counted["value"] == 5 and len(counted["ids"]) == 5  # BOS and four words
    code, counted = await post(sim, "/api/extra/tokencount", {"prompt": "one two", "special": False})
    assert (code, counted["value"]) == (200, 2)
    for path in ("/v1/messages", "/v1/messages/count_tokens", "/v1/responses", "/v1/rerank", "/rerank"):
        code, _body = await post(sim, path, {**MESSAGES, "input": "x", "query": "q", "documents": ["d"]})
        assert code == 404, path


@pytest_twisted.ensureDeferred
async def test_vllm_sim_serves_messages_count_tokens_and_responses_under_its_served_name(
        weights: Path) -> None:
    sim = SimHarness.loaded(["vllm", "serve", str(weights / "t1.sim.json"), "--served-model-name", "chat"])
    code, message = await post(sim, "/v1/messages", {"model": "chat", **MESSAGES})
    assert code == 200 and message["type"] == "message" and message["model"] == "chat"
    assert message["usage"]["output_tokens"] == 3 and message["content"][0]["type"] == "text"
    code, counted = await post(sim, "/v1/messages/count_tokens", {"model": "chat", **MESSAGES})
    assert code == 200 and counted["input_tokens"] > 0
    code, response = await post(sim, "/v1/responses", {"model": "chat", "input": "one two",
                                                       "max_output_tokens": 2})
    assert code == 200 and response["object"] == "response" and response["usage"]["output_tokens"] == 2
    code, _refused = await post(sim, "/v1/messages", {"model": "other", **MESSAGES})
    assert code == 404  # vLLM's model check, as on its chat route


@pytest_twisted.ensureDeferred
async def test_vllm_sim_reranks_on_its_three_paths_with_a_pooling_model_only(weights: Path) -> None:
    pooling = SimHarness.loaded(["vllm", "serve", str(weights / "t1.sim.json"), "--served-model-name", "r",
                                 "--runner", "pooling"])
    asked = {"model": "r", "query": "q", "documents": ["a", "b", "c"], "top_n": 2}
    scores = []
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        code, ranked = await post(pooling, path, asked)
        assert code == 200 and len(ranked["results"]) == 2, path
        scores.append(ranked["results"])
    assert scores[0] == scores[1] == scores[2]
    generating = SimHarness.loaded(["vllm", "serve", str(weights / "t1.sim.json"),
                                    "--served-model-name", "g"])
    code, _refused = await post(generating, "/v2/rerank", {**asked, "model": "g"})
    assert code >= 400
