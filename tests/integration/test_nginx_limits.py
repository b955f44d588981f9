"""A key that trickles bodies through the shipped nginx site (``etc/nginx-routerd.conf``, which
streams request bodies to the node with ``proxy_request_buffering off``) no longer starves another
key: nginx opens one upstream request per trickled upload, so the node sees each declared body at
its head and counts it to its key's share of the replay budget (``server.max_client_buffer_share``,
at least one ``limits.max_body_mb`` body); the second 8 MiB body of the trickling key is refused
at its head and the refusal reaches the client as routerd wrote it, another key's request with a
body is served meanwhile, and the body still held is cut with a 408 once it is slower than
``server.min_body_rate``."""

from __future__ import annotations

import json
import select
import ssl
import time
from pathlib import Path

import pytest

from tests.integration.nginx_site import NGINX, node_behind_nginx, read_answer

SLOW = "slow-key-0123456789"
OTHER = "other-key-0123456789"
DECLARED = 8 * 1024 * 1024
#: 8 MiB at 2 MiB a second: the held body must be complete 4 s after its head
RATE = 2 * 1024 * 1024
CHAT = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}],
                   "max_tokens": 2}).encode()
pytestmark = pytest.mark.slow


def _upload_head(key: str, length: int) -> bytes:
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n"
            "Connection: close\r\n\r\n").encode()


def _answered(conns: list[ssl.SSLSocket], wait: float) -> list[ssl.SSLSocket]:
    """Those of ``conns`` that have something to read (an answer, or their end) within ``wait`` s."""
    pending = [conn for conn in conns if conn.pending()]
    if pending:
        return pending
    return list(select.select(conns, [], [], wait)[0])


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (the README test command installs it)")
def test_a_key_trickling_two_large_bodies_through_nginx_no_longer_starves_another_key(tmp_path: Path) -> None:
    config = {"server": {"allowed_cidrs": ["127.0.0.0/8"], "trusted_proxies": ["127.0.0.1/32"],
                         "min_body_rate": RATE, "body_deadline_floor": "1s", "max_client_buffer_share": 0.25},
              "auth": {"inference_keys": [SLOW, OTHER]}, "limits": {"max_body_mb": 8, "replay_buffer_mb": 16}}
    with node_behind_nginx(tmp_path, config) as front:
        tricklers = [front.connect(), front.connect()]
        try:
            for conn in tricklers:
                conn.sendall(_upload_head(SLOW, DECLARED) + b"{")  # and then nothing more
            # the second 8 MiB body is past the slow key's share of the 16 MiB budget: refused at its head
            refused = _answered(tricklers, 3)  # well before the held body is due
            assert len(refused) == 1
            status, payload = read_answer(refused[0])
            assert (status, json.loads(payload)["error"]["code"]) == (503, "buffer_full")
            held = next(conn for conn in tricklers if conn is not refused[0])
            started = time.monotonic()
            # meanwhile another key's request with a body is served, while the slow key still holds one
            status, payload = front.ask(_upload_head(OTHER, len(CHAT)), CHAT)
            assert status == 200 and json.loads(payload)["choices"], payload[:200]
            assert not _answered([held], 0), "the held body was cut before the other key was served"
            # the held body is slower than server.min_body_rate: cut 4 s after its head (reaped once a second)
            assert _answered([held], 10)
            status, payload = read_answer(held)
            assert (status, json.loads(payload)["error"]["code"]) == (408, "request_timeout")
            assert time.monotonic() - started < 8
        finally:
            for conn in tricklers:
                conn.close()
