"""The ``kobold`` family: one KoboldCpp process serves text, embeddings, image, speech and
music (reference cluster.md §7.1, §7.2).

* It starts with the model's *runtime config*: the ``.kcpps`` rewritten with absolute weight
  paths and without routerd's own keys, written to a directory of its own, which is also
  KoboldCpp's ``--admindir``.
* A switch is ``POST /api/admin/reload_config {"filename", "baseconfig", "overrideconfig"}``
  with ``Bearer <admin password>`` (a random one per router run); the slot then waits for
  liveness (``GET /api/extra/version``), at most ``kobold.reload_timeout``.
* Unloading stops it and starts it again with ``--nomodel``; ``kobold.no_model`` starts it that
  way at boot.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from twisted.internet.defer import Deferred

from routerd.catalog.model import MUSIC_FIELDS, ModelConfig

HOST = "127.0.0.1"
RELOAD_PATH = "/api/admin/reload_config"
#: Flags routerd sets itself; a config's or the node's ``extra_args`` may not change them.
_OWN_FLAGS = frozenset({"--host", "--port", "--config", "--admin", "--adminpassword", "--admindir",
                        "--nomodel"})
_DROPPED_FLAGS = frozenset({"--routermode"})
#: ``.kcpps`` keys KoboldCpp does not know (routerd's own).
_ROUTER_KEYS = frozenset({"backend_mode", "extra_args", "vllm"})


class HTTPPoster(Protocol):
    def post(self, url: str, *, data: bytes, headers: Mapping[str, Sequence[str]],
             timeout: float | None = None) -> Deferred[Any]: ...


def new_admin_password() -> str:
    # hex: a urlsafe token may start with "-", which argparse (koboldcpp's too) reads as an option
    return secrets.token_hex(18)


def clean_extra_args(args: Sequence[str]) -> list[str]:
    """``extra_args`` without ``--routermode`` and without the flags routerd sets (with their
    values: ``--port 5001`` and ``--port=5001`` both go)."""
    out: list[str] = []
    skip_value = False
    for arg in args:
        if skip_value:
            skip_value = False
            if not arg.startswith("-"):
                continue
        name = arg.split("=", 1)[0]
        if name in _DROPPED_FLAGS:
            continue
        if name in _OWN_FLAGS:
            skip_value = "=" not in arg and name != "--admin" and name != "--nomodel"
            continue
        out.append(arg)
    return out


def runtime_config(model: ModelConfig) -> dict[str, Any]:
    """What KoboldCpp loads for ``model``: its ``.kcpps`` keys with absolute weight paths, without
    routerd's keys (``backend_mode``, ``extra_args``, ``vllm``, ``router_*``)."""
    out = {k: v for k, v in model.options.items()
           if k not in _ROUTER_KEYS and not k.startswith("router_")}
    paths = {"model": model.text_model, "mmproj": model.mmproj, "embeddingsmodel": model.embeddings_model,
             "sdmodel": model.sd_model, "whispermodel": model.whisper_model, "ttsmodel": model.tts_model,
             **{key: getattr(model, attr) for key, attr in MUSIC_FIELDS.items()}}
    for key, path in paths.items():
        if path:
            out[key] = path
        else:
            out.pop(key, None)
    out.pop("model_param", None)
    if model.text_model:
        out["model_param"] = model.text_model
    return out


def write_runtime_config(directory: str, model: ModelConfig) -> str:
    """Write the runtime config of ``model`` into ``directory``; returns its file name."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, model.filename)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(runtime_config(model), handle, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return model.filename


def common_argv(cmd: Sequence[str], port: int, password: str, admindir: str) -> list[str]:
    return [*cmd, "--host", HOST, "--port", str(port), "--admin", "--adminpassword", password,
            "--admindir", admindir, "--skiplauncher", "--quiet"]


def model_argv(cmd: Sequence[str], extra: Sequence[str], model: ModelConfig, port: int, password: str,
               admindir: str) -> list[str]:
    """Start KoboldCpp with ``model``'s runtime config."""
    name = write_runtime_config(admindir, model)
    return [*common_argv(cmd, port, password, admindir), "--config", os.path.join(admindir, name),
            *clean_extra_args(model.extra_args), *clean_extra_args(extra)]


def idle_argv(cmd: Sequence[str], extra: Sequence[str], port: int, password: str, admindir: str) -> list[str]:
    """Start KoboldCpp with no model (``--nomodel``), ready for a reload."""
    os.makedirs(admindir, exist_ok=True)
    return [*common_argv(cmd, port, password, admindir), "--nomodel", *clean_extra_args(extra)]


def reload_body(filename: str) -> bytes:
    return json.dumps({"filename": filename, "baseconfig": "", "overrideconfig": ""}).encode()


class ReloadRefused(Exception):
    """KoboldCpp answered the reload with an error."""


async def reload_config(http: HTTPPoster, base_url: str, password: str, admindir: str, model: ModelConfig,
                        timeout: float) -> None:
    """Write ``model``'s runtime config and ask the running KoboldCpp to load it."""
    filename = write_runtime_config(admindir, model)
    response = await http.post(
        base_url + RELOAD_PATH, data=reload_body(filename),
        headers={"Authorization": [f"Bearer {password}"], "Content-Type": ["application/json"]},
        timeout=timeout)
    raw = await response.content()
    judge_reload(int(response.code), bytes(raw))


def judge_reload(code: int, raw: bytes) -> None:
    """Raise :class:`ReloadRefused` unless the answer is 2xx ``{"success": true}``."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if 200 <= code < 300 and isinstance(body, dict) and body.get("success") is True:
        return
    detail = body.get("error") if isinstance(body, dict) else None
    raise ReloadRefused(f"HTTP {code}: {detail or raw[:200].decode('utf-8', 'replace')}")
