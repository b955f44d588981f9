"""Hold the simulator to a real server: send both the same request, compare what routerd reads of the answers.

An answer is reduced to what a client program depends on and a correct simulator can reproduce: the status,
the media type, the JSON *shape* (key sets and value types, not values: the simulator's model and the
generated tiny model say different sentences) and, for a stream, the SSE framing (event lines, one shape per
``data:`` frame, ``data: [DONE]``).  :func:`differences` lists where a simulator answer departs from the real
one, apart from the departures a check declares allowed (each with why it cannot matter to routerd).

The servers run as child processes (:func:`start_server`); the probes are plain blocking HTTP
(``http.client``), so the byte framing seen is the server's own.
"""

from __future__ import annotations

import fnmatch
import http.client
import json
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import attrs

from tests.integration.nodes import free_port

__all__ = ["Answer", "Check", "Probe", "Running", "ask", "differences", "free_port", "multipart", "shape",
           "start_server"]

#: Longest a server may take from start to its first ``/health`` 200 (the machine is shared and busy).
START_TIMEOUT_S = 60.0


@attrs.frozen
class Probe:
    """One request: ``json`` is sent as a JSON body, ``raw`` as given (bad JSON), ``form`` as multipart."""

    method: str
    path: str
    json: object = None
    raw: bytes | None = None
    form: Mapping[str, bytes] | None = None


@attrs.frozen
class Answer:
    status: int
    media_type: str  # the Content-Type without its parameters, lower case
    body: object  # parsed JSON, or the text
    frames: tuple[object, ...] | None = None  # an event stream: each frame's parsed data ("[DONE]" as is)
    frame_lines: tuple[tuple[str, ...], ...] = ()  # each frame's field names ("data", "event", ...)


def multipart(fields: Mapping[str, bytes]) -> tuple[bytes, str]:
    """A ``multipart/form-data`` body of ``fields`` (``file`` goes as a file part) and its content type."""
    boundary = "conformance-boundary-7d1f"
    parts: list[bytes] = []
    for name, value in fields.items():
        disposition = f'form-data; name="{name}"' + ('; filename="audio.wav"' if name == "file" else "")
        parts.append(f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + value + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def _parse_body(media_type: str, raw: bytes) -> object:
    text = raw.decode("utf-8", "replace")
    if media_type == "application/json" or text[:1] in ("{", "["):
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def _frames(raw: bytes) -> tuple[tuple[object, ...], tuple[tuple[str, ...], ...]]:
    frames: list[object] = []
    names: list[tuple[str, ...]] = []
    for block in raw.decode("utf-8").replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        names.append(tuple(line.partition(":")[0] for line in lines))
        data = "\n".join(line[len("data:"):].strip() for line in lines if line.startswith("data:"))
        frames.append(data if data == "[DONE]" else json.loads(data))
    return tuple(frames), tuple(names)


def ask(port: int, probe: Probe, timeout: float = 30.0) -> Answer:
    """Send ``probe`` to the server on ``port`` and read its whole answer."""
    headers: dict[str, str] = {}
    body: bytes | None = None
    if probe.form is not None:
        body, headers["Content-Type"] = multipart(probe.form)
    elif probe.raw is not None:
        body, headers["Content-Type"] = probe.raw, "application/json"
    elif probe.json is not None:
        body, headers["Content-Type"] = json.dumps(probe.json).encode(), "application/json"
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(probe.method, probe.path, body=body, headers=headers)
        response = connection.getresponse()
        raw = response.read()
    finally:
        connection.close()
    media_type = (response.getheader("Content-Type") or "").split(";")[0].strip().lower()
    if media_type == "text/event-stream":
        frames, names = _frames(raw)
        return Answer(response.status, media_type, None, frames, names)
    return Answer(response.status, media_type, _parse_body(media_type, raw))


def shape(value: object) -> object:
    """What of a JSON value is compared: its type, an object's keys (each with its value's shape) and the
    shapes a list holds (the distinct ones, in order); never the values themselves."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        shapes: list[object] = []
        for item in value:
            if shape(item) not in shapes:
                shapes.append(shape(item))
        return shapes
    if value is None:
        return "null"
    return type(value).__name__  # bool, int, float, str


def _walk(real: object, sim: object, path: str) -> Iterator[tuple[str, str]]:
    """(path, what differs) for every place the two shapes part; a list's item shapes are each compared with
    the other side's first, and an empty list only matches an empty one."""
    if isinstance(real, dict) and isinstance(sim, dict):
        for key in real:
            if key not in sim:
                yield f"{path}.{key}", "missing in the simulator"
            else:
                yield from _walk(real[key], sim[key], f"{path}.{key}")
        for key in sim:
            if key not in real:
                yield f"{path}.{key}", "only in the simulator"
        return
    if isinstance(real, list) and isinstance(sim, list):
        if bool(real) != bool(sim):
            yield path, f"real {'a' if real else 'no'} item, simulator {'a' if sim else 'no'} item"
        elif real and sim:
            for item in sim:
                yield from _walk(real[0], item, f"{path}[]")
            for item in real[1:]:
                yield from _walk(item, sim[0], f"{path}[]")
        return
    if real != sim:
        yield path, f"real {_kind(real)}, simulator {_kind(sim)}"


def _kind(node: object) -> str:
    return "object" if isinstance(node, dict) else "array" if isinstance(node, list) else str(node)


@attrs.frozen
class Check:
    """A probe and the departures it allows: path patterns (``fnmatch``, e.g. ``$.data[].meta.weights`` or
    ``$.language_probabilities.*``) each with why the difference cannot matter to routerd."""

    name: str
    probe: Probe
    allowed: Mapping[str, str] = attrs.field(factory=dict)


def differences(real: Answer, sim: Answer, allowed: Mapping[str, str] | None = None) -> list[str]:
    """Where ``sim`` departs from ``real``: status, media type, body shape, stream framing (frame count, each
    frame's fields and data shape); departures under an ``allowed`` pattern are left out."""
    patterns = tuple(allowed or {})
    found: list[str] = []
    if real.status != sim.status:
        found.append(f"status: real {real.status}, simulator {sim.status}")
    if real.media_type != sim.media_type:
        found.append(f"content type: real {real.media_type!r}, simulator {sim.media_type!r}")
    if real.frames is None or sim.frames is None:
        found += [f"{path}: {what}" for path, what in _walk(shape(real.body), shape(sim.body), "$")
                  if not _allowed(path, patterns)]
        return found
    if len(real.frames) != len(sim.frames):
        found.append(f"frames: real {len(real.frames)}, simulator {len(sim.frames)}")
    for index, (real_frame, sim_frame) in enumerate(zip(real.frames, sim.frames, strict=False)):
        if real.frame_lines[index] != sim.frame_lines[index]:
            found.append(f"frame {index} fields: real {real.frame_lines[index]}, "
                         f"simulator {sim.frame_lines[index]}")
        found += [f"frame {index} {path}: {what}"
                  for path, what in _walk(shape(real_frame), shape(sim_frame), "$")
                  if not _allowed(path, patterns)]
    return found


def _allowed(path: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) or path.startswith(pattern + ".") for pattern in patterns)


@attrs.define
class Running:
    """A server child process and the ``/health`` answers it gave while starting (refused connections
    left out), the last being its first 200."""

    process: subprocess.Popen[bytes]
    port: int
    startup: list[Answer]
    log: Path
    #: What a test asked of the server as soon as it was ready (see its fixture).
    fresh: Answer | None = None
    #: The first "loading" (503) answer to each of the probes :func:`start_server` was given, by path.
    loading: dict[str, Answer] = attrs.field(factory=dict)

    def ask(self, probe: Probe) -> Answer:
        return ask(self.port, probe)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_server(argv: Sequence[str], port: int, log: Path, while_loading: Sequence[Probe] = ()) -> Running:
    """Start ``argv`` (listening on ``port``) and poll ``/health`` without pause until it answers 200, keeping
    every answer on the way (so a fast load is still seen answering "loading"); while ``/health`` says 503,
    each of ``while_loading`` is asked too until it has been answered 503 once."""
    with log.open("wb") as out:
        process = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT)
    running = Running(process, port, [], log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{argv[0]} exited with {process.returncode}:\n{log.read_text()[-2000:]}")
        try:
            answer = ask(port, Probe("GET", "/health"), timeout=5.0)
        except OSError:
            time.sleep(0.002)
            continue
        running.startup.append(answer)
        if answer.status == 200:
            return running
        for probe in while_loading:
            if probe.path not in running.loading:
                try:
                    during = ask(port, probe, timeout=5.0)
                except OSError:
                    continue
                if during.status == 503:
                    running.loading[probe.path] = during
    running.stop()
    raise RuntimeError(f"{argv[0]} was not ready within {START_TIMEOUT_S} s:\n{log.read_text()[-2000:]}")
