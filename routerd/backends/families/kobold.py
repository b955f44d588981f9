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

Its declared facts are its ``DECLARED`` (read by :mod:`routerd.families`).

The APIs clients speak besides chat (README "APIs"), checked in KoboldCpp's own source
(``koboldcpp.py`` at v1.76, commit 94a5a27b, the newest snapshot at hand): its HTTP handler serves no
``/v1/messages``, ``/v1/responses`` nor rerank route, and counts tokens at ``POST /api/extra/tokencount``
(``{"prompt", "special"}`` -> ``{"value", "ids"}``, the raw text, no chat template).  So routerd
translates Anthropic's Messages and OpenAI's Responses to its ``/v1/chat/completions`` and back, counts a
Messages request's tokens with ``/api/extra/tokencount`` on the request's text, and refuses rerank (no
chat counterpart).  Its chat answers report a fixed ``usage`` (100 and 100 tokens) and its streams
none (no ``stream_options``), which a translated answer can only pass on (a stream's output counted a
token a chunk).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from twisted.internet.defer import Deferred

from routerd.backends.families.base import Family, FamilyPlugin, FamilyWorld, SlotFactory, command, text_side
from routerd.backends.process import Scheduler
from routerd.backends.readiness import PROBE_TIMEOUT_S, HTTPGetter, Probe, probe_image, probe_text, probe_url
from routerd.backends.slot import RuntimeSlot
from routerd.catalog.model import MUSIC_FIELDS, ModelConfig, RuntimeKind
from routerd.config.schema import Config
from routerd.families import Declared

#: The route kinds of KoboldCpp's own API.
KOBOLD_ROUTES = frozenset({"kobold_tts", "kobold_generate", "kobold_generate_stream", "kobold_transcribe",
                           "kobold_music"})

DECLARED = Declared(
    "kobold",
    sections={"text": "kobold", "image": "kobold", "stt": "kobold"},
    simulators={"kobold": "koboldcpp"},
    single_process=True,
    settings=("no_model", "reload_timeout"),
    passes_through=KOBOLD_ROUTES | {"tts", "stt"},
    # KoboldCpp speaks none of these (module docstring): Messages, token counting and Responses are
    # translated to chat completions (and /api/extra/tokencount), rerank has no counterpart
    translates=frozenset({"messages", "count_tokens", "responses"}),
    refuses=frozenset({"rerank"}),
    token_count_path="/api/extra/tokencount",
)
_SECTION = DECLARED.sections["text"]

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


# -- readiness -------------------------------------------------------------------------------

#: ``/api/extra/version`` capability key per Kobold lane.
KOBOLD_VERSION_KEYS = {"embeddings": "embeddings", "tts": "tts", "stt": "transcribe", "image": "txt2img",
                       "music": "music"}


def kobold_version_has(key: str) -> Callable[[Any], bool]:
    """Judge a ``GET /api/extra/version`` body: the capability ``key`` must be boolean true."""

    def judge(body: Any) -> bool:
        return isinstance(body, dict) and body.get(key) is True

    return judge


def kobold_capabilities(body: Any) -> frozenset[str]:
    """The lanes a ``/api/extra/version`` body says the running KoboldCpp serves."""
    if not isinstance(body, dict):
        return frozenset()
    return frozenset(lane for lane, key in KOBOLD_VERSION_KEYS.items() if body.get(key) is True)


def probe_kobold_live(http: HTTPGetter, base_url: str, timeout: float = PROBE_TIMEOUT_S) -> Deferred[bool]:
    """KoboldCpp liveness: ``GET /api/extra/version`` answers 2xx JSON (it answers 503 while
    a reload is loading)."""
    return Deferred.fromCoroutine(probe_url(http, base_url + "/api/extra/version", timeout, lambda _b: True))


def probe_kobold_capability(key: str) -> Probe:
    """A probe for one Kobold lane that ``/api/extra/version`` reports (``tts``, ``embeddings``,
    ``transcribe``, ``music``)."""

    def probe(http: HTTPGetter, base_url: str, timeout: float = PROBE_TIMEOUT_S) -> Deferred[bool]:
        return Deferred.fromCoroutine(probe_url(http, base_url + "/api/extra/version", timeout,
                                                kobold_version_has(key)))

    return probe


def _sleep(clock: Scheduler, seconds: float) -> Deferred[None]:
    d: Deferred[None] = Deferred()
    clock.callLater(seconds, d.callback, None)
    return d


class KoboldFamily(Family):
    """One KoboldCpp process for every lane."""

    name = DECLARED.name
    #: How often a reload waits for a just-started (``--nomodel``) process to answer.
    LIVE_POLL_S = 0.1

    def __init__(self, config: Config, make: SlotFactory, *, clock: Scheduler, http: Any,
                 probe_timeout_s: float) -> None:
        binary = config.kobold
        setting = f"{_SECTION}.binary_path"
        self.password = new_admin_password()
        self.admindir = os.path.join(config.cluster.store_dir, "kobold-configs")
        self.no_model = binary.no_model
        self._clock = clock
        self._http = http
        self._probe_timeout_s = probe_timeout_s
        self._reload_timeout_s = binary.reload_timeout

        def argv_for(model: ModelConfig, port: int) -> list[str]:
            return model_argv(command(binary, setting), binary.extra_args, model, port,
                              self.password, self.admindir)

        def idle(port: int) -> list[str]:
            return idle_argv(command(binary, setting), binary.extra_args, port, self.password, self.admindir)

        self.slot = make("text", "koboldcpp", argv_for, probe_kobold_live, reload=self._reload,
                         reload_timeout_s=binary.reload_timeout, idle_argv=idle)

    def _reload(self, model: ModelConfig, port: int) -> Deferred[None]:
        return Deferred.fromCoroutine(self._reload_async(model, port))

    async def _reload_async(self, model: ModelConfig, port: int) -> None:
        base = f"http://127.0.0.1:{port}"
        deadline = self._clock.seconds() + self._reload_timeout_s
        # A process started a moment ago (--nomodel) may not listen yet.
        while not await probe_kobold_live(self._http, base, self._probe_timeout_s):
            if self._clock.seconds() >= deadline:
                raise ReloadRefused("KoboldCpp did not answer to take the reload")
            await _sleep(self._clock, self.LIVE_POLL_S)
        await reload_config(self._http, base, self.password, self.admindir, model, self._probe_timeout_s)

    def slots(self) -> list[RuntimeSlot]:
        return [self.slot]

    def slot_for(self, kind: RuntimeKind, model: ModelConfig) -> RuntimeSlot | None:
        caps = model.capabilities
        serves = {"text": text_side(model), "image": caps.image, "stt": caps.stt}[kind]
        return self.slot if serves else None

    def slots_for_kind(self, kind: RuntimeKind) -> list[RuntimeSlot]:
        return [self.slot]

    def lane_probe(self, kind: RuntimeKind, model: ModelConfig) -> Probe:
        caps = model.capabilities
        if kind == "image":
            return probe_image
        if kind == "stt":
            return probe_kobold_capability("transcribe")
        if caps.llm:
            return probe_text
        if caps.embeddings:
            return probe_kobold_capability("embeddings")
        if caps.tts:
            return probe_kobold_capability("tts")
        return probe_kobold_capability("music")

    def boot(self) -> None:
        if self.no_model:
            self.slot.start_idle()


def _build(config: Config, make: SlotFactory, world: FamilyWorld) -> Family:
    return KoboldFamily(config, make, clock=world.clock, http=world.http,
                        probe_timeout_s=world.probe_timeout_s)


PLUGIN = FamilyPlugin(DECLARED, _build)
