"""Issue 23 on a real cluster with lending: a master with named keys, an owner slave and a helper
slave with simulator backends (a job takes ~100 ms).  A batch key floods the owner's model with 50
requests; an interactive request sent afterwards is answered within about one job plus its own
time, and a second batch key's single request waits about one job per active key (under FIFO both
waited behind the flood: ~25 jobs with the helper's help).  Limits answer 429."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_twisted
from twisted.internet import defer

from tests.integration.lending_support import JOB, Trio, ask_chat, start_trio, text_models, warm_and_link
from tests.integration.nodes import wait_until

FLOOD, FLOOD2, CHAT, TIGHT = "sk-flood-0123456789", "sk-flood2-0123456789", "sk-chat-0123456789", \
    "sk-tight-0123456789"
KEYS = [
    {"name": "flood", "key": FLOOD, "class": "batch"},
    {"name": "flood2", "key": FLOOD2, "class": "batch"},
    {"name": "chat", "key": CHAT, "class": "interactive"},
    {"name": "tight", "key": TIGHT, "limits": {"requests_per_minute": 2}},
]
#: Scheduling slack for a loaded test machine (2 cores shared): the FIFO figure is ~25 jobs.
SLACK_S = 0.4


@pytest_twisted.async_yield_fixture
async def trio(tmp_path: Path) -> AsyncIterator[Trio]:
    depth_one = {"scheduling_min_samples": 2, "offload_probe_idle": "100ms",
                 "scheduling_refresh_interval": "10m", "scheduling_backend_depth": 1}
    running = await start_trio(tmp_path, text_models(alpha=JOB), text_models(beta=JOB),
                               master_extra=depth_one, slave_extra=depth_one,
                               master_sections={"auth": {"inference_keys": KEYS}})
    yield running
    await running.stop()


async def _timed(url: str, key: str) -> tuple[float, int]:
    started = time.monotonic()
    code, _, _ = await ask_chat(url, "alpha", key=key)
    return time.monotonic() - started, code


@pytest_twisted.ensureDeferred
async def test_an_interactive_request_and_a_second_batch_key_pass_a_batch_flood(trio: Trio) -> None:
    await warm_and_link(trio, key=CHAT)
    job_s, code = await _timed(trio.master.url, FLOOD)  # one job, alone
    assert code == 200
    flood = [defer.Deferred.fromCoroutine(ask_chat(trio.master.url, "alpha", key=FLOOD)) for _ in range(50)]
    queue = trio.owner.node.lending.queues["text"]
    await wait_until(lambda: len(queue.pending()) >= 20)
    chat = defer.Deferred.fromCoroutine(_timed(trio.master.url, CHAT))
    second = defer.Deferred.fromCoroutine(_timed(trio.master.url, FLOOD2))
    await wait_until(lambda: any(e.key_name == "chat" for e in queue.pending() + queue.admitted()))
    held = trio.owner.node.lending.held_requests()
    assert any(h.get("key_name") == "chat" and h["priority"] == "interactive" for h in held) or \
        any(e.key_name == "chat" for e in queue.admitted())
    chat_s, chat_code = await chat
    second_s, second_code = await second
    results = await defer.gatherResults(flood)
    assert chat_code == second_code == 200 and all(code == 200 for code, _, _ in results)
    # interactive: the job running when it arrived, then its own
    assert chat_s <= 2 * job_s + SLACK_S, (chat_s, job_s)
    # the second batch key: one job per active key (flood, flood2; the interactive one went first)
    assert second_s <= 4 * job_s + SLACK_S, (second_s, job_s)
    # the owner's decision log names class and key of what it lent: batch work only
    rows = await trio.owner.node.lending.decisions.query(kind="dispatch", limit=500)
    lent = [r for r in rows if r["outcome"] == "lent"]
    assert lent
    assert all(r.get("priority") == "batch" and r.get("key_name") in ("flood", "flood2") for r in lent)


@pytest_twisted.ensureDeferred
async def test_a_key_over_its_requests_per_minute_gets_429_from_the_master(trio: Trio) -> None:
    for _ in range(2):
        code, _, _ = await ask_chat(trio.master.url, "alpha", key=TIGHT)
        assert code == 200
    code, body, response = await ask_chat(trio.master.url, "alpha", key=TIGHT)
    assert code == 429 and body["error"]["code"] == "key_limited" and "'tight'" in body["error"]["message"]
    assert int(response.headers.getRawHeaders(b"retry-after")[0]) >= 1
    code, _, _ = await ask_chat(trio.master.url, "alpha", key=CHAT)  # another key is not limited
    assert code == 200


