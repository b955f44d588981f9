"""What the simulated ``llama-server`` says about itself: the per-slot context, its slots, and the bodies of
``/v1/models``, ``/props``, ``/slots`` and ``/metrics`` in llama-server's shapes (llama.cpp b11434, checked by
``tests/integration/test_real_conformance.py``)."""

from __future__ import annotations

import attrs

from routerd.sim.weights import Weights

__all__ = [
    "AUTO_PARALLEL",
    "AUTO_SLOTS",
    "CONTEXT_PAD",
    "LlamaMetrics",
    "Slot",
    "SlotTable",
    "models_body",
    "props_body",
    "slot_context",
    "timings_body",
    "usage_body",
]

#: ``-np`` left at its default: llama-server then runs :data:`AUTO_SLOTS` slots sharing one context.
AUTO_PARALLEL = -1
AUTO_SLOTS = 4
#: llama.cpp rounds each slot's context up to a multiple of this.
CONTEXT_PAD = 256

CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' "
                 "+ message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
                 "{{ '<|im_start|>assistant\\n' }}{% endif %}")


def slot_context(ctx_size: int, parallel: int, unified: bool, train_context: int) -> int:
    """The context each slot gets, as llama-server computes it.

    ``-c 0`` means the model's training context per slot.  Otherwise ``-c`` is the total, split evenly over
    the slots unless the KV cache is unified (``--kv-unified``, or ``-np`` left at its default), rounded up
    to a multiple of 256 and capped at the training context: ``-c 512 -np 2`` gives two slots of 256,
    ``-c 300 -np 2`` two of 256, ``-c 600`` one of 768, ``-c 8192`` on a 2048-token model one of 2048.
    """
    if ctx_size <= 0:
        return train_context
    share = ctx_size if unified else ctx_size // max(1, parallel)
    padded = -(-share // CONTEXT_PAD) * CONTEXT_PAD
    return min(padded, train_context)


@attrs.define
class Slot:
    """One slot as ``/slots`` shows it; a slot that has served a task keeps showing that task."""

    id: int
    processing: bool = False
    task: int | None = None
    prompt_tokens: int = 0
    n_predict: int = -1
    decoded: int = 0

    def to_json(self, n_ctx: int) -> dict[str, object]:
        out: dict[str, object] = {"id": self.id, "n_ctx": n_ctx, "speculative": False,
                                  "is_processing": self.processing}
        if self.task is None:
            return out
        return {**out, "id_task": self.task, "n_prompt_tokens": self.prompt_tokens,
                "n_prompt_tokens_processed": self.prompt_tokens if self.processing else 0,
                "n_prompt_tokens_cache": 0,
                "params": {"n_predict": self.n_predict, "max_tokens": self.n_predict, "stream": False},
                "next_token": [{"has_next_token": self.processing, "has_new_line": False,
                                "n_remain": max(0, self.n_predict - self.decoded),
                                "n_decoded": self.decoded}]}


@attrs.define
class SlotTable:
    """The slots of one server: a task takes the lowest free slot (the runtime's semaphore already bounds how
    many run at once) and gives it back when done."""

    slots: list[Slot]
    next_task: int = 0

    @classmethod
    def of(cls, count: int) -> SlotTable:
        return cls([Slot(index) for index in range(count)])

    def take(self, prompt_tokens: int, n_predict: int) -> Slot:
        slot = next(slot for slot in self.slots if not slot.processing)
        slot.processing, slot.task = True, self.next_task
        slot.prompt_tokens, slot.n_predict, slot.decoded = prompt_tokens, n_predict, 0
        self.next_task += 1
        return slot

    def to_json(self, n_ctx: int) -> list[dict[str, object]]:
        return [slot.to_json(n_ctx) for slot in self.slots]


def models_body(model: str, weights: Weights, n_ctx: int, created: int, vision: bool) -> dict[str, object]:
    """``/v1/models``: an Ollama-style ``models`` list beside the OpenAI ``data`` list, as llama-server has.

    ``meta.weights`` is the simulator's own: tests tell by it which weights answered."""
    return {
        "models": [{
            "name": model, "model": model, "modified_at": "", "size": "", "digest": "", "type": "model",
            "description": "", "tags": [""], "capabilities": ["completion"], "parameters": "",
            "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                        "parameter_size": "", "quantization_level": ""},
        }],
        "object": "list",
        "data": [{
            "id": model, "aliases": [model], "tags": [], "object": "model",
            "architecture": {"input_modalities": ["text", "image"] if vision else ["text"],
                             "output_modalities": ["text"]},
            "created": created, "owned_by": "llamacpp",
            "meta": {"vocab_type": 1, "n_vocab": 0, "n_ctx": n_ctx, "n_ctx_train": weights.context,
                     "n_embd": weights.embedding_dim, "n_params": 0, "size": 0, "ftype": "simulated",
                     "weights": weights.label},
        }],
    }


def props_body(*, model: str, model_path: str, n_ctx: int, slots: int, vision: bool, metrics: bool,
               build_info: str) -> dict[str, object]:
    """``/props``: the keys llama-server answers with (sampler defaults reduced to ``n_predict``)."""
    return {
        "default_generation_settings": {"params": {"n_predict": -1}, "n_ctx": n_ctx},
        "total_slots": slots,
        "model_alias": model,
        "model_ftype": "simulated",
        "model_path": model_path,
        "modalities": {"vision": vision, "video": False, "audio": False},
        "media_marker": "<__media__>",
        "endpoint_slots": True,
        "endpoint_props": False,
        "endpoint_metrics": metrics,
        "ui": False,
        "ui_settings": {},
        "chat_template": CHAT_TEMPLATE,
        "chat_template_caps": {"supports_string_content": True, "supports_system_role": True},
        "bos_token": "<s>",
        "eos_token": "</s>",
        "build_info": build_info,
        "is_sleeping": False,
        "cors_proxy_enabled": False,
    }


class LlamaMetrics:
    """What llama-server counts for ``/metrics`` (b11434 ``server_task_result_metrics::to_metrics``): prompt
    and generated tokens with the seconds spent on them since start, and the same since the previous scrape
    (the throughput gauges are averaged over the window between two scrapes, and a scrape starts the next)."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.prompt_seconds = 0.0
        self.predicted_tokens = 0
        self.predicted_seconds = 0.0
        self.decodes = 0
        self.tokens_max = 0
        self._window = [0, 0.0, 0, 0.0]  # prompt tokens, seconds; predicted tokens, seconds

    def add(self, prompt_tokens: int, prompt_s: float, predicted_tokens: int, predicted_s: float) -> None:
        """One finished task: its prompt (one decode) and each generated token (a decode each)."""
        self.prompt_tokens += prompt_tokens
        self.prompt_seconds += prompt_s
        self.predicted_tokens += predicted_tokens
        self.predicted_seconds += predicted_s
        self.decodes += 1 + predicted_tokens
        self.tokens_max = max(self.tokens_max, prompt_tokens + predicted_tokens)
        window = self._window
        window[0] += prompt_tokens
        window[1] += prompt_s
        window[2] += predicted_tokens
        window[3] += predicted_s

    def text(self, processing: int, deferred: int) -> str:
        """The Prometheus text of one scrape (and the start of the next window)."""
        prompt_n, prompt_s, predicted_n, predicted_s = self._window
        self._window = [0, 0.0, 0, 0.0]
        counters = (
            ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens",
             self.prompt_tokens),
            ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", 0),
            ("prompt_seconds_total", "Total time spent processing prompts", self.prompt_seconds),
            ("tokens_predicted_total", "Number of generation tokens processed", self.predicted_tokens),
            ("tokens_predicted_seconds_total", "Total time spent generating tokens", self.predicted_seconds),
            ("n_decode_total", "Total number of llama_decode() calls, excluding speculative decoding and "
             "multimodal decoding", self.decodes),
            ("n_tokens_max", "Largest observed sequence length (prompt + generation)", self.tokens_max),
            ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", 0),
            ("spec_decode_num_accepted_tokens_total",
             "Speculative: Total draft tokens accepted by the target model", 0),
            ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps", 0),
        )
        gauges = (
            ("prompt_tokens_seconds", "Average prompt throughput in tokens/s",
             prompt_n / prompt_s if prompt_s > 0 else 0.0),
            ("predicted_tokens_seconds", "Average generation throughput in tokens/s",
             predicted_n / predicted_s if predicted_s > 0 else 0.0),
            ("requests_processing", "Number of requests processing", processing),
            ("requests_deferred", "Number of requests deferred", deferred),
            ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
             1.0 if self.decodes else 0.0),
        )
        lines: list[str] = []
        for kind, series in (("counter", counters), ("gauge", gauges)):
            for name, help_text, value in series:
                lines += [f"# HELP llamacpp:{name} {help_text}", f"# TYPE llamacpp:{name} {kind}",
                          f"llamacpp:{name} {value:g}"]
        return "\n".join(lines) + "\n"


def timings_body(prompt_n: int, prompt_s: float, predicted_n: int, predicted_s: float) -> dict[str, object]:
    """llama-server's ``timings`` (a rate of nothing is null, as llama-server's JSON of an infinity is)."""
    prompt_ms, predicted_ms = round(prompt_s * 1000.0, 3), round(predicted_s * 1000.0, 3)
    return {
        "cache_n": 0,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else None,
        "prompt_per_second": prompt_n / prompt_s if prompt_s > 0 else None,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else None,
        "predicted_per_second": predicted_n / predicted_s if predicted_s > 0 else None,
    }


def usage_body(prompt_tokens: int, completion_tokens: int) -> dict[str, object]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
