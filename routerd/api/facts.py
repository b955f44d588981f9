"""What the HTTP edge knows of one route before it reads a byte of the body: its facts.

A declared route (:class:`~routerd.api.routes.Declared`) carries its :class:`RouteFacts` — the auth
class its caller needs, the error family its refusals and errors are written in, the node phases it
is served in, and what happens to it in the others — and the site's
:class:`~routerd.api.routes.RouteTable` answers them for any path (:meth:`RouteTable.facts`).
Admission (:mod:`routerd.api.admission`) and the one error writer (:mod:`routerd.api.errors`) read
them from there.  A path no route declares has the facts of its namespace (:func:`namespace_facts`),
so an unknown path is refused, or answered 404, exactly as its neighbours are.

Pure: no Twisted, no Klein.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import attrs

from routerd.cluster.auth import RouteClass, route_class
from routerd.errors import ErrorStyle, style_for_path

#: A node's lifecycle phase (``Node.phase``).
Phase = Literal["starting", "ready", "draining"]
#: Served only once the node is ready (most routes).
READY: frozenset[Phase] = frozenset({"ready"})
#: Served while running jobs end during a drain too (a video job's poll and cancel).
READY_OR_DRAINING: frozenset[Phase] = frozenset({"ready", "draining"})
#: Served in every phase (health, metrics, the API's description).
EVERY_PHASE: frozenset[Phase] = frozenset({"starting", "ready", "draining"})


@attrs.frozen
class RouteFacts:
    """The facts of one route (see the module docstring)."""

    auth: RouteClass
    #: The error envelope its refusals and errors are written in (OpenAI's, or Ollama's).
    errors: ErrorStyle = "openai"
    #: The node phases it is served in; in any other it is refused 503 + ``Retry-After``.
    phases: frozenset[Phase] = READY
    #: A request it does not serve in a phase goes back to its owner (409 ``offload_returned``)
    #: instead of a 503: an owner's relay, which the owner then serves itself.
    returns: bool = False
    #: For a branch whose rest is another of this node's paths (a master's forwarded request):
    #: the prefix to strip; the route is served in the phases of the path it forwards to.
    forwards: str | None = None


def namespace_facts(path: str) -> RouteFacts:
    """The facts of a path no route declares: its namespace's auth class
    (:func:`~routerd.cluster.auth.route_class`) and error family
    (:func:`~routerd.errors.style_for_path`), served when ready."""
    return RouteFacts(route_class(path), style_for_path(path))


def served(facts_of: Callable[[str], RouteFacts], path: str, phase: str) -> bool:
    """Whether ``path`` is served in ``phase``, by the facts ``facts_of`` gives (a forwarding
    branch: whether the path it forwards to is)."""
    facts = facts_of(path)
    if facts.forwards is not None and path.startswith(facts.forwards + "/"):
        facts = facts_of(path[len(facts.forwards):])
    return phase in facts.phases


__all__ = ["EVERY_PHASE", "READY", "READY_OR_DRAINING", "Phase", "RouteFacts", "namespace_facts", "served"]
