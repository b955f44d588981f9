"""The one admission decision both HTTP edges apply.

:func:`decide` is pure: from the caller's address, the request's :class:`~routerd.api.head.RequestHead`,
the node's phase, the free bytes of the replay budget and the node's :class:`EdgeRules`, it returns a
:class:`Verdict`.  It runs as soon as a head is complete, before a byte of the body is read, on the
lean channel and on twisted.web's channel alike; the edges only carry the verdict out.  In order:

1. a CORS preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``) from a listed
   origin on an allowed network is answered 204 with its headers; any other preflight 403;
2. the caller: ``server.allowed_cidrs`` (403) on the client address (the peer, or for a trusted proxy
   the nearest untrusted entry of the joined ``X-Forwarded-For`` list), then the key its route class
   needs (401): see :mod:`routerd.cluster.auth`; any request's ``Host`` and path must parse (400,
   first of all);
3. the node's phase: a route is served in the phases it is declared with (``/health``, ``/metrics``
   and ``/openapi.json`` in every one; a video job's poll and cancel while draining too, so running
   jobs end and their clients fetch the results; a master's forwarded request in the phases of the
   path it forwards to).  Otherwise a borrowed request (``X-Routerd-Offload: 1``) or a route declared
   ``returns`` (an owner's relay) goes back to its owner (409 ``offload_returned``), anything else
   gets 503 + ``Retry-After``;
   (an admitted request's verdict names its key and class: :attr:`Verdict.key_name`)
4. what a web page could make a browser send: a request no configured key vouches for meets
   :func:`~routerd.api.browser.browser_refusal` (its ``Host``, ``Origin`` and body type: 421, 403,
   415);
5. the body: a ``Content-Length`` over ``limits.max_body_bytes`` is a 413; a key with
   ``max_concurrent`` requests whose bodies are still arriving (counted from their heads; a whole
   body's request is the inference front's to count) a 429 ``key_limited``; a body that does not
   fit in the replay budget (``limits.replay_buffer_mb``), or in its holder's share of it (its
   key's, else its client's: ``server.max_client_buffer_share``), a 503 ``buffer_full`` +
   ``Retry-After``.  An admitted request reserves its whole ``Content-Length`` from the budget at
   once (``reserve``).

The auth class, the phases and the error family of every path come from the site's declared routes
(:meth:`~routerd.api.routes.RouteTable.facts`): admission keeps no path list of its own.  A refusal
is answered with ``Connection: close`` (its body is never read) in the route's error family, by the
one error writer (:mod:`routerd.api.errors`, which adds ``Retry-After`` to a
:class:`~routerd.errors.Saturated` refusal).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple, Protocol, get_args

import attrs

from routerd.api.browser import BrowserRules, browser_refusal, malformed, vouched
from routerd.api.cors import CorsPolicy
from routerd.api.facts import RouteFacts, namespace_facts, served
from routerd.api.head import RequestHead
from routerd.cluster.auth import AuthPolicy, RouteClass
from routerd.config.keys import PRIORITY_CLASSES
from routerd.errors import ErrorStyle, HTTPError, Saturated, StatusError
from routerd.lending.offload import offload_returned
from routerd.routing.call import KEY_CLASS_HEADER, KEY_NAME_HEADER
from routerd.routing.key_limits import key_limited

Headers = tuple[tuple[bytes, bytes], ...]


@attrs.frozen
class EdgeRules:
    """What admission reads of the node's configuration (replaced whole on a reload)."""

    policy: AuthPolicy
    max_body_bytes: int
    cors: CorsPolicy = CorsPolicy.build(())
    #: The facts of a path: the site's declared routes (``Dispatch.route_facts``), by default the
    #: path's namespace's.
    routes: Callable[[str], RouteFacts] = namespace_facts
    #: What a web page may not make a browser send (:mod:`routerd.api.browser`); none by default.
    browser: BrowserRules = BrowserRules()
    #: The route classes whose callers showed a key the policy checks
    #: (:func:`~routerd.api.browser.vouched`), decided once per policy rather than per request.
    vouched: frozenset[RouteClass] = attrs.field(init=False, eq=False, repr=False)

    @vouched.default
    def _vouched(self) -> frozenset[RouteClass]:
        return frozenset(cls for cls in get_args(RouteClass) if vouched(self.policy, cls))


class BudgetView(Protocol):
    """What admission reads of the replay budget: the bytes a holder (a request's key, else its
    client) may still take, and how many of its admitted requests' bodies are still arriving."""

    def free_for(self, holder: str) -> int: ...

    def arriving(self, holder: str) -> int: ...


class Verdict(NamedTuple):
    """Admit (``error`` None) or refuse.  ``headers`` go on the answer either way (CORS);
    ``reserve`` is the body's bytes to take from the replay budget before reading it.

    Immutable, one per request: a named tuple (built in one C call; as a frozen attrs class its
    ten fields were set one by one, 77 opcodes a request; ops.py)."""

    error: StatusError | None = None
    headers: Headers = ()
    authenticated: bool = False
    preflight: bool = False
    reserve: int = 0
    #: The name and class of the inference key that admitted the request ("" when none): on the
    #: inference paths from the key itself, on the cluster's paths from the master's
    #: ``X-Routerd-Key-Name``/``-Class`` (the cluster token vouches for them).  Never the key.
    key_name: str = ""
    key_class: str = ""
    #: The error family of the request's route: what its refusal and its errors are written in.
    errors: ErrorStyle = "openai"
    #: Who the reserved bytes are counted to (see :class:`BudgetView`).
    holder: str = ""
    #: The client the decision applied to (the peer, or behind a trusted proxy the forwarded
    #: client): what the access line names.  "" before it was known (a malformed head).
    client: str = ""

    @property
    def refused(self) -> bool:
        return self.error is not None


def _refuse(error: StatusError, facts: RouteFacts, headers: Headers = (), client: str = "") -> Verdict:
    return Verdict(error=error, headers=headers, errors=facts.errors, client=client)


def _cors_headers(values: dict[str, str]) -> Headers:
    return tuple((name.encode("latin-1"), value.encode("latin-1")) for name, value in values.items())


def decide(rules: EdgeRules, head: RequestHead, peer: str, phase: str,
           budget_free: int | BudgetView | None) -> Verdict:
    """The verdict on ``head`` from ``peer`` (see the module docstring); ``budget_free`` is the
    replay budget (its free bytes, or a view of what each holder may take), None when the node
    keeps none."""
    facts = rules.routes(head.path)
    error = malformed(head)
    if error is not None:
        return _refuse(error, facts)
    fields = head.fields
    path = head.path
    policy = rules.policy
    cors = rules.cors
    # membership and subscripts rather than dict.get: no calls for the fields a request lacks
    origin = fields["origin"] if cors.enabled and "origin" in fields else None
    host = policy.client_host(peer, fields["x-forwarded-for"]) if "x-forwarded-for" in fields else peer
    if origin is not None and head.method == "OPTIONS" and "access-control-request-method" in fields:
        if not policy.client_allowed(host):
            return _refuse(HTTPError(403, "client address is not allowed", "forbidden", "forbidden"),
                           facts, (), host)
        if not cors.allows(origin):
            return _refuse(HTTPError(403, f"origin {origin} is not in server.cors_origins",
                                     "forbidden", "forbidden"), facts)
        return Verdict(preflight=True, headers=_cors_headers(
            cors.preflight_headers(origin, fields.get("access-control-request-headers"))), client=host)
    headers: Headers = _cors_headers(cors.response_headers(origin)) \
        if origin is not None and cors.allows(origin) else ()
    authorization = fields["authorization"] if "authorization" in fields else None
    cls = facts.auth
    try:
        authenticated = policy.check(path, host, authorization.encode("latin-1")
                                     if authorization is not None else None, cls)
    except StatusError as err:
        return _refuse(err, facts, headers, host)
    if phase != "ready" and not served(rules.routes, path, phase):
        if fields.get("x-routerd-offload") == "1" or facts.returns:
            # A borrowed request goes back to its owner, who serves it itself; so does one an owner
            # relays through a master that is starting or draining.
            return _refuse(offload_returned(f"helper node is {phase}"), facts, headers, host)
        return _refuse(Saturated(503, f"this node is {phase}; retry later", phase), facts, headers, host)
    if cls not in rules.vouched:
        error = browser_refusal(rules.browser, head, cors, cls, authenticated)
        if error is not None:
            return _refuse(error, facts, headers, host)
    length = head.length or 0
    if length > rules.max_body_bytes:
        return _refuse(HTTPError(413, f"request body is larger than {rules.max_body_bytes} bytes",
                                 "request_too_large", "request_too_large"), facts, headers, host)
    key_name, key_class, concurrent = _key_of(policy, cls, fields, authorization)
    # who the body's bytes are counted to: its key, else its client; a master's forwarded
    # requests (counted where they were admitted) to no one
    holder = "" if cls == "cluster" else f"key {key_name}" if key_name else f"client {host}"
    if isinstance(budget_free, int):
        free = budget_free
    elif budget_free is not None:
        free = budget_free.free_for(holder)
        if length and concurrent and budget_free.arriving(holder) >= concurrent:
            # counted from the head: a key's requests whose bodies are still arriving
            return _refuse(key_limited(key_name, f"max_concurrent ({concurrent} requests at once)", 1),
                           facts, headers, host)
    if budget_free is not None and length > free:
        return _refuse(buffer_full(), facts, headers, host)
    return Verdict(headers=headers, authenticated=authenticated, reserve=length, key_name=key_name,
                   key_class=key_class, errors=facts.errors, client=host, holder=holder)


def _key_of(policy: AuthPolicy, cls: RouteClass, fields: Mapping[str, str],
            authorization: str | None) -> tuple[str, str, int]:
    """The admitting key's name and class (see :attr:`Verdict.key_name`), and its
    ``max_concurrent`` (0: none, or not counted here)."""
    if cls == "inference" and policy.named_keys:
        key = policy.inference_key(authorization.encode("latin-1") if authorization is not None else None)
        return ("", "", 0) if key is None else (key.name, key.priority, key.limits.max_concurrent)
    if cls == "cluster":
        name = fields.get(KEY_NAME_HEADER, "")
        klass = fields.get(KEY_CLASS_HEADER, "")
        return name, klass if klass in PRIORITY_CLASSES else "", 0
    return "", "", 0


def buffer_full() -> Saturated:
    return Saturated(503, "this node's request buffer (limits.replay_buffer_mb) is full; retry later",
                     "buffer_full")


__all__ = ["BudgetView", "EdgeRules", "Verdict", "buffer_full", "decide"]
