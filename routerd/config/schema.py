"""The routerd configuration as typed, immutable attrs classes (contract §2).

Every duration is held in seconds (float).  Paths are absolute once loaded
(relative paths resolve against the YAML file's directory).
"""

from __future__ import annotations

import functools

import attrs

from routerd.config.keys import InferenceKey
from routerd.config.lending import LendingSettings
from routerd.config.routing import RoutingConfig
from routerd.families import DEFAULT_MODE

ROLES = ("standalone", "master", "slave")


@attrs.frozen
class ServerConfig:
    bind: str = "127.0.0.1:8080"
    allowed_cidrs: tuple[str, ...] = (
        "127.0.0.0/8",
        "::1/128",
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
    )
    #: Proxies (CIDRs) whose ``X-Forwarded-For`` names the client for the CIDR check.
    trusted_proxies: tuple[str, ...] = ()
    #: How long a SIGTERM waits for in-flight requests before stopping the backends.
    drain_timeout: float = 30.0
    #: Browser origins (``https://host[:port]``, or ``*``) allowed to call the API (CORS).
    cors_origins: tuple[str, ...] = ()
    #: Host names the node answers to besides IP literals, loopback names, the host of
    #: ``cluster.public_url`` and of ``bind`` (``*``: any); a request no key vouches for must name one.
    allowed_hosts: tuple[str, ...] = ()
    #: Seconds a request head may take from its first byte to its blank line (then 408 + close).
    head_timeout: float = 30.0
    #: Seconds a request body may go without a byte arriving (then 408 + close).
    body_timeout: float = 60.0
    #: Bytes a second a declared body must arrive at on average: it must be complete its length /
    #: this rate after its head, at least ``body_deadline_floor`` (then 408 + close); 0: no such rule.
    min_body_rate: int = 65536
    #: Seconds any declared body may take whatever its length (the floor of that deadline).
    body_deadline_floor: float = 60.0
    #: The fraction of the replay budget (``limits.replay_buffer_mb``) one holder (an inference
    #: key, else a client address) may hold, or one ``limits.max_body_mb`` body when that is more.
    max_client_buffer_share: float = 0.25
    #: Seconds an answer's output may stay backed up (a client not reading), or a closing
    #: connection stay open, before the connection is aborted.
    send_timeout: float = 60.0
    #: Open client connections beyond which a new one is answered 503 and closed.
    max_connections: int = 4096
    #: Open connections one client address may hold (a trusted proxy's and loopback's are not
    #: capped); beyond it a new one is answered 503 and closed.
    max_connections_per_peer: int = 256
    #: Connections the kernel queues for the node before it accepts them (``listen(2)``'s backlog;
    #: the kernel caps it at ``net.core.somaxconn``).  Twisted's default, 50, reset clients of a
    #: burst of thousands of connects (``benchmarks/held.py``).
    listen_backlog: int = 1024

    @property
    def host(self) -> str:
        return self.bind.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.bind.rsplit(":", 1)[1])


@attrs.frozen
class AuthConfig:
    inference_keys: tuple[str, ...] = ()
    admin_keys: tuple[str, ...] = ()
    #: Keys that open ``/metrics`` only (admin keys open it too).
    metrics_keys: tuple[str, ...] = ()
    #: The inference keys with their names, classes and limits (``inference_keys`` holds their
    #: secrets in the same order); empty when built from plain strings in code.
    named_keys: tuple[InferenceKey, ...] = ()

    def inference_entries(self) -> tuple[InferenceKey, ...]:
        """Every inference key named: the configured entries, or ``key-1``… for plain strings."""
        return self._entries

    @functools.cached_property
    def _entries(self) -> tuple[InferenceKey, ...]:
        # worked out once per config: the key limits read it for every request
        if self.named_keys:
            return self.named_keys
        return tuple(InferenceKey(f"key-{n}", key.strip()) for n, key in enumerate(self.inference_keys, 1))


@attrs.frozen
class ModelsConfig:
    config_dir: str = "./models"
    startup_model: str = ""
    shared_dir: str = ""
    file_roots: tuple[str, ...] = ()
    concurrent_asset_transfers: int = 2
    #: Idle TTL (seconds) after which a loaded model is unloaded; ``None``: never (Ollama's
    #: ``keep_alive`` on a request overrides it for that model).
    keep_alive: float | None = None
    #: Peer pull bounds (cluster reference §8.4): MB/s per transfer, the whole transfer's deadline
    #: (seconds) and how long a peer lookup answer is reused (seconds).
    asset_transfer_rate_mb: float = 512.0
    asset_transfer_deadline: float = 15 * 60.0
    asset_lookup_cache: float = 5.0
    #: KV slots kept across swaps (llama-server's ``--slot-save-path``): how many sessions' slots are
    #: saved before their model is unloaded (0: none) and the MB their files may take, oldest dropped.
    slot_keep_count: int = 0
    slot_keep_mb: float = 4096.0

    @property
    def slot_keep_bytes(self) -> int:
        return int(self.slot_keep_mb * 1024 * 1024)


@attrs.frozen
class BackendConfig:
    mode: str = DEFAULT_MODE


@attrs.frozen
class BinaryConfig:
    """How to start one backend program.

    ``command`` is the argv prefix: a plain ``binary_path`` string becomes a
    one-element tuple; a YAML list (``[routerd-sim, llama-server]``) is kept
    as given so a simulator or wrapper can stand in for the real binary.
    """

    command: tuple[str, ...] = ()
    extra_args: tuple[str, ...] = ()


@attrs.frozen
class KoboldConfig(BinaryConfig):
    """The ``kobold`` section: the binary plus how its one process is run.

    ``no_model``: start KoboldCpp at boot with ``--nomodel`` (the first load is then a reload);
    ``reload_timeout``: how long a ``reload_config`` switch may take to come back live (seconds).
    """

    no_model: bool = False
    reload_timeout: float = 90.0


@attrs.frozen
class ClusterConfig:
    role: str = "standalone"
    node_id: str = "local"
    token: str = ""
    master_url: str = ""
    public_url: str = ""
    slave_urls: tuple[str, ...] = ()
    store_dir: str = "./routerd-data"
    sync_interval: float = 60.0
    health_interval: float = 15.0
    control_timeout: float = 30.0
    lending: LendingSettings = attrs.Factory(LendingSettings)


@attrs.frozen
class LimitsConfig:
    max_body_mb: float = 64.0
    replay_buffer_mb: float = 512.0
    #: Requests of one model waiting for its backend (not yet running) before new ones get 429.
    max_queued_per_model: int = 256
    #: A forwarded request's wait for the first byte of the answer (covers a model load).
    first_byte_timeout: float = 600.0
    #: Longest silence inside a forwarded answer once it has started.
    idle_stream_timeout: float = 300.0
    #: Parts a ``multipart/form-data`` body may hold; more is refused 413 before they are read.
    max_form_parts: int = 64

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)

    @property
    def replay_buffer_bytes(self) -> int:
        return int(self.replay_buffer_mb * 1024 * 1024)


@attrs.frozen
class QueueConfig:
    #: A waiting request rises one priority class per ``aging`` seconds, so a low class still runs.
    aging: float = 30.0


@attrs.frozen
class SchedulingConfig:
    """The ``scheduling`` section: the order a runtime shared by several models serves them in."""

    #: Swap-avoiding order: when the next request would switch the shared runtime to another model,
    #: up to this many more queued requests of the loaded model go first (0: off, the class order).
    swap_batch: int = 0
    #: No request of another model is passed over once it has waited this long (s; never past
    #: ``queue.aging``).
    swap_max_wait: float = 10.0


@attrs.frozen
class AnalyticsConfig:
    """The ``analytics`` section (contract §2, §9); durations in seconds."""

    enabled: bool = True
    #: How often buffered request and load rows are written to the router database.
    flush_interval: float = 180.0
    #: How long raw rows are kept, and each rollup level.
    raw_retention: float = 720 * 3600.0
    minute_retention: float = 48 * 3600.0
    hour_retention: float = 2160 * 3600.0
    day_retention: float = 8760 * 3600.0
    #: Rows held in memory before they are written whatever the interval.
    max_buffered: int = 50_000
    #: Request bodies are stored only for these key names and models (public or local IDs), at most
    #: ``capture_max_bytes`` of each, kept ``capture_retention``; none by default.
    capture_keys: tuple[str, ...] = ()
    capture_models: tuple[str, ...] = ()
    capture_max_bytes: int = 16_384
    capture_retention: float = 24 * 3600.0


@attrs.frozen
class TracingConfig:
    """Traces of every request (``routerd.tracing``); nothing is traced unless ``enabled``."""

    enabled: bool = False
    #: The collector's OTLP/HTTP traces URL (``…/v1/traces``).
    endpoint: str = "http://127.0.0.1:4318/v1/traces"
    service_name: str = "routerd"
    #: The share of new traces kept (0 to 1); a trace a caller's ``traceparent`` samples is kept.
    sampling_ratio: float = 1.0
    #: Headers sent with each export (a collector's own credentials).
    headers: tuple[tuple[str, str], ...] = ()


@attrs.frozen
class Config:
    server: ServerConfig = attrs.Factory(ServerConfig)
    auth: AuthConfig = attrs.Factory(AuthConfig)
    models: ModelsConfig = attrs.Factory(ModelsConfig)
    backend: BackendConfig = attrs.Factory(BackendConfig)
    llama: BinaryConfig = attrs.Factory(BinaryConfig)
    sdcpp: BinaryConfig = attrs.Factory(BinaryConfig)
    whispercpp: BinaryConfig = attrs.Factory(BinaryConfig)
    kobold: KoboldConfig = attrs.Factory(KoboldConfig)
    vllm: BinaryConfig = attrs.Factory(BinaryConfig)
    cluster: ClusterConfig = attrs.Factory(ClusterConfig)
    limits: LimitsConfig = attrs.Factory(LimitsConfig)
    queue: QueueConfig = attrs.Factory(QueueConfig)
    scheduling: SchedulingConfig = attrs.Factory(SchedulingConfig)
    analytics: AnalyticsConfig = attrs.Factory(AnalyticsConfig)
    routing: RoutingConfig = attrs.Factory(RoutingConfig)
    tracing: TracingConfig = attrs.Factory(TracingConfig)
    source: str = "<embedded default>"
