"""whisper.cpp's real ``whisper-server`` behind routerd: transcriptions through a master, a switch between
two whisper models on one node, and selector-less STT scheduling on the nodes' real runtime status.

A routing-only master (no models) and two slaves, each running the real whisper-server: ``left`` has
``ears`` (transcribes to :data:`WHISPER_ANSWER`), ``ears-b`` (:data:`OTHER_ANSWER`) and ``broken`` (the
tiny model cut short: whisper-server refuses it), ``right`` has ``ears-r`` (:data:`RIGHT_ANSWER`), so
every transcript says which model file wrote it.  One cluster serves the whole module.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq

from tests.integration import nodes
from tests.integration.nodes import knows, plan_cluster, post, start_cluster
from tests.integration.real_backends import WHISPER_ANSWER, RealServers, TinyModels, real_node_config
from tests.support_models import write_tiny_whisper

pytestmark = [pytest.mark.slow, pytest.mark.real]

OTHER_ANSWER = " Hello world from a whisper."
RIGHT_ANSWER = " Hello from a tiny whisper."


class Cluster(nodes.Cluster):
    left = nodes.slave("left")
    right = nodes.slave("right")


@pytest_twisted.async_yield_fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory, real_servers: RealServers,
                  tiny_models: TinyModels) -> AsyncIterator[Cluster]:
    root = tmp_path_factory.mktemp("real-whisper")
    other = str(write_tiny_whisper(root / "other.bin", answer=OTHER_ANSWER))
    right = str(write_tiny_whisper(root / "right.bin", answer=RIGHT_ANSWER))
    broken = root / "broken.bin"  # the header and the first tensors, not the rest
    broken.write_bytes(Path(tiny_models.whisper).read_bytes()[:3_000_000])
    plan = plan_cluster(root, ["left", "right"])
    (plan.root / "master" / "models").mkdir(parents=True)
    slaves = {
        "left": real_node_config(plan.root / "left", real_servers,
                                 {"ears": {"whispermodel": tiny_models.whisper},
                                  "ears-b": {"whispermodel": other}, "broken": {"whispermodel": str(broken)}},
                                 plan.slave_sections("left")),
        "right": real_node_config(plan.root / "right", real_servers, {"ears-r": {"whispermodel": right}},
                                  plan.slave_sections("right")),
    }
    started = await start_cluster(
        plan, plan.master_config(), slaves,
        ready=lambda r: knows(r, left="ears-b", right="ears-r") and nodes.all_healthy(r))
    running = Cluster(started.plan, started.master, started.slaves)
    yield running
    await running.stop()


async def transcribe(url: str, audio: str, model: str | None = None,
                     response_format: str | None = None) -> tuple[int, bytes, str]:
    """POST the WAV file ``audio`` to ``/v1/audio/transcriptions``: (status, body, the answering node)."""
    fields = {"model": model, "response_format": response_format}
    response = await treq.post(url + "/v1/audio/transcriptions",
                               data={k: v for k, v in fields.items() if v is not None},
                               files={"file": ("tone.wav", "audio/wav", Path(audio).read_bytes())})
    node = (response.headers.getRawHeaders(b"x-routerd-node") or [b""])[0].decode()
    return response.code, await response.content(), node


def text_of(body: bytes) -> str:
    return str(json.loads(body)["text"]).strip()


async def state_of(cluster: Cluster, node_id: str) -> dict[str, Any]:
    """The master's view of one node's STT runtime (``/router/v1/site/nodes/state``)."""
    response = await treq.get(cluster.master.url + "/router/v1/site/nodes/state", params={"node_id": node_id})
    state = json.loads(await response.content())
    [stt] = [runtime for runtime in state["runtimes"] if runtime["kind"] == "stt"]
    return dict(stt)


@pytest_twisted.ensureDeferred
async def test_a_transcription_through_the_master_is_the_real_whisper_servers_text(
        cluster: Cluster, tiny_models: TinyModels) -> None:
    code, body, node = await transcribe(cluster.master.url, tiny_models.tone, "ears")
    assert (code, node) == (200, "left"), body
    assert json.loads(body) == {"text": WHISPER_ANSWER.strip()}  # OpenAI's shape: no blank around it
    code, body, _ = await transcribe(cluster.master.url, tiny_models.tone, "ears", "text")
    assert code == 200 and body.decode().strip() == WHISPER_ANSWER.strip()
    code, body, _ = await transcribe(cluster.master.url, tiny_models.tone, "ears", "verbose_json")
    verbose = json.loads(body)
    assert code == 200 and verbose["text"].strip() == WHISPER_ANSWER.strip()
    assert verbose["duration"] == pytest.approx(2.0) and verbose["segments"]


@pytest_twisted.ensureDeferred
async def test_the_second_whisper_model_on_a_node_is_switched_to_by_a_request_and_back_by_load(
        cluster: Cluster, tiny_models: TinyModels) -> None:
    code, body, node = await transcribe(cluster.master.url, tiny_models.tone, "ears-b")
    assert (code, node, text_of(body)) == (200, "left", OTHER_ANSWER.strip())
    assert (await state_of(cluster, "left"))["model_id"] == "ears-b"
    code, payload, _ = await post(cluster.master.url + "/router/v1/load", {"model": "ears"})
    assert code == 200 and payload["node_id"] == "left", payload
    stt = await state_of(cluster, "left")
    assert (stt["model_id"], stt["state"]) == ("ears", "ready")
    code, body, _ = await transcribe(cluster.master.url, tiny_models.tone, "ears")
    assert (code, text_of(body)) == (200, WHISPER_ANSWER.strip())


@pytest_twisted.ensureDeferred
async def test_a_whisper_model_the_server_refuses_is_a_502_with_its_own_words_and_the_node_serves_on(
        cluster: Cluster, tiny_models: TinyModels) -> None:
    code, body, _ = await transcribe(cluster.master.url, tiny_models.tone, "broken")
    error = json.loads(body)["error"]
    assert (code, error["code"]) == (502, "load_failed"), body
    assert "not all tensors loaded from model file" in error["message"]  # whisper.cpp's own cause
    response = await treq.get(cluster.master.url + "/router/v1/site/load-errors", params={"model": "broken"})
    listed = json.loads(await response.content())
    assert response.code == 200, listed
    [entry] = listed["errors"]
    assert (entry["node_id"], entry["model"], entry["runtime"]) == ("left", "broken", "stt")
    assert any("ERROR not all tensors loaded from model file" in line for line in entry["log_tail"])
    code, body, node = await transcribe(cluster.master.url, tiny_models.tone, "ears")
    assert (code, node, text_of(body)) == (200, "left", WHISPER_ANSWER.strip())


@pytest_twisted.ensureDeferred
async def test_a_transcription_naming_no_model_goes_to_the_node_whose_whisper_model_is_loaded(
        cluster: Cluster, tiny_models: TinyModels) -> None:
    code, payload, _ = await post(cluster.master.url + "/router/v1/unload", {"target": "all"})
    assert code == 200, payload
    for name in ("left", "right"):
        await cluster.slaves[name].node.runtimes.unload("stt")
    code, payload, _ = await post(cluster.master.url + "/router/v1/load", {"model": "ears-r"})
    assert code == 200 and payload["node_id"] == "right", payload
    answers = [await transcribe(cluster.master.url, tiny_models.tone) for _ in range(2)]
    assert [(code, node, text_of(body)) for code, body, node in answers] == [
        (200, "right", RIGHT_ANSWER.strip())] * 2
    # the loaded config moves to the left node: so do the selector-less transcriptions
    await cluster.right.node.runtimes.unload("stt")
    code, payload, _ = await post(cluster.master.url + "/router/v1/load", {"model": "ears-b"})
    assert code == 200 and payload["node_id"] == "left", payload
    answers = [await transcribe(cluster.master.url, tiny_models.tone) for _ in range(2)]
    assert [(code, node, text_of(body)) for code, body, node in answers] == [
        (200, "left", OTHER_ANSWER.strip())] * 2
