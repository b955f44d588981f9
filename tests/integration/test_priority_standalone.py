"""Issue 23 on a standalone node (no links, no cluster): the model is linked nowhere, yet its
requests wait in the router queue in class order.  Before, they went straight to the backend and
waited there first come, first served: an interactive request sent after a batch flood waited
behind all of it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_twisted
from twisted.internet import defer

from tests.integration.lending_support import JOB, ask_chat
from tests.integration.nodes import RunningNode, node_config, start_node, wait_until, write_models

FLOOD, CHAT, PAIR = "sk-flood-0123456789", "sk-chat-0123456789", "sk-pair-0123456789"
KEYS = [
    {"name": "flood", "key": FLOOD, "class": "batch"},
    {"name": "chat", "key": CHAT, "class": "interactive"},
    {"name": "pair", "key": PAIR, "limits": {"max_concurrent": 1}},
]
#: Scheduling slack for a loaded test machine (2 cores shared): under FIFO the wait is ~20 jobs.
SLACK_S = 0.4


@pytest_twisted.async_yield_fixture
async def solo(tmp_path: Path) -> AsyncIterator[RunningNode]:
    write_models(tmp_path, {"alpha": {"model": "../weights/alpha.sim.json", "contextsize": 4096}},
                 {"alpha": JOB})
    running = await start_node(node_config(tmp_path, {"auth": {"inference_keys": KEYS},
                                                      "cluster": {"scheduling_backend_depth": 1}}))
    yield running
    await running.stop()


async def _timed(url: str, key: str) -> tuple[float, int, str]:
    started = time.monotonic()
    code, _, response = await ask_chat(url, "alpha", key=key)
    position = (response.headers.getRawHeaders(b"x-routerd-queue-position") or [b""])[0].decode()
    return time.monotonic() - started, code, position


@pytest_twisted.ensureDeferred
async def test_an_interactive_request_passes_a_batch_flood_on_a_model_linked_nowhere(
        solo: RunningNode) -> None:
    node = solo.node
    job_s, code, _ = await _timed(solo.url, FLOOD)  # loads the model; then one job alone
    job_s, code, _ = await _timed(solo.url, FLOOD)
    assert code == 200
    assert not node.lending.enrolled("text", "alpha")  # linked nowhere
    queue = node.lending.queues["text"]
    flood = [defer.Deferred.fromCoroutine(_timed(solo.url, FLOOD)) for _ in range(30)]
    await wait_until(lambda: len(node.local.active) + len(queue.pending()) >= 20)  # wherever they wait
    chat = defer.Deferred.fromCoroutine(_timed(solo.url, CHAT))
    await wait_until(lambda: len(node.local.active) + len(queue.pending()) >= 31)
    held = node.lending.held_requests()
    assert all(h["model_id"] == "alpha" and h["state"] == "queued" for h in held)
    assert {(h["priority"], h.get("key_name")) for h in held} <= {("batch", "flood"), ("interactive", "chat")}
    chat_s, chat_code, chat_position = await chat
    results = await defer.gatherResults(flood)
    assert chat_code == 200 and all(code == 200 for _, code, _ in results)
    # the job running when it arrived, then its own (FIFO: ~20 jobs)
    assert chat_s <= 2 * job_s + SLACK_S, (chat_s, job_s)
    # its place in the class order: next after the one job in the backend
    assert chat_position == "2", chat_position
    assert max(int(p) for _, _, p in results) > 10  # the flood's own places are arrival order


@pytest_twisted.ensureDeferred
async def test_per_key_limits_answer_429_on_a_standalone_node(solo: RunningNode) -> None:
    """A guard, not new behaviour: max_concurrent already answered 429 before the router queue
    took unlinked models; it still does now that they wait there."""
    first = defer.Deferred.fromCoroutine(ask_chat(solo.url, "alpha", key=PAIR))
    await wait_until(lambda: len(solo.node.local.active) >= 1)
    code, body, response = await ask_chat(solo.url, "alpha", key=PAIR)
    assert code == 429 and body["error"]["code"] == "key_limited" and "'pair'" in body["error"]["message"]
    assert int(response.headers.getRawHeaders(b"retry-after")[0]) >= 1
    assert (await first)[0] == 200
