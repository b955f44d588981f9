"""One client inference request as it moves through a node."""

from __future__ import annotations

import os
from typing import Any

import attrs
from twisted.web.iweb import IRequest

from routerd.routing.classify import Route


def new_request_id() -> str:
    return os.urandom(8).hex()


@attrs.define
class Outcome:
    """What happened, for metrics and samples."""

    status: str = "ok"
    http_status: int = 200
    work: tuple[float, ...] = ()


@attrs.define
class Call:
    request: IRequest
    route: Route
    path: str
    body: bytes
    content_type: str
    parsed: dict[str, Any] | None
    stream: bool
    request_id: str
    started: float
    selector: str | None
    outcome: Outcome = attrs.Factory(Outcome)
    borrowed: bool = False  # lent to this node by another owner
    serving_since: float | None = None  # when the backend slot was acquired


@attrs.define
class ActiveRequest:
    request_id: str
    model_id: str
    route: str
    runtime: str
    started_ms: int
    state: str = "waiting"
    borrowed: bool = False

    def to_json(self, now_ms: int) -> dict[str, Any]:
        return {"request_id": self.request_id, "model_id": self.model_id, "route": self.route,
                "runtime": self.runtime, "state": self.state, "started_ms": self.started_ms,
                "borrowed": self.borrowed,
                "elapsed_ms": max(0, now_ms - self.started_ms)}
