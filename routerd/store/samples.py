"""Measured requests and model loads: the inputs of cost fitting (lending reference §5)."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

#: ``RequestSample.section`` values (analytics sections; text requests are ``llm``).  ``tts`` and
#: ``music`` are recorded for completeness (the routing layer emits them) but never priced; ``video``
#: (sd-server's ``vid_gen`` jobs, ``steps × width × height × frames``) is measured apart from
#: ``image`` so a video job's minutes do not skew the image lane's fit, and is never priced (never lent).
SECTIONS: tuple[str, ...] = ("llm", "image", "stt", "embeddings", "tts", "music", "video")
#: ``LoadSample.runtime`` values.
RUNTIMES: tuple[str, ...] = ("text", "image", "stt")
#: The status of a successful request or load; anything else is an error code.
OK = "ok"


def _work(values: Iterable[float]) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


@attrs.frozen
class RequestSample:
    """One finished request.

    ``work`` depends on the section: text ``(prompt_tokens, output_tokens)``;
    image ``(steps * width * height * count,)``; stt ``(audio_seconds,)``; embeddings and
    tts as the routing layer measures them.
    """

    model_id: str
    section: str
    work: tuple[float, ...] = attrs.field(converter=_work)
    duration_ms: float
    status: str
    finished_at_ms: int
    http_status: int = 200
    request_bytes: int = 0
    node_id: str = ""


@attrs.frozen
class LoadSample:
    """One finished model (config) load, successful or not."""

    config_filename: str
    model_id: str
    runtime: str
    duration_ms: float
    status: str
    finished_at_ms: int
    reason: str = ""
