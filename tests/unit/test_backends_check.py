"""``--check`` of the backend families: binaries set, found and executable."""

from __future__ import annotations

import sys
from pathlib import Path

from routerd.backends.check import check_families, sections_needed
from routerd.catalog.model import Capabilities, ModelConfig
from routerd.config.schema import BackendConfig, BinaryConfig, Config, KoboldConfig


def model(local_id: str, mode: str, caps: Capabilities) -> ModelConfig:
    return ModelConfig(local_id=local_id, filename=f"{local_id}.kcpps", path=f"/m/{local_id}.kcpps",
                       backend_mode=mode, capabilities=caps, config_hash="h")


def test_a_kobold_node_needs_its_koboldcpp_and_says_what_it_runs() -> None:
    config = Config(backend=BackendConfig(mode="kobold"), kobold=KoboldConfig(command=(sys.executable,)))
    errors, notes = check_families(config, [model("a", "kobold", Capabilities(llm=True))])
    assert errors == []
    assert notes == [f"kobold: kobold would run {sys.executable}"]


def test_unset_and_missing_binaries_are_errors_naming_the_setting(tmp_path: Path) -> None:
    not_executable = tmp_path / "vllm"
    not_executable.write_text("#!/bin/sh\n")
    config = Config(backend=BackendConfig(mode="kobold"),
                    vllm=BinaryConfig(command=(str(not_executable),)))
    errors, _ = check_families(config, [model("a", "kobold", Capabilities(llm=True)),
                                        model("b", "vllm", Capabilities(llm=True))])
    assert errors[0] == "kobold.binary_path: required by the kobold backend family (needed by a.kcpps)"
    assert errors[1] == f"vllm.binary_path: {not_executable} is not executable (needed by b.kcpps)"


def test_llama_sdcpp_needs_only_the_binaries_its_models_use() -> None:
    models = [model("t", "llama_sdcpp", Capabilities(llm=True)),
              model("i", "llama_sdcpp", Capabilities(image=True))]
    assert sections_needed("llama_sdcpp", models) == ["llama", "sdcpp"]
    assert sections_needed("llama_sdcpp", []) == ["llama", "sdcpp", "whispercpp"]
