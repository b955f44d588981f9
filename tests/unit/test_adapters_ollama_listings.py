"""Synthesized model listings: /api/tags, /api/ps, /api/show, /v1/models."""

from __future__ import annotations

import hashlib
import json

import httpx
import ollama
from ollama._types import ListResponse, ProcessResponse, ShowResponse

from routerd.routing.adapters.ollama import (
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

HASH = "ab" * 32
WHEN = "2024-05-01T12:00:00Z"

CHAT = ListedModel(
    "qwen", HASH, 4_000_000_000, WHEN, ("llm", "multimodal"), 8192, family="qwen2", loaded=True
)
EMBED = ListedModel("bge", "notahash", 300_000_000, WHEN, ("embeddings",), 512)
ALPHA = ListedModel("alpha", "", 1, "", ("llm",), 0)


def test_tags_lists_each_model_once_sorted_by_name() -> None:
    replica = ListedModel("qwen", HASH, 4_000_000_000, WHEN, ("llm",), 8192, loaded=False)
    tags = ollama_tags([CHAT, EMBED, replica, ALPHA])
    assert [m["name"] for m in tags["models"]] == ["alpha", "bge", "qwen"]
    assert [m["model"] for m in tags["models"]] == ["alpha", "bge", "qwen"]


def test_tags_entry_shape_digest_details_and_capabilities() -> None:
    qwen = ollama_tags([CHAT])["models"][0]
    assert qwen["digest"] == f"sha256:{HASH}"
    assert qwen["size"] == 4_000_000_000
    assert qwen["modified_at"] == WHEN
    assert qwen["details"]["format"] == "gguf"
    assert qwen["details"]["family"] == "qwen2"
    assert qwen["details"]["parameter_size"] == "unknown"
    assert qwen["details"]["quantization_level"] == "unknown"
    assert qwen["capabilities"] == ["completion", "vision"]


def test_digest_is_model_hash_when_sha256_else_hash_of_name_and_hash() -> None:
    assert ollama_digest("x", HASH.upper()) == f"sha256:{HASH}"
    assert ollama_digest("x", f"sha256:{HASH}") == f"sha256:{HASH}"
    expected = hashlib.sha256(b"bge\0notahash").hexdigest()
    assert ollama_digest("bge", "notahash") == f"sha256:{expected}"
    assert ollama_tags([EMBED])["models"][0]["digest"] == f"sha256:{expected}"


def test_capabilities_use_ollama_vocabulary_and_embedding_only_lists_only_embedding() -> None:
    assert ollama_capabilities(["embeddings"]) == ["embedding"]
    assert ollama_capabilities(["multimodal"]) == ["completion", "vision"]
    assert ollama_capabilities(["llm", "tools", "stt", "image", "embeddings", "bogus"]) == [
        "completion",
        "tools",
        "audio",
        "image",
        "embedding",
    ]
    assert ollama_capabilities(["completion", "vision"]) == ["completion", "vision"]


def test_unparsable_modified_at_becomes_epoch() -> None:
    assert ollama_tags([ALPHA])["models"][0]["modified_at"] == "1970-01-01T00:00:00Z"


def test_tags_parse_as_real_list_response() -> None:
    parsed = ListResponse(**ollama_tags([CHAT, EMBED, ALPHA]))
    assert [m.model for m in parsed.models] == ["alpha", "bge", "qwen"]
    assert parsed.models[2].details is not None and parsed.models[2].details.family == "qwen2"


def test_ps_lists_only_loaded_models_with_size_vram_and_expiry() -> None:
    ps = ollama_ps([CHAT, EMBED, ALPHA])
    assert [m["name"] for m in ps["models"]] == ["qwen"]
    qwen = ps["models"][0]
    assert qwen["size_vram"] == qwen["size"] == 4_000_000_000
    assert qwen["expires_at"] == NEVER_EXPIRES
    assert qwen["context_length"] == 8192
    assert (
        ollama_ps([CHAT], expires_at="2024-05-01T13:00:00Z")["models"][0]["expires_at"]
        == "2024-05-01T13:00:00Z"
    )
    parsed = ProcessResponse(**ps)
    assert parsed.models[0].size_vram == 4_000_000_000


def test_ps_counts_a_model_loaded_if_any_replica_is() -> None:
    idle = ListedModel("qwen", HASH, 4_000_000_000, WHEN, ("llm",), 8192, loaded=False)
    assert [m["name"] for m in ollama_ps([idle, CHAT])["models"]] == ["qwen"]


def test_show_gives_modelfile_parameters_template_details_model_info_capabilities() -> None:
    show = ollama_show(CHAT)
    assert "FROM qwen" in show["modelfile"]
    assert show["parameters"] == "num_ctx 8192"
    assert show["template"]
    assert show["details"]["format"] == "gguf"
    assert show["model_info"]["general.architecture"] == "qwen2"
    assert show["model_info"]["qwen2.context_length"] == 8192
    assert show["capabilities"] == ["completion", "vision"]
    parsed = ShowResponse(**show)
    assert parsed.modelinfo is not None and parsed.modelinfo["qwen2.context_length"] == 8192
    assert parsed.capabilities == ["completion", "vision"]


def test_show_without_context_omits_context_length() -> None:
    show = ollama_show(ALPHA)
    assert show["parameters"] == ""
    assert show["model_info"] == {"general.architecture": "unknown", "general.basename": "alpha"}
    ShowResponse(**show)


def test_not_found_body_names_the_model() -> None:
    assert json.loads(ollama_not_found("nope")) == {"error": "model 'nope' not found"}


def test_openai_models_lists_each_model_once_owned_by_routerd() -> None:
    models = openai_models([CHAT, EMBED, CHAT, ALPHA])
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["alpha", "bge", "qwen"]
    qwen = models["data"][2]
    assert qwen == {"id": "qwen", "object": "model", "created": 1714564800, "owned_by": "routerd"}
    assert models["data"][0]["created"] == 0


def test_real_client_reads_listings() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/tags":
            return httpx.Response(200, json=ollama_tags([CHAT, EMBED]))
        if request.url.path == "/api/ps":
            return httpx.Response(200, json=ollama_ps([CHAT, EMBED]))
        name = json.loads(request.content)["model"]
        if name != "qwen":
            return httpx.Response(404, content=ollama_not_found(name))
        return httpx.Response(200, json=ollama_show(CHAT))

    client = ollama.Client(host="http://ollama.test", transport=httpx.MockTransport(handler))
    assert [m.model for m in client.list().models] == ["bge", "qwen"]
    assert [m.model for m in client.ps().models] == ["qwen"]
    assert client.show("qwen").capabilities == ["completion", "vision"]
    try:
        client.show("nope")
    except ollama.ResponseError as err:
        assert err.status_code == 404 and err.error == "model 'nope' not found"
    else:
        raise AssertionError("show of an unknown model must fail")
