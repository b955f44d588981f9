"""Backend flags a model config's ``extra_args`` may not carry when it is written over HTTP.

routerd starts every backend on loopback, on a port it chose, with the weights a config names
inside ``models.file_roots``; a config's ``extra_args`` come after those flags on the command line,
so a later ``--host 0.0.0.0`` or ``-m /elsewhere`` would win.  :func:`unsafe_arg` finds, in any
backend family's spelling:

- a flag routerd sets itself (:data:`OWN_FLAGS`: the listen address and port, the weights, the
  backend's own admin and config files, its slot and log paths);
- a flag whose value is a path or a download (:data:`PATH_FLAGS`, and any flag with ``file``,
  ``path``, ``dir`` or ``url`` among the words of its name): the backend would open, write or
  fetch a file that ``models.file_roots`` does not vouch for;
- a value that is itself a path (absolute, home-relative, or climbing with ``..``).

Cook refuses such a config (400 ``unsafe_extra_arg``); ``routerd check`` warns of one in a config
written by hand (the operator may mean it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: Flags routerd sets itself (every family's spelling).
OWN_FLAGS = frozenset({
    "--host", "--port", "--listen-ip", "--listen-port", "-m", "--model", "--served-model-name",
    "--mmproj", "-mm", "--embeddings-model", "--config", "--admin", "--admindir", "--adminpassword",
    "--nomodel", "--slot-save-path", "--log-file", "--logfile", "--api-key", "--api-key-file",
})
#: Flags whose value is a file, a directory or a download (beyond the names :data:`_PATHLIKE` covers).
PATH_FLAGS = frozenset({
    "-f", "-o", "-of", "-md", "-mu", "-hf", "-hfr", "-hff", "-hfd", "-hfrd", "-hft", "-hfv", "-hffv",
    "--lora", "--lora-scaled", "--control-vector", "--control-vector-scaled", "--hf-repo", "--hf-file",
    "--hf-repo-draft", "--hf-repo-v", "--hf-file-v", "--hf-token", "--docker-repo", "--prompt-cache",
    "--ssl-key-file", "--ssl-cert-file", "--output", "--public", "--path", "--vae", "--taesd",
    "--clip_l", "--clip_g", "--t5xxl", "--control-net", "--upscale-model", "--embd-dir", "--init-img",
    "--mask", "--control-image", "--tokenizer", "--download-dir", "--chat-template", "--sdvae",
    "--sdlora", "--sdt5xxl", "--sdclipl", "--sdclipg", "--sdphotomaker", "--preloadstory",
    "--savedatafile", "--chatcompletionsadapter", "--ttswavtokenizer", "--whispermodel", "--sdmodel",
    "--ttsmodel", "--draftmodel", "--embeddingsmodel", "--tmp-dir", "--media-path", "--model-draft",
    "--model-vocoder", "--model-url", "--diffusion-model", "--lora-model-dir",
})
#: Words of a flag's name that say its value is a file, a directory or a download.
_PATH_WORDS = frozenset({"file", "path", "dir", "url", "files", "paths", "dirs", "urls"})


def _flag(arg: str) -> str | None:
    """The flag name of ``arg`` (``--name`` of ``--name=value``), None for a value."""
    if not arg.startswith("-") or len(arg) < 2 or arg[1:2].isdigit() or arg[1:2] == ".":
        return None  # a value (a negative number such as -1 included)
    return arg.split("=", 1)[0]


def _is_path(value: str) -> bool:
    return (value.startswith(("/", "~", "\\")) or re.match(r"[A-Za-z]:[\\/]", value) is not None
            or ".." in re.split(r"[\\/]", value))


def unsafe_arg(args: Iterable[str]) -> str | None:
    """Why ``args`` may not be written over HTTP (see the module docstring), or None."""
    for arg in args:
        flag = _flag(arg)
        if flag is not None:
            name = flag.lower() if flag.startswith("--") else flag  # -M is not -m
            if name in OWN_FLAGS:
                return f"extra_args may not set {flag}: routerd sets it itself"
            if name in PATH_FLAGS or not _PATH_WORDS.isdisjoint(re.split(r"[-_]", name.lstrip("-"))):
                return f"extra_args may not set {flag}: its value is a file, a directory or a download"
        value = arg.split("=", 1)[1] if flag is not None and "=" in arg else (arg if flag is None else "")
        if value and _is_path(value):
            return f"extra_args may not name the path {value[:80]!r}: model files come from models.file_roots"
    return None


__all__ = ["OWN_FLAGS", "PATH_FLAGS", "unsafe_arg"]
