"""Loopback ports for test and benchmark nodes that no socket can take from them in between.

A test picks a port, lets it go, and binds a node to it later, often more than once: a master (or
a slave) is stopped and started again on the same address so that the other nodes, which know it
by that address, find it again.  A port from ``bind(("127.0.0.1", 0))`` lies in the kernel's
ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default): the range
the kernel hands out on its own to every ``bind`` to port 0 and to every outgoing ``connect``.
While such a port is free (between the pick and the first bind, or while its node is stopped)
any of those sockets may get it: an outgoing connection of another node, or a simulator backend
that routerd started on a port it picked the same way.  The node's bind then fails with
``EADDRINUSE``, and meanwhile the other nodes' calls to its address reach whatever holds the port
(a CI run saw a master's old port answer 503 and then refuse the master's restart).

The kernel never hands out a port outside that range by itself, so :func:`free_port` picks one
outside it (above 10000, clear of the usual services), checks it is free now, and never hands out
the same port twice in one process; a random pick (from the system's generator, which no test's
``random.seed`` touches) keeps two test runs on one machine apart.
"""

from __future__ import annotations

import random
import socket
from functools import cache

EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST = 10000  # below: the usual services' ports (8080 among them)
_handed_out: set[int] = set()
_pick = random.SystemRandom()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (first, last), Linux's default when it cannot be read."""
    try:
        with open(EPHEMERAL_RANGE_FILE) as f:
            first, last = (int(field) for field in f.read().split())
    except (OSError, ValueError):
        return 32768, 60999
    return first, last


@cache
def _candidates() -> tuple[range, ...]:
    first, last = ephemeral_range()
    outside = tuple(r for r in (range(LOWEST, first), range(last + 1, 65536)) if len(r) > 0)
    return outside or (range(1024, 65536),)  # a system that hands out every port: nothing is safe


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now that the kernel will not hand to another socket later
    (outside its ephemeral range) and that this process has not handed out before."""
    return free_ports_in_a_row(1)


def free_ports_in_a_row(count: int) -> int:
    """The first of ``count`` consecutive ports, each as :func:`free_port` gives one (a demo's
    ports are its base port and the next ones)."""
    ranges = [r for r in _candidates() if len(r) >= count]
    weights = [len(r) for r in ranges]
    for _ in range(1000):
        chosen = _pick.choices(ranges, weights)[0]
        base = _pick.randrange(chosen.start, chosen.stop - count + 1)
        run = range(base, base + count)
        if not _handed_out.intersection(run) and all(_is_free(port) for port in run):
            _handed_out.update(run)
            return base
    raise RuntimeError(f"no {count} free loopback ports in a row outside the kernel's ephemeral range")
