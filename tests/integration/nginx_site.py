"""A live node behind the shipped nginx site (``etc/nginx-routerd.conf``) on loopback ephemeral ports,
for the tests that check what reaches a client through it: the private nginx prefix, the node and
nginx started and stopped together (:func:`node_behind_nginx`), and a raw exchange over TLS that
sends a head and then its body in pieces as an upload does (:func:`ask`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.integration.nodes import FAST_TEXT, SIM, write_models
from tests.integration.processes import stop
from tests.integration.test_twistd_e2e import _wait_http
from tests.ports import free_port

ROOT = Path(__file__).parents[2]
ROUTERD = str(Path(sys.executable).parent / "routerd")
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def nginx_prefix(tmp_path: Path, upstream_port: int, tls_port: int, http_port: int) -> Path:
    """A private nginx prefix serving ``etc/nginx-routerd.conf`` (ports and certificate paths
    changed to the test's own, nothing else)."""
    prefix = tmp_path / "nginx"
    (prefix / "logs").mkdir(parents=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=routerd.example.internal", "-keyout", str(prefix / "key.pem"),
                    "-out", str(prefix / "cert.pem")], check=True, capture_output=True)
    site = (ROOT / "etc/nginx-routerd.conf").read_text()
    site = re.sub(r"^\s*listen \[::\]:.*\n", "", site, flags=re.MULTILINE)
    site = site.replace("listen 443 ssl http2;", f"listen 127.0.0.1:{tls_port} ssl http2;")
    site = site.replace("listen 80;", f"listen 127.0.0.1:{http_port};")
    site = site.replace("server 127.0.0.1:8080;", f"server 127.0.0.1:{upstream_port};")
    site = site.replace("/etc/ssl/certs/routerd.pem", str(prefix / "cert.pem"))
    site = site.replace("/etc/ssl/private/routerd.key", str(prefix / "key.pem"))
    (prefix / "routerd.conf").write_text(site)
    user = "user root;\n" if os.geteuid() == 0 else ""
    (prefix / "nginx.conf").write_text(
        f"{user}pid {prefix}/nginx.pid;\nerror_log stderr;\nevents {{}}\nhttp {{\n  access_log off;\n"
        + "".join(f"  {name}_temp_path {prefix}/{name};\n"
                  for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        + f"  include {prefix}/routerd.conf;\n}}\n")
    return prefix


def client_tls() -> ssl.SSLContext:
    """A TLS client context that accepts the prefix's self-signed certificate."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return context


@dataclass(frozen=True)
class NginxFront:
    """Where the shipped site listens (TLS) in front of the node, and the context to reach it."""

    tls_port: int
    context: ssl.SSLContext

    def connect(self, timeout: float = 30) -> ssl.SSLSocket:
        """A new TLS connection to the site."""
        plain = socket.create_connection(("127.0.0.1", self.tls_port), timeout=timeout)
        return self.context.wrap_socket(plain)

    def ask(self, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
        """Send ``head`` and then ``body`` in pieces, as an upload does; the status and body answered."""
        with self.connect() as conn:
            conn.sendall(head)
            try:
                for at in range(0, len(body), 65536):
                    conn.sendall(body[at:at + 65536])
            except OSError:
                pass  # the answer may have ended the upload: read it
            return read_answer(conn)


def read_answer(conn: ssl.SSLSocket) -> tuple[int, bytes]:
    """Read until the connection ends (or fails); the status and body of the answer."""
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


@contextmanager
def node_behind_nginx(tmp_path: Path, config: Mapping[str, Any]) -> Iterator[NginxFront]:
    """A node (one simulated ``chat`` model) run with ``config`` (its ``server.bind`` set to a free
    loopback port) behind the shipped nginx site; yields once the site answers ``/health``."""
    assert NGINX is not None
    port, tls_port, http_port = free_port(), free_port(), free_port()
    write_models(tmp_path, {"chat": {"model": "../weights/chat.sim.json", "contextsize": 2048}},
                 {"chat": FAST_TEXT})
    cfg = tmp_path / "node.yaml"
    server = {**config.get("server", {}), "bind": f"127.0.0.1:{port}"}
    cfg.write_text(json.dumps({"models": {"config_dir": "models"},
                               "llama": {"binary_path": [*SIM, "llama-server"]},
                               "cluster": {"store_dir": "store"}, **config, "server": server}))
    prefix = nginx_prefix(tmp_path, port, tls_port, http_port)
    nginx = [NGINX, "-p", str(prefix), "-c", str(prefix / "nginx.conf")]
    node = subprocess.Popen([ROUTERD, "run", "--config", str(cfg)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proxy = subprocess.Popen([*nginx, "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    front = NginxFront(tls_port, client_tls())
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", node)
        deadline = time.monotonic() + 10
        while True:
            try:
                assert front.ask(HEALTH)[0] == 200
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield front
    finally:
        proxy.terminate()
        proxy.wait(10)
        stop(node)
