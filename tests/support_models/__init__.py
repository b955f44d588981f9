"""Tiny models made by the tests: real backends load them, and their answers are known in advance.

Nothing here is downloaded; every file is generated, the same bytes each run, in well under a second
(the slow llama variant, 55 MB, in about a third of one):

* :func:`write_tiny_llama`: a llama GGUF that llama.cpp's ``llama-server`` answers every chat from with
  :data:`LLAMA_ANSWER` then end-of-sequence; ``slow=True`` is a larger variant with the same answer;
* :func:`write_unloadable_gguf`: GGUFs llama.cpp refuses (``truncated``, ``wrong_architecture``);
* :func:`write_tiny_whisper`: a whisper.cpp model that transcribes any audio of a second or more to
  :data:`WHISPER_ANSWER`; :func:`write_tone_wav` writes such audio.

How each model gets its known answer is told in its module.
"""

from __future__ import annotations

from .audio import write_tone_wav
from .llama_gguf import ANSWER as LLAMA_ANSWER
from .llama_gguf import UNLOADABLE, write_tiny_llama, write_unloadable_gguf
from .whisper_ggml import ANSWER as WHISPER_ANSWER
from .whisper_ggml import write_tiny_whisper

__all__ = [
    "LLAMA_ANSWER",
    "UNLOADABLE",
    "WHISPER_ANSWER",
    "write_tiny_llama",
    "write_tiny_whisper",
    "write_tone_wav",
    "write_unloadable_gguf",
]
