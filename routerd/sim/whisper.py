"""A stand-in for whisper.cpp's ``whisper-server`` (``/inference`` and ``/load``)."""

from __future__ import annotations

import argparse
import os

import attrs
from klein import Klein
from twisted.web.server import Request

from routerd.sim.flags import Flag
from routerd.sim.outputs import transcript
from routerd.sim.program import Family
from routerd.sim.routes import build_family_app, routes
from routerd.sim.runtime import SimRuntime
from routerd.sim.timing import stt_seconds
from routerd.sim.wav import wav_duration
from routerd.sim.web import HttpError, send_json, send_text
from routerd.sim.weights import WeightsError, load_weights

__all__ = ["FLAGS", "PROGRAM", "WhisperOptions", "build_app", "options_from_args"]

FLAGS: tuple[Flag, ...] = (
    Flag(("--host",), "host", str, "127.0.0.1", "address to listen on", "HOST"),
    Flag(("--port",), "port", int, 8080, "port to listen on", "PORT"),
    Flag(("-m", "--model"), "model", str, None, "model weights (*.sim.json)", "PATH"),
    Flag(("-l", "--language"), "language", str, "en", "spoken language", "LANG"),
)


@attrs.frozen
class WhisperOptions:
    model_path: str
    language: str = "en"


def options_from_args(ns: argparse.Namespace) -> WhisperOptions:
    return WhisperOptions(model_path=ns.model, language=ns.language)


def _error(status: int, message: str) -> HttpError:
    return HttpError(status, {"error": message})


def _field(request: Request, name: str) -> bytes | None:
    """A multipart form field (Twisted parses ``multipart/form-data`` into ``request.args``)."""
    args = request.args or {}
    values = args.get(name.encode("ascii"))
    return values[0] if values else None


def _text_field(request: Request, name: str, default: str) -> str:
    raw = _field(request, name)
    if raw is None:
        return default
    return raw.decode("utf-8", "replace").strip() or default


def _timestamp(seconds: float, separator: str) -> str:
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


class WhisperServer:
    def __init__(self, runtime: SimRuntime, options: WhisperOptions) -> None:
        self.rt = runtime
        self.opts = options

    async def health(self, request: Request) -> bytes:
        return send_json(request, 200, {"status": "ok"})

    async def inference(self, request: Request) -> bytes:
        audio = _field(request, "file")
        if audio is None:
            raise _error(400, "no 'file' field in the request")
        try:
            duration = wav_duration(audio)
        except ValueError as exc:
            raise _error(400, f"failed to read audio data as WAV: {exc}") from None
        response_format = _text_field(request, "response_format", "json")
        language = _text_field(request, "language", self.opts.language)
        async with self.rt.slot():
            await self.rt.work(stt_seconds(self.rt.weights, duration))
        text = transcript(self.rt.weights.label, audio, duration)
        if response_format == "text":
            return send_text(request, 200, text + "\n")
        if response_format in ("srt", "vtt"):
            separator = "," if response_format == "srt" else "."
            span = f"{_timestamp(0.0, separator)} --> {_timestamp(duration, separator)}"
            head = "1\n" if response_format == "srt" else "WEBVTT\n\n"
            return send_text(request, 200, f"{head}{span}\n{text}\n")
        if response_format == "verbose_json":
            return send_json(request, 200, {
                "task": "transcribe", "language": language, "duration": duration, "text": text,
                "segments": [{"id": 0, "start": 0.0, "end": duration, "text": text}],
            })
        return send_json(request, 200, {"text": text})

    async def load(self, request: Request) -> bytes:
        raw = _field(request, "model")
        if raw is None:
            raise _error(400, "no 'model' field in the request")
        path = raw.decode("utf-8", "replace").strip()
        if not os.path.isfile(path):
            raise _error(400, "model not found!")
        try:
            weights = load_weights(path, "stt")
        except WeightsError as exc:
            self.rt.complain(f"error: {exc}")
            self.rt.complain("error: model init failed, no model loaded must exit")
            return await self.rt.die(1)
        async with self.rt.slot():
            loaded = await self.rt.load(weights, path)
        if not loaded:
            return await self.rt.die(1)
        return send_text(request, 200, "Load was successful!", b"application/text")


def _loading(request: Request) -> bytes:
    if request.path == b"/health":
        return send_json(request, 503, {"status": "loading model"})
    return send_json(request, 503, {"error": "Loading model"})


def build_app(runtime: SimRuntime, options: WhisperOptions) -> Klein:
    server = WhisperServer(runtime, options)
    table = [
        *routes("GET", {"/health": server.health}, work=False),
        *routes("POST", {"/inference": server.inference}, work=True),
        *routes("POST", {"/load": server.load}, work=False),
    ]
    return build_family_app(runtime, table, loading_reply=_loading,
                            error_body=lambda code, message: {"error": message})


def _build(runtime: SimRuntime, ns: argparse.Namespace) -> Klein:
    return build_app(runtime, options_from_args(ns))


PROGRAM = Family("whisper-server", "stt", FLAGS, _build)
