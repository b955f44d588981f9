"""routerd.catalog.eligibility: which configs may be linked for text lending."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from routerd.catalog.eligibility import (
    MULTIMODAL_MISMATCH,
    NO_CONTEXT,
    NOT_TEXT,
    concurrency,
    pair_ineligibility,
    text_ineligibility,
)
from routerd.catalog.kcpps import parse_kcpps
from routerd.catalog.model import ModelConfig


def model(tmp_path: Path, content: dict[str, Any], name: str = "m") -> ModelConfig:
    path = tmp_path / f"{name}.kcpps"
    path.write_text(json.dumps(content))
    parsed = parse_kcpps(str(path), "llama_sdcpp")
    assert isinstance(parsed, ModelConfig), parsed
    return parsed


def test_sequential_text_model_with_context_is_eligible(tmp_path: Path) -> None:
    assert text_ineligibility(model(tmp_path, {"model": "/t.gguf", "contextsize": 4096})) is None
    assert (
        text_ineligibility(model(tmp_path, {"model": "/t.gguf", "contextsize": 4096, "parallel": 1})) is None
    )


def test_vllm_model_with_one_sequence_and_max_model_length_is_eligible(tmp_path: Path) -> None:
    cfg = {
        "backend_mode": "vllm",
        "model": "/m",
        "vllm": {"settings": {"max_model_length": 8192, "max_number_sequences": 1}},
    }
    assert text_ineligibility(model(tmp_path, cfg)) is None


@pytest.mark.parametrize(
    "content",
    [{"sdmodel": "/i.gguf"}, {"whispermodel": "/w.bin"}, {"embeddingsmodel": "/e.gguf", "contextsize": 512}],
)
def test_model_that_is_not_an_llm_is_ineligible(tmp_path: Path, content: dict[str, Any]) -> None:
    assert text_ineligibility(model(tmp_path, content)) == NOT_TEXT == "model does not run as a text model"


def test_parallel_two_or_more_means_serves_concurrently(tmp_path: Path) -> None:
    reason = text_ineligibility(model(tmp_path, {"model": "/t.gguf", "contextsize": 4096, "parallel": 2}))
    assert reason is not None and "serves requests concurrently" in reason and "parallel 2" in reason


def test_vllm_max_number_sequences_two_or_more_means_serves_concurrently(tmp_path: Path) -> None:
    cfg = {"model": "/m", "vllm": {"settings": {"max_model_length": 8192, "max_number_sequences": 16}}}
    reason = text_ineligibility(model(tmp_path, cfg))
    assert reason is not None and "serves requests concurrently" in reason
    assert "max_number_sequences 16" in reason


def test_concurrency_is_reported_before_a_missing_context(tmp_path: Path) -> None:
    reason = text_ineligibility(model(tmp_path, {"model": "/t.gguf", "parallel": 4}))
    assert reason is not None and "concurrently" in reason


@pytest.mark.parametrize("content", [{"model": "/t.gguf"}, {"model": "/t.gguf", "contextsize": 0}])
def test_model_without_a_context_window_is_ineligible(tmp_path: Path, content: dict[str, Any]) -> None:
    assert (
        text_ineligibility(model(tmp_path, content)) == NO_CONTEXT == "model does not state a context window"
    )


def test_pair_of_eligible_text_models_is_linkable(tmp_path: Path) -> None:
    a = model(tmp_path, {"model": "/a.gguf", "contextsize": 4096}, "a")
    b = model(tmp_path, {"model": "/b.gguf", "contextsize": 8192}, "b")
    assert pair_ineligibility(a, b) is None


def test_multimodal_links_only_with_multimodal(tmp_path: Path) -> None:
    mm = model(tmp_path, {"model": "/a.gguf", "mmproj": "/p.gguf", "contextsize": 4096}, "mm")
    mm2 = model(tmp_path, {"model": "/c.gguf", "mmproj": "/q.gguf", "contextsize": 4096}, "mm2")
    text = model(tmp_path, {"model": "/b.gguf", "contextsize": 4096}, "text")
    assert pair_ineligibility(mm, text) == MULTIMODAL_MISMATCH
    assert pair_ineligibility(text, mm) == MULTIMODAL_MISMATCH
    assert pair_ineligibility(mm, mm2) is None


def test_pair_reports_which_side_is_ineligible(tmp_path: Path) -> None:
    ok = model(tmp_path, {"model": "/a.gguf", "contextsize": 4096}, "ok")
    busy = model(tmp_path, {"model": "/b.gguf", "contextsize": 4096, "parallel": 3}, "busy")
    reason = pair_ineligibility(ok, busy)
    assert reason is not None and reason.startswith("helper busy: ") and "concurrently" in reason


@pytest.mark.parametrize(("extra", "expected"), [
    ({}, 1),
    ({"parallel": 1}, 1),
    ({"parallel": 4}, 4),
    ({"vllm": {"settings": {"max_number_sequences": 8}}}, 8),
    ({"parallel": 2, "vllm": {"settings": {"max_number_sequences": 3}}}, 3),
])
def test_concurrency_is_the_parallel_sequences_a_config_states_and_1_when_unstated(
        tmp_path: Path, extra: dict[str, Any], expected: int) -> None:
    """What the router queue gives a model linked nowhere (issue 23 review: depth + N - 1 places);
    any N ≥ 2 is exactly what makes the config ineligible for lending."""
    config = model(tmp_path, {"model": "w.gguf", "contextsize": 4096, **extra})
    assert concurrency(config) == expected
    assert (text_ineligibility(config) is None) == (expected == 1)
