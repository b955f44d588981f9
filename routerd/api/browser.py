"""What a web page could make a browser send to the node, and what admission refuses of it.

A node without keys trusts its network position: whoever reaches its port may use it.  A web page
the operator opens in a browser reaches loopback too, so on every request that no configured key
vouches for (a keyless route: any route of a node without keys, the inference routes of a node with
admin keys only) admission applies three rules, :func:`browser_refusal`:

1. **Host** (DNS rebinding: a page's own name made to resolve to 127.0.0.1): the ``Host`` must be a
   name the node answers to — an IP literal (a rebinding needs a name), ``localhost`` or a name
   under ``.localhost``, the host of ``cluster.public_url``, the host of ``server.bind``, or one of
   ``server.allowed_hosts`` (``*`` there: any name).  Else 421 ``unknown_host``.  The WebUI's
   files, ``/openapi.json`` and a ``/health`` that shows no node details are the same for anyone
   and are not checked.
2. **Origin**: a request that may change state (any method but GET, HEAD, OPTIONS) sent by a page
   of another origin — its ``Sec-Fetch-Site`` is ``cross-site`` or ``same-site``, or its ``Origin``
   is neither the origin of the ``Host`` it was sent to nor that of ``cluster.public_url`` — is 403
   ``cross_origin``, unless the origin is in ``server.cors_origins``.
3. **Body type**: a page may send a body without a preflight only as ``text/plain``,
   ``application/x-www-form-urlencoded`` or ``multipart/form-data``.  A ``text/plain`` body, or a
   ``multipart/form-data`` one outside the upload routes (:data:`MULTIPART_PATHS`), is 415
   ``unsupported_media_type``: JSON goes as ``application/json``.  ``text/plain`` is the label an
   HTML form (which older browsers send without ``Origin``) can give a JSON body.  A form cannot
   write JSON as ``application/x-www-form-urlencoded`` (it percent-encodes braces and quotes), and a
   script that labels JSON so always sends ``Origin`` (rule 2), so that label stays taken: it is
   what ``curl -d`` sends, and keyless loopback stays a one-command ``curl``.

A request that carries a key the node checks cannot come from a drive-by page: a browser sends an
``Authorization`` header only after a preflight, which only ``server.cors_origins`` pass.

Whatever the rules, the names a request gives must parse (:func:`malformed`): a ``Host`` that is no
``host[:port]`` or a path whose percent escapes are not UTF-8 is a 400.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterable
from urllib.parse import unquote_to_bytes, urlsplit

import attrs

from routerd.api.cors import CorsPolicy
from routerd.api.head import RequestHead, bad_request
from routerd.cluster.auth import AuthPolicy, RouteClass
from routerd.config.schema import Config
from routerd.errors import HTTPError

#: Methods that change nothing (a page's GET cannot read the answer without CORS).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Body types a page may send without a preflight (the Fetch standard's CORS-safelisted types).
SIMPLE_TYPES = frozenset({"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"})
#: The simple types refused on a JSON route (see rule 3 of the module docstring).
REFUSED_TYPES = frozenset({"text/plain", "multipart/form-data"})
#: Routes whose body is a ``multipart/form-data`` upload (audio for speech-to-text).
MULTIPART_PATHS = frozenset({"/v1/audio/transcriptions", "/v1/audio/translations", "/api/extra/transcribe"})
#: Route classes whose answer is the same for anyone (the WebUI's files, the API description).
_STATIC_CLASSES = frozenset({"ui", "docs"})

#: ``host[:port]``: a reg-name (RFC 3986 unreserved, sub-delims, pct-encoded) or a bracketed IP literal.
_AUTHORITY = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~!$&'()*+,;=%-]*)(?::([0-9]{0,5}))?")


def malformed(head: RequestHead) -> HTTPError | None:
    """400 for a ``Host`` that is no ``host[:port]``, or a path whose escapes are not UTF-8."""
    fields = head.fields
    host = fields["host"] if "host" in fields else None
    if host is not None and _AUTHORITY.fullmatch(host) is None:
        return bad_request("Host must be host[:port]")
    path = head.path
    if "%" in path:
        try:
            unquote_to_bytes(path).decode("utf-8")
        except UnicodeDecodeError:
            return bad_request("the request path's percent escapes are not UTF-8")
    return None


@functools.lru_cache(maxsize=1024)
def split_authority(authority: str) -> tuple[str, int | None]:
    """``host[:port]`` as (lower-case host without brackets or a final dot, port or None).
    Remembered: every request's ``Host`` is split, and a node answers to few names (a hit is one
    call where the split took 8)."""
    match = _AUTHORITY.fullmatch(authority.strip())
    if match is None:
        return "", None
    host, port = match.group(1), match.group(2)
    return host.strip("[]").rstrip(".").lower(), int(port) if port else None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@attrs.frozen
class BrowserRules:
    """The names the node answers to, and whether the rules apply at all (``enabled``: the node's
    edge; a bare edge built in code applies none)."""

    enabled: bool = False
    #: Names (lower-case, no port) beyond IP literals and loopback names.
    hosts: frozenset[str] = frozenset()
    #: ``server.allowed_hosts`` holds ``*``: any name.
    any_host: bool = False
    #: The origin of ``cluster.public_url`` (``scheme://host[:port]``, lower-case), or "".
    public_origin: str = ""

    @classmethod
    def build(cls, allowed_hosts: Iterable[str], public_url: str = "", bind_host: str = "") -> BrowserRules:
        names = {name.strip().rstrip(".").lower() for name in allowed_hosts if name.strip()}
        public_origin = ""
        if public_url:
            parts = urlsplit(public_url)
            if parts.hostname:
                names.add(parts.hostname.rstrip(".").lower())
                public_origin = _origin(parts.scheme, parts.hostname, parts.port)
        if bind_host:
            names.add(bind_host.strip("[]").lower())
        return cls(True, frozenset(names - {"*"}), "*" in names, public_origin)

    def knows(self, host: str) -> bool:
        """Whether ``host`` (lower-case, no port) is a name the node answers to."""
        return (self.any_host or not host or host in self.hosts or host == "localhost"
                or host.endswith(".localhost") or _is_ip(host))


def browser_rules(config: Config) -> BrowserRules:
    """The rules of a node with ``config`` (its edge applies them)."""
    return BrowserRules.build(config.server.allowed_hosts, config.cluster.public_url, config.server.host)


def _origin(scheme: str, host: str, port: int | None) -> str:
    scheme = scheme.lower()
    if port is None:
        port = 443 if scheme == "https" else 80
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host.lower()}:{port}"


def _origin_of(origin: str) -> str:
    """``origin`` as ``scheme://host:port`` (the port made explicit), or "" when it is none."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return ""
    if not parts.scheme or not parts.hostname:
        return ""
    return _origin(parts.scheme, parts.hostname, port)


def vouched(policy: AuthPolicy, cls: RouteClass) -> bool:
    """Whether an admitted request of ``cls`` showed a key the node checks (cluster token, admin,
    metrics or inference key), rather than being let in by its address alone."""
    if cls == "cluster":
        return True
    if cls == "admin":
        return bool(policy.admin_keys)
    if cls == "metrics":
        return bool(policy.admin_keys or policy.metrics_keys)
    if cls == "inference":
        return bool(policy.inference_keys)
    return False


def unknown_host(host: str) -> HTTPError:
    return HTTPError(421, f"this node does not answer to the name {host!r}: set cluster.public_url or "
                          "list it in server.allowed_hosts", "invalid_request_error", "unknown_host")


def cross_origin(origin: str) -> HTTPError:
    return HTTPError(403, f"a request from the web page at {origin!r} (another origin) may not change "
                          "this node: list the origin in server.cors_origins", "forbidden", "cross_origin")


def unsupported_type(content_type: str) -> HTTPError:
    return HTTPError(415, f"a body of type {content_type!r} is not taken here: send it as "
                          "application/json", "invalid_request_error", "unsupported_media_type")


def browser_refusal(rules: BrowserRules, head: RequestHead, cors: CorsPolicy, cls: RouteClass,
                    shows_details: bool) -> HTTPError | None:
    """The refusal of an admitted request that no key vouched for (see the module docstring), or
    None.  ``shows_details``: the answer would show the node's details (``/health``)."""
    if not rules.enabled or cls in _STATIC_CLASSES:
        return None
    fields = head.fields
    # membership and subscripts rather than dict.get: no calls for the fields a request lacks
    raw_host = fields["host"] if "host" in fields else ""
    host, port = split_authority(raw_host)
    if (cls != "health" or shows_details) and not rules.knows(host):
        return unknown_host(raw_host)
    if head.method in SAFE_METHODS:
        return None
    origin = fields["origin"] if "origin" in fields else None
    if origin is not None and cors.allows(origin):
        return None
    if "sec-fetch-site" in fields and fields["sec-fetch-site"].strip().lower() in ("cross-site", "same-site"):
        return cross_origin(origin or fields.get("referer", "") or "?")
    if origin is not None:
        sent = _origin_of(origin)
        scheme = sent.partition("://")[0] or "http"
        if not sent or (sent != _origin(scheme, host, port) and sent != rules.public_origin):
            return cross_origin(origin)
    if head.length or head.chunked:
        media = _media_type(fields["content-type"]) if "content-type" in fields else ""
        if media in REFUSED_TYPES and not (media == "multipart/form-data" and _upload(head.path)):
            return unsupported_type(media)
    return None


@functools.lru_cache(maxsize=256)
def _media_type(content_type: str) -> str:
    """A ``Content-Type``'s media type, lower-case (remembered: clients send the same few)."""
    return content_type.partition(";")[0].strip().lower()


def _upload(path: str) -> bool:
    return path.rstrip("/") in MULTIPART_PATHS


__all__ = ["MULTIPART_PATHS", "REFUSED_TYPES", "SAFE_METHODS", "SIMPLE_TYPES", "BrowserRules",
           "browser_refusal", "browser_rules", "cross_origin", "malformed", "split_authority", "unknown_host",
           "unsupported_type", "vouched"]
