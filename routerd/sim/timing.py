"""The simulator's timing model (contract section 3), as pure functions of the request."""

from __future__ import annotations

from collections.abc import Mapping

from routerd.jsonvalues import json_int
from routerd.sim.weights import Weights

__all__ = [
    "DEFAULT_IMAGE_SIZE",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_STEPS",
    "count_tokens",
    "image_seconds",
    "requested_max_tokens",
    "stt_seconds",
    "text_seconds",
]

DEFAULT_MAX_TOKENS = 16
DEFAULT_STEPS = 20
DEFAULT_IMAGE_SIZE = (512, 512)


def count_tokens(text: str) -> int:
    """Prompt tokens are the whitespace-separated words of the prompt text."""
    return len(text.split())




def requested_max_tokens(body: Mapping[str, object], default: int = DEFAULT_MAX_TOKENS) -> int:
    """Tokens to generate: ``max_tokens``, ``max_completion_tokens``, ``n_predict``, or Ollama's
    ``options.num_predict`` / ``num_predict``; negative or missing values mean ``default``."""
    candidates: list[object] = [
        body.get("max_tokens"),
        body.get("max_completion_tokens"),
        body.get("n_predict"),
        body.get("num_predict"),
    ]
    options = body.get("options")
    if isinstance(options, Mapping):
        candidates.append(options.get("num_predict"))
    for candidate in candidates:
        count = json_int(candidate)
        if count is not None and count >= 0:
            return count
    return default


def text_seconds(weights: Weights, prompt_tokens: int, gen_tokens: int) -> tuple[float, float]:
    """(prompt processing, generation) seconds of a text job at full speed."""
    return prompt_tokens / weights.prompt_tokens_per_s, gen_tokens / weights.gen_tokens_per_s


def image_seconds(weights: Weights, steps: int, width: int, height: int, count: int) -> float:
    """steps x megapixels x images x ms_per_step_megapixel, in seconds."""
    return steps * (width * height / 1e6) * count * weights.ms_per_step_megapixel / 1000.0


def stt_seconds(weights: Weights, audio_seconds: float) -> float:
    """audio seconds x realtime_factor."""
    return audio_seconds * weights.realtime_factor
