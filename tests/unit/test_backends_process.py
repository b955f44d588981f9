"""Command resolution, and the real launcher's process handle driven without a process."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.error import ProcessDone, ProcessExitedAlready, ProcessTerminated
from twisted.internet.task import Clock
from twisted.logger import LogEvent, formatEvent, globalLogPublisher
from twisted.python.failure import Failure

from routerd.backends.errors import BackendMissing
from routerd.backends.process import (
    TAIL_LINES,
    ReactorProcessLauncher,
    describe_exit,
    resolve_command,
)


def executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_resolve_finds_the_binary_on_path(tmp_path: Path) -> None:
    binary = executable(tmp_path / "llama-server")
    argv = resolve_command(("llama-server", "--verbose"), search_path=str(tmp_path))
    assert argv == [str(binary), "--verbose"]


def test_resolve_falls_back_to_the_directory_of_the_running_python(tmp_path: Path) -> None:
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    sim = executable(venv_bin / "routerd-sim")
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = resolve_command(
        ("routerd-sim", "llama-server"),
        search_path=str(empty),
        executable=str(venv_bin / "python"),
    )
    assert argv == [str(sim), "llama-server"]


def test_resolve_prefers_path_over_the_python_directory(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    on_path = executable(tmp_path / "a" / "tool")
    executable(tmp_path / "b" / "tool")
    argv = resolve_command(
        ("tool",), search_path=str(tmp_path / "a"), executable=str(tmp_path / "b" / "python")
    )
    assert argv == [str(on_path)]


def test_resolve_keeps_an_existing_absolute_path(tmp_path: Path) -> None:
    binary = executable(tmp_path / "sd-server")
    assert resolve_command((str(binary), "-v"), "sdcpp.binary_path") == [str(binary), "-v"]


def test_missing_binary_names_the_setting_to_fix(tmp_path: Path) -> None:
    with pytest.raises(BackendMissing) as info:
        resolve_command(("llama-server",), search_path=str(tmp_path), executable=str(tmp_path / "python"))
    assert str(info.value) == "backend binary 'llama-server' not found (set llama.binary_path)"
    with pytest.raises(BackendMissing, match=r"set whispercpp\.binary_path"):
        resolve_command((str(tmp_path / "nope"),), "whispercpp.binary_path")
    with pytest.raises(BackendMissing, match="no backend binary configured"):
        resolve_command((), "sdcpp.binary_path")


def test_a_non_executable_file_is_not_a_binary(tmp_path: Path) -> None:
    plain = tmp_path / "llama-server"
    plain.write_text("")
    with pytest.raises(BackendMissing):
        resolve_command((str(plain),))


def test_describe_exit() -> None:
    assert describe_exit(0) == "exit code 0"
    assert describe_exit(-9) == "signal 9"


class FakeTransport:
    def __init__(self) -> None:
        self.pid = 4242
        self.signals: list[str] = []
        self.stdin_closed = False
        self.gone = False

    def closeStdin(self) -> None:  # noqa: N802
        self.stdin_closed = True

    def signalProcess(self, sig: str) -> None:  # noqa: N802
        if self.gone:
            raise ProcessExitedAlready()
        self.signals.append(sig)


class FakeProcessReactor(Clock):
    def __init__(self) -> None:
        super().__init__()
        self.spawned: list[tuple[Any, str, list[str], dict[str, str] | None]] = []
        self.transport = FakeTransport()

    def spawnProcess(self, protocol: Any, executable: str, args: Any, env: Any = None, **kw: Any) -> Any:  # noqa: N802
        self.spawned.append((protocol, executable, list(args), env))
        protocol.makeConnection(self.transport)
        return self.transport


def launch(env: dict[str, str] | None = None) -> tuple[FakeProcessReactor, Any, Any]:
    reactor = FakeProcessReactor()
    handle = ReactorProcessLauncher(reactor).spawn(["/bin/llama-server", "--port", "1"], "llama-server", env)
    protocol = reactor.spawned[0][0]
    return reactor, handle, protocol


def test_spawn_runs_argv_with_the_given_or_inherited_environment() -> None:
    reactor, handle, _ = launch({"A": "1"})
    _, exe, args, env = reactor.spawned[0]
    assert (exe, args, env) == ("/bin/llama-server", ["/bin/llama-server", "--port", "1"], {"A": "1"})
    assert handle.pid == 4242 and reactor.transport.stdin_closed
    reactor, _, _ = launch(None)
    assert reactor.spawned[0][3] == dict(os.environ)


def test_every_output_line_is_logged_under_the_backend_name_and_the_last_ones_kept() -> None:
    _, handle, protocol = launch()
    events: list[LogEvent] = []
    globalLogPublisher.addObserver(events.append)
    try:
        protocol.childDataReceived(1, b"loading model\nprogress 10%\rprogress 20")
        protocol.childDataReceived(2, b"warning: on stderr\n")
        protocol.childDataReceived(1, b"% done\r\n")
        protocol.childDataReceived(1, b"".join(b"line %d\n" % i for i in range(30)))
    finally:
        globalLogPublisher.removeObserver(events.append)
    lines = [e for e in events if "backend" in e and "line" in e]
    assert [formatEvent(e) for e in lines[:2]] == ["llama-server: loading model",
                                                   "llama-server: progress 10%"]
    logged = [(e["backend"], e["line"]) for e in lines]
    assert logged[:4] == [
        ("llama-server", "loading model"),
        ("llama-server", "progress 10%"),
        ("llama-server", "warning: on stderr"),
        ("llama-server", "progress 20% done"),
    ]
    assert len(logged) == 34
    assert handle.last_lines() == [f"line {i}" for i in range(30 - TAIL_LINES, 30)]


def test_an_output_listener_is_told_each_whole_line_until_it_is_removed_and_cannot_break_the_output() -> None:
    _, handle, protocol = launch()
    heard: list[str] = []
    handle.on_output(heard.append)
    protocol.childDataReceived(1, b"load_tensors: loading\nsrv  load_model: model ")
    assert heard == ["load_tensors: loading"]  # a partial line waits for its end
    protocol.childDataReceived(1, b"loaded\n\n")
    assert heard == ["load_tensors: loading", "srv  load_model: model loaded"]

    def broken(line: str) -> None:
        raise RuntimeError(line)

    handle.on_output(broken)
    protocol.childDataReceived(1, b"main: server is listening\n")  # logged, not raised
    handle.on_output(None)
    protocol.childDataReceived(1, b"all slots are idle\n")
    assert len(heard) == 2
    assert handle.last_lines()[-2:] == ["main: server is listening", "all slots are idle"]


def test_exited_fires_every_observer_with_the_exit_code_or_minus_the_signal() -> None:
    _, handle, protocol = launch()
    first, second = handle.exited, handle.exited
    protocol.childDataReceived(2, b"fatal: no such file")  # no newline: flushed at exit
    protocol.processEnded(Failure(ProcessTerminated(exitCode=3)))
    assert [first.result, second.result, handle.exited.result] == [3, 3, 3]
    assert handle.pid is None and handle.last_lines() == ["fatal: no such file"]
    _, killed, protocol = launch()
    protocol.processEnded(Failure(ProcessTerminated(signal=9)))
    assert killed.exited.result == -9
    _, clean, protocol = launch()
    protocol.processEnded(Failure(ProcessDone(0)))
    assert clean.exited.result == 0


def test_stop_sends_sigterm_then_sigkill_after_the_grace_period() -> None:
    reactor, handle, protocol = launch()
    stopped = handle.stop(grace_s=5.0)
    assert reactor.transport.signals == ["TERM"]
    reactor.advance(4.9)
    assert reactor.transport.signals == ["TERM"]
    reactor.advance(0.2)
    assert reactor.transport.signals == ["TERM", "KILL"]
    assert not stopped.called
    protocol.processEnded(Failure(ProcessTerminated(signal=9)))
    assert stopped.called and stopped.result is None


def test_stop_of_a_process_that_exits_in_time_sends_no_sigkill() -> None:
    reactor, handle, protocol = launch()
    stopped = handle.stop(grace_s=5.0)
    protocol.processEnded(Failure(ProcessTerminated(signal=15)))
    reactor.advance(10)
    assert reactor.transport.signals == ["TERM"] and stopped.called
    assert handle.stop().called  # already gone: at once
    assert reactor.getDelayedCalls() == []


def test_stop_races_a_process_that_is_already_gone() -> None:
    reactor, handle, protocol = launch()
    reactor.transport.gone = True
    stopped = handle.stop()
    protocol.processEnded(Failure(ProcessDone(0)))
    assert stopped.called
