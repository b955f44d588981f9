"""Who may call what (contract §4).

Route classes: ``/router/v1/node/*`` needs the cluster token; other ``/router/v1/*`` paths need an
admin key when any is configured; ``/metrics`` needs an admin key (or an ``auth.metrics_keys``
key) when any of those is configured; ``/health`` needs no key but shows node details only to a
caller who could use the inference paths; ``/openapi.json`` (the API's description, nothing of the
node) needs no key; the WebUI's files and redirects (``/``, ``/ui``, ``/ui/*``) need no key; every
other path needs an inference key when any is configured, and an admin key is accepted wherever
an inference key is.  Clients outside
``server.allowed_cidrs`` are refused first, on every path.  The client address is the peer's,
or — only when the peer is one of ``server.trusted_proxies`` — the nearest untrusted address of
its ``X-Forwarded-For``.  Token comparison is constant-time.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
from collections.abc import Iterable
from typing import Literal

import attrs

from routerd.config.keys import InferenceKey
from routerd.errors import HTTPError
from routerd.paths import NODE_PREFIX

#: ``ui``: the WebUI's static files and redirects (allowed networks, no key: the pages ask for it).
RouteClass = Literal["cluster", "admin", "inference", "health", "metrics", "docs", "ui"]
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def route_class(path: str) -> RouteClass:
    if path.startswith(NODE_PREFIX + "/") or path == NODE_PREFIX:
        return "cluster"
    if path.startswith("/router/"):
        return "admin"
    if path == "/health":
        return "health"
    if path == "/metrics":
        return "metrics"
    if path == "/openapi.json":
        return "docs"
    if path in ("/", "/ui") or path.startswith("/ui/"):
        return "ui"
    return "inference"


def bearer(header: bytes | None) -> str:
    if not header:
        return ""
    text = header.decode("latin-1").strip()
    scheme, _, value = text.partition(" ")
    if scheme.lower() != "bearer":
        return ""
    return value.strip()


def _matches(candidate: str, keys: Iterable[str]) -> bool:
    given = candidate.encode()
    found = False
    for key in keys:
        # Compare against every key so timing does not reveal which one matched.
        found |= hmac.compare_digest(given, key.encode())
    return found


@functools.lru_cache(maxsize=1024)
def _address(host: str) -> _Address | None:
    """``host`` as an address (IPv4-mapped IPv6 as IPv4); None when it is not one.  Cached: every
    request's peer is checked, and clients are few (the parse was ~3 % of a request)."""
    try:
        address = ipaddress.ip_address(host.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _within(networks: tuple[_Network, ...], host: str) -> bool:
    """Whether ``host`` is inside one of ``networks`` (remembered per policy by
    :meth:`AuthPolicy.client_allowed`)."""
    address = _address(host)
    return address is not None and any(address in net for net in networks)


def _remembered(known: dict[str, bool], networks: tuple[_Network, ...], host: str) -> bool:
    """:func:`_within`, looked up in (or added to) ``known``, one policy's answers for ``networks``."""
    found = known.get(host)
    if found is None:
        if len(known) >= 4096:  # a bound, as the shared cache had
            known.clear()
        found = known[host] = _within(networks, host)
    return found


def _unauthorized(message: str) -> HTTPError:
    return HTTPError(401, message, "unauthorized", "unauthorized")


@attrs.frozen
class AuthPolicy:
    inference_keys: tuple[str, ...]
    admin_keys: tuple[str, ...]
    cluster_token: str
    networks: tuple[_Network, ...]
    metrics_keys: tuple[str, ...] = ()
    trusted_proxies: tuple[_Network, ...] = ()
    #: The inference keys with their names, classes and limits (same order as ``inference_keys``).
    named_keys: tuple[InferenceKey, ...] = ()
    #: host -> allowed (:meth:`client_allowed`) and host -> trusted proxy (:meth:`proxy`): every
    #: request's client is checked, clients are few, and ``ipaddress``'s containment test is Python
    #: code.  Kept on the policy (a reload builds a new one) rather than in a cache keyed by
    #: (networks, host), whose key hashed every network in Python on each request
    #: (benchmarks/trees.py --profile: 27 calls a request there, 8 with these dicts).
    _allowed: dict[str, bool] = attrs.field(factory=dict, init=False, eq=False, repr=False, hash=False)
    _proxies: dict[str, bool] = attrs.field(factory=dict, init=False, eq=False, repr=False, hash=False)

    @classmethod
    def build(cls, inference_keys: Iterable[str], admin_keys: Iterable[str], cluster_token: str,
              allowed_cidrs: Iterable[str], *, metrics_keys: Iterable[str] = (),
              trusted_proxies: Iterable[str] = (), named_keys: Iterable[InferenceKey] = ()) -> AuthPolicy:
        keys = tuple(k.strip() for k in inference_keys)
        named = tuple(named_keys) or tuple(InferenceKey(f"key-{n}", k) for n, k in enumerate(keys, 1))
        return cls(
            keys,
            tuple(k.strip() for k in admin_keys),
            cluster_token.strip(),
            tuple(ipaddress.ip_network(c, strict=False) for c in allowed_cidrs),
            tuple(k.strip() for k in metrics_keys),
            tuple(ipaddress.ip_network(c, strict=False) for c in trusted_proxies),
            named,
        )

    def client_allowed(self, host: str) -> bool:
        return _remembered(self._allowed, self.networks, host)

    def proxy(self, host: str) -> bool:
        """Whether ``host`` is a trusted proxy (``server.trusted_proxies``)."""
        return _remembered(self._proxies, self.trusted_proxies, host)

    def _trusted(self, address: _Address | None) -> bool:
        return address is not None and any(address in net for net in self.trusted_proxies)

    def client_host(self, peer: str, forwarded_for: str | None) -> str:
        """The address the CIDR check applies to.

        ``X-Forwarded-For`` counts only when the peer is a trusted proxy; then the right-most
        address that is not itself a trusted proxy is the client (entries to its left were written
        by the client and prove nothing).  An unparseable entry stops the walk and is returned, so
        the CIDR check refuses it.
        """
        if not forwarded_for or not self._trusted(_address(peer)):
            return peer
        hops = [hop.strip() for hop in forwarded_for.split(",") if hop.strip()]
        client = peer
        for hop in reversed(hops):
            client = hop
            if not self._trusted(_address(hop)):
                break
        return client

    def check(self, path: str, client_host: str, authorization: bytes | None,
              cls: RouteClass | None = None) -> bool:
        """Raise ``HTTPError`` (401/403) unless the caller may use ``path`` (of route class ``cls``,
        by default its namespace's); returns whether the caller is authenticated for inference
        (what ``/health`` shows node details to)."""
        if not self.client_allowed(client_host):
            raise HTTPError(403, "client address is not allowed", "forbidden", "forbidden")
        if cls is None:
            cls = route_class(path)
        if cls == "ui":
            return False
        if cls == "inference" and not self.inference_keys:
            return True  # any caller (what inference_allowed says of any token), no token parsed
        token = bearer(authorization)
        if cls == "cluster":
            if not self.cluster_token:
                raise _unauthorized("cluster token is required")
            if not token or not _matches(token, (self.cluster_token,)):
                raise _unauthorized("invalid cluster token")
            return True
        if cls == "docs":
            return self.inference_allowed(token)
        if cls == "health":
            return self.inference_allowed(token) or (
                bool(token) and bool(self.cluster_token) and _matches(token, (self.cluster_token,)))
        if cls == "metrics":
            keys = self.admin_keys + self.metrics_keys
            if keys and (not token or not _matches(token, keys)):
                raise _unauthorized("a valid admin or metrics key is required")
            return True
        if cls == "admin":
            if self.admin_keys and (not token or not _matches(token, self.admin_keys)):
                raise _unauthorized("a valid admin key is required")
            return True
        if not self.inference_allowed(token):
            raise _unauthorized("a valid inference key is required")
        return True

    def inference_key(self, authorization: bytes | None) -> InferenceKey | None:
        """The named inference key the caller's bearer token is (None for an admin key, no key or
        an unknown one).  Every key is compared, in constant time, so timing tells nothing."""
        if not self.named_keys:
            return None
        token = bearer(authorization)
        if not token:
            return None
        given = token.encode()
        found: InferenceKey | None = None
        for entry in self.named_keys:
            if hmac.compare_digest(given, entry.key.encode()) and found is None:
                found = entry
        return found

    def inference_allowed(self, token: str) -> bool:
        """Whether ``token`` opens the inference paths: any token when no inference key is
        configured, else an inference or admin key."""
        if not self.inference_keys:
            return True
        return bool(token) and _matches(token, self.inference_keys + self.admin_keys)
