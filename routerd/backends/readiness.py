"""Readiness probes (reference cluster.md §4.2): how a probe asks (:func:`probe_url`) and the probes
of llama-server, sd-server and whisper-server, which more than one family runs.  A family's own
probes (KoboldCpp's liveness and capabilities, vLLM's health) are in its module under
:mod:`routerd.backends.families`.

A probe answers one question: "is the backend at ``base_url`` ready to serve
the config it was started with?"  Anything short of a clear yes — 503 while the
backend loads, connection refused before it listens, a timeout, a body that is
not the expected JSON — is "not yet"; the slot keeps polling until its deadline.

The judgements on the decoded body are pure functions, tested on their own.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet.defer import Deferred
from twisted.logger import Logger

log = Logger()

#: Per-probe HTTP timeout, seconds.
PROBE_TIMEOUT_S = 5.0

INACTIVE = "inactive"


class HTTPGetter(Protocol):
    """The treq-like client the probes need (``treq``, ``treq.client.HTTPClient``,
    ``treq.testing.StubTreq`` or a test fake).  ``get`` fires with a response
    that has ``.code`` and ``content() -> Deferred[bytes]``."""

    def get(self, url: str, *, timeout: float | None = None) -> Deferred[Any]: ...


#: ``probe(http, base_url, timeout) -> Deferred[bool]``.
Probe = Callable[[HTTPGetter, str, float], "Deferred[bool]"]


def _is_active_id(value: Any) -> bool:
    return isinstance(value, str) and value != "" and value != INACTIVE


def models_ready(body: Any) -> bool:
    """``GET /v1/models`` body of llama-server: ready unless the top-level
    ``model``/``id`` is ``inactive`` or every listed id is ``inactive``.  Both
    the OpenAI list (``data``) and llama-server's own (``models``) are read; an
    answer that lists nothing is taken as ready (the backend answered 2xx)."""
    if not isinstance(body, dict):
        return False
    if body.get("model") == INACTIVE or body.get("id") == INACTIVE:
        return False
    ids: list[Any] = []
    for key in ("data", "models"):
        entries = body.get(key)
        if isinstance(entries, list):
            for entry in entries:
                if isinstance(entry, dict):
                    ids.append(entry.get("id", entry.get("model", entry.get("name"))))
    if not ids:
        return True
    return any(_is_active_id(i) for i in ids)


def sd_models_ready(body: Any) -> bool:
    """``GET /sdapi/v1/sd-models`` body of sd-server: ready when some entry has a
    non-empty ``model_name``, ``title``, ``model`` or ``id`` other than ``inactive``.
    A bare list is expected; ``{"data": [...]}``/``{"models": [...]}`` are read too."""
    entries: Any = body
    if isinstance(body, dict):
        entries = body.get("data", body.get("models"))
    if not isinstance(entries, list):
        return False
    return any(
        isinstance(entry, dict)
        and any(_is_active_id(entry.get(k)) for k in ("model_name", "title", "model", "id"))
        for entry in entries
    )


async def _get(http: HTTPGetter, url: str, timeout: float) -> tuple[int, bytes]:
    response = await http.get(url, timeout=timeout)
    body = await response.content()  # always read: it releases the connection
    return int(response.code), bytes(body)


async def probe_url(http: HTTPGetter, url: str, timeout: float, judge: Callable[[Any], bool] | None) -> bool:
    """Whether ``GET url`` answers 2xx (and, with ``judge``, a JSON body it accepts); anything else,
    a refused connection or a timeout included, is "not yet"."""
    try:
        code, body = await _get(http, url, timeout)
    except Exception as e:  # connection refused, timeout, reset: not yet
        log.debug("probe {url}: {error}", url=url, error=repr(e))
        return False
    if not 200 <= code < 300:
        return False
    if judge is None:
        return True
    try:
        decoded = json.loads(body)
    except ValueError:
        return False
    return judge(decoded)


def probe_text(http: HTTPGetter, base_url: str, timeout: float = PROBE_TIMEOUT_S) -> Deferred[bool]:
    """llama-server (text, embeddings, multimodal): ``GET /v1/models``."""
    return Deferred.fromCoroutine(probe_url(http, base_url + "/v1/models", timeout, models_ready))


def probe_image(http: HTTPGetter, base_url: str, timeout: float = PROBE_TIMEOUT_S) -> Deferred[bool]:
    """sd-server: ``GET /sdapi/v1/sd-models``."""
    return Deferred.fromCoroutine(probe_url(http, base_url + "/sdapi/v1/sd-models", timeout, sd_models_ready))


def probe_stt(http: HTTPGetter, base_url: str, timeout: float = PROBE_TIMEOUT_S) -> Deferred[bool]:
    """whisper-server: ``GET /health`` 2xx."""
    return Deferred.fromCoroutine(probe_url(http, base_url + "/health", timeout, None))
