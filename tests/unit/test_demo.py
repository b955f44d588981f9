"""``routerd demo``'s pure parts: the configs it writes, the site calls it makes and its waves."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from routerd.catalog.catalog import Catalog
from routerd.config.load import load_config
from routerd.demo.demo import (
    BURST_S,
    GUARDIAN,
    HELPER,
    OWNER,
    WAVE_S,
    prepare_demo,
    request_for,
    setup_calls,
    wave_plan,
)
from routerd.site.settings import normalise_batch

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "etc" / "cluster"


def test_the_demo_configs_load_with_their_own_model_folders_a_guardian_and_the_weights_as_file_roots(
        tmp_path: Path) -> None:
    nodes = prepare_demo(EXAMPLES, tmp_path, 9080)
    assert [n.node_id for n in nodes] == ["master", "slave-a", "slave-b"]
    for spec in nodes:
        config = load_config(str(spec.config), env={})
        assert Path(config.models.config_dir) == tmp_path / "models" / spec.name
        assert config.models.file_roots == (str((EXAMPLES / "weights").resolve()),)
        catalog = Catalog.scan(config.models.config_dir, config.backend.mode)
        assert not catalog.invalid
        assert all(not m.weight_files() or all(Path(p).is_file() for p in m.weight_files().values())
                   for m in catalog.models)
        assert config.analytics.enabled
    guardian = Catalog.scan(str(tmp_path / "models" / "slave-b"), "llama_sdcpp")
    vision = [m for m in guardian.models if m.local_id == GUARDIAN["model_id"]]
    assert vision and vision[0].capabilities.multimodal
    # the examples are only read
    assert not list(EXAMPLES.glob("models/*/vision.kcpps"))


def test_the_site_calls_link_the_slow_owner_to_the_fast_helper_and_set_valid_settings() -> None:
    calls = dict(setup_calls())
    normalise_batch(calls["/router/v1/site/offload/settings"]["values"])  # raises on a bad value
    group = calls["/router/v1/site/text-routing-groups"]
    assert group["anchor"] == OWNER and group["lends_to"][0]["node_id"] == HELPER["node_id"]
    assert calls["/router/v1/site/guardians"]["guardian"] == GUARDIAN
    weights = {n: json.loads((EXAMPLES / "models" / n / "llama-8b.kcpps").read_text())["model"]
               for n in ("slave-a", "slave-b")}
    assert weights["slave-b"].endswith("q8.sim.json") and weights["slave-a"].endswith("q4.sim.json")


def test_a_wave_backs_up_the_owner_then_goes_quiet_and_every_kind_is_sent() -> None:
    burst = Counter(k for s in range(BURST_S) for k in wave_plan(s))
    quiet = Counter(k for s in range(BURST_S, WAVE_S) for k in wave_plan(s))
    assert burst["owner"] >= 4 * BURST_S and burst["replica"] > 0
    assert sum(quiet.values()) < sum(burst.values()) / 4
    kinds = {k for s in range(WAVE_S * 4) for k in wave_plan(s)}
    assert kinds == {"owner", "replica", "guardian", "image", "fast"}
    for kind in kinds:
        path, body = request_for(kind)  # type: ignore[arg-type]
        assert path.startswith("/v1/") and body["model"]


def test_routerd_demo_is_a_subcommand_of_the_routerd_command_with_its_own_options(
        capsys: pytest.CaptureFixture[str]) -> None:
    from routerd.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["demo", "--base-port", "70000"])
    assert exited.value.code == 2
    assert "--base-port must be between 1 and 65533" in capsys.readouterr().err
