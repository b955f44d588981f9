"""Refusals before the body come through the shipped nginx site as themselves: a live node behind
``etc/nginx-routerd.conf`` on loopback ephemeral ports refuses a keyless upload (401), one past
``limits.max_body_mb`` (413) and one past the replay budget (503) from their heads while the client
still sends the body; the client gets routerd's status and JSON body, not nginx's 502 (a node that
closed with the body unread reset the connection under nginx's upload)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.nginx_site import NGINX, node_behind_nginx

KEY = "nginx-refusal-key-0123"
#: Each case is sent this often: the lost answer was a race (about one upload in five).
TRIES = 12
pytestmark = pytest.mark.slow


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (the README test command installs it)")
def test_refusals_before_the_body_reach_the_client_through_nginx_as_routerd_wrote_them(
        tmp_path: Path) -> None:
    config = {"server": {"allowed_cidrs": ["127.0.0.0/8"], "trusted_proxies": ["127.0.0.1/32"]},
              "auth": {"inference_keys": [KEY]}, "limits": {"max_body_mb": 2, "replay_buffer_mb": 1}}
    keyed = f"Authorization: Bearer {KEY}\r\n"
    cases = [  # (what, key header, body size, status, error code)
        ("no key", "", 2_500_000, 401, "unauthorized"),
        ("past max_body_mb", keyed, 2_500_000, 413, "request_too_large"),
        ("past replay_buffer_mb", keyed, 1_500_000, 503, "buffer_full"),
    ]
    with node_behind_nginx(tmp_path, config) as front:
        for what, key, size, status, code in cases:
            head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{key}"
                    f"Content-Type: application/json\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n"
                    ).encode()
            body = b"x" * size
            for _ in range(TRIES):
                got, payload = front.ask(head, body)
                assert got == status, (what, got, payload[:200])
                assert json.loads(payload)["error"]["code"] == code, what
