"""Load and validate a routerd YAML config (contract §2).

``load_config`` collects *every* problem before failing, so an operator fixes
a config in one pass; each message names the key and the reason.  This module
reads each section (with the typed readers of :mod:`routerd.config.reader`) and
checks what the values mean together (binds, URLs, the cluster, the keys).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import yaml

from routerd.config.keys import read_inference_keys
from routerd.config.lending import SETTINGS, LendingSettings, SettingError, normalise
from routerd.config.reader import Errors, Reader, did_you_mean, section_of
from routerd.config.routing import ROUTING_KEYS, RoutingConfig
from routerd.config.schema import (
    ROLES,
    AnalyticsConfig,
    AuthConfig,
    BackendConfig,
    ClusterConfig,
    Config,
    KoboldConfig,
    LimitsConfig,
    ModelsConfig,
    QueueConfig,
    SchedulingConfig,
    ServerConfig,
)
from routerd.config.tracing import parse_tracing
from routerd.families import DEFAULT_MODE, binary_sections, every_family, is_declared, modes_phrase
from routerd.replica_modes import KEY_SOURCES, MODES

PLACEHOLDER_TOKENS = ("change-me", "changeme", "replace-me", "replace_me")
MIN_TOKEN_LENGTH = 16
TOKEN_ENV = "ROUTERD_CLUSTER_TOKEN"
TOKEN_FILE_ENV = "ROUTERD_CLUSTER_TOKEN_FILE"



def _family_keys() -> dict[str, tuple[str, ...]]:
    """Keys a family's section has besides ``binary_path`` and ``extra_args``."""
    return {section: family.settings for family in every_family()
            for section in family.binary_sections if family.settings}


def _sections() -> tuple[str, ...]:
    """Every section a config may have (the families' sections as the families declare them)."""
    return ("server", "auth", "models", "backend", *binary_sections(), "cluster", "limits", "queue",
            "scheduling", "analytics", "routing", "tracing")


class ConfigError(Exception):
    """A config that does not validate; ``errors`` lists every problem."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = list(errors)


def embedded_default_path() -> str:
    """Path of the embedded default config shipped inside the package."""
    return str(resources.files("routerd.defaults").joinpath("default.yaml"))


def load_config(
    path: str | None = None,
    env: Mapping[str, str] | None = None,
    read_file: Callable[[str], str] | None = None,
) -> Config:
    """Read, parse and validate the config at ``path`` (embedded default if None)."""
    env = os.environ if env is None else env
    source = path or embedded_default_path()
    reader = read_file or _read_text
    try:
        text = reader(source)
    except OSError as exc:
        raise ConfigError([f"config: cannot read {source}: {exc.strerror or exc}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"config: {source} is not valid YAML: {exc}"]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"config: {source} must hold a mapping of sections"])
    # Relative paths resolve against the config file's directory; the embedded
    # default finds its models in the package but keeps its store in ./routerd-data.
    base_dir = os.path.dirname(os.path.abspath(source))
    return parse_config(data, base_dir=base_dir, env=env, source=source, embedded=path is None)


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def parse_config(
    data: Mapping[str, Any],
    base_dir: str,
    env: Mapping[str, str],
    source: str = "<memory>",
    embedded: bool = False,
) -> Config:
    """Validate a parsed YAML mapping into a ``Config`` or raise ``ConfigError``."""
    errs = Errors()
    known = _sections()
    for section in data:
        if section not in known:
            errs.add(str(section), "unknown section" + did_you_mean(str(section), known))
    sections = {name: section_of(data, name, errs) for name in known}
    reader = Reader(errs, base_dir)

    s = sections["server"]
    server = ServerConfig(
        bind=reader.string(s, "server", "bind", ServerConfig().bind),
        allowed_cidrs=reader.str_list(s, "server", "allowed_cidrs", ServerConfig().allowed_cidrs),
        cors_origins=tuple(o.strip().rstrip("/") for o in reader.str_list(s, "server", "cors_origins", ())),
        trusted_proxies=reader.str_list(s, "server", "trusted_proxies", ()),
        allowed_hosts=reader.str_list(s, "server", "allowed_hosts", ()),
        drain_timeout=reader.duration(s, "server", "drain_timeout", ServerConfig().drain_timeout),
        head_timeout=reader.duration(s, "server", "head_timeout", ServerConfig().head_timeout),
        body_timeout=reader.duration(s, "server", "body_timeout", ServerConfig().body_timeout),
        send_timeout=reader.duration(s, "server", "send_timeout", ServerConfig().send_timeout),
        max_client_buffer_share=reader.number(s, "server", "max_client_buffer_share",
                                              ServerConfig().max_client_buffer_share),
        body_deadline_floor=reader.duration(s, "server", "body_deadline_floor",
                                            ServerConfig().body_deadline_floor),
        min_body_rate=reader.integer(s, "server", "min_body_rate", ServerConfig().min_body_rate, 0, 1 << 40),
        max_connections=reader.integer(s, "server", "max_connections", ServerConfig().max_connections,
                                       1, 1_000_000),
        max_connections_per_peer=reader.integer(s, "server", "max_connections_per_peer",
                                                ServerConfig().max_connections_per_peer, 1, 1_000_000),
        listen_backlog=reader.integer(s, "server", "listen_backlog", ServerConfig().listen_backlog, 1, 65535),
    )
    reader.unknown(s, "server", ("bind", "allowed_cidrs", "cors_origins", "trusted_proxies", "drain_timeout",
                                 "head_timeout", "body_timeout", "send_timeout", "max_connections",
                                 "listen_backlog", "allowed_hosts", "min_body_rate",
                                 "max_connections_per_peer", "max_client_buffer_share",
                                 "body_deadline_floor"))
    for origin in server.cors_origins:
        if origin != "*" and not _valid_origin(origin):
            errs.add("server.cors_origins", f"{origin!r} is not an origin (scheme://host[:port], or *)")
    for name in server.allowed_hosts:
        if name != "*" and _HOST_NAME.fullmatch(name) is None:
            errs.add("server.allowed_hosts", f"{name!r} is not a host name (no scheme, no port), or *")
    _check_bind(server.bind, errs)
    if server.max_client_buffer_share > 1:
        errs.add("server.max_client_buffer_share", f"must be at most 1, got {server.max_client_buffer_share}")
    for key, cidrs in (("allowed_cidrs", server.allowed_cidrs), ("trusted_proxies", server.trusted_proxies)):
        for cidr in cidrs:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                errs.add(f"server.{key}", f"invalid network {cidr!r}")

    a = sections["auth"]
    named_keys = read_inference_keys(a.get("inference_keys"), env, reader.path_value, errs.add)
    auth = AuthConfig(
        inference_keys=tuple(k.key for k in named_keys),
        named_keys=named_keys,
        admin_keys=reader.str_list(a, "auth", "admin_keys", ()),
        metrics_keys=reader.str_list(a, "auth", "metrics_keys", ()),
    )
    reader.unknown(a, "auth", ("inference_keys", "admin_keys", "metrics_keys"))

    m = sections["models"]
    models = ModelsConfig(
        config_dir=reader.path(m, "models", "config_dir", ModelsConfig().config_dir),
        startup_model=reader.string(m, "models", "startup_model", ""),
        shared_dir=reader.path(m, "models", "shared_dir", ""),
        file_roots=tuple(reader.path_value(p) for p in reader.str_list(m, "models", "file_roots", ())),
        concurrent_asset_transfers=reader.integer(m, "models", "concurrent_asset_transfers", 2, 1, 64),
        keep_alive=reader.duration(m, "models", "keep_alive", 0.0) or None,
        asset_transfer_rate_mb=reader.number(m, "models", "asset_transfer_rate_mb",
                                             ModelsConfig().asset_transfer_rate_mb),
        asset_transfer_deadline=reader.duration(m, "models", "asset_transfer_deadline",
                                                ModelsConfig().asset_transfer_deadline),
        asset_lookup_cache=reader.duration(m, "models", "asset_lookup_cache",
                                           ModelsConfig().asset_lookup_cache),
        slot_keep_count=reader.integer(m, "models", "slot_keep_count", 0, 0, 1024),
        slot_keep_mb=reader.number(m, "models", "slot_keep_mb", ModelsConfig().slot_keep_mb),
    )
    reader.unknown(m, "models", ("config_dir", "startup_model", "shared_dir", "file_roots",
                                 "concurrent_asset_transfers", "keep_alive", "asset_transfer_rate_mb",
                                 "asset_transfer_deadline", "asset_lookup_cache", "slot_keep_count",
                                 "slot_keep_mb"))
    if "" in models.file_roots:
        errs.add("models.file_roots", "cannot contain empty paths")
    if not os.path.isdir(models.config_dir):
        errs.add("models.config_dir", f"directory {models.config_dir} does not exist")

    b = sections["backend"]
    backend = BackendConfig(mode=reader.string(b, "backend", "mode", DEFAULT_MODE).strip())
    reader.unknown(b, "backend", ("mode",))
    if not is_declared(backend.mode):
        errs.add("backend.mode", "must be " + modes_phrase())

    family_keys = _family_keys()
    binaries: dict[str, Any] = {name: reader.binary(sections[name], name, family_keys.get(name, ()))
                                for name in binary_sections()}
    k = sections["kobold"]
    base = binaries["kobold"]
    binaries["kobold"] = KoboldConfig(
        command=base.command, extra_args=base.extra_args,
        no_model=reader.boolean(k, "kobold", "no_model", False),
        reload_timeout=reader.duration(k, "kobold", "reload_timeout", 90.0),
    )

    c = sections["cluster"]
    token = reader.string(c, "cluster", "token", "")
    token = _token_from_env(env, token, errs)
    cluster = ClusterConfig(
        role=reader.string(c, "cluster", "role", "standalone").strip(),
        node_id=reader.string(c, "cluster", "node_id", "local").strip(),
        token=token.strip(),
        master_url=reader.string(c, "cluster", "master_url", "").strip(),
        public_url=reader.string(c, "cluster", "public_url", "").strip(),
        slave_urls=tuple(u.strip() for u in reader.str_list(c, "cluster", "slave_urls", ())),
        store_dir=reader.path(c, "cluster", "store_dir", "./routerd-data",
                              base=os.getcwd() if embedded else None),
        sync_interval=reader.duration(c, "cluster", "sync_interval", 60.0),
        health_interval=reader.duration(c, "cluster", "health_interval", 15.0),
        control_timeout=reader.duration(c, "cluster", "control_timeout", 30.0),
        lending=_lending(c, errs),
    )
    reader.unknown(c, "cluster", ("role", "node_id", "token", "master_url", "public_url", "slave_urls",
                                  "store_dir", "sync_interval", "health_interval", "control_timeout",
                                  *(spec.key for spec in SETTINGS)))
    _check_cluster(cluster, auth, errs)

    lim = sections["limits"]
    limits = LimitsConfig(
        max_body_mb=reader.number(lim, "limits", "max_body_mb", 64.0),
        replay_buffer_mb=reader.number(lim, "limits", "replay_buffer_mb", 512.0),
        max_queued_per_model=reader.integer(lim, "limits", "max_queued_per_model",
                                            LimitsConfig().max_queued_per_model, 1, 1_000_000),
        first_byte_timeout=reader.duration(lim, "limits", "first_byte_timeout",
                                           LimitsConfig().first_byte_timeout),
        idle_stream_timeout=reader.duration(lim, "limits", "idle_stream_timeout",
                                            LimitsConfig().idle_stream_timeout),
        max_form_parts=reader.integer(lim, "limits", "max_form_parts", LimitsConfig().max_form_parts,
                                      1, 100_000),
    )
    reader.unknown(lim, "limits", ("max_body_mb", "replay_buffer_mb", "max_queued_per_model",
                                   "first_byte_timeout", "idle_stream_timeout", "max_form_parts"))

    q = sections["queue"]
    queue = QueueConfig(aging=reader.duration(q, "queue", "aging", QueueConfig().aging))
    reader.unknown(q, "queue", ("aging",))
    sch = sections["scheduling"]
    scheduling = SchedulingConfig(
        swap_batch=reader.integer(sch, "scheduling", "swap_batch", SchedulingConfig().swap_batch, 0, 100_000),
        swap_max_wait=reader.duration(sch, "scheduling", "swap_max_wait", SchedulingConfig().swap_max_wait))
    reader.unknown(sch, "scheduling", ("swap_batch", "swap_max_wait"))
    analytics = _analytics(sections["analytics"], reader)
    routing = _routing(sections["routing"], reader)
    tracing = parse_tracing(sections["tracing"], reader)

    if not _is_loopback_bind(server.bind) and not (auth.inference_keys or auth.admin_keys):
        errs.add("server.bind", f"{server.bind} is not a loopback address; configure auth.inference_keys "
                                "or auth.admin_keys before exposing routerd")
    _check_keys(auth, cluster, errs)

    if errs.items:
        raise ConfigError(errs.items)
    return Config(server=server, auth=auth, models=models, backend=backend, cluster=cluster,
                  limits=limits, queue=queue, scheduling=scheduling, analytics=analytics, routing=routing,
                  tracing=tracing, source=source, **binaries)


def _routing(section: Mapping[str, Any], reader: Reader) -> RoutingConfig:
    """The ``routing`` section, every problem added to the reader's errors."""
    default = RoutingConfig()
    choice = reader.string(section, "routing", "replica_choice", default.replica_choice)
    if choice not in MODES:
        reader.errs.add("routing.replica_choice", f"must be one of {', '.join(MODES)}, got {choice!r}")
        choice = default.replica_choice
    source = reader.string(section, "routing", "affinity_key", default.affinity_key)
    if source not in KEY_SOURCES:
        reader.errs.add("routing.affinity_key", f"must be one of {', '.join(KEY_SOURCES)}, got {source!r}")
        source = default.affinity_key
    bound = reader.number(section, "routing", "load_bound", default.load_bound)
    if bound < 1.0:
        reader.errs.add("routing.load_bound", f"must be at least 1, got {bound}")
        bound = default.load_bound
    history = reader.integer(section, "routing", "affinity_history", default.affinity_history, 1, 10_000_000)
    reader.unknown(section, "routing", ROUTING_KEYS)
    return RoutingConfig(replica_choice=choice, affinity_key=source,
                         load_bound=bound, affinity_history=history)


def _analytics(section: Mapping[str, Any], reader: Reader) -> AnalyticsConfig:
    """The ``analytics`` section (contract §2): every duration must be positive."""
    default = AnalyticsConfig()
    durations = ("flush_interval", "raw_retention", "minute_retention", "hour_retention", "day_retention",
                 "capture_retention")
    values = {key: reader.duration(section, "analytics", key, getattr(default, key)) for key in durations}
    config = AnalyticsConfig(
        enabled=reader.boolean(section, "analytics", "enabled", default.enabled),
        max_buffered=reader.integer(section, "analytics", "max_buffered", default.max_buffered, 1, 1_000_000),
        capture_keys=reader.str_list(section, "analytics", "capture_keys", ()),
        capture_models=reader.str_list(section, "analytics", "capture_models", ()),
        capture_max_bytes=reader.integer(section, "analytics", "capture_max_bytes", default.capture_max_bytes,
                                         1, 16 * 1024 * 1024),
        **values)
    reader.unknown(section, "analytics", ("enabled", "max_buffered", "capture_keys", "capture_models",
                                          "capture_max_bytes", *durations))
    return config


def _lending(section: Mapping[str, Any], errs: Errors) -> LendingSettings:
    texts: dict[str, str] = {}
    for spec in SETTINGS:
        if spec.key not in section:
            continue
        try:
            texts[spec.key] = normalise(spec.key, section[spec.key])
        except SettingError as exc:
            errs.add(f"cluster.{spec.key}", str(exc).removeprefix(f"{spec.key}: "))
    return LendingSettings.from_texts(texts)


def _token_from_env(env: Mapping[str, str], token: str, errs: Errors) -> str:
    direct = env.get(TOKEN_ENV, "")
    file_name = env.get(TOKEN_FILE_ENV, "")
    if direct and file_name:
        errs.add("cluster.token", f"set only one of {TOKEN_ENV} and {TOKEN_FILE_ENV}")
        return token
    if direct:
        return direct.strip()
    if file_name:
        try:
            with open(file_name, encoding="utf-8") as fh:
                value = fh.read().strip()
        except OSError as exc:
            errs.add("cluster.token", f"{TOKEN_FILE_ENV} {file_name}: {exc.strerror or exc}")
            return token
        if not value or "\n" in value:
            errs.add("cluster.token", f"{TOKEN_FILE_ENV} {file_name} must hold one non-empty token")
            return token
        return value
    return token


def _check_bind(bind: str, errs: Errors) -> None:
    host, sep, port = bind.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        errs.add("server.bind", f"must be host:port, got {bind!r}")


def _is_loopback_bind(bind: str) -> bool:
    host = bind.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: A host name or IP address as ``server.allowed_hosts`` lists it.
_HOST_NAME = re.compile(r"[A-Za-z0-9_.-]+|\[?[0-9A-Fa-f:.]+\]?")


def _valid_origin(origin: str) -> bool:
    scheme, sep, rest = origin.partition("://")
    return bool(sep) and scheme in ("http", "https") and bool(rest) and "/" not in rest


def _valid_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and not parts.username


def _check_cluster(cluster: ClusterConfig, auth: AuthConfig, errs: Errors) -> None:
    if cluster.role not in ROLES:
        errs.add("cluster.role", "must be standalone, master, or slave")
        return
    if not cluster.node_id:
        errs.add("cluster.node_id", "is required")
    if cluster.role != "standalone":
        token = cluster.token
        if not token:
            errs.add("cluster.token", f"is required when cluster.role is {cluster.role} "
                                      f"(or set {TOKEN_ENV} / {TOKEN_FILE_ENV})")
        elif token.lower() in PLACEHOLDER_TOKENS:
            errs.add("cluster.token", "contains a known placeholder; generate a real secret")
        elif len(token) < MIN_TOKEN_LENGTH:
            errs.add("cluster.token", f"must be at least {MIN_TOKEN_LENGTH} characters")
    if cluster.role == "slave":
        if not cluster.master_url:
            errs.add("cluster.master_url", "is required when cluster.role is slave")
        if not cluster.public_url:
            errs.add("cluster.public_url", "is required when cluster.role is slave")
    for key in ("master_url", "public_url"):
        value = getattr(cluster, key)
        if value and not _valid_url(value):
            errs.add(f"cluster.{key}", f"is not a valid http(s) URL: {value!r}")
    seen: set[str] = set()
    for url in cluster.slave_urls:
        if not _valid_url(url):
            errs.add("cluster.slave_urls", f"contains invalid URL {url!r}")
            continue
        norm = url.rstrip("/").lower()
        if norm in seen:
            errs.add("cluster.slave_urls", f"lists {url!r} twice")
        seen.add(norm)


def _check_keys(auth: AuthConfig, cluster: ClusterConfig, errs: Errors) -> None:
    for name, keys in (("auth.inference_keys", auth.inference_keys), ("auth.admin_keys", auth.admin_keys),
                       ("auth.metrics_keys", auth.metrics_keys)):
        for key in keys:
            if not key.strip():
                errs.add(name, "cannot contain empty keys")
            elif key.strip().lower() in PLACEHOLDER_TOKENS:
                errs.add(name, "contains a known placeholder; generate a real secret")
    inference = set(auth.inference_keys)
    admin = set(auth.admin_keys)
    if inference & admin:
        errs.add("auth", "credentials cannot be reused across inference_keys and admin_keys")
    if cluster.token and cluster.token in inference:
        errs.add("cluster.token", "credentials cannot be reused across cluster.token and auth.inference_keys")
    if cluster.token and cluster.token in admin:
        errs.add("cluster.token", "credentials cannot be reused across cluster.token and auth.admin_keys")
    metrics = set(auth.metrics_keys)
    if metrics & (inference | admin) or (cluster.token and cluster.token in metrics):
        errs.add("auth.metrics_keys", "credentials cannot be reused across metrics_keys and other keys")


def reread_config(config: Config) -> Config:
    """The config ``config`` was loaded from, read again (a reload); the embedded default is read
    again too, and a config built in memory (no file, as tests build them) stays as it is."""
    source = config.source
    if source == embedded_default_path():
        return load_config(None)
    return load_config(source) if os.path.isfile(source) else config
