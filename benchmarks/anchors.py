"""Near-limit reverse proxies to measure routerd against (issue 20): nginx and Go's standard library.

Both proxy every request to one backend URL over a keep-alive pool and stream answers through
unbuffered, as routerd does:

* **nginx** (``/usr/sbin/nginx`` or ``nginx`` on ``PATH``): ``proxy_pass`` to an ``upstream`` with a
  ``keepalive`` pool, one process (``master_process off``, so the process measured is the one
  worker), ``proxy_buffering off``, access log on (routerd writes its access line too).
* **Go** (``go`` on ``PATH``, Debian's ``golang-go``): ``httputil.NewSingleHostReverseProxy`` with
  ``FlushInterval: -1``, built at run time into a temporary directory with ``GOPROXY=off`` and
  ``GO111MODULE=off`` (standard library only: nothing is downloaded), run with
  ``GOMAXPROCS=1`` (one worker, like the other proxies).

:func:`start_nginx` and :func:`start_go` return the proxy's URL and process, or raise
:class:`Missing` with a sentence saying why the anchor is skipped.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from _harness import free_port

GO_PROXY = """package main

import (
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"time"
)

func main() {
	target, err := url.Parse(os.Args[2])
	if err != nil {
		log.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.FlushInterval = -1
	proxy.Transport = &http.Transport{
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
	}
	log.Fatal(http.ListenAndServe("127.0.0.1:"+os.Args[1], proxy))
}
"""

NGINX_CONF = """worker_processes 1;
master_process off;
daemon off;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log {root}/access.log;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    upstream backend {{
        server {backend};
        keepalive 256;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
"""


class Missing(Exception):
    """The anchor cannot run here; the message says why."""



def _wait_listening(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise Missing(f"{what} exited with status {proc.returncode} at start")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise Missing(f"{what} did not listen on port {port} within {timeout:.0f} s")


def _host_port(backend_url: str) -> str:
    return backend_url.split("://", 1)[1].rstrip("/")


def start_nginx(backend_url: str, root: Path) -> tuple[str, subprocess.Popen[bytes]]:
    binary = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if binary is None:
        raise Missing("nginx is not installed (no nginx on PATH nor /usr/sbin/nginx)")
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = root / "nginx.conf"
    conf.write_text(NGINX_CONF.format(root=root, backend=_host_port(backend_url), port=port))
    proc = subprocess.Popen([binary, "-p", str(root), "-c", str(conf)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_listening(port, proc, "nginx")
    return f"http://127.0.0.1:{port}", proc


def start_go(backend_url: str, root: Path) -> tuple[str, subprocess.Popen[bytes]]:
    go = shutil.which("go")
    if go is None:
        raise Missing("go is not installed (Debian: apt-get install golang-go)")
    root.mkdir(parents=True, exist_ok=True)
    (root / "main.go").write_text(GO_PROXY)
    env = {**os.environ, "GOPROXY": "off", "GOFLAGS": "", "GO111MODULE": "off", "CGO_ENABLED": "0",
           "GOPATH": str(root / "gopath"), "GOCACHE": str(root / "gocache")}
    build = subprocess.run([go, "build", "-o", str(root / "proxy"), str(root / "main.go")], env=env,
                           capture_output=True, text=True)
    if build.returncode != 0:
        raise Missing(f"the Go proxy did not build: {build.stderr.strip()[:300]}")
    port = free_port()
    proc = subprocess.Popen([str(root / "proxy"), str(port), backend_url],
                            env={**os.environ, "GOMAXPROCS": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_listening(port, proc, "the Go proxy")
    return f"http://127.0.0.1:{port}", proc
