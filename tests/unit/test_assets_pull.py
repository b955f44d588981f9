"""Peer pull units (issue 15): one transfer per hash, bounded concurrency, verify before rename."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http_headers import Headers

from routerd.assets.index import AssetIndex
from routerd.assets.pull import AssetPuller, PullFailed


class FakeResponse:
    def __init__(self, body: bytes) -> None:
        self.code = 200
        self.length = len(body)
        self.headers = Headers()
        self.body = body

    def deliverBody(self, protocol: Any) -> None:
        protocol.makeConnection(None)
        protocol.dataReceived(self.body)
        protocol.connectionLost(Failure(ResponseDone()))


class FakeAgent:
    """Answers each GET when the test releases it."""

    def __init__(self, bodies: dict[str, bytes]) -> None:
        self.bodies = bodies
        self.pending: list[tuple[str, Deferred[Any]]] = []

    def request(self, method: bytes, url: bytes, headers: Any = None, body: Any = None) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        self.pending.append((url.decode(), d))
        return d

    def release(self) -> None:
        url, d = self.pending.pop(0)
        d.callback(FakeResponse(self.bodies[url.split("/")[2]]))


def _puller(tmp_path: Path, agent: FakeAgent, slots: int) -> AssetPuller:
    return AssetPuller(agent=agent, token="t", clock=Clock(), shared_dir=str(tmp_path), index=AssetIndex(),
                       slots=slots, run_in_thread=lambda f, *a: succeed(f(*a)))


def test_concurrent_resolutions_of_one_hash_share_one_transfer_and_slots_bound_the_rest(
        tmp_path: Path) -> None:
    one, two = b"first file", b"second file"
    h1, h2 = hashlib.sha256(one).hexdigest(), hashlib.sha256(two).hexdigest()
    agent = FakeAgent({"peer": one})
    puller = _puller(tmp_path, agent, slots=1)
    results: list[Any] = []
    for _ in range(8):
        puller.pull(h1, "one.gguf", ["http://peer"]).addCallback(results.append)
    other = puller.pull(h2, "two.gguf", ["http://peer"])
    assert len(agent.pending) == 1  # 8 resolutions -> 1 stream; the second hash waits for the slot
    agent.bodies["peer"] = one
    agent.release()
    assert len(results) == 8 and all(a.path == results[0].path for a in results)
    assert Path(results[0].path).read_bytes() == one
    assert Path(results[0].path) == tmp_path / "sha256" / h1[:2] / h1 / "one.gguf"
    assert len(agent.pending) == 1  # now the second transfer runs
    agent.bodies["peer"] = two
    agent.release()
    assert other.called


def test_a_wrong_hash_is_deleted_and_never_becomes_visible(tmp_path: Path) -> None:
    want = hashlib.sha256(b"good").hexdigest()
    agent = FakeAgent({"bad": b"evil", "good": b"good"})
    puller = _puller(tmp_path, agent, slots=2)
    failures: list[Failure] = []
    puller.pull(want, "w.gguf", ["http://bad"]).addErrback(failures.append)
    agent.release()
    assert failures and failures[0].check(PullFailed)
    folder = tmp_path / "sha256" / want[:2] / want
    assert list(folder.iterdir()) == []  # no partial, no final file
    done: list[Any] = []
    puller.pull(want, "w.gguf", ["http://bad", "http://good"]).addCallback(done.append)
    agent.release()
    agent.release()
    assert done and (folder / "w.gguf").read_bytes() == b"good"
