"""Refusals before the body come through the shipped nginx site as themselves: a live node behind
``etc/nginx-routerd.conf`` on loopback ephemeral ports refuses a keyless upload (401), one past
``limits.max_body_mb`` (413) and one past the replay budget (503) from their heads while the client
still sends the body; the client gets routerd's status and JSON body, not nginx's 502 (a node that
closed with the body unread reset the connection under nginx's upload)."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.nodes import FAST_TEXT, SIM, write_models
from tests.integration.processes import stop
from tests.integration.test_examples import NGINX, _nginx_prefix
from tests.integration.test_twistd_e2e import _free_port, _wait_http

ROUTERD = str(Path(sys.executable).parent / "routerd")
KEY = "nginx-refusal-key-0123"
#: Each case is sent this often: the lost answer was a race (about one upload in five).
TRIES = 12
pytestmark = pytest.mark.slow


def _ask(port: int, context: ssl.SSLContext, head: bytes, body: bytes) -> tuple[int, bytes]:
    """Send the head and then the body in pieces, as an upload does; the status and body answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as plain, \
            context.wrap_socket(plain) as conn:
        conn.sendall(head)
        try:
            for at in range(0, len(body), 65536):
                conn.sendall(body[at:at + 65536])
        except OSError:
            pass  # the answer may have ended the upload: read it
        answer = b""
        while True:
            try:
                part = conn.recv(65536)
            except OSError:
                break
            if not part:
                break
            answer += part
    head_part, _, payload = answer.partition(b"\r\n\r\n")
    return int(head_part.split(b" ", 2)[1]), payload


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (the README test command installs it)")
def test_refusals_before_the_body_reach_the_client_through_nginx_as_routerd_wrote_them(
        tmp_path: Path) -> None:
    assert NGINX is not None
    port, tls_port, http_port = _free_port(), _free_port(), _free_port()
    write_models(tmp_path, {"chat": {"model": "../weights/chat.sim.json", "contextsize": 2048}},
                 {"chat": FAST_TEXT})
    cfg = tmp_path / "node.yaml"
    cfg.write_text(json.dumps({"server": {"bind": f"127.0.0.1:{port}", "allowed_cidrs": ["127.0.0.0/8"],
                                          "trusted_proxies": ["127.0.0.1/32"]},
                               "auth": {"inference_keys": [KEY]}, "models": {"config_dir": "models"},
                               "limits": {"max_body_mb": 2, "replay_buffer_mb": 1},
                               "llama": {"binary_path": [*SIM, "llama-server"]},
                               "cluster": {"store_dir": "store"}}))
    prefix = _nginx_prefix(tmp_path, port, tls_port, http_port)
    nginx = [NGINX, "-p", str(prefix), "-c", str(prefix / "nginx.conf")]
    node = subprocess.Popen([ROUTERD, "run", "--config", str(cfg)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proxy = subprocess.Popen([*nginx, "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    keyed = f"Authorization: Bearer {KEY}\r\n"
    cases = [  # (what, key header, body size, status, error code)
        ("no key", "", 2_500_000, 401, "unauthorized"),
        ("past max_body_mb", keyed, 2_500_000, 413, "request_too_large"),
        ("past replay_buffer_mb", keyed, 1_500_000, 503, "buffer_full"),
    ]
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", node)
        deadline = time.monotonic() + 10
        while True:
            try:
                health = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                assert _ask(tls_port, context, health, b"")[0] == 200
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        for what, key, size, status, code in cases:
            head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{key}"
                    f"Content-Type: application/json\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n"
                    ).encode()
            body = b"x" * size
            for _ in range(TRIES):
                got, payload = _ask(tls_port, context, head, body)
                assert got == status, (what, got, payload[:200])
                assert json.loads(payload)["error"]["code"] == code, what
    finally:
        proxy.terminate()
        proxy.wait(10)
        stop(node)
