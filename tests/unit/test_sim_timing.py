"""routerd.sim.timing and routerd.sim.weights: the contract's timing model and weight files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from routerd.sim.timing import (
    count_tokens,
    image_seconds,
    requested_max_tokens,
    stt_seconds,
    text_seconds,
)
from routerd.sim.weights import (
    Weights,
    WeightsError,
    load_weights,
    weights_display_name,
    write_weights,
)


def _weights(**overrides: object) -> Weights:
    data: dict[str, object] = {
        "kind": "text", "weights": "w", "load_ms": 0, "prompt_tokens_per_s": 100.0,
        "gen_tokens_per_s": 20.0, "ms_per_step_megapixel": 50.0, "realtime_factor": 0.25,
        "context": 512,
    }
    data.update(overrides)
    return Weights.from_dict(data)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("", 0), ("one", 1), ("two words", 2), ("  spaced\tout\n words  ", 3), ("a-b c,d", 2)],
)
def test_prompt_tokens_are_whitespace_separated_words(text: str, tokens: int) -> None:
    assert count_tokens(text) == tokens


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({}, 16),
        ({"max_tokens": 5}, 5),
        ({"max_tokens": 0}, 0),
        ({"max_completion_tokens": 7}, 7),
        ({"n_predict": 9}, 9),
        ({"n_predict": -1}, 16),
        ({"num_predict": 4}, 4),
        ({"options": {"num_predict": 3}}, 3),
        ({"max_tokens": 2, "n_predict": 9}, 2),
        ({"max_tokens": "5"}, 16),
        ({"max_tokens": True}, 16),
        ({"max_tokens": 6.0}, 6),
    ],
)
def test_requested_max_tokens_reads_openai_llama_and_ollama_names(
    body: dict[str, object], expected: int
) -> None:
    assert requested_max_tokens(body) == expected


def test_text_duration_is_prompt_over_prompt_speed_plus_tokens_over_gen_speed() -> None:
    prompt_s, gen_s = text_seconds(_weights(), prompt_tokens=50, gen_tokens=10)
    assert prompt_s == pytest.approx(0.5)
    assert gen_s == pytest.approx(0.5)


def test_image_duration_is_steps_times_megapixels_times_count_times_ms_per_step() -> None:
    # 20 steps x 0.25 MP x 2 images x 50 ms = 500 ms
    assert image_seconds(_weights(), steps=20, width=500, height=500, count=2) == pytest.approx(0.5)


def test_stt_duration_is_audio_seconds_times_realtime_factor() -> None:
    assert stt_seconds(_weights(), 8.0) == pytest.approx(2.0)


def test_write_weights_then_load_weights_round_trips(tmp_path: Path) -> None:
    path = write_weights(tmp_path / "a.sim.json", "image", "flux-a", load_ms=250, ms_per_step_megapixel=12.5)
    weights = load_weights(path, "image")
    assert (weights.kind, weights.label, weights.load_ms, weights.ms_per_step_megapixel) == (
        "image", "flux-a", 250, 12.5)
    assert weights.context == 4096  # a default fills what was not given
    assert json.loads(path.read_text())["weights"] == "flux-a"


def test_write_weights_refuses_unknown_fields_and_bad_values(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        write_weights(tmp_path / "x.sim.json", "text", "x", tokens_per_s=3)
    with pytest.raises(WeightsError):
        write_weights(tmp_path / "x.sim.json", "text", "x", gen_tokens_per_s=0)
    assert not (tmp_path / "x.sim.json").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("not json", "not a simulator weights file"),
        ("[1, 2]", "JSON object"),
        ('{"kind": "audio", "weights": "x"}', "'kind'"),
        ('{"kind": "text"}', "'weights'"),
        ('{"kind": "text", "weights": "x", "context": 1.5}', "integer"),
        ('{"kind": "text", "weights": "x", "load_ms": -1}', "out of range"),
        ('{"kind": "text", "weights": "x", "gen_tokens_per_s": "fast"}', "number"),
        ('{"kind": "stt", "weights": "x"}', "needs text weights"),
    ],
)
def test_load_weights_explains_what_is_wrong(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "m.sim.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(WeightsError, match=message):
        load_weights(path, "text")


@pytest.mark.parametrize(
    ("path", "name"),
    [("/w/juggernautXL.safetensors", "juggernautXL"), ("flux.sim.json", "flux"),
     ("/a/b/model.gguf", "model"), ("/a/plain", "plain")],
)
def test_weights_display_name_drops_directories_and_weight_endings(path: str, name: str) -> None:
    assert weights_display_name(path) == name
