"""The rack telemetry collector (routerd.telemetry): a fake NVML, a fake psutil, a fake backend and a Clock.

GPUs present give their figures; no NVIDIA driver reads as "no GPU" (NVML asked once); an NVML failure is
reported in the reading and never stops it; llama-server's own counters are read from its /metrics; the
"needs attention" rules follow the clock.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.logger import LogEvent, globalLogPublisher

from routerd import documents
from routerd.assembly.rack import runtime_inputs
from routerd.clients.node_client import NodeClient
from routerd.cluster.master import MasterAgent
from routerd.metrics import NodeMetrics, request_failed
from routerd.registry.identity import MemoryPublicIdStore
from routerd.registry.registry import Registry
from routerd.telemetry.attention import LONG_QUEUE, THRASH_LOADS, WINDOW_S, AttentionBook, RuntimeQueue
from routerd.telemetry.collector import RuntimeInput, Telemetry
from routerd.telemetry.counters import parse_llama_metrics
from routerd.telemetry.gauges import HostGauges
from routerd.telemetry.host import HostReader, NvmlGpus
from routerd.urls import AllowList
from routerd.wire.records import Snapshot, parse_snapshot, snapshot_to_json
from routerd.wire.status import RuntimeStatus
from routerd.wire.telemetry import NodeTelemetry, parse_telemetry, telemetry_to_json
from tests.fake_nvml import GIB, FakeGpu, FakeNvml, NVMLError_GpuIsLost, NVMLError_LibraryNotFound


class FakePsutil:
    def __init__(self) -> None:
        self.cpu = [0.0, 37.5]

    def cpu_percent(self, interval: float | None) -> float:
        assert interval is None  # never blocks
        return self.cpu.pop(0) if self.cpu else 12.0

    def cpu_count(self) -> int:
        return 16

    def virtual_memory(self) -> Any:
        return SimpleNamespace(total=64 * GIB, available=40 * GIB)


class BrokenPsutil(FakePsutil):
    def virtual_memory(self) -> Any:
        raise OSError("no /proc/meminfo")


# -- a fake backend /metrics ---------------------------------------------------------------------------

#: What llama-server b11434 answers on /metrics (the series routerd reads, in its order and form).
LLAMA_METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 240
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 23
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 100
# HELP llamacpp:n_tokens_max Largest observed sequence length (prompt + generation)
# TYPE llamacpp:n_tokens_max counter
llamacpp:n_tokens_max 34
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 2400.5
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 41.25
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
"""


class FakeBackends:
    """``get(url)`` answers per port: (code, body), or an exception to raise."""

    def __init__(self, answers: dict[int, tuple[int, str] | Exception]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def get(self, url: str, *, timeout: float | None = None) -> defer.Deferred[Any]:
        self.asked.append(url)
        assert timeout is not None
        port = int(url.split(":")[2].split("/")[0])
        answer = self.answers[port]
        if isinstance(answer, Exception):
            return defer.fail(answer)
        code, body = answer
        return defer.succeed(SimpleNamespace(code=code, content=lambda: defer.succeed(body.encode())))


def text_runtime(state: str = "ready", *, waiting: int = 0, port: int | None = 9001,
                 backend: str = "llama-server", kind: str = "text") -> RuntimeInput:
    model = "alpha" if state == "ready" else None
    return RuntimeInput(kind=kind, backend=backend, state=state, model_id=model, waiting=waiting, since=100.0,
                        last_load_ms=1234, port=port)


def collector(clock: Clock, *, nvml: Any = None, psutil: Any = None,
              runtimes: Callable[[], list[RuntimeInput]] = lambda: [text_runtime()],
              http: FakeBackends | None = None, failed: Callable[[], int] = lambda: 0) -> Telemetry:
    return Telemetry(clock=clock, host=HostReader(psutil or FakePsutil()),
                     gpus=NvmlGpus(nvml if nvml is not None else FakeNvml([])), runtimes=runtimes,
                     http=http or FakeBackends({9001: (200, LLAMA_METRICS)}), failed_requests=failed)


def refreshed(telemetry: Telemetry) -> NodeTelemetry:
    d = telemetry.refresh()
    assert d.called, "a reading over fakes finishes at once"
    result: NodeTelemetry = d.result
    return result


# -- GPUs --------------------------------------------------------------------------------------------


def test_gpus_present_give_utilisation_vram_temperature_and_power() -> None:
    nvml = FakeNvml([FakeGpu("NVIDIA RTX 4090", 87, 20 * GIB, 24 * GIB, 71, 312_500),
                     FakeGpu("NVIDIA RTX 3060", 3, 1 * GIB, 12 * GIB, 40, None)])
    reading = refreshed(collector(Clock(), nvml=nvml))
    assert reading.gpu.state == "ok" and reading.gpu.reason == ""
    first, second = reading.gpu.gpus
    assert (first.index, first.name, first.utilization_percent) == (0, "NVIDIA RTX 4090", 87.0)
    assert (first.memory_used_bytes, first.memory_total_bytes) == (20 * GIB, 24 * GIB)
    assert (first.temperature_c, first.power_w, first.power_limit_w) == (71.0, 312.5, 300.0)
    assert second.name == "NVIDIA RTX 3060" and second.power_w is None  # the card does not report it


def test_a_machine_without_the_nvidia_driver_reads_as_no_gpu_and_nvml_is_asked_once() -> None:
    nvml = FakeNvml([], init_error=NVMLError_LibraryNotFound("NVML Shared Library Not Found"))
    telemetry = collector(Clock(), nvml=nvml)
    first = refreshed(telemetry)
    second = refreshed(telemetry)
    assert first.gpu.state == second.gpu.state == "none"
    assert "NVML Shared Library Not Found" in first.gpu.reason and not first.gpu.gpus
    assert nvml.inits == 1
    assert first.host is not None  # the rest of the reading stands


def test_nvml_counting_no_device_reads_as_no_gpu() -> None:
    reading = refreshed(collector(Clock(), nvml=FakeNvml([])))
    assert reading.gpu.state == "none" and reading.gpu.reason == "NVML counts no GPU"


def test_an_nvml_failure_is_reported_never_breaks_the_reading_and_is_tried_again() -> None:
    nvml = FakeNvml([FakeGpu("NVIDIA A100", 50, GIB, 40 * GIB, 60, 100_000)])
    telemetry = collector(Clock(), nvml=nvml)
    nvml.count_error = NVMLError_GpuIsLost("GPU is lost")
    broken = refreshed(telemetry)
    assert broken.gpu.state == "error" and "GPU is lost" in broken.gpu.reason
    assert broken.host is not None and broken.host.cpu_percent == 37.5
    assert [r.kind for r in broken.runtimes] == ["text"] and broken.runtimes[0].counters is not None
    nvml.count_error = None
    assert refreshed(telemetry).gpu.state == "ok"


def test_an_unexpected_gpu_reader_failure_reads_as_an_error_state() -> None:
    class Exploding:
        def read(self) -> Any:
            raise RuntimeError("driver went away")

    telemetry = Telemetry(clock=Clock(), host=None, gpus=Exploding(), runtimes=list,
                          http=FakeBackends({}), failed_requests=lambda: 0)
    reading = refreshed(telemetry)
    assert reading.gpu.state == "error" and "driver went away" in reading.gpu.reason
    assert reading.host is None and "unavailable" in reading.host_error


# -- host --------------------------------------------------------------------------------------------


def test_host_cpu_and_memory_come_from_psutil() -> None:
    reading = refreshed(collector(Clock()))
    assert reading.host is not None
    # the first cpu_percent(None) only starts psutil's interval; the reading is the next
    assert reading.host.cpu_percent == 37.5 and reading.host.cpu_count == 16
    assert (reading.host.memory_used_bytes, reading.host.memory_total_bytes) == (24 * GIB, 64 * GIB)


def test_a_host_reader_failure_is_reported_and_the_gpus_still_read() -> None:
    nvml = FakeNvml([FakeGpu("NVIDIA L4", 10, GIB, 24 * GIB, 50, 70_000)])
    reading = refreshed(collector(Clock(), nvml=nvml, psutil=BrokenPsutil()))
    assert reading.host is None and "no /proc/meminfo" in reading.host_error
    assert reading.gpu.state == "ok"


# -- runtimes and the backend's counters -------------------------------------------------------------------


def test_a_ready_llama_server_s_own_counters_are_read_from_its_metrics() -> None:
    http = FakeBackends({9001: (200, LLAMA_METRICS)})
    reading = refreshed(collector(Clock(), http=http))
    (text,) = reading.runtimes
    assert http.asked == ["http://127.0.0.1:9001/metrics"]
    assert text.counters is not None and text.counters_error == ""
    assert (text.counters.tokens_per_second, text.counters.prompt_tokens_per_second) == (41.25, 2400.5)
    assert (text.counters.requests_processing, text.counters.requests_deferred) == (1, 2)
    assert (text.counters.prompt_tokens_total, text.counters.prompt_tokens_cached_total) == (240, 23)
    assert (text.counters.tokens_predicted_total, text.counters.n_tokens_max) == (100, 34)
    assert (text.model_id, text.loaded_since_ms, text.last_load_ms) == ("alpha", 100_000, 1234)


def test_a_backend_without_metrics_or_not_answering_is_reported_per_runtime() -> None:
    runtimes = [text_runtime(port=9001), text_runtime(port=9002, kind="embeddings")]
    http = FakeBackends({9001: (501, '{"error": {}}'), 9002: ConnectionRefusedError("refused")})
    reading = refreshed(collector(Clock(), http=http, runtimes=lambda: runtimes))
    text, embeddings = reading.runtimes
    assert text.counters is None and "--metrics" in text.counters_error
    assert embeddings.counters is None and "ConnectionRefusedError" in embeddings.counters_error


def test_only_ready_llama_servers_are_asked_for_counters() -> None:
    runtimes = [text_runtime("loading"), text_runtime(backend="sd-server", kind="image", port=9003),
                text_runtime("empty", port=None, kind="stt", backend="whisper-server")]
    http = FakeBackends({})
    reading = refreshed(collector(Clock(), http=http, runtimes=lambda: runtimes))
    assert http.asked == []
    assert [r.loaded_since_ms for r in reading.runtimes] == [None, 100_000, None]


def test_counters_parse_llama_server_s_prometheus_text() -> None:
    counters = parse_llama_metrics(LLAMA_METRICS)
    assert counters.tokens_per_second == 41.25 and counters.requests_deferred == 2
    assert parse_llama_metrics("").tokens_per_second is None


# -- readings over time ------------------------------------------------------------------------------


def test_reading_answers_the_latest_and_starts_the_next_at_most_once_a_gap() -> None:
    clock = Clock()
    http = FakeBackends({9001: (200, LLAMA_METRICS)})
    telemetry = collector(clock, http=http)
    first = telemetry.reading()  # none yet: one taken now without counters, and a full one started
    assert first.runtimes[0].counters is None
    assert len(http.asked) == 1 and telemetry.latest is not None and telemetry.latest.runtimes[0].counters
    telemetry.reading()
    assert len(http.asked) == 1  # within the gap: no second reading
    clock.advance(1.0)
    assert telemetry.reading().runtimes[0].counters is not None
    assert len(http.asked) == 2


def test_the_reading_survives_the_wire_strictly() -> None:
    nvml = FakeNvml([FakeGpu("NVIDIA RTX 4090", 87, 20 * GIB, 24 * GIB, 71, 312_500)])
    reading = refreshed(collector(Clock(), nvml=nvml))
    assert parse_telemetry(telemetry_to_json(reading)) == reading
    bad = telemetry_to_json(reading)
    bad["host"]["cpu_percent"] = "37.5"
    try:
        parse_telemetry(bad)
    except Exception as exc:  # noqa: BLE001
        assert "cpu_percent" in str(exc)
    else:
        raise AssertionError("a string for a number was accepted")


def test_host_and_gpu_gauges_in_metrics_come_from_the_latest_reading() -> None:
    nvml = FakeNvml([FakeGpu("NVIDIA RTX 4090", 87, 20 * GIB, 24 * GIB, 71, None)])
    telemetry = collector(Clock(), nvml=nvml)
    metrics = NodeMetrics()
    metrics.registry.register(HostGauges(lambda: telemetry.latest))
    before = metrics.render().decode()
    assert "\nrouterd_host_cpu_percent " not in before  # no reading yet: no figure
    refreshed(telemetry)
    text = metrics.render().decode()
    assert "routerd_host_cpu_percent 37.5" in text
    assert "routerd_host_memory_total_bytes 6.8719476736e+10" in text
    assert 'routerd_gpu_utilization_percent{gpu="0",name="NVIDIA RTX 4090"} 87.0' in text
    assert 'routerd_gpu_temperature_celsius{gpu="0",name="NVIDIA RTX 4090"} 71.0' in text
    assert "routerd_gpu_power_watts{" not in text  # not reported by the card


# -- needs attention ---------------------------------------------------------------------------------


def codes(book: AttentionBook, runtimes: list[RuntimeQueue] | None = None, failed: int = 0) -> list[str]:
    return [f.code for f in book.flags(runtimes or [RuntimeQueue("text", 0)], failed)]


def test_swap_thrash_is_many_loads_of_two_models_within_the_window() -> None:
    clock = Clock()
    book = AttentionBook(clock)
    for n in range(THRASH_LOADS - 1):
        clock.advance(10)
        book.load("text", "alpha" if n % 2 else "beta", ok=True)
    assert codes(book) == []  # one load short
    book.load("text", "alpha", ok=True)
    (flag,) = book.flags([RuntimeQueue("text", 0)], 0)
    assert flag.code == "swap_thrash" and flag.runtime == "text"
    assert f"loaded {THRASH_LOADS} times" in flag.message and "beta, alpha" in flag.message
    clock.advance(WINDOW_S)  # the oldest loads leave the window
    assert codes(book) == []


def test_reloading_one_model_many_times_is_not_swap_thrash() -> None:
    clock = Clock()
    book = AttentionBook(clock)
    for _ in range(THRASH_LOADS * 2):
        clock.advance(5)
        book.load("text", "alpha", ok=True)
    assert codes(book) == []
    assert book.counts("text").loads == THRASH_LOADS * 2


def test_the_demo_s_33_loads_in_7_minutes_are_swap_thrash() -> None:
    clock = Clock()
    book = AttentionBook(clock)
    for n in range(33):
        clock.advance(7 * 60 / 33)
        book.load("image", ("sketch-dream", "photo-real")[n % 2], ok=True)
    assert codes(book, [RuntimeQueue("image", 0)]) == ["swap_thrash"]


def test_a_failed_load_is_flagged_for_the_window() -> None:
    clock = Clock()
    book = AttentionBook(clock)
    book.load("image", "sketch", ok=False)
    assert codes(book, [RuntimeQueue("image", 0)]) == ["failed_loads"]
    assert book.counts("image").failed_loads == 1 and book.counts("image").loads == 0
    clock.advance(WINDOW_S + 1)
    assert codes(book, [RuntimeQueue("image", 0)]) == []


def test_a_long_queue_is_flagged_while_it_lasts() -> None:
    book = AttentionBook(Clock())
    assert codes(book, [RuntimeQueue("text", LONG_QUEUE - 1)]) == []
    (flag,) = book.flags([RuntimeQueue("text", LONG_QUEUE)], 0)
    assert flag.code == "long_queue" and f"{LONG_QUEUE} requests waiting" in flag.message


def test_failed_requests_count_within_the_window_from_the_running_total() -> None:
    clock = Clock()
    book = AttentionBook(clock)
    assert book.failed_requests(0) == 0
    clock.advance(60)
    assert book.failed_requests(3) == 3  # a node younger than the window counts from its start
    clock.advance(WINDOW_S - 30)
    assert book.failed_requests(3) == 3  # the failures are 9.5 min old: still in
    clock.advance(60)
    assert book.failed_requests(4) == 1  # the first three left the window; one new
    clock.advance(WINDOW_S)
    assert book.failed_requests(4) == 0
    assert codes(book, failed=2) == ["failed_requests"]


def test_the_collector_flags_from_the_node_s_failed_request_total_and_loads() -> None:
    clock = Clock()
    total = [0]
    telemetry = collector(clock, failed=lambda: total[0],
                          runtimes=lambda: [text_runtime(waiting=LONG_QUEUE)])
    assert [f.code for f in refreshed(telemetry).attention] == ["long_queue"]
    total[0] = 2
    for n in range(THRASH_LOADS):
        telemetry.book.load("text", f"m{n % 2}", ok=True)
    telemetry.book.load("text", "m0", ok=False)
    reading = refreshed(telemetry)
    assert [f.code for f in reading.attention] == ["swap_thrash", "failed_loads", "long_queue",
                                                   "failed_requests"]
    assert reading.failed_requests == 2 and reading.runtimes[0].loads == THRASH_LOADS
    assert reading.runtimes[0].failed_loads == 1


def test_failed_requests_are_the_server_s_failures_not_the_client_s() -> None:
    assert all(request_failed(s) for s in ("backend_error", "internal_error", "stream_broken", "http_502"))
    assert not any(request_failed(s) for s in ("ok", "http_400", "http_429", "client_disconnected",
                                               "bad_request"))
    metrics = NodeMetrics()
    for status in ("ok", "backend_error", "http_404", "http_503", "ok"):
        metrics.request_children("m", "text", "chat", status)[0].inc()
    assert metrics.failed_requests() == 2


# -- on the health poll, and in the site inventory ---------------------------------------------------------


class Slaves:
    """The cluster client's ``models``: each slave answers a snapshot carrying ``telemetry``."""

    def __init__(self, telemetry: dict[str, Any] | None) -> None:
        self.telemetry = telemetry
        self.asked = 0

    def models(self, url: str) -> defer.Deferred[Snapshot]:
        self.asked += 1
        return defer.succeed(Snapshot(node_id="slave-a", node_url=url, build_version="x", protocol_version=2,
                                      telemetry=self.telemetry))


def master_over(slaves: Slaves) -> MasterAgent:
    return MasterAgent(node_id="master", slave_urls=("http://slave-a",),
                       registry=Registry("master", "", MemoryPublicIdStore()),
                       client=cast(NodeClient, slaves), routing_allowed=AllowList(), clock=Clock(),
                       health_interval=10.0, local_status=lambda: RuntimeStatus("master"))


def test_the_master_takes_its_own_reading_with_each_health_poll() -> None:
    clock = Clock()
    telemetry = collector(clock)
    master = master_over(Slaves(None))
    master.when_polled(telemetry.refresh)
    assert telemetry.latest is None
    master.poll_all()
    first = telemetry.latest
    assert first is not None and first.taken_ms == 0
    clock.advance(10)
    master.poll_all()
    assert telemetry.latest is not None and telemetry.latest.taken_ms == 10_000


def test_a_failing_reading_never_breaks_the_health_poll() -> None:
    slaves = Slaves(None)
    master = master_over(slaves)
    master.when_polled(lambda: defer.fail(RuntimeError("psutil exploded")))
    events: list[LogEvent] = []
    globalLogPublisher.addObserver(events.append)
    try:
        done = master.poll_all()
    finally:
        globalLogPublisher.removeObserver(events.append)
    assert done.called and done.result is None
    assert [n.node_id for n in master.registry.nodes() if n.healthy] == ["slave-a"]
    failures = [e["log_failure"] for e in events if "log_failure" in e]
    assert [f.getErrorMessage() for f in failures] == ["psutil exploded"]


def test_the_inventory_carries_each_slave_s_reading_and_a_bad_one_as_an_error() -> None:
    reading = telemetry_to_json(refreshed(collector(Clock())))
    master = master_over(Slaves(reading))
    master.poll_all()
    (node,) = documents.inventory("master", "", master.registry.nodes(), [], telemetry=reading)["nodes"][1:]
    assert node["healthy"] and node["telemetry"] == reading
    bad = {**reading, "failed_requests": "many"}
    master = master_over(Slaves(bad))
    master.poll_all()
    (info,) = master.registry.nodes()
    assert info.healthy  # a telemetry part the master cannot read never refuses the node
    (node,) = documents.inventory("master", "", [info], [])["nodes"][1:]
    assert node["telemetry"] is None and "failed_requests" in node["telemetry_error"]


def test_a_new_reading_alone_is_no_registry_change_but_is_kept() -> None:
    """Each poll brings a new reading; the records and public IDs are not rebuilt for it (a rebuild is linear
    in the cluster's records), yet the inventory shows the newest."""
    slaves = Slaves({"taken_ms": 1})
    master = master_over(slaves)
    master.poll_all()
    revision = master.registry.revision
    slaves.telemetry = {"taken_ms": 2}
    master.poll_all()
    assert master.registry.revision == revision
    (info,) = master.registry.nodes()
    assert info.telemetry == {"taken_ms": 2}


def test_a_snapshot_without_telemetry_is_the_contract_s_snapshot() -> None:
    plain = snapshot_to_json(Snapshot(node_id="n", protocol_version=2))
    assert "telemetry" not in plain
    assert parse_snapshot(plain).telemetry is None
    carried = snapshot_to_json(Snapshot(node_id="n", protocol_version=2, telemetry={"taken_ms": 1}))
    assert parse_snapshot(carried).telemetry == {"taken_ms": 1}


def test_a_runtime_s_queue_counts_the_router_s_queued_and_held_requests_of_its_lane_not_the_lent() -> None:
    slot = SimpleNamespace(name="llama-server", status=lambda: SimpleNamespace(
        kind="text", state="ready", model_id="alpha", waiters=1, since=5.0, last_load_ms=40, port=9001))
    held = [{"lane": "text", "state": "queued"}, {"lane": "text", "state": "held"},
            {"lane": "text", "state": "lent"}, {"lane": "image", "state": "queued"}]
    (text,) = runtime_inputs([slot], held)
    assert text == RuntimeInput(kind="text", backend="llama-server", state="ready", model_id="alpha",
                                waiting=3, since=5.0, last_load_ms=40, port=9001)
