"""What the tests that run real processes (``twistd``, ``routerd-cluster``, ``routerd demo``) share."""

from __future__ import annotations

import signal
import subprocess


def stop(proc: subprocess.Popen[bytes], signum: int = signal.SIGTERM, timeout: float = 20.0, *,
         collect: bool = False) -> bytes:
    """Send ``signum`` to a running ``proc`` and wait up to ``timeout`` seconds for it to end (killed
    if it has not).  With ``collect``, what is left of its stdout is read meanwhile (so a full pipe
    cannot stall the stop) and returned; without, stdout is left for the caller to read."""
    if proc.poll() is None:
        proc.send_signal(signum)
    try:
        return _wait(proc, timeout, collect)
    except subprocess.TimeoutExpired:
        proc.kill()
        return _wait(proc, None, collect)


def _wait(proc: subprocess.Popen[bytes], timeout: float | None, collect: bool) -> bytes:
    if collect:
        return proc.communicate(timeout=timeout)[0] or b""
    proc.wait(timeout)
    return b""
