"""The kobold and vllm families: argv, runtime configs, capability parsing, reload switching,
unload to --nomodel, family choice per model and lane readiness judgements."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from routerd.backends.errors import LoadFailed
from routerd.backends.families import kobold, vllm
from routerd.backends.families.kobold import kobold_capabilities, kobold_version_has
from routerd.backends.runtimes import Runtimes
from routerd.backends.testing import FakeBackendHTTP, FakeLauncher, PortCounter
from routerd.catalog.model import Capabilities, ModelConfig
from routerd.config.schema import BackendConfig, BinaryConfig, ClusterConfig, Config, KoboldConfig

from .test_backends_slot import failure_of, result_of

SIM = (sys.executable, "-m", "routerd.sim")


def model(local_id: str, caps: Capabilities, mode: str = "kobold", **fields: Any) -> ModelConfig:
    return ModelConfig(local_id=local_id, filename=f"{local_id}.kcpps", path=f"/models/{local_id}.kcpps",
                       backend_mode=mode, capabilities=caps, config_hash=local_id, **fields)


COMBO = model("combo", Capabilities(llm=True, image=True, tts=True), text_model="/w/t.gguf",
              sd_model="/w/sd.safetensors", tts_model="/w/voice.gguf",
              options={"model": "t.gguf", "sdmodel": "sd.safetensors", "ttsmodel": "voice.gguf",
                       "contextsize": 4096, "backend_mode": "kobold", "router_unload_policy": "all",
                       "extra_args": ["--port", "1", "--routermode", "--flashattention"]},
              extra_args=("--port", "1", "--routermode", "--flashattention"))
OTHER = model("other", Capabilities(llm=True), text_model="/w/o.gguf", options={"model": "o.gguf"})
VLLM_CHAT = model("vchat", Capabilities(llm=True, context=8192), "vllm", text_model="/w/qwen",
                  options={"vllm": {"settings": {"max_model_length": 8192, "max_number_sequences": 4,
                                                 "dtype": "bfloat16", "enable_chunked_prefill": True},
                                    "serve_args": ["--enforce-eager"]}})
VLLM_EMBED = model("vembed", Capabilities(embeddings=True), "vllm", embeddings_model="/w/e5")
VLLM_VOICE = model("vvoice", Capabilities(tts=True), "vllm", tts_model="/w/tts")
LLAMA = model("plain", Capabilities(llm=True), "llama_sdcpp", text_model="/w/p.gguf")


# -- argv and runtime configs -------------------------------------------------------------------

def test_kobold_runtime_config_has_absolute_paths_and_no_router_keys() -> None:
    config = kobold.runtime_config(COMBO)
    assert config["model"] == config["model_param"] == "/w/t.gguf"
    assert config["sdmodel"] == "/w/sd.safetensors" and config["ttsmodel"] == "/w/voice.gguf"
    assert config["contextsize"] == 4096
    assert not {"backend_mode", "extra_args", "router_unload_policy"} & set(config)


def test_kobold_argv_starts_with_the_runtime_config_and_admin_flags(tmp_path: Path) -> None:
    argv = kobold.model_argv(["koboldcpp"], ["--host", "0.0.0.0", "--usecublas"], COMBO, 5005, "pw",
                             str(tmp_path))
    assert argv[:12] == ["koboldcpp", "--host", "127.0.0.1", "--port", "5005", "--admin", "--adminpassword",
                         "pw", "--admindir", str(tmp_path), "--skiplauncher", "--quiet"]
    assert argv[12:14] == ["--config", str(tmp_path / "combo.kcpps")]
    # --port/--host may not be overridden, --routermode is stripped, other flags pass.
    assert argv[14:] == ["--flashattention", "--usecublas"]
    written = json.loads((tmp_path / "combo.kcpps").read_text())
    assert written["model"] == "/w/t.gguf"


def test_kobold_idle_argv_is_nomodel(tmp_path: Path) -> None:
    argv = kobold.idle_argv(["koboldcpp"], [], 5006, "pw", str(tmp_path))
    assert "--nomodel" in argv and "--config" not in argv


def test_kobold_reload_answer_must_be_success() -> None:
    kobold.judge_reload(200, b'{"success": true}')
    with pytest.raises(kobold.ReloadRefused, match="bad file"):
        kobold.judge_reload(200, b'{"success": false, "error": "bad file"}')
    with pytest.raises(kobold.ReloadRefused, match="HTTP 401"):
        kobold.judge_reload(401, b"nope")


def test_vllm_serve_argv_maps_settings_and_serves_the_local_id() -> None:
    argv = vllm.serve_argv(["vllm"], ["--disable-log-requests"], VLLM_CHAT, 8100)
    assert argv[:9] == ["vllm", "serve", "/w/qwen", "--host", "127.0.0.1", "--port", "8100",
                        "--served-model-name", "vchat"]
    rest = argv[9:]
    assert rest[rest.index("--max-model-len") + 1] == "8192"
    assert rest[rest.index("--max-num-seqs") + 1] == "4"
    assert rest[rest.index("--dtype") + 1] == "bfloat16"
    assert "--enable-chunked-prefill" in rest
    assert rest[-2:] == ["--enforce-eager", "--disable-log-requests"]


def test_vllm_runtime_follows_the_config() -> None:
    assert vllm.runtime_of(VLLM_CHAT) == "generation"
    assert vllm.runtime_of(VLLM_EMBED) == "pooling"
    assert vllm.runtime_of(VLLM_VOICE) == "speech"
    assert "--runner" in vllm.serve_argv(["vllm"], [], VLLM_EMBED, 1)


# -- capability parsing -------------------------------------------------------------------------

def test_kobold_version_capabilities_need_boolean_true() -> None:
    body = {"result": "KoboldCpp", "tts": True, "embeddings": "true", "transcribe": False, "txt2img": True}
    assert kobold_capabilities(body) == {"tts", "image"}
    assert kobold_version_has("tts")(body) and not kobold_version_has("embeddings")(body)
    assert kobold_capabilities(["not", "a", "dict"]) == frozenset()


# -- runtimes -----------------------------------------------------------------------------------

class World:
    def __init__(self, tmp_path: Path, mode: str = "kobold", no_model: bool = False) -> None:
        self.clock = Clock()
        self.launcher = FakeLauncher()
        self.http = FakeBackendHTTP(self.clock.seconds)
        config = Config(
            backend=BackendConfig(mode=mode),
            kobold=KoboldConfig(command=(*SIM, "koboldcpp"), no_model=no_model, reload_timeout=10.0),
            vllm=BinaryConfig(command=(*SIM, "vllm")),
            llama=BinaryConfig(command=(*SIM, "llama-server")),
            cluster=ClusterConfig(store_dir=str(tmp_path)),
        )
        self.runtimes = Runtimes(self.clock, config, self.http, self.launcher, None, PortCounter())

    def ready(self, pid_index: int = -1) -> None:
        self.http.ready.add(self.launcher.spawned[pid_index].port)
        self.clock.advance(0.5)


def test_kobold_serves_every_lane_of_a_config_from_one_process(tmp_path: Path) -> None:
    w = World(tmp_path)
    text = w.runtimes.acquire("text", COMBO)
    image = w.runtimes.acquire("image", COMBO)
    w.ready()
    assert len(w.launcher.spawned) == 1
    leases = [result_of(text), result_of(image)]
    assert leases[0].base_url == leases[1].base_url
    assert w.runtimes.loaded_config("image") == "combo.kcpps"
    failure_of(w.runtimes.acquire("stt", COMBO), LoadFailed)  # the config has no whisper model


def test_kobold_switch_is_a_reload_in_the_same_process(tmp_path: Path) -> None:
    w = World(tmp_path)
    lease = w.runtimes.acquire("text", COMBO)
    w.ready()
    result_of(lease).release()
    port = w.launcher.spawned[0].port
    switching = w.runtimes.acquire("text", OTHER)
    w.clock.advance(0.5)
    assert len(w.launcher.spawned) == 1 and w.launcher.spawned[0].running
    url, body = w.http.posts[-1]
    assert url == f"http://127.0.0.1:{port}/api/admin/reload_config"
    assert json.loads(body) == {"filename": "other.kcpps", "baseconfig": "", "overrideconfig": ""}
    assert (tmp_path / "kobold-configs" / "other.kcpps").exists()
    assert result_of(switching).model.local_id == "other"


def test_kobold_refused_reload_fails_the_load_and_stops_the_process(tmp_path: Path) -> None:
    w = World(tmp_path)
    result_of_lease = w.runtimes.acquire("text", COMBO)
    w.ready()
    result_of(result_of_lease).release()
    w.http.post_answer = (200, b'{"success": false, "error": "no such file"}')
    err = failure_of(w.runtimes.acquire("text", OTHER), LoadFailed)
    assert isinstance(err, LoadFailed) and "no such file" in err.reason
    assert not w.launcher.spawned[0].running


def test_kobold_unload_restarts_with_nomodel_and_no_model_boots_that_way(tmp_path: Path) -> None:
    w = World(tmp_path, no_model=True)
    w.runtimes.boot()
    assert "--nomodel" in w.launcher.spawned[0].argv
    w.http.ready.add(w.launcher.spawned[0].port)
    loading = w.runtimes.acquire("text", COMBO)
    w.clock.advance(0.5)
    assert len(w.launcher.spawned) == 1  # the no-model process took a reload
    result_of(loading).release()
    done = w.runtimes.unload("all")
    assert result_of(done) is None
    assert not w.launcher.spawned[0].running
    assert "--nomodel" in w.launcher.spawned[1].argv and w.launcher.spawned[1].running
    assert w.runtimes.status()[0].state == "empty"


def test_a_config_backend_mode_overrides_the_node_mode(tmp_path: Path) -> None:
    w = World(tmp_path, mode="kobold")
    vllm_lease = w.runtimes.acquire("text", VLLM_CHAT)
    w.runtimes.acquire("text", LLAMA)
    assert w.launcher.spawned[0].argv[3:5] == ["vllm", "serve"]
    w.ready()
    result_of(vllm_lease).release()  # then the llama_sdcpp family takes the GPU
    names = [p.name for p in w.launcher.spawned]
    assert names == ["vllm-generation", "llama-server"]


def test_vllm_runs_generation_pooling_and_speech_side_by_side(tmp_path: Path) -> None:
    w = World(tmp_path, mode="vllm")
    for m in (VLLM_CHAT, VLLM_EMBED, VLLM_VOICE):
        w.runtimes.acquire("text", m)
    assert [p.name for p in w.launcher.spawned] == ["vllm-generation", "vllm-pooling", "vllm-speech"]
    assert not w.runtimes.serves("image", VLLM_CHAT)
    w.clock.advance(0.1)
    assert all(url.endswith("/health") for _, url in w.http.requests)


def test_lane_readiness_reads_the_last_probe(tmp_path: Path) -> None:
    w = World(tmp_path)
    lease = w.runtimes.acquire("text", COMBO)
    assert w.runtimes.ready("text", COMBO)  # loading: the request would queue
    w.ready()
    result_of(lease).release()
    port = w.launcher.spawned[0].port
    assert w.runtimes.ready("text", COMBO)  # just loaded, not probed yet
    w.http.versions[port] = {"tts": False, "txt2img": True}
    result_of(w.runtimes.refresh_readiness())
    assert w.runtimes.ready("text", COMBO) and w.runtimes.ready("image", COMBO)
    w.http.hung.add(port)
    result_of(w.runtimes.refresh_readiness())
    assert not w.runtimes.ready("text", COMBO) and not w.runtimes.ready("image", COMBO)
    assert not w.runtimes.ready("text", OTHER)  # a switch needs the process live too
    w.http.hung.clear()
    result_of(w.runtimes.refresh_readiness())
    assert w.runtimes.ready("text", COMBO)


def test_kobold_speech_lane_needs_tts_in_the_version(tmp_path: Path) -> None:
    voice = model("voice", Capabilities(tts=True), tts_model="/w/v.gguf")
    w = World(tmp_path)
    lease = w.runtimes.acquire("text", voice)
    w.ready()
    result_of(lease).release()
    port = w.launcher.spawned[0].port
    w.http.versions[port] = {"tts": False}
    result_of(w.runtimes.refresh_readiness())
    assert not w.runtimes.ready("text", voice)
    w.http.versions[port] = {"tts": True}
    result_of(w.runtimes.refresh_readiness())
    assert w.runtimes.ready("text", voice)


# -- family switch (one GPU) ---------------------------------------------------------------------

def test_loading_a_model_of_another_family_stops_the_running_family_first(tmp_path: Path) -> None:
    w = World(tmp_path, mode="kobold")
    lease = result_of_ready(w, w.runtimes.acquire("text", COMBO))
    switching = w.runtimes.acquire("text", LLAMA)
    assert len(w.launcher.spawned) == 1  # KoboldCpp still has a user: llama-server waits
    lease.release()
    assert not w.launcher.spawned[0].running  # KoboldCpp stopped, and not restarted --nomodel
    assert [p.name for p in w.launcher.spawned] == ["koboldcpp", "llama-server"]
    w.ready()
    plain = result_of(switching)
    assert plain.model.local_id == "plain"
    assert [p.name for p in w.launcher.running] == ["llama-server"]
    # and back: KoboldCpp starts again only once llama-server's user is done and it is gone
    back = w.runtimes.load(COMBO)
    assert [p.name for p in w.launcher.running] == ["llama-server"]
    plain.release()
    assert [p.name for p in w.launcher.running] == ["koboldcpp"]
    w.ready()
    assert result_of(back) is None
    assert w.runtimes.loaded_config("text") == "combo.kcpps"


def test_a_family_switch_stops_a_kobold_process_idling_without_a_model(tmp_path: Path) -> None:
    w = World(tmp_path, mode="kobold", no_model=True)
    w.runtimes.boot()
    assert w.launcher.spawned[0].running and "--nomodel" in w.launcher.spawned[0].argv
    loading = w.runtimes.acquire("text", VLLM_CHAT)
    assert not w.launcher.spawned[0].running
    assert [p.name for p in w.launcher.running] == ["vllm-generation"]
    w.ready()
    assert result_of(loading).model.local_id == "vchat"


def test_same_family_loads_do_not_stop_anything(tmp_path: Path) -> None:
    w = World(tmp_path, mode="vllm")
    for m in (VLLM_CHAT, VLLM_EMBED):
        w.runtimes.acquire("text", m)
    assert [p.name for p in w.launcher.running] == ["vllm-generation", "vllm-pooling"]


def result_of_ready(w: World, acquiring: Any) -> Any:
    w.ready()
    return result_of(acquiring)


# -- what a request reads of the other families: kept as the slots change, never asked per request --

_STEP = st.one_of(
    st.tuples(st.just("acquire"), st.sampled_from(["text", "image"]),
              st.sampled_from([COMBO, OTHER, VLLM_CHAT, VLLM_EMBED, LLAMA])),
    st.tuples(st.just("load"), st.sampled_from([COMBO, VLLM_CHAT, LLAMA])),
    st.tuples(st.just("release"), st.integers(0, 7)),
    st.tuples(st.just("ready"), st.integers(0, 7)),
    st.tuples(st.just("crash"), st.integers(0, 7)),
    st.tuples(st.just("hold_stops"), st.booleans()),
    st.tuples(st.just("unload"), st.sampled_from(["text", "image", "all"])),
    st.tuples(st.just("tick"), st.sampled_from([0.1, 0.5, 11.0])),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mode=st.sampled_from(["kobold", "vllm", "llama_sdcpp"]), no_model=st.booleans(),
       steps=st.lists(_STEP, max_size=25))
def test_the_occupied_slots_runtimes_keeps_are_the_ones_each_slot_says(
        tmp_path: Path, mode: str, no_model: bool, steps: list[tuple[Any, ...]]) -> None:
    """``acquire`` reads the occupied slots ``Runtimes`` keeps as the slots tell it of each change,
    not ``occupied()`` of every other family's slot: after every step of loads, switches, users,
    crashes, held stops and unloads they are the slots whose ``occupied()`` says so."""
    w = World(tmp_path, mode=mode, no_model=no_model)
    w.runtimes.boot()
    slots = [slot for family in w.runtimes._families.values() for slot in family.slots()]
    leases: list[Any] = []
    pending: list[Any] = []
    hold = False

    def check() -> None:
        assert w.runtimes._occupied == {slot for slot in slots if slot.occupied()}

    check()
    for step in steps:
        kind = step[0]
        if kind == "acquire":
            pending.append(w.runtimes.acquire(step[1], step[2]))
        elif kind == "load":
            w.runtimes.load(step[1]).addErrback(lambda _f: None)
        elif kind == "release" and leases:
            leases.pop(step[1] % len(leases)).release()
        elif kind == "ready" and w.launcher.spawned:
            w.http.ready.add(w.launcher.spawned[step[1] % len(w.launcher.spawned)].port)
        elif kind == "crash" and w.launcher.running:
            w.launcher.running[step[1] % len(w.launcher.running)].exit(1)
        elif kind == "hold_stops":
            hold = step[1]
            for process in w.launcher.spawned:
                process.hold_stop = hold
        elif kind == "unload":
            w.runtimes.unload(step[1]).addErrback(lambda _f: None)
        elif kind == "tick":
            w.clock.advance(step[1])
        for process in w.launcher.spawned:
            process.hold_stop = process.hold_stop or hold
        for acquiring in list(pending):
            if acquiring.called:
                pending.remove(acquiring)
                acquiring.addCallbacks(leases.append, lambda _f: None)
        check()
