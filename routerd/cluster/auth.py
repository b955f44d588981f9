"""Who may call what (contract §4).

Three route classes: ``/router/v1/node/*`` needs the cluster token; other
``/router/v1/*`` paths need an admin key when any is configured; every other
path needs an inference key when any is configured.  Clients outside
``server.allowed_cidrs`` are refused first.  Token comparison is constant-time.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable
from typing import Literal

import attrs

from routerd.errors import HTTPError

RouteClass = Literal["cluster", "admin", "inference"]
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def route_class(path: str) -> RouteClass:
    if path.startswith("/router/v1/node/") or path == "/router/v1/node":
        return "cluster"
    if path.startswith("/router/"):
        return "admin"
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


@attrs.frozen
class AuthPolicy:
    inference_keys: tuple[str, ...]
    admin_keys: tuple[str, ...]
    cluster_token: str
    networks: tuple[_Network, ...]

    @classmethod
    def build(cls, inference_keys: Iterable[str], admin_keys: Iterable[str], cluster_token: str,
              allowed_cidrs: Iterable[str]) -> AuthPolicy:
        return cls(
            tuple(k.strip() for k in inference_keys),
            tuple(k.strip() for k in admin_keys),
            cluster_token.strip(),
            tuple(ipaddress.ip_network(c, strict=False) for c in allowed_cidrs),
        )

    def client_allowed(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in net for net in self.networks)

    def check(self, path: str, client_host: str, authorization: bytes | None) -> None:
        """Raise ``HTTPError`` (401/403) unless the caller may use ``path``."""
        if not self.client_allowed(client_host):
            raise HTTPError(403, "client address is not allowed", "forbidden", "forbidden")
        cls = route_class(path)
        token = bearer(authorization)
        if cls == "cluster":
            if not self.cluster_token:
                raise HTTPError(401, "cluster token is required", "unauthorized", "unauthorized")
            if not token or not _matches(token, (self.cluster_token,)):
                raise HTTPError(401, "invalid cluster token", "unauthorized", "unauthorized")
            return
        keys = self.admin_keys if cls == "admin" else self.inference_keys
        if keys and (not token or not _matches(token, keys)):
            raise HTTPError(401, f"a valid {cls} key is required", "unauthorized", "unauthorized")
