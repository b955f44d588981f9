"""The official ``openai`` and ``ollama`` Python packages used as real clients against a node.

Both clients are synchronous, so each call runs in a worker thread while the
reactor serves the node.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import ollama
import openai
import pytest
import pytest_twisted
from twisted.internet.threads import deferToThread

from routerd.sim.wav import make_wav
from tests.integration.nodes import FAST_TEXT, RunningNode, node_config, start_node, write_models

MODELS = {
    "talker": {"model": "../weights/talker.sim.json", "contextsize": 4096},
    "embedder": {"embeddingsmodel": "../weights/embedder.sim.json"},
    "ears": {"whispermodel": "../weights/ears.sim.json"},
}
WEIGHTS = {
    "talker": FAST_TEXT,
    "embedder": {**FAST_TEXT, "embedding_dim": 6},
    "ears": {"kind": "stt", "load_ms": 20, "realtime_factor": 0.01},
}


@pytest_twisted.async_yield_fixture
async def node(tmp_path: Path) -> AsyncIterator[RunningNode]:
    write_models(tmp_path, MODELS, WEIGHTS)
    running = await start_node(node_config(tmp_path))
    yield running
    await running.stop()


@pytest_twisted.ensureDeferred
async def test_openai_client_chat_stream_embeddings_models_and_transcription(
        node: RunningNode, tmp_path: Path) -> None:
    client = openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0)

    def run() -> None:
        reply = client.chat.completions.create(
            model="talker", messages=[{"role": "user", "content": "hello"}], max_tokens=5)
        assert reply.model == "talker"
        assert reply.usage is not None and reply.usage.completion_tokens == 5
        chunks = list(client.chat.completions.create(
            model="talker", messages=[{"role": "user", "content": "hello"}], max_tokens=5, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text.strip() and all(c.model == "talker" for c in chunks)
        emb = client.embeddings.create(model="embedder", input="hi")
        assert len(emb.data[0].embedding) == 6
        assert {"talker", "embedder"} <= {m.id for m in client.models.list()}
        wav = tmp_path / "a.wav"
        wav.write_bytes(make_wav(1.0))
        with wav.open("rb") as fh:
            transcript = client.audio.transcriptions.create(model="ears", file=fh)
        assert transcript.text
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="missing", messages=[{"role": "user", "content": "x"}])

    await deferToThread(run)


@pytest_twisted.ensureDeferred
async def test_ollama_client_chat_generate_embed_list_and_show(node: RunningNode) -> None:
    client = ollama.Client(host=node.url)

    def run() -> None:
        reply = client.chat(model="talker", messages=[{"role": "user", "content": "hi"}],
                            options={"num_predict": 3})
        assert reply.done and reply.message.content and reply.eval_count == 3
        parts = list(client.chat(model="talker", messages=[{"role": "user", "content": "hi"}],
                                 options={"num_predict": 4}, stream=True))
        assert parts[-1].done and sum(1 for p in parts if p.message.content) >= 2
        gen = client.generate(model="talker", prompt="once upon", options={"num_predict": 2})
        assert gen.done and gen.response
        emb = client.embed(model="embedder", input=["a", "b"])
        assert len(emb.embeddings) == 2
        assert "talker" in {m.model for m in client.list().models}
        assert client.show("talker").capabilities
        with pytest.raises(ollama.ResponseError) as info:
            client.chat(model="missing", messages=[{"role": "user", "content": "x"}])
        assert info.value.status_code == 404

    await deferToThread(run)


@pytest_twisted.ensureDeferred
async def test_ollama_client_preloads_unloads_and_ps_follows(node: RunningNode) -> None:
    """Ollama's control requests, as ``ollama run``/``ollama stop`` send them: an empty prompt loads
    the model without generating (``done_reason: "load"``), with ``keep_alive: 0`` it unloads it
    (``"unload"``), and ``ps`` lists what is loaded."""
    client = ollama.Client(host=node.url)

    def text_model() -> str | None:
        runtimes = node.node.runtimes.status()
        return next((r.model_id for r in runtimes if r.kind == "text" and r.state == "ready"), None)

    def run() -> None:
        loaded = client.generate(model="talker", prompt="")
        assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
        assert text_model() == "talker"
        assert "talker" in {m.model for m in client.ps().models}
        chat_loaded = client.chat(model="talker", messages=[])
        assert chat_loaded.done_reason == "load"
        gone = client.generate(model="talker", prompt="", keep_alive=0)
        assert gone.done and gone.done_reason == "unload"
        assert text_model() is None
        assert "talker" not in {m.model for m in client.ps().models}
        with pytest.raises(ollama.ResponseError) as info:
            client.generate(model="missing", prompt="")
        assert info.value.status_code == 404
        with pytest.raises(ollama.ResponseError) as bad:
            client.generate(model="talker", prompt="", keep_alive="soon")
        assert bad.value.status_code == 400

    await deferToThread(run)
