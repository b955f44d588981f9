"""The plug-in contract every registered backend family keeps, run over the whole registry.

A family is one module of ``routerd/backends/families`` plus its simulator. For each family found:
its declaration is its own module's ``DECLARED``, the one :mod:`routerd.families` holds, and names
config sections the config has; it builds slots (nothing starts: a fake launcher, a fake clock)
whose command lines run the program its declaration names for each kind it serves, and none for the
kinds it does not serve; one process serves every lane exactly when it says so; its load and lane
readiness probes answer yes for a ready program and no for one that refuses; the request planning
serves, passes through or refuses routes as it declares; and the simulator of each of its programs
is found in the simulator's own modules, serving a kind its section serves. The API description
lists every declared mode, from the declarations (it names none itself).
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml
from twisted.internet.task import Clock

from routerd.api.openapi import BACKEND_MODES_MARK, openapi_document
from routerd.backends.families import Family, FamilyPlugin, FamilyWorld, plugins, slot_factory
from routerd.backends.families.kobold import KOBOLD_VERSION_KEYS
from routerd.backends.readiness import Probe
from routerd.backends.slot import RuntimeSlot
from routerd.backends.testing import FakeBackendHTTP, FakeLauncher, PortCounter
from routerd.catalog.model import RUNTIME_KINDS, Capabilities, ModelConfig, RuntimeKind
from routerd.config.schema import BinaryConfig, ClusterConfig, Config
from routerd.errors import HTTPError
from routerd.families import DEFAULT_MODE, FAMILY_PACKAGE, backend_modes, binary_sections, declared
from routerd.routing.classify import INFERENCE_PATHS, Route, classify
from routerd.routing.plan import plan_backend_call
from routerd.sim.families import get_family

from .test_backends_slot import result_of

PLUGINS = [pytest.param(plugin, id=name) for name, plugin in plugins().items()]
PORT = 47001


@attrs.frozen
class Made:
    """One slot a family asked the factory for, with what it was given."""

    slot: RuntimeSlot
    argv_for: Any
    probe: Probe


def sample_config(tmp_path: Path) -> Config:
    """Every family section runs ``python --<section>``, so a command line shows its section."""
    binaries = {section: BinaryConfig(command=(sys.executable, f"--{section}"))
                for section in binary_sections()}
    config = Config(cluster=ClusterConfig(store_dir=str(tmp_path)))
    return attrs.evolve(config, **{name: attrs.evolve(getattr(config, name), command=binary.command)
                                   for name, binary in binaries.items()})


def sample_model(mode: str, kind: RuntimeKind, tmp_path: Path) -> ModelConfig:
    """A config of the ``mode`` family serving ``kind`` only."""
    weights = {"text": {"text_model": str(tmp_path / "t.gguf")},
               "image": {"sd_model": str(tmp_path / "i.gguf")},
               "stt": {"whisper_model": str(tmp_path / "w.bin")}}[kind]
    caps = Capabilities(llm=kind == "text", image=kind == "image", stt=kind == "stt")
    return ModelConfig(local_id=f"sample-{kind}", filename=f"sample-{kind}.kcpps",
                       path=str(tmp_path / f"sample-{kind}.kcpps"), backend_mode=mode, capabilities=caps,
                       config_hash="h", **weights)


def build(plugin: FamilyPlugin, config: Config, http: FakeBackendHTTP) -> tuple[Family, list[Made]]:
    clock = Clock()
    real = slot_factory(clock, FakeLauncher(), http, PortCounter(), None, {}, 1.0)
    made: list[Made] = []

    def make(kind: RuntimeKind, name: str, argv_for: Any, probe: Probe, **more: Any) -> RuntimeSlot:
        slot = real(kind, name, argv_for, probe, **more)
        made.append(Made(slot, argv_for, probe))
        return slot

    return plugin.build(config, make, FamilyWorld(clock, http, 1.0)), made


def made_for(made: list[Made], slot: RuntimeSlot) -> Made:
    return next(m for m in made if m.slot is slot)


def test_the_registry_holds_every_declared_family_and_only_those() -> None:
    assert tuple(plugins()) == backend_modes()
    assert backend_modes()[0] == DEFAULT_MODE
    for name, plugin in plugins().items():
        assert plugin.declared is declared(name)


def test_every_module_of_the_family_package_declaring_a_family_is_found() -> None:
    package = importlib.import_module(FAMILY_PACKAGE)
    declaring = {info.name for info in pkgutil.iter_modules(package.__path__)
                 if hasattr(importlib.import_module(f"{FAMILY_PACKAGE}.{info.name}"), "DECLARED")}
    assert declaring == set(backend_modes())


@pytest.mark.parametrize("plugin", PLUGINS)
def test_its_declaration_and_plugin_live_in_its_own_module(plugin: FamilyPlugin) -> None:
    module = importlib.import_module(f"{FAMILY_PACKAGE}.{plugin.name}")
    assert module.DECLARED is plugin.declared is declared(plugin.name)
    assert module.PLUGIN is plugin


@pytest.mark.parametrize("plugin", PLUGINS)
def test_its_declaration_names_config_sections_the_config_has(plugin: FamilyPlugin) -> None:
    facts = plugin.declared
    assert facts.kinds, "a family serves at least one runtime kind"
    for section in facts.binary_sections:
        section_config = getattr(Config(), section)
        assert isinstance(section_config, BinaryConfig)
        for setting in facts.settings:
            assert hasattr(section_config, setting), f"{section}.{setting}"


@pytest.mark.parametrize("plugin", PLUGINS)
def test_it_builds_a_command_line_running_the_declared_program_for_each_kind(
        plugin: FamilyPlugin, tmp_path: Path) -> None:
    facts = plugin.declared
    family, made = build(plugin, sample_config(tmp_path), FakeBackendHTTP())
    for kind in RUNTIME_KINDS:
        model = sample_model(plugin.name, kind, tmp_path)
        slot = family.slot_for(kind, model)
        if kind not in facts.kinds:
            assert slot is None and family.slots_for_kind(kind) == [], kind
            continue
        assert slot is not None and slot in family.slots() and slot in family.slots_for_kind(kind), kind
        argv = made_for(made, slot).argv_for(model, PORT)
        assert argv[:2] == [sys.executable, f"--{facts.sections[kind]}"], kind
        assert str(PORT) in argv
    assert not [m for m in made if m.slot.has_process], "building a family starts nothing"


@pytest.mark.parametrize("plugin", PLUGINS)
def test_one_process_serves_every_lane_exactly_when_declared(plugin: FamilyPlugin, tmp_path: Path) -> None:
    family, _ = build(plugin, sample_config(tmp_path), FakeBackendHTTP())
    per_kind = [{id(s) for s in family.slots_for_kind(kind)} for kind in plugin.declared.kinds]
    if plugin.declared.single_process:
        assert len(family.slots()) == 1
        assert all(kinds == per_kind[0] for kinds in per_kind)
    else:
        for i, mine in enumerate(per_kind):
            assert all(not mine & other for other in per_kind[i + 1:])


@pytest.mark.parametrize("plugin", PLUGINS)
def test_its_probes_say_yes_to_a_ready_program_and_no_to_a_refusing_one(
        plugin: FamilyPlugin, tmp_path: Path) -> None:
    http = FakeBackendHTTP()
    family, made = build(plugin, sample_config(tmp_path), http)
    base = f"http://127.0.0.1:{PORT}"
    probes = [m.probe for m in made] + [family.lane_probe(kind, sample_model(plugin.name, kind, tmp_path))
                                        for kind in plugin.declared.kinds]
    for probe in probes:
        assert result_of(probe(http, base, 1.0)) is False
    http.ready.add(PORT)
    http.versions[PORT] = {key: True for key in KOBOLD_VERSION_KEYS.values()}
    for probe in probes:
        assert result_of(probe(http, base, 1.0)) is True


def _plan(route: Route, path: str, family: str) -> Any:
    if route.runtime == "stt" and route.kind == "stt":
        raw, ctype, parsed = b"--b\r\n\r\n--b--\r\n", "multipart/form-data; boundary=b", None
    else:
        parsed = {"model": "public", "prompt": "hi", "messages": [{"role": "user", "content": "hi"}],
                  "input": "hi", "audio_data": "UklGRg=="}
        raw, ctype = json.dumps(parsed).encode(), "application/json"
    return plan_backend_call(route, path, parsed, raw, ctype, "local-id", False, family)


def _routes() -> list[tuple[str, Route]]:
    found = [(path, classify("POST", path)) for path in sorted(INFERENCE_PATHS)]
    return [(path, route) for path, route in found if route is not None]


@pytest.mark.parametrize("plugin", PLUGINS)
def test_its_request_planning_keeps_to_its_declared_routes(plugin: FamilyPlugin) -> None:
    facts = plugin.declared
    route_kinds = {route.kind for _, route in _routes()}
    assert facts.passes_through <= route_kinds and facts.refuses <= route_kinds
    assert not facts.passes_through & facts.refuses
    assert facts.translates <= route_kinds and not facts.translates & (facts.passes_through | facts.refuses)
    for path, route in _routes():
        if route.kind in facts.refuses or route.runtime not in facts.kinds:
            with pytest.raises(HTTPError) as refused:
                _plan(route, path, plugin.name)
            assert refused.value.status == 501, path
        elif route.kind in facts.passes_through:
            assert route.runtime in facts.kinds
            assert _plan(route, path, plugin.name).path == path
        elif route.kind in facts.translates:  # answered in the client's API, not passed through
            assert _plan(route, path, plugin.name).answer_format in ("anthropic", "responses", "token_count")


@pytest.mark.parametrize("plugin", PLUGINS)
def test_the_simulator_of_each_of_its_programs_exists(plugin: FamilyPlugin) -> None:
    facts = plugin.declared
    assert set(facts.simulators) == set(facts.binary_sections)
    for section, program in facts.simulators.items():
        simulator = get_family(program)
        assert simulator is not None and simulator.implemented, program
        assert simulator.kind in {kind for kind in facts.kinds if facts.sections[kind] == section}, program


def _enums_of(node: Any, key: str) -> list[list[Any]]:
    """Every ``enum`` the API description gives for a property named ``key``."""
    found: list[list[Any]] = []
    if isinstance(node, dict):
        for name, value in node.items():
            if name == key and isinstance(value, dict) and "enum" in value:
                found.append(value["enum"])
            found += _enums_of(value, key)
    elif isinstance(node, list):
        for item in node:
            found += _enums_of(item, key)
    return found


def test_the_api_description_lists_every_declared_mode() -> None:
    enums = _enums_of(openapi_document(), "backend_mode")
    assert enums, "the API description names backend_mode"
    for enum in enums:
        assert enum == list(backend_modes())


def test_the_api_description_names_no_family_itself() -> None:
    text = (resources.files("routerd.api") / "openapi.yaml").read_text(encoding="utf-8")
    assert not _enums_of(yaml.safe_load(text), "backend_mode"), "the modes come from the declarations"
    assert BACKEND_MODES_MARK in text
