"""The examples in ``etc/`` work: the nginx site passes ``nginx -t`` and streams a chat chunk by
chunk to the client; the systemd unit is hardened and the Docker files parse."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.nginx_site import NGINX, nginx_prefix, node_behind_nginx
from tests.integration.nodes import FAST_TEXT, SIM, write_models
from tests.integration.processes import stop
from tests.integration.test_twistd_e2e import _wait_http
from tests.ports import free_port

ROOT = Path(__file__).parents[2]
ROUTERD = str(Path(sys.executable).parent / "routerd")
pytestmark = pytest.mark.slow


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (the README test command installs it)")
def test_the_nginx_site_passes_nginx_t_and_streams_a_chat_chunk_by_chunk(tmp_path: Path) -> None:
    assert NGINX is not None
    port, tls_port, http_port = free_port(), free_port(), free_port()
    slow = {**FAST_TEXT, "load_ms": 50, "gen_tokens_per_s": 20}  # 20 tokens: one second
    write_models(tmp_path, {"chat": {"model": "../weights/chat.sim.json", "contextsize": 2048}},
                 {"chat": slow})
    cfg = tmp_path / "node.yaml"
    cfg.write_text(json.dumps({"server": {"bind": f"127.0.0.1:{port}"}, "models": {"config_dir": "models"},
                               "llama": {"binary_path": [*SIM, "llama-server"]},
                               "cluster": {"store_dir": "store"}}))
    prefix = nginx_prefix(tmp_path, port, tls_port, http_port)
    nginx = [NGINX, "-p", str(prefix), "-c", str(prefix / "nginx.conf")]
    checked = subprocess.run([*nginx, "-t"], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    node = subprocess.Popen([ROUTERD, "run", "--config", str(cfg)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proxy = subprocess.Popen([*nginx, "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", node)
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        deadline = time.monotonic() + 10
        while True:
            try:
                conn = http.client.HTTPSConnection("127.0.0.1", tls_port, context=context, timeout=30)
                conn.request("GET", "/health")
                health = conn.getresponse()
                health.read()
                assert health.status == 200
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        conn.request("POST", "/v1/chat/completions", body=json.dumps({
            "model": "chat", "stream": True, "max_tokens": 20,
            "messages": [{"role": "user", "content": "hi"}]}), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200
        assert response.getheader("content-type", "").startswith("text/event-stream")
        arrivals: list[tuple[float, bytes]] = []
        while line := response.readline():
            if line.startswith(b"data: "):
                arrivals.append((time.monotonic(), line))
        conn.close()
        assert arrivals[-1][1].strip() == b"data: [DONE]"
        assert len(arrivals) >= 20
        # chunk by chunk: the first tokens reached the client long before the last ones
        assert arrivals[-1][0] - arrivals[0][0] > 0.5
    finally:
        proxy.terminate()
        proxy.wait(10)
        stop(node, timeout=15)


_CHAT = b'{"model":"chat","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}'
#: (name, the request's bytes, the statuses a client may get) through
#: the shipped nginx site: nginx's own refusals and routerd's behind it.
_NGINX_CASES = [
    ("authorization twice", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer KEY\r\n"
     b"Authorization: Bearer wrong\r\nContent-Length: 2\r\n\r\n{}", {400}),
    ("no host", b"POST /v1/chat/completions HTTP/1.1\r\nAuthorization: Bearer KEY\r\n"
     b"Content-Length: 2\r\n\r\n{}", {400}),
    ("forwarded-for twice, last entry outside allowed_cidrs",
     b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer KEY\r\n"
     b"X-Forwarded-For: 127.0.0.5\r\nX-Forwarded-For: 203.0.113.9\r\nContent-Length: 2\r\n\r\n{}", {403}),
    ("5,000-digit content-length", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
     + b"9" * 5000 + b"\r\n\r\n", {400, 413}),
    ("control byte in the target", b"POST /v1/chat/\x01completions HTTP/1.1\r\nHost: x\r\n\r\n", {400}),
    ("no key", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", {401}),
    ("served", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer KEY\r\n"
     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(_CHAT), _CHAT), {200}),
]


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (the README test command installs it)")
def test_malformed_and_repeated_field_requests_through_the_nginx_site_are_refused(tmp_path: Path) -> None:
    """The malformed-head cases replayed through etc/nginx-routerd.conf in front of a node that trusts
    nginx's X-Forwarded-For: what nginx lets through, routerd refuses the same way."""
    key = "nginx-test-key-0123"
    config = {"server": {"allowed_cidrs": ["127.0.0.0/8"], "trusted_proxies": ["127.0.0.1/32"]},
              "auth": {"inference_keys": [key]}}
    with node_behind_nginx(tmp_path, config) as front:

        def status_of(raw: bytes) -> int:
            with front.connect() as conn:
                conn.sendall(raw)
                answer = b""
                while b"\r\n" not in answer:
                    part = conn.recv(4096)
                    if not part:
                        break
                    answer += part
            return int(answer.split(b" ", 2)[1])

        for name, raw, expected in _NGINX_CASES:
            assert status_of(raw.replace(b"KEY", key.encode())) in expected, name


SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
def test_the_systemd_unit_is_hardened_to_an_exposure_of_at_most_4(tmp_path: Path) -> None:
    assert SYSTEMD_ANALYZE is not None
    unit = tmp_path / "routerd.service"  # systemd-analyze wants a unit file name it knows the type of
    shutil.copy(ROOT / "etc/routerd.service", unit)
    result = subprocess.run([SYSTEMD_ANALYZE, "security", "--offline=true", "--threshold=40", str(unit)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    level = re.search(r"Overall exposure level for routerd.service: ([0-9.]+)", result.stdout)
    assert level is not None and float(level.group(1)) <= 4.0


def test_the_systemd_unit_uses_readiness_credentials_and_the_config_exit_status() -> None:
    from routerd.tap import EXIT_CONFIG

    unit = (ROOT / "etc/routerd.service").read_text()
    for line in ("Type=notify", f"RestartPreventExitStatus={EXIT_CONFIG}",
                 "ExecReload=/bin/kill -HUP $MAINPID",
                 "LoadCredential=cluster-token:", "Environment=ROUTERD_CLUSTER_TOKEN_FILE=%d/cluster-token"):
        assert f"\n{line}" in unit, line


def test_a_node_notifies_systemd_once_it_listens_and_exits_78_on_a_config_error(tmp_path: Path) -> None:
    import socket

    port = free_port()
    write_models(tmp_path, {"chat": {"model": "../weights/chat.sim.json"}}, {"chat": FAST_TEXT})
    cfg = tmp_path / "node.yaml"
    cfg.write_text(json.dumps({"server": {"bind": f"127.0.0.1:{port}"}, "models": {"config_dir": "models"},
                               "llama": {"binary_path": [*SIM, "llama-server"]},
                               "cluster": {"store_dir": "store"}}))
    address = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(address)
        listener.settimeout(30)
        node = subprocess.Popen([ROUTERD, "run", "--config", str(cfg)], cwd=tmp_path,
                                env={**os.environ, "NOTIFY_SOCKET": address},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            message = listener.recv(4096).decode()
            # READY comes after the listener is open: the node answers at once
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            assert conn.getresponse().status == 200
            conn.close()
        finally:
            stop(node, timeout=15)
    assert message.startswith("READY=1\n") and f":{port}" in message
    cfg.write_text(json.dumps({"server": {"bind": "nowhere"}}))
    bad = subprocess.run([ROUTERD, "run", "--config", str(cfg)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 78 and "server.bind" in bad.stderr
