"""routerd.sim flag parsing and process start-up decisions (no reactor, no sockets)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from twisted.internet.task import Clock

from routerd.sim.cli import StartupError, main, make_server
from routerd.sim.families import programs
from routerd.sim.flags import ENV_TIME_SCALE, SIM_FLAGS, parse_flags, split_known
from routerd.sim.llama import FLAGS as LLAMA_FLAGS
from routerd.sim.sd import FLAGS as SD_FLAGS
from routerd.sim.weights import write_weights
from routerd.sim.whisper import FLAGS as WHISPER_FLAGS

LLAMA = LLAMA_FLAGS + SIM_FLAGS


def test_llama_defaults_match_the_real_binary() -> None:
    ns, ignored = parse_flags("t", ["-m", "x.sim.json"], LLAMA)
    # -np left out is llama-server's "auto": four slots sharing one context
    assert (ns.host, ns.port, ns.model, ns.parallel, ns.ctx_size) == ("127.0.0.1", 8080, "x.sim.json", -1, 0)
    assert (ns.mmproj, ns.embedding, ns.alias) == (None, False, None)
    assert ignored == []


def test_llama_short_and_long_spellings() -> None:
    short, _ = parse_flags("t", ["-m", "a", "-c", "2048", "-np", "4", "-a", "name", "--embedding"], LLAMA)
    long, _ = parse_flags(
        "t", ["--model", "a", "--ctx-size", "2048", "--parallel", "4", "--alias", "name", "--embeddings"],
        LLAMA)
    assert vars(short) == vars(long)
    assert (short.ctx_size, short.parallel, short.alias, short.embedding) == (2048, 4, "name", True)
    inline, _ = parse_flags("t", ["--model=a", "--port=9", "--mmproj=p.gguf"], LLAMA)
    assert (inline.model, inline.port, inline.mmproj) == ("a", 9, "p.gguf")


def test_unknown_real_flags_are_ignored_not_confused_with_known_short_ones() -> None:
    argv = ["-ngl", "99", "-m", "a", "-mg", "1", "-ctk", "q8_0", "-fa", "--seed", "-1",
            "--no-webui", "--jinja", "-cb", "--foo=bar", "-c", "64"]
    ns, ignored = parse_flags("t", argv, LLAMA)
    assert (ns.model, ns.ctx_size) == ("a", 64)
    assert ignored == ["-ngl 99", "-mg 1", "-ctk q8_0", "-fa", "--seed -1", "--no-webui", "--jinja",
                       "-cb", "--foo=bar"]


def test_split_known_keeps_values_of_known_flags_even_if_they_look_like_flags() -> None:
    known, unknown = split_known(["-a", "-weird-alias", "--x"], LLAMA)
    assert known == ["-a", "-weird-alias"] and unknown == ["--x"]


def test_sd_server_accepts_listen_and_host_port_spellings() -> None:
    flags = SD_FLAGS + SIM_FLAGS
    a, _ = parse_flags("t", ["-l", "0.0.0.0", "--listen-port", "7", "-m", "m"], flags)
    b, _ = parse_flags("t", ["--host", "0.0.0.0", "--port", "7", "--model", "m"], flags)
    c, _ = parse_flags("t", ["--listen-ip", "0.0.0.0", "--port", "7", "-m", "m"], flags)
    assert (a.host, a.port, a.model) == (b.host, b.port, b.model) == (c.host, c.port, c.model)
    assert parse_flags("t", [], flags)[0].port == 1234


def test_whisper_server_flags() -> None:
    ns, ignored = parse_flags("t", ["--host", "h", "--port", "5", "-m", "w", "-t", "8"],
                              WHISPER_FLAGS + SIM_FLAGS)
    assert (ns.host, ns.port, ns.model) == ("h", 5, "w")
    assert ignored == ["-t 8"]


def test_sim_knob_flags() -> None:
    ns, _ = parse_flags("t", ["--sim-fail-load", "--sim-crash-after", "3", "--sim-slowdown", "2.5",
                              "--sim-hang", "--sim-time-scale", "0.1"], LLAMA)
    assert (ns.sim_fail_load, ns.sim_crash_after, ns.sim_slowdown, ns.sim_hang, ns.sim_time_scale) == (
        True, 3, 2.5, True, 0.1)
    defaults, _ = parse_flags("t", [], LLAMA)
    assert (defaults.sim_fail_load, defaults.sim_crash_after, defaults.sim_slowdown,
            defaults.sim_hang) == (False, None, 1.0, False)


def test_time_scale_defaults_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_TIME_SCALE, raising=False)
    assert parse_flags("t", [], LLAMA)[0].sim_time_scale == 1.0
    monkeypatch.setenv(ENV_TIME_SCALE, "0.05")
    assert parse_flags("t", [], LLAMA)[0].sim_time_scale == 0.05
    assert parse_flags("t", ["--sim-time-scale", "2"], LLAMA)[0].sim_time_scale == 2.0


@pytest.mark.parametrize(
    "argv",
    [["--port", "x"], ["-np", "0"], ["--sim-slowdown", "0"], ["--sim-time-scale", "-1"],
     ["--sim-crash-after", "-2"], ["-c", "-5"], ["--port"]],
)
def test_bad_flag_values_exit_with_status_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_flags("t", argv, LLAMA, programs()["llama-server"].validate)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def _make(argv: list[str]) -> tuple[io.StringIO, object]:
    err = io.StringIO()
    server = make_server(argv, clock=Clock(), on_exit=lambda code: None, out=io.StringIO(), err=err)
    return err, server


@pytest.mark.parametrize("family", ["koboldcpp", "vllm"])
def test_kobold_and_vllm_without_a_model_exit_1(family: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Both families are runnable now; started with no weights they refuse like a real binary."""
    with pytest.raises(StartupError) as exc:
        _make([family, "--port", "1"])
    assert exc.value.code == 1 and "no model given" in str(exc.value)
    assert main([family]) == 1
    assert "no model given" in capsys.readouterr().err


def test_unknown_family_and_no_family_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ollama"]) == 2
    assert "unknown backend family" in capsys.readouterr().err
    assert main([]) == 2
    assert main(["--help"]) == 0
    assert "llama-server" in capsys.readouterr().out


def test_missing_model_flag_or_file_or_wrong_kind_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["llama-server"]) == 1
    assert "no model" in capsys.readouterr().err
    assert main(["llama-server", "-m", str(tmp_path / "missing.sim.json")]) == 1
    assert "no such file" in capsys.readouterr().err
    stt = write_weights(tmp_path / "w.sim.json", "stt", "w")
    assert main(["llama-server", "-m", str(stt)]) == 1
    assert "needs text weights" in capsys.readouterr().err
    assert main(["sd-server", "-m", str(stt)]) == 1
    assert "needs image weights" in capsys.readouterr().err


def test_make_server_warns_about_ignored_flags_and_builds_runtime(tmp_path: Path) -> None:
    weights = write_weights(tmp_path / "t.sim.json", "text", "t")
    err, server = _make(["llama-server", "-m", str(weights), "-np", "3", "-ngl", "99",
                         "--sim-crash-after", "2", "--sim-time-scale", "0.5"])
    assert "ignoring unsupported argument: -ngl 99" in err.getvalue()
    runtime = server.runtime  # type: ignore[attr-defined]
    assert runtime.total_slots == 3
    assert runtime.knobs.crash_after == 2 and runtime.time_scale == 0.5


def test_sd_server_takes_diffusion_model_when_no_m_flag(tmp_path: Path) -> None:
    weights = write_weights(tmp_path / "flux.sim.json", "image", "flux")
    _, server = _make(["sd-server", "--diffusion-model", str(weights)])
    assert server.runtime.weights.label == "flux"  # type: ignore[attr-defined]
