"""What the tests that run real processes (``twistd``, ``routerd-cluster``, ``routerd demo``) share."""

from __future__ import annotations

import signal
import subprocess


def stop(proc: subprocess.Popen[bytes], signum: int = signal.SIGTERM, timeout: float = 20.0) -> bytes:
    """Send ``signum`` to a running ``proc`` and wait up to ``timeout`` seconds for it to end (killed
    if it has not); what is left of its stdout (``b""`` when it was not piped)."""
    if proc.poll() is None:
        proc.send_signal(signum)
    try:
        rest, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rest, _ = proc.communicate()
    return rest or b""
