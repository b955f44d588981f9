"""Routerd's own context gate: a text request whose estimated prompt cannot fit the window of the
backend slot that would serve it is refused (400 ``exceed_context_size_error``) before the backend
sees it.

The window is the backend's real one, not the config's ``contextsize``: llama-server splits
``--ctx-size`` over its ``--parallel`` slots (512 on two slots gives each 256) and caps a slot at
the model's training context, so after each load the gate reads the slot window from the backend's
``GET /props`` (``default_generation_settings.n_ctx``), once per backend process.  A backend that
does not answer it (another family) is not gated.

The prompt's size is estimated as lending's is (spec "LLM lending": body bytes over the model's
measured bytes per token) but pulled the other way by the ratio's spread: lending's estimate leans
to more tokens (a request thought too big merely stays with its owner), a refusal must lean to fewer
(a request is refused only when even the fewest tokens it plausibly holds fill the slot).  A model
with no measured profile yet has no estimate and is not gated: its backend answers an overflow itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs
from twisted.logger import Logger
from twisted.web.iweb import IAgent

from routerd.catalog.model import ModelConfig
from routerd.errors import HTTPError
from routerd.jsonvalues import json_int
from routerd.routing.call import Call
from routerd.routing.plan import SECTIONS
from routerd.routing.relay import collect

log = Logger()

#: ``prompt_tokens(call, model)``: the fewest prompt tokens a text call plausibly holds, or None.
PromptEstimate = Callable[[Call, ModelConfig], int | None]


def slot_window(props: object) -> int | None:
    """The per-slot context window in a llama-server ``/props`` answer, or None."""
    if not isinstance(props, dict):
        return None
    settings = props.get("default_generation_settings")
    n_ctx = json_int(settings.get("n_ctx")) if isinstance(settings, dict) else None
    return n_ctx if n_ctx is not None and n_ctx > 0 else None


def overflow(public_id: str, prompt_tokens: int, window: int) -> HTTPError | None:
    """The refusal of a prompt of at least ``prompt_tokens`` on a ``window``-token slot, or None when
    it may fit.  The backend refuses a prompt that fills its slot, as this does."""
    if prompt_tokens < window:
        return None
    return HTTPError(400, f"the request's prompt (at least {prompt_tokens} tokens, estimated) fills the "
                          f"{window}-token context window of each backend slot of model {public_id!r}",
                     "exceed_context_size_error", "context_exceeded")


@attrs.define(eq=False)
class ContextGate:
    """The slot windows of the configs' backends, and the gate on them."""

    agent: IAgent
    prompt_tokens: PromptEstimate
    #: (config file name, config hash) -> (the base URL of the process that reported it, its slot
    #: window or None when it reported none).
    _windows: dict[tuple[str, str], tuple[str, int | None]] = attrs.field(init=False, factory=dict)

    def _estimate(self, call: Call, model: ModelConfig) -> int | None:
        if call.route.runtime != "text" or SECTIONS.get(call.route.kind) != "llm":
            return None
        return self.prompt_tokens(call, model)

    def refuse_known(self, call: Call, model: ModelConfig, public_id: str) -> None:
        """Before the runtime is acquired: raise the 400 of :func:`overflow` when the window its
        config's last process reported cannot hold ``call`` (no model switch for a doomed request)."""
        known = self._windows.get((model.filename, model.config_hash))
        window = None if known is None else known[1]
        estimate = None if window is None else self._estimate(call, model)
        refusal = None if window is None or estimate is None else overflow(public_id, estimate, window)
        if refusal is not None:
            raise refusal

    async def check(self, call: Call, model: ModelConfig, base_url: str, public_id: str) -> None:
        """With the runtime held: raise the 400 of :func:`overflow` for a text generation ``call``
        that cannot fit the window of the process at ``base_url``."""
        estimate = self._estimate(call, model)
        if estimate is None:
            return
        window = await self.window(model, base_url)
        refusal = None if window is None else overflow(public_id, estimate, window)
        if refusal is not None:
            raise refusal

    async def window(self, model: ModelConfig, base_url: str) -> int | None:
        """The slot window of the process at ``base_url`` serving ``model`` (read once per process:
        a new load starts a new one)."""
        key = (model.filename, model.config_hash)
        known = self._windows.get(key)
        if known is not None and known[0] == base_url:
            return known[1]
        window: int | None = None
        try:
            response: Any = await self.agent.request(b"GET", (base_url + "/props").encode())
            body = await collect(response)
            if int(response.code) == 200:
                window = slot_window(json.loads(body))
        except Exception as exc:  # a backend without /props is simply not gated
            log.debug("no slot window from {url}: {error}", url=base_url, error=str(exc))
        self._windows[key] = (base_url, window)
        return window


__all__ = ["ContextGate", "PromptEstimate", "overflow", "slot_window"]
