"""Kobold ``/api/v1/generate`` <-> llama-server native ``/completion``.

:func:`kobold_generate_to_llama` maps a Kobold generate body to a
non-streaming llama-server ``/completion`` body; :func:`llama_completion_to_kobold`
maps the answer back; :func:`llama_error_to_kobold` maps an error body.
Pure functions, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from routerd.jsonvalues import json_int
from routerd.routing.adapters import AdapterError, JSONObject

COMPLETION_PATH = "/completion"

# Kobold's default generation length.
DEFAULT_MAX_LENGTH = 100

# Kobold field -> llama-server /completion field.
_FLOAT_FIELDS: dict[str, str] = {
    "temperature": "temperature",
    "top_p": "top_p",
    "min_p": "min_p",
    "typical": "typical_p",
    "rep_pen": "repeat_penalty",
    "presence_penalty": "presence_penalty",
    "dynatemp_range": "dynatemp_range",
    "dynatemp_exponent": "dynatemp_exponent",
    "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta",
}
_INT_FIELDS: dict[str, str] = {
    "top_k": "top_k",
    "rep_pen_range": "repeat_last_n",
    "sampler_seed": "seed",
    "mirostat": "mirostat",
}




def kobold_generate_to_llama(body: Mapping[str, Any]) -> tuple[str, JSONObject]:
    """Kobold generate body -> (``/completion``, llama-server body).

    ``memory`` is prepended to ``prompt`` as Kobold does; ``max_length``
    (default 100) becomes ``n_predict``; sampling fields are renamed
    (``rep_pen`` -> ``repeat_penalty``, ``rep_pen_range`` -> ``repeat_last_n``,
    ``typical`` -> ``typical_p``, ``sampler_seed`` -> ``seed``);
    ``stop_sequence`` becomes ``stop``; ``grammar`` is kept; ``model`` is kept
    for routing.  The answer is never streamed.  Raises :class:`AdapterError`
    for a malformed body.
    """
    if not isinstance(body, Mapping):
        raise AdapterError("request body must be a JSON object")
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise AdapterError("prompt is required")
    memory = body.get("memory")
    if memory is not None and not isinstance(memory, str):
        raise AdapterError("memory must be a string")
    out: JSONObject = {}
    model = body.get("model")
    if isinstance(model, str) and model:
        out["model"] = model
    out["prompt"] = (memory or "") + prompt
    max_length = body.get("max_length")
    n_predict = DEFAULT_MAX_LENGTH if max_length is None else json_int(max_length)
    if n_predict is None:
        raise AdapterError("max_length must be an integer")
    out["n_predict"] = n_predict
    for key, target in _FLOAT_FIELDS.items():
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise AdapterError(f"{key} must be a number")
        out[target] = value
    for key, target in _INT_FIELDS.items():
        value = body.get(key)
        if value is None:
            continue
        n = json_int(value)
        if n is None:
            raise AdapterError(f"{key} must be an integer")
        out[target] = n
    stop = body.get("stop_sequence")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise AdapterError("stop_sequence must be a list of strings")
        out["stop"] = list(stop)
    grammar = body.get("grammar")
    if isinstance(grammar, str) and grammar:
        out["grammar"] = grammar
    out["stream"] = False
    return COMPLETION_PATH, out


def _finish_reason(resp: Mapping[str, Any]) -> str:
    stop_type = resp.get("stop_type")
    if stop_type == "limit" or resp.get("stopped_limit") is True:
        return "length"
    return "stop"


def llama_completion_to_kobold(resp: Mapping[str, Any]) -> JSONObject:
    """llama-server ``/completion`` answer -> Kobold ``{"results": [{"text", "finish_reason", ...}]}``.

    ``finish_reason`` is ``length`` when generation hit ``n_predict``
    (``stop_type: "limit"`` or the older ``stopped_limit``), else ``stop``.
    """
    content = resp.get("content")
    result: JSONObject = {
        "text": content if isinstance(content, str) else "",
        "finish_reason": _finish_reason(resp),
        "logprobs": None,
    }
    prompt_n = json_int(resp.get("tokens_evaluated"))
    completion_n = json_int(resp.get("tokens_predicted"))
    if prompt_n is not None:
        result["prompt_tokens"] = prompt_n
    if completion_n is not None:
        result["completion_tokens"] = completion_n
    return {"results": [result]}


def llama_error_to_kobold(status: int, body: bytes) -> bytes:
    """A llama-server/OpenAI error body -> Kobold's ``{"detail": {"msg", "type"}}``."""
    message = ""
    try:
        parsed: object = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        parsed = None
    if isinstance(parsed, Mapping):
        err = parsed.get("error")
        if isinstance(err, Mapping) and isinstance(err.get("message"), str):
            message = err["message"]
        elif isinstance(err, str):
            message = err
        elif isinstance(parsed.get("message"), str):
            message = parsed["message"]
    if not message:
        message = body.decode("utf-8", "replace").strip()[:2000] or f"backend returned HTTP {status}"
    kind = "bad_input" if 400 <= status < 500 else "service_unavailable"
    return json.dumps({"detail": {"msg": message, "type": kind}}, ensure_ascii=False).encode("utf-8")
