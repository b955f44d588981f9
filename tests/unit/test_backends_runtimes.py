"""Runtimes: the three llama_sdcpp slots wired to the config's binaries and probes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
from twisted.internet.task import Clock

from routerd.backends.errors import LoadFailed, RuntimeClosed
from routerd.backends.families import FamilyPlugin
from routerd.backends.runtimes import Runtimes
from routerd.backends.slot import LoadEvent
from routerd.backends.testing import FakeBackendHTTP, FakeLauncher, PortCounter
from routerd.catalog.model import RUNTIME_KINDS, Capabilities, ModelConfig, RuntimeKind
from routerd.config.schema import BackendConfig, BinaryConfig, Config, KoboldConfig

from .test_backend_family_contract import PLUGINS, build, sample_config, sample_model
from .test_backends_slot import failure_of, result_of

SIM = (sys.executable, "-m", "routerd.sim")
CONFIG = Config(
    llama=BinaryConfig(command=(*SIM, "llama-server"), extra_args=("--verbose",)),
    sdcpp=BinaryConfig(command=(*SIM, "sd-server")),
    whispercpp=BinaryConfig(command=(*SIM, "whisper-server")),
)


def model(local_id: str, caps: Capabilities, **fields: Any) -> ModelConfig:
    return ModelConfig(
        local_id=local_id,
        filename=f"{local_id}.kcpps",
        path=f"/models/{local_id}.kcpps",
        backend_mode="llama_sdcpp",
        capabilities=caps,
        config_hash="h",
        **fields,
    )


TEXT = model("qwen", Capabilities(llm=True), text_model="/w/qwen.sim.json")
COMBO = model(
    "combo",
    Capabilities(llm=True, image=True, stt=True),
    text_model="/w/t.sim.json",
    sd_model="/w/sd.sim.json",
    whisper_model="/w/wh.sim.json",
)
IMAGE = model("sdxl", Capabilities(image=True), sd_model="/w/sdxl.sim.json")


class World:
    def __init__(self, config: Config = CONFIG) -> None:
        self.clock = Clock()
        self.launcher = FakeLauncher()
        self.http = FakeBackendHTTP(self.clock.seconds)
        self.events: list[LoadEvent] = []
        self.runtimes = Runtimes(
            self.clock, config, self.http, self.launcher, self.events.append, PortCounter(), env={"X": "1"}
        )

    def all_ready(self) -> None:
        for p in self.launcher.spawned:
            self.http.ready.add(p.port)
        self.clock.advance(0.5)


def test_each_kind_starts_its_own_binary_with_its_argv_and_probe() -> None:
    w = World()
    d = w.runtimes.load(COMBO)
    by_name = {p.name: p for p in w.launcher.spawned}
    assert sorted(by_name) == ["llama-server", "sd-server", "whisper-server"]
    assert by_name["llama-server"].argv == [
        *SIM,
        "llama-server",
        "--host",
        "127.0.0.1",
        "--port",
        str(by_name["llama-server"].port),
        "-m",
        "/w/t.sim.json",
        "--parallel",
        "1",
        "--metrics",
        "--verbose",
    ]
    assert by_name["sd-server"].argv[3:6] == ["sd-server", "--listen-ip", "127.0.0.1"]
    assert by_name["whisper-server"].argv[-2:] == ["-m", "/w/wh.sim.json"]
    assert all(p.env == {"X": "1"} for p in w.launcher.spawned)
    w.clock.advance(0.1)
    paths = {u.split("/", 3)[3] for _, u in w.http.requests}
    assert paths == {"v1/models", "sdapi/v1/sd-models", "health"}
    w.all_ready()
    assert result_of(d) is None
    assert {e.kind for e in w.events if e.ok} == {"text", "image", "stt"}
    assert [s.state for s in w.runtimes.status()] == ["ready", "ready", "ready"]


def test_load_with_a_kind_loads_only_that_runtime() -> None:
    w = World()
    w.runtimes.load(COMBO, "image")
    assert [p.name for p in w.launcher.spawned] == ["sd-server"]


def test_load_fails_with_the_load_error() -> None:
    w = World()
    d = w.runtimes.load(COMBO)
    w.launcher.spawned[1].exit(1, "sd: cannot open /w/sd.sim.json")
    w.all_ready()
    err = failure_of(d, LoadFailed)
    assert isinstance(err, LoadFailed) and "cannot open /w/sd.sim.json" in err.reason


def test_acquire_for_a_kind_the_model_does_not_serve_fails() -> None:
    w = World()
    failure_of(w.runtimes.acquire("image", TEXT), LoadFailed)
    failure_of(w.runtimes.load(TEXT, "stt"), LoadFailed)
    assert w.launcher.spawned == []


def test_missing_binary_fails_the_load_naming_the_setting() -> None:
    w = World(Config(sdcpp=BinaryConfig(command=("no-such-sd-server-binary",))))
    err = failure_of(w.runtimes.acquire("image", IMAGE), LoadFailed)
    assert isinstance(err, LoadFailed)
    assert "backend binary 'no-such-sd-server-binary' not found (set sdcpp.binary_path)" in err.reason
    assert w.events[-1].ok is False and w.runtimes.status()[1].state == "failed"


def test_loaded_config_and_ready_follow_the_slots() -> None:
    w = World()
    assert w.runtimes.loaded_config("text") is None
    assert w.runtimes.ready("text", TEXT)  # empty: it can load
    assert not w.runtimes.ready("image", TEXT)  # the model has no image side
    d = w.runtimes.acquire("text", TEXT)
    assert w.runtimes.ready("text", TEXT) and w.runtimes.loaded_config("text") is None
    w.all_ready()
    result_of(d)
    assert w.runtimes.loaded_config("text") == "qwen.kcpps"
    assert w.runtimes.ready("text", COMBO)  # another config: it can switch
    result_of(w.runtimes.stop())
    assert not w.runtimes.ready("text", TEXT)


def test_unload_targets() -> None:
    w = World()
    d = w.runtimes.load(COMBO)
    w.all_ready()
    result_of(d)
    result_of(w.runtimes.unload("image"))
    assert [s.state for s in w.runtimes.status()] == ["ready", "empty", "ready"]
    result_of(w.runtimes.unload("all"))
    assert [s.state for s in w.runtimes.status()] == ["empty", "empty", "empty"]
    assert w.launcher.running == []
    failure_of(w.runtimes.unload("music"), ValueError)


def test_stop_stops_every_process_and_fails_waiters() -> None:
    w = World()
    d = w.runtimes.load(COMBO)
    assert len(w.launcher.running) == 3
    result_of(w.runtimes.stop())
    assert w.launcher.running == []
    failure_of(d, RuntimeClosed)
    failure_of(w.runtimes.acquire("text", TEXT), RuntimeClosed)


def test_lanes_sharing_a_runtime_are_its_own_lane_with_llama_sdcpp_and_every_lane_with_kobold() -> None:
    """Issue 21 §2: own work takes borrowed work back from every lane that shares its runtime or
    process; separate llama-server/sd-server processes share nothing, KoboldCpp's one process
    serves both lanes (and speech-to-text)."""
    runtimes = World().runtimes
    assert runtimes.lanes_sharing("text", COMBO) == ("text",)
    assert runtimes.lanes_sharing("image", COMBO) == ("image",)
    assert runtimes.lanes_sharing("stt", COMBO) == ()
    assert runtimes.lanes_sharing(None, COMBO) == ("image", "text")  # a load of every part
    assert runtimes.lanes_sharing(None, TEXT) == ("text",)
    kobold = World(Config(backend=BackendConfig(mode="kobold"),
                          kobold=KoboldConfig(command=(*SIM, "koboldcpp")))).runtimes
    combo = attrs.evolve(COMBO, backend_mode="kobold")
    assert kobold.lanes_sharing("text", combo) == ("image", "text")
    assert kobold.lanes_sharing("stt", combo) == ("image", "text")


def test_lanes_sharing_answers_for_the_model_as_it_is_now_after_a_reload_changes_it() -> None:
    """Answers are remembered per (kind, model value): a config that a reload changed (same id,
    other parts or another family) is answered afresh, and the old one keeps its own answer."""
    runtimes = World().runtimes
    assert runtimes.lanes_sharing(None, COMBO) == ("image", "text")
    text_only = attrs.evolve(COMBO, capabilities=attrs.evolve(COMBO.capabilities, image=False))
    assert runtimes.lanes_sharing(None, text_only) == ("text",)
    assert runtimes.lanes_sharing(None, COMBO) == ("image", "text")
    kobold = World(Config(backend=BackendConfig(mode="kobold"),
                          kobold=KoboldConfig(command=(*SIM, "koboldcpp")))).runtimes
    assert kobold.lanes_sharing("text", COMBO) == ("text",)  # its own .kcpps names llama_sdcpp
    assert kobold.lanes_sharing("text", attrs.evolve(COMBO, backend_mode="kobold")) == ("image", "text")


@pytest.mark.parametrize("plugin", PLUGINS)
@pytest.mark.parametrize("kind", RUNTIME_KINDS)
def test_a_familys_slots_stay_the_ones_it_was_built_with(plugin: FamilyPlugin, kind: RuntimeKind,
                                                          tmp_path: Path) -> None:
    """Runtimes works out once, when made, which slots a request must find idle and where a loaded
    config is: a family's ``slots()`` and ``slots_for_kind()`` are the slots it was built with,
    before a load and while one runs."""
    family, made = build(plugin, sample_config(tmp_path), FakeBackendHTTP(Clock().seconds))

    def slots() -> tuple[list[Any], dict[RuntimeKind, list[Any]]]:
        return family.slots(), {k: family.slots_for_kind(k) for k in RUNTIME_KINDS}

    before = slots()
    model = sample_model(plugin.name, kind, tmp_path)
    slot = family.slot_for(kind, model)
    if slot is not None:
        slot.acquire(model)  # loading
    assert slots() == before and set(before[0]) == {m.slot for m in made}
