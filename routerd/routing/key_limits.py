"""Per-key limits: ``limits.max_concurrent``, ``requests_per_minute`` and
``tokens_per_minute`` of a named inference key.

Pure: fed the clock's seconds, no timers.  The node that admits a client's request counts it — the
master for every request it routes (whichever node serves it), a node called directly by a client
for what it receives that way; a request the master forwards is not counted again by the node it
goes to.  A request over a limit is refused with 429 ``key_limited`` and ``Retry-After`` (when the
window frees a place; 1 s for the concurrency limit).

``tokens_per_minute`` counts the prompt and output tokens a finished text request used: those its
backend reported when the counting node served it, or those the answer reports as it comes back
from the node the master forwarded it to (so a key has one token limit for the site, not one per
node); a request is refused while the last minute's count is at or over the limit.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

import attrs

from routerd.config.keys import KeyLimits
from routerd.errors import Saturated

WINDOW_S = 60.0


def key_limited(key_name: str, what: str, retry_after: int) -> Saturated:
    """429 ``key_limited`` naming the key and the limit it is over."""
    return Saturated(429, f"key {key_name!r} is over its {what}; retry in {retry_after} s", "key_limited",
                     retry_after)


@attrs.define
class _Use:
    running: int = 0
    starts: deque[float] = attrs.Factory(deque)
    tokens: deque[tuple[float, int]] = attrs.Factory(deque)
    token_total: int = 0

    def expire(self, now: float) -> None:
        while self.starts and self.starts[0] <= now - WINDOW_S:
            self.starts.popleft()
        while self.tokens and self.tokens[0][0] <= now - WINDOW_S:
            self.token_total -= self.tokens.popleft()[1]

    @property
    def idle(self) -> bool:
        return not self.running and not self.starts and not self.tokens


class KeyLimiter:
    """What each named key has running and used in the last minute."""

    def __init__(self, limits: Callable[[str], KeyLimits | None]) -> None:
        self.limits = limits  # a key's limits by name (read live: a reload changes them)
        self._use: dict[str, _Use] = {}

    def admit(self, key_name: str, now: float) -> None:
        """Count a request of ``key_name`` starting now, or raise 429 ``key_limited``."""
        limits = self.limits(key_name) if key_name else None
        if limits is None or not limits.limited:
            return
        use = self._use.setdefault(key_name, _Use())
        use.expire(now)
        if limits.max_concurrent and use.running >= limits.max_concurrent:
            raise key_limited(key_name, f"max_concurrent ({limits.max_concurrent} requests at once)", 1)
        if limits.requests_per_minute and len(use.starts) >= limits.requests_per_minute:
            raise key_limited(key_name, f"requests_per_minute ({limits.requests_per_minute})",
                              _until(use.starts[0], now))
        if limits.tokens_per_minute and use.token_total >= limits.tokens_per_minute:
            raise key_limited(key_name, f"tokens_per_minute ({limits.tokens_per_minute})",
                              _until(use.tokens[0][0], now))
        use.running += 1
        use.starts.append(now)

    def done(self, key_name: str, now: float, tokens: int = 0) -> None:
        """A request :meth:`admit` counted has ended, having used ``tokens`` (0: unknown)."""
        use = self._use.get(key_name)
        if use is None:
            return
        use.running = max(use.running - 1, 0)
        if tokens > 0:
            use.tokens.append((now, tokens))
            use.token_total += tokens
        use.expire(now)
        if use.idle:
            del self._use[key_name]

    def running(self, key_name: str) -> int:
        use = self._use.get(key_name)
        return use.running if use is not None else 0


def _until(oldest: float, now: float) -> int:
    return max(1, math.ceil(oldest + WINDOW_S - now))


__all__ = ["WINDOW_S", "KeyLimiter", "key_limited"]
