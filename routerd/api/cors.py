"""CORS for browser clients (``server.cors_origins``).

A request whose ``Origin`` is listed gets ``Access-Control-Allow-Origin`` (that origin) and the
routerd headers a page may read.  A preflight (``OPTIONS`` with ``Access-Control-Request-Method``)
is answered 204 with the allowed methods and headers for a listed origin only; any other origin
gets 403 and no CORS headers, so the browser refuses the call.  ``*`` lists every origin.  With no
origins listed (the default) routerd sends no CORS headers and answers no preflight.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

ALLOW_METHODS = "GET, POST, DELETE, OPTIONS"
DEFAULT_ALLOW_HEADERS = "Authorization, Content-Type"
EXPOSE_HEADERS = "X-Routerd-Node, X-Routerd-Request-Id, X-Routerd-Lent-To, X-Routerd-Model"
MAX_AGE_S = 600


def normalise_origin(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


@attrs.frozen
class CorsPolicy:
    origins: frozenset[str]

    @classmethod
    def build(cls, origins: Iterable[str]) -> CorsPolicy:
        return cls(frozenset(normalise_origin(o) for o in origins))

    @property
    def enabled(self) -> bool:
        return bool(self.origins)

    def allows(self, origin: str | None) -> bool:
        if not origin:
            return False
        return "*" in self.origins or normalise_origin(origin) in self.origins

    def response_headers(self, origin: str) -> dict[str, str]:
        """Headers for an actual (non-preflight) request from an allowed ``origin``."""
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
                "Access-Control-Expose-Headers": EXPOSE_HEADERS}

    def preflight_headers(self, origin: str, requested_headers: str | None) -> dict[str, str]:
        """Headers of the 204 answer to an allowed ``origin``'s preflight."""
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
                "Access-Control-Allow-Methods": ALLOW_METHODS,
                "Access-Control-Allow-Headers": requested_headers or DEFAULT_ALLOW_HEADERS,
                "Access-Control-Max-Age": str(MAX_AGE_S)}


__all__ = ["CorsPolicy", "normalise_origin"]
