"""Video jobs: sd-server's asynchronous ``vid_gen`` routed, held and answered (``routing.jobs`` decides).

A submission is served like an image request (``inference.local``: the image runtime is acquired, the
model loaded or switched, image-side readiness) and sent to the backend, whose 202 names its job.
From then on the runtime lease stays held by :class:`VideoJobs`, which polls the backend's job
itself (:func:`~routerd.routing.jobs.poll_delay`) until it ends: no switch or unload happens under
a running job, and the job's duration is measured.  The client gets the 202 with a routerd job ID
and ``poll_url``; its polls and cancels are answered here, by the node that runs the job (the
backend's live answer, or the kept one once the job ended, since the process may then be
switched) or, on a master, by forwarding them to the node it forwarded the job to.  A job belongs
to the key that submitted it (``routing.jobs``: another key's poll or cancel is a 404).  Jobs are
never lent.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent

from routerd.errors import HTTPError
from routerd.paths import INFERENCE_PREFIX
from routerd.routing.body import BytesProducer
from routerd.routing.call import Call, Reply
from routerd.routing.forward import TRANSPORT_ERRORS, Forwarder, Outbound, Unreachable
from routerd.routing.jobs import JOBS_PREFIX, Job, JobAction, JobTable, new_job_id, poll_delay
from routerd.routing.plan import BackendPlan
from routerd.routing.relay import collect

log = Logger()

#: Seconds one poll of a backend's job may take before it counts as unanswered.
POLL_TIMEOUT_S = 10.0
_JSON = {b"content-type": [b"application/json"]}


class VideoJobs:
    """The video jobs this node runs, and on a master the ones it forwarded to other nodes."""

    def __init__(self, *, node_id: str, clock: IReactorTime, agent: IAgent,
                 forwarder: Forwarder | None = None,
                 node_url: Callable[[str], str | None] = lambda _node_id: None,
                 table: JobTable | None = None) -> None:
        self.node_id = node_id
        self.clock = clock
        self.agent = agent  # the backends' (loopback) agent
        self.forwarder = forwarder  # a master's, to the nodes it forwarded jobs to
        self.node_url = node_url
        self.table = table if table is not None else JobTable()
        self._sleeping: dict[str, tuple[Deferred[None], IDelayedCall]] = {}
        self._polling: dict[str, Deferred[Any]] = {}  # the watcher's poll under way, per job

    # -- a submission on this node ----------------------------------------------------------------

    async def submit(self, call: Call, base_url: str, plan: BackendPlan,
                     public_id: str) -> tuple[bytes, Deferred[str] | None]:
        """Send the job to the backend at ``base_url``.  Accepted: the routerd 202, and a Deferred
        firing with the job's final status when it ends (the caller holds the runtime until then).
        Refused: the backend's answer as it gave it, and None."""
        pending = self.agent.request(b"POST", (base_url + plan.path).encode(), Headers(dict(_JSON)),
                                     BytesProducer(plan.body))
        response = await pending
        code = int(response.code)
        raw = await collect(response)
        document = _object(raw)
        backend_id = document.get("id") if document is not None else None
        reply = call.reply
        call.outcome.http_status = code
        reply.set_header(b"content-type", b"application/json")
        if code != 202 or document is None or not isinstance(backend_id, str) or not backend_id:
            call.outcome.status = "ok" if 200 <= code < 300 else f"http_{code}"
            reply.set_status(code)
            return raw, None
        self.table.expire(self.clock.seconds())  # ended jobs nobody polls are let go here too
        job = self.table.add_local(new_job_id(), public_id, backend_id, base_url, document,
                                   self.clock.seconds(), owner=call.key_name)
        log.info("video job {job_id} of {model} runs as {backend_id} at {base_url}", job_id=job.job_id,
                 model=public_id, backend_id=backend_id, base_url=base_url)
        done: Deferred[str] = Deferred()
        Deferred.fromCoroutine(self._watch(job)).addBoth(lambda _: done.callback(job.status))
        reply.set_status(202)
        return json.dumps(job.document).encode(), done

    async def _watch(self, job: Job) -> None:
        """Poll the backend's job until it ends (or its backend is lost)."""
        try:
            while not job.terminal:
                await self._sleep(job, poll_delay(self.clock.seconds() - job.created))
                if not job.terminal:
                    polling = self._polling[job.job_id] = Deferred.fromCoroutine(self._poll_backend(job))
                    try:
                        await polling
                    finally:
                        self._polling.pop(job.job_id, None)
        except Exception as exc:  # noqa: BLE001 - the runtime must be given back whatever happened
            log.failure("watching video job {job_id} failed", job_id=job.job_id)
            self.table.fail(job, "router_error", f"routerd stopped watching the job: {exc}",
                            self.clock.seconds())
        log.info("video job {job_id} ended: {status}", job_id=job.job_id, status=job.status)

    def _sleep(self, job: Job, seconds: float) -> Deferred[None]:
        woken: Deferred[None] = Deferred()
        timer = self.clock.callLater(seconds, self._wake, job.job_id)
        self._sleeping[job.job_id] = (woken, timer)
        return woken

    def _wake(self, job_id: str) -> None:
        """The watcher of ``job_id`` polls now (a client's poll or cancel saw the job end)."""
        sleeping = self._sleeping.pop(job_id, None)
        if sleeping is not None:
            woken, timer = sleeping
            if timer.active():
                timer.cancel()
            woken.callback(None)

    async def _poll_backend(self, job: Job) -> tuple[int, dict[str, Any] | None]:
        """One poll of the backend's job, observed into the table: (status code, document)."""
        url = job.base_url + JOBS_PREFIX + job.backend_id
        now = self.clock.seconds
        try:
            pending = self.agent.request(b"GET", url.encode(), Headers({}), None)
            pending.addTimeout(POLL_TIMEOUT_S, self.clock)
            response = await pending
            code = int(response.code)
            document = _object(await collect(response))
        except Exception as exc:  # noqa: BLE001 - any failure to answer counts the same
            if self.table.poll_failed(job):
                self.table.fail(job, "backend_lost", f"the backend stopped answering: {exc}", now())
            return 0, None
        if code in (404, 410):
            self.table.fail(job, "backend_lost", "the backend no longer knows the job", now())
        elif code == 200 and document is not None:
            self.table.observe(job, document, now())
        return code, document

    # -- a master's forwarded submission -------------------------------------------------------------

    def forwarded(self, call: Call, answer: bytes, node_id: str, public_id: str) -> None:
        """The node ``node_id`` accepted a job the master forwarded: its polls go there."""
        document = _object(answer)
        job_id = document.get("id") if document is not None else None
        if call.outcome.http_status == 202 and isinstance(job_id, str) and job_id:
            self.table.expire(self.clock.seconds())
            self.table.add_remote(job_id, public_id, node_id, self.clock.seconds(), owner=call.key_name)

    def stop(self) -> None:
        """The node stops: every job still running here ends as failed (its runtime given back)."""
        for job in self.table.running():
            self.table.fail(job, "node_stopping", "the node running the job stopped", self.clock.seconds())
            self._wake(job.job_id)
            polling = self._polling.get(job.job_id)
            if polling is not None:
                polling.cancel()

    # -- polls and cancels -------------------------------------------------------------------------

    def running(self) -> int:
        """Jobs this node's backends run now."""
        return len(self.table.running())

    async def answer(self, job_id: str, action: JobAction, reply: Reply, asker: str = "") -> bytes:
        """A client's (or the master's) poll or cancel of job ``job_id``; ``asker`` is the name of
        the client's key (another key's job is not found; "" sees every job)."""
        found = self.table.lookup(job_id, self.clock.seconds(), asker)
        if found is None:
            raise HTTPError(404, f"job {job_id!r} was not found", "not_found", "job_not_found")
        if found == "expired":
            raise HTTPError(410, f"job {job_id!r} ended more than {self.table.ttl_s:g} s ago and is gone",
                            "not_found", "job_expired")
        reply.set_header(b"content-type", b"application/json")
        if not found.local:
            return await self._remote(found, action, reply)
        reply.set_header(b"x-routerd-node", self.node_id.encode())
        if not found.terminal:
            if action == "cancel":
                await self._cancel_backend(found)
            else:
                await self._poll_backend(found)
            if found.terminal:
                self._wake(found.job_id)  # the watcher ends it (and gives the runtime back) now
        return json.dumps(found.document).encode()

    async def _cancel_backend(self, job: Job) -> None:
        url = job.base_url + JOBS_PREFIX + job.backend_id + "/cancel"
        try:
            response = await self.agent.request(b"POST", url.encode(), Headers(dict(_JSON)),
                                                BytesProducer(b""))
            code = int(response.code)
            raw = await collect(response)
        except TRANSPORT_ERRORS as exc:
            raise HTTPError(502, f"the backend running job {job.job_id!r} did not answer: {exc}",
                            "backend_error", "backend_error") from None
        document = _object(raw)
        if code == 200 and document is not None:
            self.table.observe(job, document, self.clock.seconds())
            return
        error = document.get("error") if document is not None else None
        message = error if isinstance(error, str) else raw.decode("utf-8", "replace")[:200]
        if code == 409:
            raise HTTPError(409, f"job {job.job_id!r} cannot be cancelled now: {message}",
                            "invalid_request_error", "job_not_cancellable")
        raise HTTPError(502 if code >= 500 else code, f"the backend refused to cancel job "
                        f"{job.job_id!r}: {message}", "backend_error", "backend_error")

    async def _remote(self, job: Job, action: JobAction, reply: Reply) -> bytes:
        """A master passes the poll or cancel to the node running the job, and its answer back."""
        assert job.node_id is not None
        base = self.node_url(job.node_id)
        if base is None or self.forwarder is None:
            raise HTTPError(502, f"node {job.node_id!r} running job {job.job_id!r} is not known",
                            "backend_error", "node_unreachable")
        path = JOBS_PREFIX + job.job_id + ("/cancel" if action == "cancel" else "")
        out = Outbound(url=base.rstrip("/") + INFERENCE_PREFIX + path, body=b"",
                       content_type="application/json", request_id=job.job_id,
                       method=b"POST" if action == "cancel" else b"GET")
        try:
            code, raw = await self.forwarder.send(reply, out)
        except Unreachable as exc:
            raise HTTPError(502, f"node {job.node_id!r} running job {job.job_id!r} is unreachable: {exc}",
                            "backend_error", "node_unreachable") from None
        document = _object(raw)
        if code == 200 and document is not None:
            self.table.observe(job, document, self.clock.seconds())  # an ended job expires here too
        return raw


def _object(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


__all__ = ["POLL_TIMEOUT_S", "VideoJobs"]
