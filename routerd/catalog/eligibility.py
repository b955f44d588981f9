"""Whether a model config may take part in text lending (spec: LLM lending → Eligibility).

A text model may be linked only if it runs as a text model, serves requests one
at a time (``parallel`` and ``vllm.settings.max_number_sequences`` both 1 or
unset) and states a context window (``contextsize``, or a vLLM config's
``settings.max_model_length``).  An ineligible model is still listed as a
candidate, disabled with the reason returned here.

Multimodal pairing (a multimodal model links only with another multimodal
model) concerns two models; :func:`pair_ineligibility` checks it for callers
that want one answer for a proposed link.
"""

from __future__ import annotations

from routerd.catalog.model import Capabilities, ModelConfig

NOT_TEXT = "model does not run as a text model"
NO_CONTEXT = "model does not state a context window"
MULTIMODAL_MISMATCH = "a multimodal model links only with another multimodal model"


def text_ineligibility(model: ModelConfig) -> str | None:
    """Why ``model`` cannot be linked for text lending, or None if it can."""
    return ineligibility(model.capabilities, model.parallel, model.vllm_max_sequences)


def sequences(parallel: int | None, max_sequences: int | None) -> int:
    """How many requests a model's backend serves at once: its ``parallel`` (llama.cpp,
    KoboldCpp) or ``vllm.settings.max_number_sequences``, whichever is stated higher; 1 when
    neither is (the one-at-a-time case that text lending requires)."""
    return max(parallel or 1, max_sequences or 1, 1)


def concurrency(model: ModelConfig) -> int:
    """:func:`sequences` of a local config (the router queue lets that many of its requests run)."""
    return sequences(model.parallel, model.vllm_max_sequences)


def ineligibility(capabilities: Capabilities, parallel: int | None, max_sequences: int | None) -> str | None:
    """The text-lending rule on the facts it needs (a local config or a peer's model record):
    a text model, serving one request at a time, that states a context window."""
    if not capabilities.llm:
        return NOT_TEXT
    if parallel is not None and parallel >= 2:
        return f"model serves requests concurrently (parallel {parallel})"
    if max_sequences is not None and max_sequences >= 2:
        return f"model serves requests concurrently (vllm.settings.max_number_sequences {max_sequences})"
    if capabilities.context <= 0:
        return NO_CONTEXT
    return None


def pair_ineligibility(owner: ModelConfig, helper: ModelConfig) -> str | None:
    """Why ``owner`` and ``helper`` cannot be linked, or None.  Each must be
    eligible on its own, and both or neither must be multimodal."""
    for role, model in (("owner", owner), ("helper", helper)):
        reason = text_ineligibility(model)
        if reason is not None:
            return f"{role} {model.local_id}: {reason}"
    if owner.capabilities.multimodal != helper.capabilities.multimodal:
        return MULTIMODAL_MISMATCH
    return None


__all__ = [
    "MULTIMODAL_MISMATCH",
    "NOT_TEXT",
    "NO_CONTEXT",
    "concurrency",
    "ineligibility",
    "pair_ineligibility",
    "sequences",
    "text_ineligibility",
]
