"""Ollama API <-> OpenAI API translation for ``llama-server`` backends.

The package has one module per concern; every public name is re-exported here,
so ``from routerd.routing.adapters import ollama; ollama.X`` works for all of them.

Requests (:mod:`.requests`): :func:`ollama_chat_to_openai`,
:func:`ollama_generate_to_openai` and :func:`ollama_embed_to_openai` turn an
Ollama request body into a ``(backend path, OpenAI body)`` pair.

Responses (:mod:`.responses`): :func:`openai_chat_to_ollama`,
:func:`openai_completion_to_ollama_generate` and
:func:`openai_embeddings_to_ollama_embed` convert non-streaming answers;
:func:`openai_error_to_ollama` converts an error body.

Streaming (:mod:`.streaming`): :class:`SSEToNDJSON` converts a streaming answer
incrementally.

Listings (:mod:`.listings`): :class:`ListedModel` and :func:`ollama_tags`,
:func:`ollama_ps`, :func:`ollama_show`, :func:`openai_models`.

Everything here is pure: no I/O, no reactor, clocks are passed in.
"""

from __future__ import annotations

from routerd.routing.adapters.ollama._common import Mode, iso_utc
from routerd.routing.adapters.ollama.listings import (
    NEVER_EXPIRES,
    ListedModel,
    ollama_capabilities,
    ollama_digest,
    ollama_not_found,
    ollama_ps,
    ollama_show,
    ollama_tags,
    openai_models,
)
from routerd.routing.adapters.ollama.requests import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    EMBEDDINGS_PATH,
    image_data_url,
    is_ollama_load_request,
    ollama_chat_to_openai,
    ollama_embed_to_openai,
    ollama_generate_to_openai,
    ollama_load_response,
)
from routerd.routing.adapters.ollama.responses import (
    error_message_from_body,
    ollama_error,
    openai_chat_to_ollama,
    openai_completion_to_ollama_generate,
    openai_embeddings_to_ollama_embed,
    openai_error_to_ollama,
)
from routerd.routing.adapters.ollama.streaming import SSEToNDJSON

__all__ = [
    "CHAT_PATH",
    "COMPLETIONS_PATH",
    "EMBEDDINGS_PATH",
    "NEVER_EXPIRES",
    "ListedModel",
    "Mode",
    "SSEToNDJSON",
    "error_message_from_body",
    "image_data_url",
    "is_ollama_load_request",
    "iso_utc",
    "ollama_capabilities",
    "ollama_chat_to_openai",
    "ollama_digest",
    "ollama_embed_to_openai",
    "ollama_error",
    "ollama_generate_to_openai",
    "ollama_load_response",
    "ollama_not_found",
    "ollama_ps",
    "ollama_show",
    "ollama_tags",
    "openai_chat_to_ollama",
    "openai_completion_to_ollama_generate",
    "openai_embeddings_to_ollama_embed",
    "openai_error_to_ollama",
    "openai_models",
]
