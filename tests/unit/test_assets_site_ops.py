"""Site asset operations on the owning node (issue 15, reference §8.6): substitutions need an explicit
confirmation and then bind the replacement; ``bind`` checks the Hugging Face Hub (stubbed with
``treq.testing.StubTreq``) before it records an origin; resolution jobs record events; the transfer
deadline cuts a pull that takes too long."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from treq.testing import StubTreq
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import Request

from routerd.assets.book import AssetBook
from routerd.assets.hf import BindRefused, parse_origin
from routerd.assets.index import AssetIndex, build_index_blocking
from routerd.assets.pull import AssetPuller, PullFailed
from routerd.catalog.catalog import Catalog
from routerd.catalog.hashing import FileHashCache
from routerd.catalog.kcpps import parse_kcpps
from routerd.catalog.model import ModelConfig
from routerd.errors import HTTPError
from tests.unit.test_assets_portable import _service

WANT = hashlib.sha256(b"original").hexdigest()
REPLACEMENT = hashlib.sha256(b"requantised").hexdigest()
COMMIT = "a" * 40


def _portable(tmp_path: Path) -> ModelConfig:
    path = tmp_path / "port.kcpps"
    path.write_text(json.dumps({"model_hash": WANT, "model_filename": "w.gguf"}))
    model = parse_kcpps(str(path), "llama_sdcpp")
    assert isinstance(model, ModelConfig)
    return model


def _error(d: Deferred[Any] | Any) -> HTTPError:
    failures: list[Failure] = []
    if isinstance(d, Deferred):
        d.addErrback(failures.append)
        assert failures, "expected a failure"
        err = failures[0].value
    else:
        err = d
    assert isinstance(err, HTTPError)
    return err


@pytest.mark.parametrize("body", [
    {"expected_sha256": WANT, "sha256": REPLACEMENT},  # no confirm
    {"expected_sha256": WANT, "sha256": REPLACEMENT, "confirm": "yes"},
    {"expected_sha256": WANT, "sha256": WANT, "confirm": True},  # same hash
])
def test_a_substitution_without_confirmation_or_with_the_same_hash_is_refused(
        tmp_path: Path, body: dict[str, Any]) -> None:
    service = _service(tmp_path, [Catalog()])
    with pytest.raises(HTTPError) as caught:
        service.substitute(body)
    assert caught.value.status == 400 and caught.value.code == "confirmation_required"
    assert service.book.substitutions == {}


def test_a_confirmed_substitution_is_stored_privately_and_binds_the_replacement(tmp_path: Path) -> None:
    catalog = [Catalog([_portable(tmp_path)])]
    service = _service(tmp_path, catalog)
    root = tmp_path / "root"
    root.mkdir()
    (root / "w-q4.gguf").write_bytes(b"requantised")
    service.index.replace(build_index_blocking([], [str(root)], "", FileHashCache(None)))
    ensureDeferred(service.resolve())
    assert service.states["port"].state == "unresolved"
    answer = service.substitute({"expected_sha256": WANT, "sha256": REPLACEMENT, "confirm": True})
    assert answer["substitution"]["sha256"] == REPLACEMENT
    assert service.states["port"].state == "ready"  # resolution ran again with the replacement
    bound = catalog[0].get("port")
    assert bound is not None and bound.text_model == str(root / "w-q4.gguf")
    assert service.states["port"].fields[0]["substituted_for"] == WANT
    book = tmp_path / "store" / "model-assets.json"
    assert stat.S_IMODE(os.stat(book).st_mode) == 0o600
    again = AssetBook(str(book))
    again.load()
    assert again.substitute_for(WANT) == REPLACEMENT


class _Hub(Resource):
    """The two Hub API calls ``bind`` makes, answering from ``files`` (path -> lfs oid or None)."""

    isLeaf = True

    def __init__(self, commit: str, files: dict[str, str | None]) -> None:
        super().__init__()
        self.commit = commit
        self.files = files
        self.seen: list[str] = []

    def render(self, request: Request) -> bytes:
        path = request.path.decode()
        self.seen.append(f"{request.method.decode()} {path}")
        if path.startswith("/api/models/owner/repo/revision/"):
            request.setHeader(b"content-type", b"application/json")
            return json.dumps({"id": "owner/repo", "sha": self.commit}).encode()
        if path == f"/api/models/owner/repo/paths-info/{COMMIT}" and request.method == b"POST":
            wanted = [p.decode() for p in request.args.get(b"paths", [])]
            rows = []
            for p in wanted:
                if p in self.files:
                    oid = self.files[p]
                    row: dict[str, Any] = {"type": "file", "path": p, "size": 11, "oid": "f" * 40}
                    if oid is not None:
                        row["lfs"] = {"oid": oid, "size": 11, "pointerSize": 130}
                    rows.append(row)
            return json.dumps(rows).encode()
        request.setResponseCode(404)
        return b'{"error": "not found"}'


def _bind(tmp_path: Path, hub: _Hub, sha: str, hf: str) -> Deferred[Any]:
    service = _service(tmp_path, [Catalog()])
    service.hub_http = StubTreq(hub)
    service._bound = service  # type: ignore[attr-defined]
    d = ensureDeferred(service.bind({"sha256": sha, "hf": hf}))
    d.service = service  # type: ignore[attr-defined]
    return d


def test_bind_records_an_origin_the_hub_confirms_at_that_commit_with_that_lfs_hash(tmp_path: Path) -> None:
    hub = _Hub(COMMIT, {"models/w.gguf": WANT})
    hf = f"hf://owner/repo@{COMMIT}/models/w.gguf"
    d = _bind(tmp_path, hub, WANT, hf)
    assert d.result == {"sha256": WANT, "hf": hf}
    assert d.service.book.origin(WANT) == hf  # type: ignore[attr-defined]
    assert hub.seen == [f"GET /api/models/owner/repo/revision/{COMMIT}",
                        f"POST /api/models/owner/repo/paths-info/{COMMIT}"]


@pytest.mark.parametrize(("hub", "hf", "message"), [
    (_Hub(COMMIT, {"w.gguf": REPLACEMENT}), f"hf://owner/repo@{COMMIT}/w.gguf", "has LFS sha256"),
    (_Hub(COMMIT, {"w.gguf": None}), f"hf://owner/repo@{COMMIT}/w.gguf", "is not stored in LFS"),
    (_Hub(COMMIT, {}), f"hf://owner/repo@{COMMIT}/w.gguf", "is not in owner/repo"),
    (_Hub("b" * 40, {"w.gguf": WANT}), f"hf://owner/repo@{COMMIT}/w.gguf", "does not resolve"),
    (_Hub(COMMIT, {}), "hf://owner/repo@main/w.gguf", "40-hex commit"),
    (_Hub(COMMIT, {}), f"hf://owner/repo@{COMMIT}/../w.gguf", "without '..'"),
    (_Hub(COMMIT, {}), f"hf://other/repo@{COMMIT}/w.gguf", "no such repository"),
])
def test_bind_refuses_an_origin_the_hub_does_not_confirm_and_records_nothing(
        tmp_path: Path, hub: _Hub, hf: str, message: str) -> None:
    d = _bind(tmp_path, hub, WANT, hf)
    err = _error(d)
    assert err.status == 400 and err.code == "bind_refused" and message in err.message
    assert d.service.book.origins == {}  # type: ignore[attr-defined]


def test_an_origin_names_repo_commit_and_path() -> None:
    origin = parse_origin(f"hf://owner/repo@{COMMIT}/a/b.gguf")
    assert (origin.repo, origin.commit, origin.path) == ("owner/repo", COMMIT, "a/b.gguf")
    with pytest.raises(BindRefused):
        parse_origin(f"https://huggingface.co/owner/repo@{COMMIT}/a.gguf")


def test_a_resolution_job_records_each_field_and_its_outcome(tmp_path: Path) -> None:
    catalog = [Catalog([_portable(tmp_path)])]
    service = _service(tmp_path, catalog)
    job = service.start_job("port")
    assert job.job_id == "n1-1" and job.state == "unresolved"
    kinds = [e["type"] for e in job.events]
    assert kinds == ["started", "field", "finished"]
    assert job.events[1]["state"] == "unresolved" and job.events[1]["sha256"] == WANT
    assert [e["sequence"] for e in job.events] == [1, 2, 3]
    with pytest.raises(HTTPError) as caught:
        service.start_job("nope")
    assert caught.value.status == 404


def test_a_pull_that_outlives_the_transfer_deadline_fails_with_that_reason(tmp_path: Path) -> None:
    clock = Clock()

    class Silent:
        def request(self, *_a: Any, **_k: Any) -> Deferred[Any]:
            return Deferred()

    puller = AssetPuller(agent=Silent(), token="t", clock=clock, shared_dir=str(tmp_path),  # type: ignore[arg-type]
                         index=AssetIndex(), slots=1, run_in_thread=lambda f, *a: f(*a), deadline=60.0)
    d = puller.pull(WANT, "w.gguf", ["http://peer-a", "http://peer-b"])
    failures: list[Failure] = []
    d.addErrback(failures.append)
    clock.advance(59)
    assert not failures
    clock.advance(2)
    assert failures and failures[0].check(PullFailed)
    assert "deadline (60 s) passed" in str(failures[0].value)
    assert puller.transfers[WANT].state == "failed"
