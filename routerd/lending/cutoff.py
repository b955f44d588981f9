"""The lent-request cut-off (spec "A lent request whose helper has not started answering ...";
reference §3.7): the pure rule.

A request lent under a lease that knows both speeds is given up
``3 × (switch + service) + 30 s`` after it was lent unless the helper has started answering by
then; it then follows the return path (re-queued at the head, served by the owner).  Probes and
leases without measured speeds have no limit.
"""

from __future__ import annotations

import attrs

from routerd.wire.lending import Lease

#: Give-up = ``FACTOR × (switch + service) + GRACE_MS``.
FACTOR = 3
GRACE_MS = 30_000.0


@attrs.frozen
class CutOffRule:
    """The cut-off formula's constants (fixed in production; tests may shorten the grace)."""

    factor: float = FACTOR
    grace_ms: float = GRACE_MS

    def give_up_ms(self, lease: Lease) -> float | None:
        """How long after lending to wait for the helper to start answering; None: no limit."""
        if not lease.has_speeds():
            return None
        return self.factor * (lease.helper_switch_ms + lease.helper_service_ms) + self.grace_ms


__all__ = ["FACTOR", "GRACE_MS", "CutOffRule"]
