"""The pure side of video jobs: the job table, job paths, the watcher's poll delays, a job's work,
and how ``/sdcpp/v1/vid_gen`` is classified and planned per backend family."""

from __future__ import annotations

import pytest

from routerd.errors import HTTPError
from routerd.routing.classify import classify
from routerd.routing.jobs import (
    MAX_POLL_FAILURES,
    JobTable,
    job_path,
    new_job_id,
    poll_delay,
    rewrite,
    video_work,
)
from routerd.routing.plan import NEEDS, SECTIONS, plan_backend_call
from routerd.routing.work import request_work

ACCEPTED = {"id": "job_1", "kind": "vid_gen", "status": "queued", "created": 1,
            "poll_url": "/sdcpp/v1/jobs/job_1"}
RUNNING = {"id": "job_1", "kind": "vid_gen", "status": "generating", "result": None}
DONE = {"id": "job_1", "kind": "vid_gen", "status": "completed", "result": {"b64_json": "AAAA"}}


def test_vid_gen_is_an_image_runtime_route_never_lent_needing_an_image_model_measured_as_video() -> None:
    """Image-side readiness (runtime ``image``), no lending lane, the image capability, its own
    sample section (so video minutes never enter the image lane's fit)."""
    route = classify("POST", "/sdcpp/v1/vid_gen")
    assert route is not None
    assert (route.kind, route.runtime, route.lane, route.streamable) == ("sd_vid_gen", "image", None, False)
    assert SECTIONS[route.kind] == "video" and NEEDS["video"] == "image"
    assert classify("GET", "/sdcpp/v1/vid_gen") is None
    assert classify("POST", "/sdcpp/v1/jobs/job_1") is None  # polls are no inference request


def test_vid_gen_goes_to_sd_server_as_sent_and_other_families_answer_501() -> None:
    route = classify("POST", "/sdcpp/v1/vid_gen")
    assert route is not None
    raw = b'{"model": "paint-paint", "prompt": "x"}'
    plan = plan_backend_call(route, "/sdcpp/v1/vid_gen", {"model": "paint-paint", "prompt": "x"}, raw,
                             "application/json", "paint", False, "llama_sdcpp")
    assert (plan.path, plan.body, plan.answer_format) == ("/sdcpp/v1/vid_gen", raw, "job")
    for family in ("kobold", "vllm"):
        with pytest.raises(HTTPError) as err:
            plan_backend_call(route, "/sdcpp/v1/vid_gen", {}, b"{}", "application/json", "paint", False,
                              family)
        assert (err.value.status, err.value.code) == (501, "unsupported_backend")


def test_job_paths_name_an_id_and_an_action_and_refuse_anything_else() -> None:
    assert job_path("/sdcpp/v1/jobs/rjob_ab12") == ("rjob_ab12", "poll")
    assert job_path("/sdcpp/v1/jobs/rjob_ab12/cancel") == ("rjob_ab12", "cancel")
    for path in ("/sdcpp/v1/jobs/", "/sdcpp/v1/jobs/a/b", "/sdcpp/v1/jobs/a.b", "/sdcpp/v1/vid_gen",
                 "/sdcpp/v1/jobs/" + "x" * 65):
        assert job_path(path) is None, path
    assert new_job_id() != new_job_id() and job_path("/sdcpp/v1/jobs/" + new_job_id()) is not None


def test_the_watcher_polls_often_at_first_then_once_a_second() -> None:
    assert poll_delay(0.0) == 0.05
    assert poll_delay(2.0) == pytest.approx(0.2)
    assert poll_delay(3600.0) == 1.0


def test_a_jobs_work_is_steps_times_pixels_times_the_frames_sd_server_renders() -> None:
    body = {"width": 832, "height": 480, "video_frames": 34, "sample_params": {"sample_steps": 28}}
    assert video_work(body) == (28.0 * 832 * 480 * 33,)  # 34 frames render as 33 (4n + 1)
    assert video_work({}) == (20.0 * 512 * 512,)
    assert video_work({"width": -1, "video_frames": True, "sample_params": "x"}) == (20.0 * 512 * 512,)
    route = classify("POST", "/sdcpp/v1/vid_gen")
    assert route is not None and request_work(route, body, b"", "application/json") == video_work(body)


def test_a_document_is_answered_under_the_routerd_id_poll_url_and_public_model() -> None:
    out = rewrite(ACCEPTED, "rjob_1", "paint-paint")
    assert out == {**ACCEPTED, "id": "rjob_1", "poll_url": "/sdcpp/v1/jobs/rjob_1", "model": "paint-paint"}
    assert "poll_url" not in rewrite(RUNNING, "rjob_1", "paint-paint")


def test_a_local_job_runs_until_a_terminal_document_then_is_kept_expired_and_forgotten() -> None:
    table = JobTable(ttl_s=600.0)
    job = table.add_local("rjob_1", "paint-paint", "job_1", "http://127.0.0.1:9", ACCEPTED, now=0.0)
    assert (job.status, job.terminal, job.local) == ("queued", False, True)
    assert table.running() == [job]
    assert table.observe(job, RUNNING, now=1.0) is False
    assert table.observe(job, DONE, now=2.0) is True
    assert job.finished == 2.0 and table.running() == []
    assert table.observe(job, RUNNING, now=3.0) is False and job.status == "completed"  # ends once
    assert table.lookup("rjob_1", now=601.0) is job
    assert table.lookup("rjob_1", now=602.0) == "expired"
    assert table.lookup("rjob_1", now=1202.0) is None
    assert table.lookup("rjob_other", now=0.0) is None


def test_a_job_whose_backend_stops_answering_fails_after_the_allowed_misses() -> None:
    table = JobTable()
    job = table.add_local("rjob_1", "paint-paint", "job_1", "http://127.0.0.1:9", ACCEPTED, now=0.0)
    assert not any(table.poll_failed(job) for _ in range(MAX_POLL_FAILURES - 1))
    assert table.observe(job, RUNNING, now=1.0) is False  # an answer resets the count
    assert not any(table.poll_failed(job) for _ in range(MAX_POLL_FAILURES - 1))
    assert table.poll_failed(job)
    assert table.fail(job, "backend_lost", "gone", now=5.0) is True
    assert job.document is not None and job.document["status"] == "failed"
    assert job.document["error"] == {"code": "backend_lost", "message": "gone"}
    assert table.fail(job, "backend_lost", "again", now=6.0) is False


def test_a_forwarded_job_is_remembered_by_node_and_forgotten_when_stale() -> None:
    table = JobTable(remote_max_age_s=100.0)
    job = table.add_remote("rjob_9", "paint-paint", "slave", now=0.0)
    assert (job.node_id, job.local) == ("slave", False)
    assert table.running() == []  # not run here: holds no runtime of this node
    assert table.lookup("rjob_9", now=99.0) is job
    assert table.lookup("rjob_9", now=100.0) == "expired"


def test_a_job_is_found_only_by_the_key_that_submitted_it_or_by_an_all_seeing_asker() -> None:
    """Another key's lookup is None, as for an ID never issued (also once the job expired); ""
    (an admin key, a keyless node, the master passing a poll on) finds every job."""
    table = JobTable(ttl_s=600.0)
    job = table.add_local("rjob_1", "paint-paint", "job_1", "http://127.0.0.1:9", ACCEPTED, now=0.0,
                          owner="alice")
    remote = table.add_remote("rjob_2", "paint-paint", "slave", now=0.0, owner="alice")
    for found, job_id in ((job, "rjob_1"), (remote, "rjob_2")):
        assert table.lookup(job_id, now=1.0, asker="alice") is found
        assert table.lookup(job_id, now=1.0, asker="") is found
        assert table.lookup(job_id, now=1.0, asker="bob") is None
    table.observe(job, DONE, now=2.0)
    assert table.lookup("rjob_1", now=602.0, asker="alice") == "expired"
    assert table.lookup("rjob_1", now=602.0, asker="bob") is None
    assert table.lookup("rjob_1", now=1202.0, asker="alice") is None
