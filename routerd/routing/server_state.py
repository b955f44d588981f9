"""The Responses API's server-side state, which routerd refuses (README "APIs").

OpenAI's Responses API can keep a conversation on the server: ``store: true`` keeps a response for a
later ``previous_response_id`` to continue from.  routerd keeps no conversation state: a request may run
on any node of the cluster (lent, forwarded, or on another node after a restart), so a stored response
would be on one backend only, or on none (llama-server keeps none either).  A request asking for either
is refused with 400 ``unsupported_server_state`` before it queues; the client sends the whole
conversation as ``input`` instead.  ``store: false`` (or no ``store``) passes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from routerd.errors import HTTPError
from routerd.routing.classify import Route

CODE = "unsupported_server_state"


def refuse_server_state(route: Route, parsed: Mapping[str, Any] | None) -> None:
    """Raise 400 when a Responses request asks routerd to keep or continue a stored conversation."""
    if route.kind != "responses" or parsed is None:
        return
    previous = parsed.get("previous_response_id")
    if previous is not None:
        raise HTTPError(400, "previous_response_id is not supported: routerd keeps no conversation state "
                             "(send the whole conversation as input)", "invalid_request_error", CODE)
    if parsed.get("store") is True:
        raise HTTPError(400, "store: true is not supported: routerd keeps no responses (send store: false "
                             "or leave it out)", "invalid_request_error", CODE)
