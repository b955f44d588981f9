"""Cluster URL normalisation (cluster reference §1.6, §3.4 item 5).

Every node URL the cluster compares, stores or allow-lists goes through :func:`normalise_url`
first, so ``HTTP://SLAVE:80/`` and ``http://slave`` are the same node:

* the scheme must be ``http`` or ``https``;
* there must be a host and no ``user:password@`` part;
* scheme and host are lower-cased, the scheme's default port is dropped;
* trailing ``/`` are removed from the path; query and fragment are dropped.

Anything else raises :class:`URLError` with a reason.  :func:`is_under` answers whether a full
target URL (path and query allowed) sits below a normalised base URL, which is what the cluster
client's allow-list and redirect checks need.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

import attrs

__all__ = ["AllowList", "URLError", "TargetParts", "is_under", "normalise_url", "split_target"]

_DEFAULT_PORTS = {"http": 80, "https": 443}
_HOST_NAME = re.compile(r"^[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?$")
_DOT_SEGMENTS = {".", "..", "%2e", "%2e%2e", ".%2e", "%2e."}
# Whitespace (``\s`` is ``str.isspace``), control characters and backslashes: one regex scan, not a
# Python call per character (the master checks every cluster call's URL).
_BAD_CHARS = re.compile(r"[\s\x00-\x1f\\]")


class URLError(ValueError):
    """A URL that cannot name a cluster node; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@attrs.frozen
class TargetParts:
    """A checked absolute URL: ``origin`` is ``scheme://host[:port]`` in normal form."""

    origin: str
    path: str
    query: str

    @property
    def base(self) -> str:
        """The normalised form of the URL (what :func:`normalise_url` returns)."""
        return self.origin + self.path.rstrip("/")


def split_target(url: str) -> TargetParts:
    """Check ``url`` like :func:`normalise_url` but keep its path and query as given."""
    if not isinstance(url, str):
        raise URLError("URL must be a string")
    text = url.strip()
    if not text:
        raise URLError("URL is empty")
    if _BAD_CHARS.search(text):
        raise URLError(f"URL {url!r} contains whitespace, control characters or backslashes")
    try:
        parts = urlsplit(text)
    except ValueError as exc:
        raise URLError(f"URL {url!r} is malformed: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise URLError(f"URL {url!r} must use http or https")
    netloc = parts.netloc
    if not netloc:
        raise URLError(f"URL {url!r} has no host")
    if "@" in netloc:
        raise URLError(f"URL {url!r} must not contain user information")
    host = _host(netloc, url)
    try:
        port = parts.port
    except ValueError:
        raise URLError(f"URL {url!r} has an invalid port") from None
    origin = f"{scheme}://{host}"
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        origin += f":{port}"
    return TargetParts(origin=origin, path=parts.path, query=parts.query)


def _host(netloc: str, url: str) -> str:
    if netloc.startswith("["):
        end = netloc.find("]")
        if end < 0:
            raise URLError(f"URL {url!r} has an unterminated IPv6 address")
        literal = netloc[1:end]
        try:
            address = ipaddress.IPv6Address(literal.split("%", 1)[0])
        except ValueError:
            raise URLError(f"URL {url!r} has an invalid IPv6 address") from None
        rest = netloc[end + 1:]
        if rest and not rest.startswith(":"):
            raise URLError(f"URL {url!r} has an invalid host")
        return f"[{address.compressed}]"
    host = netloc.rpartition(":")[0] if ":" in netloc else netloc
    host = host.lower()
    if not host:
        raise URLError(f"URL {url!r} has no host")
    if not _HOST_NAME.fullmatch(host) or ".." in host:
        raise URLError(f"URL {url!r} has an invalid host")
    return host


def normalise_url(url: str) -> str:
    """The normal form of a node base URL, e.g. ``HTTP://Slave:80/x/`` -> ``http://slave/x``."""
    return split_target(url).base


def _has_dot_segment(path: str) -> bool:
    return any(segment.lower() in _DOT_SEGMENTS for segment in path.split("/"))


def is_under(base: str, target: str) -> bool:
    """Whether ``target`` shares ``base``'s scheme, host and port and sits under its path.

    ``base`` may be given in any form :func:`normalise_url` accepts.  A target whose path holds
    ``.`` or ``..`` segments is never under anything (the server would resolve them away).
    Unparseable URLs are not under anything.
    """
    try:
        allowed = split_target(base)
        wanted = split_target(target)
    except URLError:
        return False
    if allowed.origin != wanted.origin or _has_dot_segment(wanted.path):
        return False
    return _path_under(allowed.path.rstrip("/"), wanted.path)


def _path_under(prefix: str, path: str) -> bool:
    return not prefix or path == prefix or path.startswith(prefix + "/")


#: Targets whose :meth:`AllowList.permits` answer one list remembers.
PERMITS_MEMO = 1024


class AllowList:
    """The base URLs cluster calls may go to, kept in normalised form.

    Bases are also indexed by origin, so :meth:`permits` parses the target once and compares paths
    only with the bases of its origin: it runs on every cluster call and forward, and a master
    allows every slave (one health-poll cycle over 200 slaves used to parse 80,000 URLs).
    Its answers are remembered per target (at most :data:`PERMITS_MEMO`, forgotten whenever the
    bases change): a master forwards to the same few URLs over and over, and parsing one cost
    ~8 µs of each forwarded request.
    """

    def __init__(self, urls: Iterable[str] = ()) -> None:
        self._bases: set[str] = set()
        self._paths: dict[str, set[str]] = {}  # origin -> path prefixes of its bases
        self._permits: dict[str, bool] = {}  # target -> permits(target), while the bases stand
        for url in urls:
            self.add(url)

    def add(self, url: str) -> str:
        """Allow ``url`` (raises :class:`URLError` if it is not a valid node URL)."""
        parts = split_target(url)
        base = parts.base
        self._permits.clear()
        self._bases.add(base)
        self._paths.setdefault(parts.origin, set()).add(parts.path.rstrip("/"))
        return base

    def remove(self, url: str) -> None:
        try:
            parts = split_target(url)
        except URLError:
            return
        self._permits.clear()
        self._bases.discard(parts.base)
        paths = self._paths.get(parts.origin)
        if paths is not None:
            paths.discard(parts.path.rstrip("/"))
            if not paths:
                del self._paths[parts.origin]

    def contains(self, url: str) -> bool:
        """Whether ``url`` itself is an allowed base (after normalisation)."""
        try:
            return normalise_url(url) in self._bases
        except URLError:
            return False

    def __contains__(self, url: object) -> bool:
        return isinstance(url, str) and self.contains(url)

    def permits(self, target: str) -> bool:
        """Whether the full URL ``target`` sits under one of the allowed bases (:func:`is_under`)."""
        known = self._permits.get(target)
        if known is None:
            memo = self._permits
            if len(memo) >= PERMITS_MEMO:
                memo.clear()
            known = memo[target] = self._check(target)
        return known

    def _check(self, target: str) -> bool:
        try:
            wanted = split_target(target)
        except URLError:
            return False
        prefixes = self._paths.get(wanted.origin)
        if not prefixes or _has_dot_segment(wanted.path):
            return False
        return any(_path_under(prefix, wanted.path) for prefix in prefixes)

    def bases(self) -> tuple[str, ...]:
        return tuple(sorted(self._bases))
