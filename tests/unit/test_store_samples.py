"""Request and load samples: round trip, window queries, load summary, pruning, failing writes."""

from __future__ import annotations

import json
import math
import sqlite3
from typing import TypeVar

from hypothesis import given
from hypothesis import strategies as st
from twisted.logger import capturedLogs

from routerd.store.samples import SECTIONS, LoadSample, RequestSample, request_row
from routerd.store.store import Store
from tests.support import fired

T = TypeVar("T")




def req(
    model: str = "llama",
    at: int = 1000,
    *,
    section: str = "llm",
    work: tuple[float, ...] = (10.0, 20.0),
    ms: float = 250.0,
    status: str = "ok",
) -> RequestSample:
    return RequestSample(model, section, work, ms, status, at)


def load(config: str = "llama.kcpps", at: int = 1000, ms: float = 3000.0, status: str = "ok") -> LoadSample:
    return LoadSample(config, "llama", "text", ms, status, at)


def test_request_sample_round_trips_every_field() -> None:
    store = Store.open_sync()
    sample = RequestSample(
        model_id="sd",
        section="image",
        work=(20 * 512 * 512 * 2,),
        duration_ms=1234.5,
        status="ok",
        finished_at_ms=1_700_000_000_123,
        http_status=200,
        request_bytes=321,
        node_id="node-a",
    )
    assert fired(store.record_request_sample(sample)) is None
    assert fired(store.request_samples("sd", "image", 0)) == [sample]


def test_request_sample_work_list_is_stored_as_a_tuple_of_floats() -> None:
    sample = RequestSample("m", "llm", [3, 4], 1.0, "ok", 1)
    assert sample.work == (3.0, 4.0)
    store = Store.open_sync()
    fired(store.record_request_sample(sample))
    stored = fired(store.request_samples("m", "llm", 0))
    assert stored[0].work == (3.0, 4.0)
    raw = fired(store.runner.run(lambda c: c.execute("SELECT work FROM request_samples").fetchone()))
    assert raw == ("[3.0, 4.0]",)


@given(
    st.sampled_from(SECTIONS),
    st.lists(st.floats(allow_nan=False, allow_infinity=False, width=64), max_size=4),
    st.floats(min_value=0, max_value=1e9),
    st.integers(min_value=0, max_value=2**62),
    st.text(max_size=20),
)
def test_any_request_sample_round_trips(
    section: str, work: list[float], ms: float, at: int, model: str
) -> None:
    store = Store.open_sync()
    sample = RequestSample(model, section, tuple(work), ms, "ok", at)
    fired(store.record_request_sample(sample))
    assert fired(store.request_samples(model, section, at)) == [sample]


def test_load_sample_round_trips_every_field() -> None:
    store = Store.open_sync()
    sample = LoadSample("flux.kcpps", "flux", "image", 8000.0, "load_failed", 42, reason="backend exited")
    fired(store.record_load_sample(sample))
    assert fired(store.load_samples(0, status=None)) == [sample]
    assert fired(store.load_samples(0)) == []


def test_request_window_honours_since_ms_inclusively_model_section_and_status() -> None:
    store = Store.open_sync()
    for sample in (
        req(at=999),
        req(at=1000),
        req(at=2000),
        req(at=1500, status="backend_error"),
        req("other", at=1500),
        req(at=1500, section="embeddings"),
    ):
        fired(store.record_request_sample(sample))
    got = fired(store.request_samples("llama", "llm", 1000))
    assert [(s.finished_at_ms, s.status) for s in got] == [(1000, "ok"), (2000, "ok")]
    errors = fired(store.request_samples("llama", "llm", 1000, status="backend_error"))
    assert [s.finished_at_ms for s in errors] == [1500]
    every_status = fired(store.request_samples("llama", "llm", 1000, status=None))
    assert [s.finished_at_ms for s in every_status] == [1000, 1500, 2000]
    every_model = fired(store.request_samples(None, "llm", 1000))
    assert sorted(s.model_id for s in every_model) == ["llama", "llama", "other"]


def test_load_window_honours_since_ms_config_and_status() -> None:
    store = Store.open_sync()
    for sample in (load(at=10), load(at=20), load("sd.kcpps", at=30), load(at=40, status="timeout")):
        fired(store.record_load_sample(sample))
    assert [s.finished_at_ms for s in fired(store.load_samples(20))] == [20, 30]
    assert [s.finished_at_ms for s in fired(store.load_samples(0, "llama.kcpps"))] == [10, 20]
    assert [s.status for s in fired(store.load_samples(0, "llama.kcpps", status=None))] == [
        "ok",
        "ok",
        "timeout",
    ]


def test_load_summary_is_the_mean_and_count_of_successful_loads_per_config_in_the_window() -> None:
    store = Store.open_sync()
    for sample in (
        load("llama.kcpps", at=5, ms=99999.0),  # before the window
        load("llama.kcpps", at=10, ms=1000.0),
        load("llama.kcpps", at=11, ms=2000.0),
        load("llama.kcpps", at=12, ms=9000.0, status="crashed"),  # failures do not count
        load("sd.kcpps", at=13, ms=500.0),
        load("", at=14, ms=700.0),  # no config file name: not attributable
    ):
        fired(store.record_load_sample(sample))
    summary = fired(store.load_summary(10))
    assert summary.keys() == {"llama.kcpps", "sd.kcpps"}
    mean, count = summary["llama.kcpps"]
    assert math.isclose(mean, 1500.0) and count == 2
    assert summary["sd.kcpps"] == (500.0, 1)
    assert fired(store.load_summary(100)) == {}


def test_prune_removes_samples_finished_before_the_cutoff_only() -> None:
    store = Store.open_sync()
    for at in (1, 2, 3):
        fired(store.record_request_sample(req(at=at)))
        fired(store.record_load_sample(load(at=at)))
    assert fired(store.prune_samples(3)) == 4
    assert [s.finished_at_ms for s in fired(store.request_samples("llama", "llm", 0))] == [3]
    assert [s.finished_at_ms for s in fired(store.load_samples(0))] == [3]


def test_failing_write_is_logged_and_fires_none_instead_of_raising() -> None:
    store = Store.open_sync()
    fired(store.runner.run(lambda c: c.execute("DROP TABLE request_samples")))
    with capturedLogs() as events:
        result = fired(store.record_request_sample(req()))
    assert result is None
    failures = [e for e in events if "log_failure" in e]
    assert len(failures) == 1
    assert failures[0]["what"] == "request sample"
    assert failures[0]["log_failure"].check(sqlite3.OperationalError)


def test_writes_after_close_are_logged_not_raised() -> None:
    store = Store.open_sync()
    fired(store.close())
    with capturedLogs() as events:
        assert fired(store.record_load_sample(load())) is None
        assert fired(store.prune_samples(10)) == 0
    assert [e["what"] for e in events if "log_failure" in e] == ["load sample", "sample pruning"]


def test_sample_with_unknown_section_is_dropped_with_a_warning() -> None:
    store = Store.open_sync()
    with capturedLogs() as events:
        assert fired(store.record_request_sample(req(section="hologram"))) is None
    assert any(e.get("section") == "hologram" for e in events)
    assert fired(store.request_samples(None, "hologram", 0, status=None)) == []


def test_a_video_jobs_sample_is_kept_under_its_own_section() -> None:
    """``video`` (sd-server vid_gen jobs) is a known section since the video routes."""
    store = Store.open_sync()
    assert fired(store.record_request_sample(req(section="video", work=(5.0,)))) is None
    assert [s.section for s in fired(store.request_samples(None, "video", 0, status=None))] == ["video"]


def test_samples_arriving_during_a_write_are_group_committed_in_one_batch() -> None:
    from twisted.internet.defer import Deferred as D

    class HeldRunner:
        """Runs nothing until released, so a write stays in flight."""

        def __init__(self, inner: object) -> None:
            self.inner = inner
            self.jobs: list[tuple[object, D[object]]] = []

        def run(self, fn, *, transaction=True):  # type: ignore[no-untyped-def]
            d: D[object] = D()
            self.jobs.append((fn, d))
            return d

        def release(self) -> None:
            fn, d = self.jobs.pop(0)
            self.inner.run(fn).chainDeferred(d)  # type: ignore[attr-defined]

    base = Store.open_sync()
    held = HeldRunner(base.runner)
    store = Store(held, base._clock)  # type: ignore[arg-type]
    first = store.record_request_sample(req())
    later = [store.record_request_sample(req()) for _ in range(5)]
    assert len(held.jobs) == 1  # the five later samples wait for the first write
    held.release()
    assert fired(first) is None
    assert len(held.jobs) == 1  # ...and then go down together
    held.release()
    assert all(fired(d) is None for d in later)
    assert len(fired(base.request_samples(None, "llm", 0))) == 6


def test_a_lone_sample_lingers_for_its_batch_and_a_read_or_close_writes_it_at_once() -> None:
    """Issue 14: one request at a time must not cost a database commit each; samples wait up to
    ``linger`` seconds to be written together, and nothing reads or closes around them."""
    from twisted.internet.task import Clock

    clock = Clock()
    store = Store.open_sync(clock=clock)
    store.linger = 0.25
    writes: list[int] = []
    run = store.runner.run

    def counting(fn, **kw):  # type: ignore[no-untyped-def]
        writes.append(1)
        return run(fn, **kw)

    store.runner.run = counting  # type: ignore[method-assign]
    first, second = store.record_request_sample(req(at=1)), store.record_request_sample(req(at=2))
    assert not first.called and writes == []
    clock.advance(0.25)
    assert fired(first) is None and fired(second) is None and len(writes) == 1
    store.record_request_sample(req(at=3))
    assert [s.finished_at_ms for s in fired(store.request_samples("llama", "llm", 0))] == [1, 2, 3]
    last = store.record_request_sample(req(at=4))
    store.close()
    assert fired(last) is None and not clock.getDelayedCalls()


def test_an_unwaited_sample_joins_the_same_batches_as_a_waited_one() -> None:
    """``add_request_sample`` (the request path's, no Deferred) queues, lingers, drops and is
    written exactly as ``record_request_sample``."""
    from twisted.internet.task import Clock

    clock = Clock()
    store = Store.open_sync(clock=clock)
    store.linger = 0.25
    store.add_request_sample(req(at=1))
    waited = store.record_request_sample(req(at=2))
    store.add_request_sample(req(at=3))
    assert not waited.called and len(clock.getDelayedCalls()) == 1
    clock.advance(0.25)
    assert fired(waited) is None
    with capturedLogs() as events:
        store.add_request_sample(req(section="hologram"))  # dropped, as record_request_sample drops it
    assert any("unknown section" in str(e.get("log_format", "")) for e in events)
    store.add_request_sample(req(at=4))
    assert [s.finished_at_ms for s in fired(store.request_samples("llama", "llm", 0))] == [1, 2, 3, 4]
    store.add_request_sample(req(at=5))
    store.close()  # writes it before closing
    assert not clock.getDelayedCalls()


def test_newest_reads_only_the_newest_samples_of_each_model_oldest_first() -> None:
    """The refit's bounded read (issue 14): the newest N per model inside the window, in time order."""
    store = Store.open_sync()
    for at in range(100, 110):
        fired(store.record_request_sample(req("a", at)))
    for at in range(200, 203):
        fired(store.record_request_sample(req("b", at)))
    fired(store.record_request_sample(req("a", 50, section="image", work=(1.0,))))
    got = fired(store.request_samples(None, "llm", 101, newest=4))
    assert [(s.model_id, s.finished_at_ms) for s in got] == [
        ("a", 106), ("a", 107), ("a", 108), ("a", 109), ("b", 200), ("b", 201), ("b", 202)]
    assert len(fired(store.request_samples(None, "llm", 0))) == 13


@given(work=st.lists(st.floats() | st.integers(-(10**20), 10**20), max_size=4))
def test_a_samples_work_is_stored_as_json_dumps_writes_it(work: list[float]) -> None:
    """``request_row`` encodes the work with the encoder ``json.dumps`` uses without options: the
    same text for every value (infinities and NaN included)."""
    sample = req(work=tuple(work))
    assert request_row(sample)[2] == json.dumps(list(sample.work))
