"""Resolution jobs (cluster reference §8.6 ``jobs``): one background resolution of a node's
portable config, with its events (what each field did, transfer progress) for the site API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

MAX_JOBS = 200  # finished jobs beyond this are forgotten, oldest first
MAX_EVENTS = 500


@attrs.define
class ResolutionJob:
    job_id: str
    node_id: str
    model_id: str
    created_ms: int
    state: str = "running"  # running | ready | unresolved | failed
    reason: str = ""
    finished_ms: int | None = None
    events: list[dict[str, Any]] = attrs.field(factory=list)
    hashes: list[str] = attrs.field(factory=list)

    def add(self, now_ms: int, kind: str, **fields: Any) -> None:
        if len(self.events) >= MAX_EVENTS:
            return
        self.events.append({"sequence": len(self.events) + 1, "time_ms": now_ms, "type": kind, **fields})

    def summary(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "node_id": self.node_id, "model_id": self.model_id,
                "state": self.state, "reason": self.reason, "created_ms": self.created_ms,
                "finished_ms": self.finished_ms}


class JobBoard:
    """The node's resolution jobs, newest last; IDs are ``<node_id>-<n>``."""

    def __init__(self, node_id: str, now_ms: Callable[[], int]) -> None:
        self.node_id = node_id
        self.now_ms = now_ms
        self._jobs: dict[str, ResolutionJob] = {}
        self._next = 1

    def create(self, model_id: str) -> ResolutionJob:
        job = ResolutionJob(job_id=f"{self.node_id}-{self._next}", node_id=self.node_id,
                            model_id=model_id, created_ms=self.now_ms())
        self._next += 1
        self._jobs[job.job_id] = job
        job.add(job.created_ms, "started", model_id=model_id)
        finished = [j for j in self._jobs.values() if j.state != "running"]
        for old in finished[: max(0, len(self._jobs) - MAX_JOBS)]:
            del self._jobs[old.job_id]
        return job

    def finish(self, job: ResolutionJob, state: str, reason: str) -> None:
        job.state, job.reason, job.finished_ms = state, reason, self.now_ms()
        job.add(job.finished_ms, "finished", state=state, reason=reason)

    def get(self, job_id: str) -> ResolutionJob | None:
        return self._jobs.get(job_id)

    def all(self) -> list[ResolutionJob]:
        return list(self._jobs.values())
