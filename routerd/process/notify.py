"""systemd readiness notification (``Type=notify``) without a dependency.

:func:`sd_notify` sends one datagram such as ``READY=1`` to the socket systemd names in
``$NOTIFY_SOCKET`` (a path, or ``@name`` for an abstract socket).  Without that variable (not run by
systemd, or another ``Type=``) it does nothing.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from twisted.logger import Logger

log = Logger()


def sd_notify(state: str, env: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (``"READY=1\\nSTATUS=..."``) to systemd; ``True`` when it was sent."""
    address = (os.environ if env is None else env).get("NOTIFY_SOCKET", "")
    if not address:
        return False
    target = "\0" + address[1:] if address.startswith("@") else address
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(target)
            sock.sendall(state.encode("utf-8"))
    except OSError as exc:
        log.warn("could not notify systemd at {address}: {reason}", address=address, reason=str(exc))
        return False
    return True


__all__ = ["sd_notify"]
