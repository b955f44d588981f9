"""Asynchronous video jobs (stable-diffusion.cpp ``sd-server``'s native ``/sdcpp/v1`` job API): the
pure job table and the rules around it.  No Twisted, no I/O; ``routerd.inference.video`` performs.

``POST /sdcpp/v1/vid_gen`` answers 202 with a job ``id`` and a ``poll_url``
(``/sdcpp/v1/jobs/{id}``); the polls (``GET /sdcpp/v1/jobs/{id}``, ``POST
/sdcpp/v1/jobs/{id}/cancel``) name no model and must reach the backend process that runs the job.
So a node gives every job it runs (or, on a master, forwarded) its own ID and keeps in a
:class:`JobTable` where the job lives: on this node (the backend's job ID and process URL) or on
another node (its node ID).  The answer a client sees is the backend's document with the routerd
ID, the routerd ``poll_url`` and the public model ID put in (:func:`rewrite`).

A job belongs to the key that submitted it: another key's poll or cancel finds no job (404, as for
an ID never issued, so an ID's existence is not revealed).  An admin key, every caller of a keyless
node (one principal) and the master passing a poll on (it checked the key itself) see every job.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, Literal

import attrs

#: Where a job's polls live (the backend's and routerd's alike).
JOBS_PREFIX = "/sdcpp/v1/jobs/"
#: The statuses after which a job changes no more (sd-server's ``async_job_status_name``).
TERMINAL = frozenset({"completed", "failed", "cancelled"})
#: How long a finished job's answer is kept for its polls (sd-server keeps it 600 s too).
FINISHED_TTL_S = 600.0
#: A job on another node is forgotten this long after it was forwarded if no poll saw it end.
REMOTE_MAX_AGE_S = 24 * 3600.0
#: Poll answers the watcher may miss in a row before the job counts as lost with its backend.
MAX_POLL_FAILURES = 5

_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")

JobAction = Literal["poll", "cancel"]


def new_job_id() -> str:
    """A routerd job ID: unguessable, unique across the cluster's nodes in practice."""
    return "rjob_" + os.urandom(10).hex()


def job_path(path: str) -> tuple[str, JobAction] | None:
    """``(job id, "poll" | "cancel")`` of a job path (``/sdcpp/v1/jobs/{id}[/cancel]``), else None
    (also for an ID that is no ``[A-Za-z0-9_-]`` word, which no job ever has)."""
    if not path.startswith(JOBS_PREFIX):
        return None
    rest = path[len(JOBS_PREFIX):]
    action: JobAction = "poll"
    if rest.endswith("/cancel"):
        rest, action = rest[: -len("/cancel")], "cancel"
    return (rest, action) if _ID.fullmatch(rest) else None


def poll_delay(elapsed_s: float) -> float:
    """Seconds until the watcher polls a job running for ``elapsed_s``: often at first (a short
    job's measured duration stays close), then every second at most."""
    return min(1.0, max(0.05, elapsed_s / 10.0))


def video_work(body: Mapping[str, Any] | None) -> tuple[float, ...]:
    """``steps × width × height × frames`` of a ``vid_gen`` body (sd-server's defaults: 20 steps,
    the model's 512 × 512, one frame; frames cut to the ``4n + 1`` sd-server renders)."""
    body = body or {}
    params = body.get("sample_params")
    steps = _positive(params.get("sample_steps") if isinstance(params, Mapping) else None, 20)
    frames = _positive(body.get("video_frames"), 1)
    frames = (frames - 1) // 4 * 4 + 1
    return (float(steps * _positive(body.get("width"), 512) * _positive(body.get("height"), 512) * frames),)


def _positive(value: Any, default: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return default
    return value


def rewrite(document: Mapping[str, Any], job_id: str, public_id: str) -> dict[str, Any]:
    """The backend's job document as routerd answers it: routerd's ID, ``poll_url`` and model."""
    out = dict(document)
    out["id"] = job_id
    if "poll_url" in out:
        out["poll_url"] = JOBS_PREFIX + job_id
    out["model"] = public_id
    return out


@attrs.define
class Job:
    """One job this node answers for.  ``node_id`` is None for a job a backend here runs
    (``backend_id`` at ``base_url``), else the node the master forwarded it to."""

    job_id: str
    public_id: str
    created: float
    node_id: str | None = None
    backend_id: str = ""
    base_url: str = ""
    status: str = "queued"
    #: The last document seen (rewritten); a finished job is answered from it.
    document: dict[str, Any] | None = None
    finished: float | None = None
    poll_failures: int = 0
    #: The name of the key that submitted the job ("" for an admin key or a keyless node).
    owner: str = ""

    @property
    def local(self) -> bool:
        return self.node_id is None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


@attrs.define
class JobTable:
    """Jobs by routerd ID; a finished job is kept :data:`FINISHED_TTL_S`, then answered as expired
    (410) for as long again, then unknown (404)."""

    ttl_s: float = FINISHED_TTL_S
    remote_max_age_s: float = REMOTE_MAX_AGE_S
    jobs: dict[str, Job] = attrs.field(factory=dict)
    expired: dict[str, float] = attrs.field(factory=dict)  # job id -> forgotten at
    expired_owners: dict[str, str] = attrs.field(factory=dict)  # job id -> its owner, while expired

    def add_local(self, job_id: str, public_id: str, backend_id: str, base_url: str,
                  document: Mapping[str, Any], now: float, owner: str = "") -> Job:
        job = Job(job_id, public_id, now, backend_id=backend_id, base_url=base_url, owner=owner)
        self.jobs[job_id] = job
        self.observe(job, document, now)
        return job

    def add_remote(self, job_id: str, public_id: str, node_id: str, now: float, owner: str = "") -> Job:
        job = Job(job_id, public_id, now, node_id=node_id, owner=owner)
        self.jobs[job_id] = job
        return job

    def lookup(self, job_id: str, now: float, asker: str = "") -> Job | Literal["expired"] | None:
        """The job, ``"expired"`` when it finished too long ago, or None when never known or not
        ``asker``'s (the name of the key asking; see :func:`visible_to`)."""
        self.expire(now)
        job = self.jobs.get(job_id)
        if job is not None:
            return job if visible_to(job.owner, asker) else None
        if job_id in self.expired and visible_to(self.expired_owners.get(job_id, ""), asker):
            return "expired"
        return None

    def observe(self, job: Job, document: Mapping[str, Any], now: float) -> bool:
        """A document the job's backend (or node) answered; True when it ended the job now.
        A finished job changes no more."""
        if job.terminal:
            return False
        job.poll_failures = 0
        job.document = rewrite(document, job.job_id, job.public_id)
        status = document.get("status")
        if isinstance(status, str) and status:
            job.status = status
        if job.terminal:
            job.finished = now
            return True
        return False

    def fail(self, job: Job, code: str, message: str, now: float) -> bool:
        """End the job as failed (its backend is gone); True when it was still running."""
        if job.terminal:
            return False
        document = dict(job.document or {"id": job.job_id, "kind": "vid_gen"})
        document.update(status="failed", result=None, error={"code": code, "message": message})
        return self.observe(job, document, now)

    def poll_failed(self, job: Job) -> bool:
        """A poll of the job's backend got no answer; True when that makes it lost
        (:data:`MAX_POLL_FAILURES` in a row)."""
        job.poll_failures += 1
        return job.poll_failures >= MAX_POLL_FAILURES

    def running(self) -> list[Job]:
        return [job for job in self.jobs.values() if job.local and not job.terminal]

    def expire(self, now: float) -> None:
        for job_id in [j for j, at in self.expired.items() if now - at >= self.ttl_s]:
            del self.expired[job_id]
            self.expired_owners.pop(job_id, None)
        for job in list(self.jobs.values()):
            done = job.finished is not None and now - job.finished >= self.ttl_s
            stale = not job.local and now - job.created >= self.remote_max_age_s
            if done or stale:
                del self.jobs[job.job_id]
                self.expired[job.job_id] = now
                self.expired_owners[job.job_id] = job.owner


def visible_to(owner: str, asker: str) -> bool:
    """Whether the key named ``asker`` may see a job ``owner`` submitted: its own, or every job for
    ``""`` (an admin key, a keyless node's callers, the master passing a poll on)."""
    return not asker or asker == owner


__all__ = ["FINISHED_TTL_S", "JOBS_PREFIX", "MAX_POLL_FAILURES", "TERMINAL", "Job", "JobTable",
           "job_path", "new_job_id", "poll_delay", "rewrite", "video_work"]
