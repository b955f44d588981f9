"""Benchmarks (contract §9): a fixed workload per lane run through the node's own front,
stored in ``<store_dir>/benchmarks.json`` and shown on the model's record."""

from __future__ import annotations

import json
import wave
from io import BytesIO
from pathlib import Path
from typing import Any

from routerd.inference.bench import AUDIO_SECONDS, text_figures, tone_wav

from .node_fixture import IMAGE, TEXT, World

ADMIN = {"authorization": [b"Bearer admin-key-for-bench"]}
STT: dict[str, Any] = {"kind": "stt", "weights": "ears"}


def solo(tmp_path: Path) -> tuple[World, Any]:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT, "paint": IMAGE, "ears": STT},
                      auth={"admin_keys": ["admin-key-for-bench"]})
    world.start(node)
    return world, node


def test_text_figures_divide_tokens_by_the_time_before_and_after_the_first_byte() -> None:
    figures = text_figures(5, started=10.0, first=10.5, ended=12.5, usage=(100, 64))
    assert figures["ttft_ms"] == 500.0 and figures["duration_ms"] == 2500.0
    assert figures["prompt_tokens_per_s"] == 200.0 and figures["gen_tokens_per_s"] == 32.0
    assert text_figures(0, 1.0, None, 1.0, None)["gen_tokens_per_s"] is None


def test_the_stt_workload_is_ten_seconds_of_audio() -> None:
    with wave.open(BytesIO(tone_wav()), "rb") as wav:
        assert wav.getnframes() / wav.getframerate() == AUDIO_SECONDS


def test_a_run_per_lane_is_answered_stored_and_carried_by_the_model_record(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    response, body = world.call("POST", node, "/router/v1/benchmarks/run", json={"model": "chat"},
                                headers=ADMIN)
    result = json.loads(body)
    assert response.code == 200, body
    assert (result["node_id"], result["model"], result["lane"], result["workload"], result["ok"]) == (
        "solo", "chat", "text", "text-v1", True)
    figures = result["figures"]
    assert figures["completion_tokens"] == 64 and figures["prompt_tokens"] > 100
    assert figures["load_ms"] >= 0 and "ttft_ms" in figures and "gen_tokens_per_s" in figures
    for model, lane, key in (("paint", "image", "seconds_per_image"), ("ears", "stt", "realtime_factor")):
        response, body = world.call("POST", node, "/router/v1/benchmarks/run", json={"model": model},
                                    headers=ADMIN)
        assert response.code == 200, body
        assert json.loads(body)["lane"] == lane and key in json.loads(body)["figures"]
    response, body = world.call("GET", node, "/router/v1/benchmarks", headers=ADMIN)
    history = json.loads(body)
    assert [r["model"] for r in history["benchmarks"]] == ["ears", "paint", "chat"]
    assert history["node_errors"] == []
    stored = json.loads((tmp_path / "solo" / "store" / "benchmarks.json").read_text())
    assert [r["id"] for r in stored["benchmarks"]] == [r["id"] for r in history["benchmarks"]]
    response, body = world.call("GET", node, "/router/v1/models", headers=ADMIN)
    records = {m["local_id"]: m for m in json.loads(body)["models"]}
    assert records["chat"]["benchmark"]["id"] == result["id"]
    world.run(node.stop())


def test_an_unknown_model_is_404_and_a_missing_model_field_400(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    response, body = world.call("POST", node, "/router/v1/benchmarks/run", json={"model": "nope"},
                                headers=ADMIN)
    assert response.code == 404 and json.loads(body)["error"]["code"] == "model_not_found"
    response, body = world.call("POST", node, "/router/v1/benchmarks/run", json={}, headers=ADMIN)
    assert response.code == 400
    world.run(node.stop())


def test_a_model_that_fails_to_load_answers_502_and_is_stored_as_failed(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"broken": {**TEXT, "load_ms": -1}},
                      auth={"admin_keys": ["admin-key-for-bench"]})
    world.start(node)
    response, body = world.call("POST", node, "/router/v1/benchmarks/run", json={"model": "broken"},
                                headers=ADMIN)
    assert response.code == 502 and json.loads(body)["error"]["code"] == "benchmark_failed"
    assert [(r["model"], r["ok"]) for r in node.bench.book.history()] == [("broken", False)]
    world.run(node.stop())
