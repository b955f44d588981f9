"""A stand-in for stable-diffusion.cpp's ``sd-server``: A1111-style and OpenAI image routes, and the
native asynchronous video job (``POST /sdcpp/v1/vid_gen`` → 202 ``{id, kind, status, created,
poll_url}``; ``GET /sdcpp/v1/jobs/{id}``; ``POST /sdcpp/v1/jobs/{id}/cancel``: 200 for a queued or
finished job, 409 while it generates; 404 for an unknown one), as sd-server's ``routes_sdcpp.cpp``
and ``async_jobs.cpp`` answer them.  A video job takes ``steps × megapixels × frames ×
ms_per_step_megapixel`` and holds the process's one generation slot meanwhile."""

from __future__ import annotations

import argparse
import base64
import json
from collections.abc import Callable

import attrs
from klein import Klein
from twisted.internet.defer import Deferred
from twisted.web.server import Request

from routerd.sim.flags import Flag
from routerd.sim.outputs import digest, png_b64
from routerd.sim.program import Family, one_slot
from routerd.sim.routes import build_family_app, openai_error_page, routes
from routerd.sim.runtime import SimRuntime, WeightsServer
from routerd.sim.timing import DEFAULT_IMAGE_SIZE, DEFAULT_STEPS, image_seconds
from routerd.sim.web import (
    HttpError,
    openai_bad_request,
    openai_error,
    openai_json_body,
    send_json,
)
from routerd.sim.weights import Weights, weights_display_name

__all__ = ["FLAGS", "PROGRAM", "ImageJob", "SdOptions", "VideoJob", "build_app", "options_from_args"]

FLAGS: tuple[Flag, ...] = (
    Flag(("-l", "--listen-ip", "--host"), "host", str, "127.0.0.1", "address to listen on", "HOST"),
    Flag(("--listen-port", "--port"), "port", int, 1234, "port to listen on", "PORT"),
    Flag(("-m", "--model"), "model", str, None, "model weights (*.sim.json)", "PATH"),
    Flag(("--diffusion-model",), "diffusion_model", str, None,
         "standalone diffusion model weights, used when -m is not given", "PATH"),
)

MAX_SIDE = 8192
MAX_COUNT = 64
MAX_STEPS = 1000


@attrs.frozen
class SdOptions:
    model_path: str

    @property
    def model_name(self) -> str:
        return weights_display_name(self.model_path)


def validate_args(ns: argparse.Namespace) -> str | None:
    if ns.model is None:
        ns.model = ns.diffusion_model
    return None


def options_from_args(ns: argparse.Namespace) -> SdOptions:
    return SdOptions(model_path=ns.model)


@attrs.frozen
class ImageJob:
    prompt: str
    negative_prompt: str
    steps: int
    width: int
    height: int
    count: int
    seed: int

    def hash_input(self) -> str:
        return json.dumps(attrs.asdict(self), sort_keys=True)


#: sd-server's video containers and their MIME types.
VIDEO_FORMATS = {"webm": "video/webm", "webp": "image/webp", "avi": "video/x-msvideo"}


@attrs.define
class VideoJob:
    """One ``vid_gen`` job, answered as sd-server's ``make_async_job_json``."""

    id: str
    created: int
    prompt: str
    steps: int
    width: int
    height: int
    frames: int
    fps: int
    output_format: str
    status: str = "queued"
    started: int | None = None
    completed: int | None = None
    result: dict[str, object] | None = None
    error: dict[str, str] | None = None

    def document(self, queue_position: int) -> dict[str, object]:
        return {"id": self.id, "kind": "vid_gen", "status": self.status, "created": self.created,
                "started": self.started, "completed": self.completed,
                "queue_position": queue_position, "result": self.result, "error": self.error}



def _int_field(body: dict[str, object], name: str, default: int, low: int, high: int) -> int:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise openai_bad_request(f"'{name}' must be an integer")
    if not low <= int(value) <= high:
        raise openai_bad_request(f"'{name}' must be between {low} and {high}")
    return int(value)


def _str_field(body: dict[str, object], name: str, required: bool = False) -> str:
    value = body.get(name)
    if value is None:
        if required:
            raise openai_bad_request(f"'{name}' is required")
        return ""
    if not isinstance(value, str):
        raise openai_bad_request(f"'{name}' must be a string")
    return value


def parse_size(size: object) -> tuple[int, int]:
    """``"WxH"`` to (width, height)."""
    if size is None:
        return DEFAULT_IMAGE_SIZE
    if isinstance(size, str):
        width, sep, height = size.lower().partition("x")
        if sep and width.isdigit() and height.isdigit():
            w, h = int(width), int(height)
            if 0 < w <= MAX_SIDE and 0 < h <= MAX_SIDE:
                return w, h
    raise openai_bad_request("'size' must look like '512x512'")


class SdServer(WeightsServer):
    def __init__(self, runtime: SimRuntime, options: SdOptions,
                 weights: Callable[[], Weights] | None = None) -> None:
        super().__init__(runtime, weights)
        self.opts = options
        self.jobs: dict[str, VideoJob] = {}
        self._job_count = 0

    async def _render(self, job: ImageJob) -> list[str]:
        async with self.rt.slot():
            await self.rt.work(
                image_seconds(self.weights, job.steps, job.width, job.height, job.count)
            )
        return [png_b64(self.weights.label, job.hash_input(), i) for i in range(job.count)]

    async def health(self, request: Request) -> bytes:
        return send_json(request, 200, {"status": "ok"})

    async def sd_models(self, request: Request) -> bytes:
        name = self.opts.model_name
        return send_json(request, 200, [
            {"title": name, "model_name": name, "filename": self.opts.model_path, "hash": None,
             "sha256": None, "config": None},
        ])

    async def txt2img(self, request: Request) -> bytes:
        body = openai_json_body(request)
        job = ImageJob(
            prompt=_str_field(body, "prompt"),
            negative_prompt=_str_field(body, "negative_prompt"),
            steps=_int_field(body, "steps", DEFAULT_STEPS, 1, MAX_STEPS),
            width=_int_field(body, "width", DEFAULT_IMAGE_SIZE[0], 1, MAX_SIDE),
            height=_int_field(body, "height", DEFAULT_IMAGE_SIZE[1], 1, MAX_SIDE),
            count=_int_field(body, "batch_size", 1, 1, MAX_COUNT),
            seed=_int_field(body, "seed", -1, -1, 2**63 - 1),
        )
        images = await self._render(job)
        parameters = {**body, **attrs.asdict(job)}
        parameters["batch_size"] = parameters.pop("count")
        info = {
            "prompt": job.prompt, "all_prompts": [job.prompt] * job.count,
            "negative_prompt": job.negative_prompt, "seed": job.seed, "steps": job.steps,
            "width": job.width, "height": job.height, "sd_model_name": self.opts.model_name,
            "weights": self.weights.label,
        }
        return send_json(request, 200, {"images": images, "parameters": parameters,
                                        "info": json.dumps(info)})

    async def generations(self, request: Request) -> bytes:
        body = openai_json_body(request)
        width, height = parse_size(body.get("size"))
        response_format = body.get("response_format", "b64_json")
        if response_format not in (None, "b64_json"):
            raise openai_bad_request("only response_format 'b64_json' is supported")
        job = ImageJob(
            prompt=_str_field(body, "prompt", required=True),
            negative_prompt=_str_field(body, "negative_prompt"),
            steps=_int_field(body, "steps", DEFAULT_STEPS, 1, MAX_STEPS),
            width=width,
            height=height,
            count=_int_field(body, "n", 1, 1, MAX_COUNT),
            seed=_int_field(body, "seed", -1, -1, 2**63 - 1),
        )
        images = await self._render(job)
        return send_json(request, 200, {
            "created": int(self.rt.now()),
            "data": [{"b64_json": image} for image in images],
            "output_format": "png",
        })


    # -- the native asynchronous video job ------------------------------------------------------

    async def vid_gen(self, request: Request) -> bytes:
        body = openai_json_body(request)
        params = body.get("sample_params")
        steps = _int_field(params, "sample_steps", DEFAULT_STEPS, 1, MAX_STEPS) \
            if isinstance(params, dict) else DEFAULT_STEPS
        output_format = body.get("output_format", "webm")
        if output_format not in VIDEO_FORMATS:
            raise openai_bad_request("invalid output_format")
        frames = _int_field(body, "video_frames", 1, 1, 4096)
        now = int(self.rt.now())
        self._job_count += 1
        job = VideoJob(
            id=f"job_{now:x}_{self._job_count:08x}", created=now,
            prompt=_str_field(body, "prompt"), steps=steps,
            width=_int_field(body, "width", DEFAULT_IMAGE_SIZE[0], 1, MAX_SIDE),
            height=_int_field(body, "height", DEFAULT_IMAGE_SIZE[1], 1, MAX_SIDE),
            frames=(frames - 1) // 4 * 4 + 1, fps=_int_field(body, "fps", 16, 1, 240),
            output_format=str(output_format))
        self.jobs[job.id] = job
        self.rt.clock.callLater(0, lambda: Deferred.fromCoroutine(self._run(job)))
        return send_json(request, 202, {"id": job.id, "kind": "vid_gen", "status": job.status,
                                        "created": job.created, "poll_url": f"/sdcpp/v1/jobs/{job.id}"})

    async def _run(self, job: VideoJob) -> None:
        async with self.rt.slot():
            if job.status != "queued":
                return  # cancelled while it waited
            job.status, job.started = "generating", int(self.rt.now())
            await self.rt.work(image_seconds(self.weights, job.steps, job.width, job.height, job.frames))
            media = b"SIMVIDEO" + digest(self.weights.label, "video", job.prompt, str(job.steps),
                                         f"{job.width}x{job.height}x{job.frames}")
            job.status, job.completed = "completed", int(self.rt.now())
            job.result = {"output_format": job.output_format, "mime_type": VIDEO_FORMATS[job.output_format],
                          "fps": job.fps, "frame_count": job.frames,
                          "b64_json": base64.b64encode(media).decode("ascii"), "weights": self.weights.label}

    def _job(self, request: Request) -> VideoJob:
        parts = request.path.decode("utf-8", "replace").split("/")  # /sdcpp/v1/jobs/<id>[/cancel]
        job = self.jobs.get(parts[4]) if len(parts) > 4 else None
        if job is None:
            raise HttpError(404, {"error": "job not found"})
        return job

    def _position(self, job: VideoJob) -> int:
        queued = [j for j in self.jobs.values() if j.status == "queued"]
        return queued.index(job) + 1 if job in queued else 0

    async def job(self, request: Request) -> bytes:
        job = self._job(request)
        return send_json(request, 200, job.document(self._position(job)))

    async def cancel(self, request: Request) -> bytes:
        job = self._job(request)
        if job.status == "generating":
            raise HttpError(409, {"error": "job is currently generating and cannot be interrupted yet"})
        if job.status == "queued":
            job.status, job.completed = "cancelled", int(self.rt.now())
            job.error = {"code": "cancelled", "message": "job cancelled by client"}
        return send_json(request, 200, job.document(0))


def _loading(request: Request) -> bytes:
    return send_json(request, 503, openai_error(503, "Loading model", "unavailable_error"))


def build_app(runtime: SimRuntime, options: SdOptions) -> Klein:
    server = SdServer(runtime, options)
    table = [
        *routes("GET", {"/health": server.health, "/sdapi/v1/sd-models": server.sd_models}, work=False),
        *routes("POST", {"/sdapi/v1/txt2img": server.txt2img, "/v1/images/generations": server.generations,
                         "/sdcpp/v1/vid_gen": server.vid_gen}, work=True),
        *routes("GET", {"/sdcpp/v1/jobs/<job_id>": server.job}, work=False),
        *routes("POST", {"/sdcpp/v1/jobs/<job_id>/cancel": server.cancel}, work=False),
    ]
    return build_family_app(runtime, table, loading_reply=_loading, error_body=openai_error_page)


def _build(runtime: SimRuntime, ns: argparse.Namespace) -> Klein:
    return build_app(runtime, options_from_args(ns))


PROGRAM = Family("sd-server", "image", FLAGS, _build, one_slot, validate_args)
