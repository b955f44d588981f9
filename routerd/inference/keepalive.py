"""Ollama's control semantics: preload, unload and ``keep_alive`` as an idle TTL.

Ollama documents that ``/api/generate`` with no prompt (``/api/chat`` with no messages) only loads
the model (``done_reason: "load"``), and with ``keep_alive: 0`` unloads it (``"unload"``).
``keep_alive`` on any request (a number of seconds or a duration such as ``"5m"``; negative = for
ever) sets how long the model stays loaded after its last use; ``models.keep_alive`` is the node's
default (none: models stay until something else needs the runtime).

:func:`parse_keep_alive` and :func:`expired` are pure; :class:`KeepAlive` holds the per-model TTLs and
last-use times and, ticked by an interval service on the node's clock, unloads expired models.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from routerd.backends.runtimes import SlotStatus
from routerd.config.durations import DurationError, parse_duration
from routerd.errors import HTTPError
from routerd.routing.adapters import ollama
from routerd.routing.adapters.ollama import Mode
from routerd.routing.selector import model_too_long

log = Logger()

FOREVER = math.inf


def parse_keep_alive(value: Any) -> float | None:
    """Seconds a model stays loaded after use: ``None`` when not stated, ``inf`` for a negative value
    (for ever), ``0`` to unload at once.  400 for anything else."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise HTTPError(400, "keep_alive must be a duration or a number of seconds")
    if isinstance(value, int | float):
        return FOREVER if value < 0 else float(value)
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("-"):
            return FOREVER
        try:
            return float(text)
        except ValueError:
            pass
        try:
            return parse_duration(text)
        except DurationError:
            pass
    raise HTTPError(400, f"keep_alive {value!r} is not a duration (e.g. \"5m\") or a number of seconds")


def expired(now: float, slots: Iterable[SlotStatus], last_used: Mapping[str, float],
            ttls: Mapping[str, float], default_ttl: float | None) -> list[str]:
    """Models loaded and idle (no users, nobody waiting) for at least their TTL."""
    out = []
    for slot in slots:
        model = slot.model_id
        if not model or slot.state != "ready" or slot.users or slot.waiters:
            continue
        ttl = ttls.get(model, default_ttl)
        if ttl is None or ttl == FOREVER:
            continue
        idle_since = max(last_used.get(model, slot.since), slot.since)
        if now - idle_since >= ttl and model not in out:
            out.append(model)
    return out


class KeepAlive:
    """Per-model idle TTLs; :meth:`tick` unloads the models whose TTL ran out."""

    def __init__(self, clock: IReactorTime, default_ttl: float | None,
                 status: Callable[[], list[SlotStatus]],
                 unload: Callable[[str], Awaitable[Any]]) -> None:
        self.clock = clock
        self.default_ttl = default_ttl
        self.status = status
        self.unload = unload
        self.ttls: dict[str, float] = {}
        self.last_used: dict[str, float] = {}

    def note(self, model: str, ttl: float | None) -> None:
        """A request for ``model`` (with its ``keep_alive``, if it stated one) just happened."""
        self.last_used[model] = self.clock.seconds()
        if ttl is not None:
            self.ttls[model] = ttl

    async def tick(self) -> None:
        now = self.clock.seconds()
        slots = self.status()
        for slot in slots:  # a model in use now was used now
            if slot.model_id and (slot.users or slot.waiters):
                self.last_used[slot.model_id] = now
        for model in expired(now, slots, self.last_used, self.ttls, self.default_ttl):
            log.info("unloading {model}: idle past its keep_alive", model=model)
            try:
                await self.unload(model)
            except Exception as exc:  # noqa: BLE001 - the next tick tries again
                log.warn("keep_alive unload of {model} failed: {error}", model=model, error=str(exc))
                continue
            self.ttls.pop(model, None)
            self.last_used.pop(model, None)


class OllamaControl:
    """Answers Ollama's load-only and unload requests, and notes every request's ``keep_alive``."""

    def __init__(self, keepalive: KeepAlive, load: Callable[[str], Awaitable[Any]],
                 unload: Callable[[str], Awaitable[Any]]) -> None:
        self.keepalive = keepalive
        self.load = load
        self.unload = unload

    async def handle(self, mode: Mode, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """The answer to a control request, or ``None`` for a request to generate (whose
        ``keep_alive`` is noted here; the caller serves it as usual)."""
        model = body.get("model")
        if not isinstance(model, str) or not model or model_too_long(model):
            return None  # the normal path answers 400
        ttl = parse_keep_alive(body.get("keep_alive"))
        if not ollama.is_ollama_load_request(mode, body):
            self.keepalive.note(model, ttl)
            return None
        now_iso = ollama.iso_utc(self.keepalive.clock.seconds())
        answer = ollama.ollama_load_response(mode, model, now_iso)
        if ttl == 0:
            await self.unload(model)
            answer["done_reason"] = "unload"
            self.keepalive.ttls.pop(model, None)
            return answer
        await self.load(model)
        self.keepalive.note(model, ttl)
        return answer
