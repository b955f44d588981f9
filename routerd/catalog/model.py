"""A local model config (one ``.kcpps`` file) as routerd understands it (contract §3)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import attrs

# Which backend runtime serves a request: the text side (text, embeddings, multimodal, speech,
# music), image, or speech-to-text; the vocabulary the backend families declare.
from routerd.families import RUNTIME_KINDS as RUNTIME_KINDS
from routerd.families import RuntimeKind as RuntimeKind
from routerd.replica_modes import Mode

#: KoboldCpp's music weight keys (``.kcpps``) and the ModelConfig attribute holding each path.
MUSIC_FIELDS: Mapping[str, str] = {"musicllm": "music_llm", "musicembeddings": "music_embeddings",
                                   "musicdiffusion": "music_diffusion", "musicvae": "music_vae"}


@attrs.frozen
class Capabilities:
    llm: bool = False
    image: bool = False
    embeddings: bool = False
    multimodal: bool = False
    stt: bool = False
    tts: bool = False
    context: int = 0  # 0 = the config states no context window
    # KoboldCpp music generation (``musicllm``/``musicdiffusion``); served on the text side.
    music: bool = False

    def serves(self, kind: RuntimeKind) -> bool:
        if kind == "text":
            return self.llm or self.embeddings or self.multimodal
        if kind == "image":
            return self.image
        return self.stt


@attrs.frozen
class ModelConfig:
    """One valid local model config.

    Paths are absolute.  ``model_hash`` is empty until the catalog has hashed
    the weight files (off the reactor thread).
    """

    local_id: str
    filename: str
    path: str
    backend_mode: str
    capabilities: Capabilities
    config_hash: str
    text_model: str | None = None
    mmproj: str | None = None
    embeddings_model: str | None = None
    sd_model: str | None = None
    whisper_model: str | None = None
    tts_model: str | None = None
    music_llm: str | None = None
    music_embeddings: str | None = None
    music_diffusion: str | None = None
    music_vae: str | None = None
    context_size: int | None = None
    parallel: int | None = None
    vllm_max_model_length: int | None = None
    vllm_max_sequences: int | None = None
    extra_args: tuple[str, ...] = ()
    #: ``"reranking": true``: llama-server starts with ``--reranking`` (serves ``/v1/rerank``).
    reranking: bool = False
    #: ``router_replica_choice``: how a master picks among this model's replicas (None: the site's).
    replica_choice: Mode | None = None
    image_id: str | None = None
    model_hash: str = ""
    options: Mapping[str, Any] = attrs.field(factory=dict, eq=False, hash=False)

    def weight_files(self) -> dict[str, str]:
        """``field -> path`` of every referenced weight file (for ``model_hash``)."""
        fields = {
            "model": self.text_model,
            "mmproj": self.mmproj,
            "embeddingsmodel": self.embeddings_model,
            "sdmodel": self.sd_model,
            "whispermodel": self.whisper_model,
            "ttsmodel": self.tts_model,
            "musicllm": self.music_llm,
            "musicembeddings": self.music_embeddings,
            "musicdiffusion": self.music_diffusion,
            "musicvae": self.music_vae,
        }
        return {k: v for k, v in fields.items() if v}

    def unbound_fields(self) -> list[str]:
        """Portable weight fields named only by ``<field>_hash`` that no file is bound to yet
        (cluster reference §8.5: they block loading before the backend starts)."""
        return list(self.unbound)

    @functools.cached_property
    def unbound(self) -> tuple[str, ...]:
        """:meth:`unbound_fields`, worked out once per config (every request reads it before its
        backend is acquired; a reload or a binding makes a new config)."""
        bound = self.weight_files()
        return tuple(f for f in ("model", "mmproj", "embeddingsmodel", "sdmodel", "whispermodel", "ttsmodel",
                                 *MUSIC_FIELDS)
                     if self.options.get(f"{f}_hash") and f not in bound)


@attrs.frozen
class InvalidConfig:
    """A ``.kcpps`` file that did not parse; listed with its reason, never fatal."""

    filename: str
    path: str
    reason: str
