"""Protocol adapters: pure request/response translators, no I/O.

A ``llama_sdcpp`` node runs llama.cpp's ``llama-server`` and ``whisper-server``,
which speak neither the Ollama nor the Kobold API, so routerd translates:

* :mod:`routerd.routing.adapters.ollama` -- Ollama ``/api/chat``, ``/api/generate``
  and ``/api/embed`` to OpenAI requests and back (including an incremental
  SSE -> NDJSON stream converter), plus the synthesized listings
  (``/api/tags``, ``/api/ps``, ``/api/show``, ``/v1/models``);
* :mod:`routerd.routing.adapters.kobold` -- Kobold ``/api/v1/generate`` to
  llama-server's native ``/completion`` and back;
* :mod:`routerd.routing.adapters.whisper` -- OpenAI ``/v1/audio/transcriptions``
  and ``/translations`` form fields to whisper-server ``/inference`` and back.

This package module only holds what the adapters share; import the adapter
functions from their submodules.
"""

from __future__ import annotations

from typing import Any

# A decoded JSON object, as the adapters take and return them.
JSONObject = dict[str, Any]


class AdapterError(ValueError):
    """The client's request cannot be translated (the caller answers 400).

    ``str(err)`` is a client-facing message.
    """


__all__ = ["AdapterError", "JSONObject"]
