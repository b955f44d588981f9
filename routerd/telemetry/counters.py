"""A backend's own counters: llama-server's ``/metrics`` (started with ``--metrics``), read with
``prometheus_client``'s text parser.

The names are llama.cpp b11434's (``tools/server/server-task.cpp``, ``to_metrics``); the simulator serves the
same (:class:`routerd.sim.llama_info.LlamaMetrics`).  That build reports no KV-cache use (the
``kv_cache_usage_ratio`` and ``kv_cache_tokens`` series of older builds are gone); ``n_tokens_max``, the
longest sequence a slot has held, is the nearest it says of how full the context gets.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from routerd.wire.telemetry import BackendCounters

__all__ = ["METRICS_PATH", "parse_llama_metrics"]

#: Where llama-server serves its counters.
METRICS_PATH = "/metrics"

# By family name: prometheus_client names a counter's family without its ``_total`` (and gives a counter
# sample the suffix when llama-server's lacks it, as ``n_tokens_max``'s does).
_FLOATS = {"llamacpp:predicted_tokens_seconds": "tokens_per_second",
           "llamacpp:prompt_tokens_seconds": "prompt_tokens_per_second"}
_INTS = {"llamacpp:requests_processing": "requests_processing",
         "llamacpp:requests_deferred": "requests_deferred",
         "llamacpp:prompt_tokens": "prompt_tokens_total",
         "llamacpp:prompt_tokens_cached": "prompt_tokens_cached_total",
         "llamacpp:tokens_predicted": "tokens_predicted_total",
         "llamacpp:n_tokens_max": "n_tokens_max"}


def parse_llama_metrics(text: str) -> BackendCounters:
    """The counters routerd shows from one ``/metrics`` answer (a series it lacks stays None); raises
    ``ValueError`` when the text is not Prometheus text."""
    found: dict[str, float | int] = {}
    for family in text_string_to_metric_families(text):
        values = [sample.value for sample in family.samples if not sample.labels]
        if not values:
            continue
        if family.name in _FLOATS:
            found[_FLOATS[family.name]] = float(values[0])
        elif family.name in _INTS:
            found[_INTS[family.name]] = int(values[0])
    return BackendCounters(**found)  # type: ignore[arg-type]
