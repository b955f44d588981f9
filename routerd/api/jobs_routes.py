"""Video job polls (contract §5): ``GET /sdcpp/v1/jobs/{job_id}`` and ``POST
/sdcpp/v1/jobs/{job_id}/cancel``, answered by :class:`~routerd.inference.video.VideoJobs` (the node that
runs the job, or a master passing them on to it).  The same calls forwarded by a master reach
``ClientAPI.serve_forwarded`` under ``/router/v1/node/inference``."""

from __future__ import annotations

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.web.iweb import IRequest

from routerd.api.facts import READY_OR_DRAINING
from routerd.api.reply import KEY_ATTRIBUTE, RequestReply
from routerd.api.routes import Routes
from routerd.inference.video import VideoJobs


class JobsAPI:
    """The client's side of sd-server's asynchronous job API (inference keys)."""

    routes = Routes()

    def __init__(self, jobs: VideoJobs) -> None:
        self.jobs = jobs

    @routes.route("/sdcpp/v1/jobs/<job_id>", methods=["GET"], auth="inference", phases=READY_OR_DRAINING)
    def poll(self, request: IRequest, job_id: str) -> Deferred[bytes]:
        return ensureDeferred(self.jobs.answer(job_id, "poll", RequestReply(request), _asker(request)))

    @routes.route("/sdcpp/v1/jobs/<job_id>/cancel", methods=["POST"], auth="inference",
                  phases=READY_OR_DRAINING)
    def cancel(self, request: IRequest, job_id: str) -> Deferred[bytes]:
        return ensureDeferred(self.jobs.answer(job_id, "cancel", RequestReply(request), _asker(request)))


def _asker(request: IRequest) -> str:
    """The name of the key that admitted the request ("" for an admin key or a keyless node)."""
    name: str = getattr(request, KEY_ATTRIBUTE, ("", ""))[0]
    return name
