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
from routerd.sim.web import send_json, send_text
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


#: What whisper-server answers every 400 with: its HTTP library's error handler replaces the handler's own
#: JSON body (``{"error": "no 'file' field in the request"}``, printed on stderr) with this text.
INVALID_REQUEST = "Invalid request"
#: Languages ``verbose_json`` reports a probability for.
LANGUAGES = ("en", "de", "es", "fr", "nl")
#: Each response format's content type, as whisper-server sends it.
CONTENT_TYPES = {"text": b"text/html", "srt": b"application/x-subrip", "vtt": b"text/vtt"}


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


def _segment(text: str, duration: float) -> dict[str, object]:
    """One ``verbose_json`` segment: its words (a word per token, timed across the clip) and their ids."""
    words = [word if i == 0 else " " + word for i, word in enumerate(text.split())]
    step = duration / max(1, len(words))
    return {
        "id": 0, "text": text, "start": 0.0, "end": duration,
        "tokens": [256 + i for i in range(len(words))],
        "words": [{"word": word, "start": round(i * step, 2), "end": round((i + 1) * step, 2), "t_dtw": -1,
                   "probability": 1.0} for i, word in enumerate(words)],
        "temperature": 0.0, "avg_logprob": 0.0, "no_speech_prob": 0.0,
    }


class WhisperServer:
    def __init__(self, runtime: SimRuntime, options: WhisperOptions) -> None:
        self.rt = runtime
        self.opts = options
        #: A ``/load`` is under way (not the startup load): requests then wait for it, as whisper-server's
        #: model lock makes them.
        self.switching = False

    def invalid(self, request: Request, reason: str) -> bytes:
        """A 400 as whisper-server answers it: the reason on stderr, "Invalid request" to the client."""
        self.rt.complain(f"error: {reason}")
        return send_text(request, 400, INVALID_REQUEST)

    async def health(self, request: Request) -> bytes:
        return send_json(request, 200, {"status": "ok"})

    async def inference(self, request: Request) -> bytes:
        audio = _field(request, "file")
        if audio is None:
            return self.invalid(request, "no 'file' field in the request")
        try:
            duration = wav_duration(audio)
        except ValueError:
            return self.invalid(request, "failed to read audio data")
        response_format = _text_field(request, "response_format", "json")
        language = _text_field(request, "language", self.opts.language)
        async with self.rt.slot():
            await self.rt.work(stt_seconds(self.rt.weights, duration))
        text = transcript(self.rt.weights.label, audio, duration)
        if response_format == "text":
            return send_text(request, 200, text + "\n", CONTENT_TYPES["text"])
        if response_format in ("srt", "vtt"):
            separator = "," if response_format == "srt" else "."
            span = f"{_timestamp(0.0, separator)} --> {_timestamp(duration, separator)}"
            head = "1\n" if response_format == "srt" else "WEBVTT\n\n"
            return send_text(request, 200, f"{head}{span}\n{text}\n", CONTENT_TYPES[response_format])
        if response_format == "verbose_json":
            return send_json(request, 200, {
                "task": "transcribe", "language": language, "duration": duration, "text": text,
                "segments": [_segment(text, duration)],
                "detected_language": language, "detected_language_probability": 1.0,
                "language_probabilities": {code: 1.0 if code == language else 0.0 for code in LANGUAGES},
            })
        return send_json(request, 200, {"text": text})

    async def load(self, request: Request) -> bytes:
        raw = _field(request, "model")
        if raw is None:
            return self.invalid(request, "no 'model' field in the request")
        path = raw.decode("utf-8", "replace").strip()
        if not os.path.isfile(path):
            return self.invalid(request, f"'model': {path} not found!")
        try:
            weights = load_weights(path, "stt")
        except WeightsError as exc:
            self.rt.complain(f"error: {exc}")
            self.rt.complain("error: model init failed, no model loaded must exit")
            return await self.rt.die(1)
        self.switching = True
        try:
            async with self.rt.slot():
                loaded = await self.rt.load(weights, path)
        finally:
            self.switching = False
        if not loaded:
            return await self.rt.die(1)
        return send_text(request, 200, "Load was successful!", b"application/text")


def _not_found(request: Request, status: int, message: str) -> bytes:
    """whisper-server's answer to an unknown path (or method): a text 404 naming the path."""
    path = (request.path or b"/").decode("utf-8", "replace")
    return send_text(request, 404, f"File Not Found ({path})")


def build_app(runtime: SimRuntime, options: WhisperOptions) -> Klein:
    server = WhisperServer(runtime, options)

    def loading(request: Request) -> bytes | None:
        if request.path == b"/health":
            return send_json(request, 503, {"status": "loading model"})
        if server.switching:
            return None  # waits for the model, as whisper-server's requests wait for its lock
        return send_json(request, 503, {"error": "Loading model"})

    table = [
        *routes("GET", {"/health": server.health}, work=False),
        *routes("POST", {"/inference": server.inference}, work=True),
        *routes("POST", {"/load": server.load}, work=False),
    ]
    return build_family_app(runtime, table, loading_reply=loading,
                            error_body=lambda code, message: {"error": message}, error_page=_not_found)


def _build(runtime: SimRuntime, ns: argparse.Namespace) -> Klein:
    return build_app(runtime, options_from_args(ns))


PROGRAM = Family("whisper-server", "stt", FLAGS, _build, listens_when_loaded=True)
