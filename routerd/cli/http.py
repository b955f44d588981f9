"""A small blocking HTTP client for the ``routerd`` console command.

The console command runs once and exits, so it uses ``urllib`` rather than a reactor.  Every answer
is JSON; an HTTP error answer becomes :class:`ApiError` carrying the status and the server's message.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8080"


class ApiError(Exception):
    """The node answered with an error status (or could not be reached: status 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status
        self.message = message


def _error_message(raw: bytes) -> str:
    try:
        body = json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace").strip() or "(empty answer)"
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or error)
    if error is not None:
        return str(error)
    return json.dumps(body)


class Client:
    """Calls one node's HTTP API with an optional bearer key."""

    def __init__(self, url: str | None = None, key: str | None = None, timeout: float = 30.0,
                 environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.url = (url or env.get("ROUTERD_URL") or DEFAULT_URL).rstrip("/")
        self.key = key if key is not None else env.get("ROUTERD_KEY") or None
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None,
             query: Mapping[str, str | int | None] | None = None) -> Any:
        params = {k: str(v) for k, v in (query or {}).items() if v is not None}
        url = self.url + path + (("?" + urllib.parse.urlencode(params)) if params else "")
        data = None if body is None else json.dumps(body).encode()
        headers = {"accept": "application/json"}
        if data is not None:
            headers["content-type"] = "application/json"
        if self.key:
            headers["authorization"] = f"Bearer {self.key}"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as err:
            raise ApiError(err.code, _error_message(err.read())) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise ApiError(0, f"cannot reach {self.url}: {reason}") from None
        return json.loads(raw) if raw.strip() else {}

    def get(self, path: str, **query: str | int | None) -> Any:
        return self.call("GET", path, query=query)

    def post(self, path: str, body: Any = None, **query: str | int | None) -> Any:
        return self.call("POST", path, body if body is not None else {}, query=query)

    def delete(self, path: str, **query: str | int | None) -> Any:
        return self.call("DELETE", path, query=query)
