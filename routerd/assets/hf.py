"""Hugging Face origins for ``bind`` (cluster reference §8.5, §8.6).

An origin is ``hf://owner/repo@commit/path``.  :func:`verify_origin` accepts it only when the Hub
says the revision is exactly that commit (``GET /api/models/{repo}/revision/{commit}`` → ``sha``)
and the file at ``path`` in that commit is stored in LFS with the wanted sha256
(``POST /api/models/{repo}/paths-info/{commit}`` with ``paths`` → ``[{path, lfs: {oid, size}}]``).
The HTTP client is injected (treq, or ``treq.testing.StubTreq`` in tests); this needs the Hub to
be reachable from the node.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import quote

import attrs
import treq

HF_ENDPOINT = "https://huggingface.co"
_ORIGIN = re.compile(r"^hf://([A-Za-z0-9][A-Za-z0-9._-]*)/([A-Za-z0-9][A-Za-z0-9._-]*)@([0-9a-f]{40})/(.+)$")


class BindRefused(ValueError):
    """The origin is malformed or the Hub does not confirm it; the message says which."""

    def __init__(self, message: str, status: int = 400, code: str = "bind_refused") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


@attrs.frozen
class HfOrigin:
    repo: str
    commit: str
    path: str

    def __str__(self) -> str:
        return f"hf://{self.repo}@{self.commit}/{self.path}"


def parse_origin(value: Any) -> HfOrigin:
    found = _ORIGIN.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        raise BindRefused("hf must be hf://owner/repo@<40-hex commit>/path")
    path = found.group(4)
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts) or "\\" in path or "\x00" in path:
        raise BindRefused("the path inside the repository must be relative, without '..'")
    return HfOrigin(f"{found.group(1)}/{found.group(2)}", found.group(3), path)


async def _json(http: Any, method: str, url: str, **kwargs: Any) -> Any:
    try:
        response = await http.request(method, url, **kwargs)
        body = await treq.content(response)
    except Exception as exc:  # noqa: BLE001 - any transport failure refuses the bind
        raise BindRefused(f"the Hugging Face Hub is not reachable: {exc}", 502, "hub_unreachable") from None
    if response.code == 404:
        raise BindRefused(f"the Hub has no such repository, revision or file ({url})")
    if response.code != 200:
        raise BindRefused(f"the Hub answered HTTP {response.code} for {url}", 502, "hub_error")
    try:
        return json.loads(body)
    except ValueError:
        raise BindRefused(f"the Hub answered something that is not JSON for {url}") from None


async def verify_origin(http: Any, origin: HfOrigin, sha256: str, endpoint: str = HF_ENDPOINT) -> int | None:
    """The file's size when the Hub confirms ``origin`` holds ``sha256``; :class:`BindRefused` else."""
    repo = quote(origin.repo, safe="/")
    info = await _json(http, "GET", f"{endpoint}/api/models/{repo}/revision/{origin.commit}")
    if not isinstance(info, dict) or info.get("sha") != origin.commit:
        raise BindRefused(f"revision {origin.commit} of {origin.repo} does not resolve to that commit")
    rows = await _json(http, "POST", f"{endpoint}/api/models/{repo}/paths-info/{origin.commit}",
                       data={"paths": origin.path, "expand": "false"})
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict) or row.get("path") != origin.path:
            continue
        lfs = row.get("lfs")
        oid = lfs.get("oid") if isinstance(lfs, dict) else None
        if not isinstance(oid, str):
            raise BindRefused(f"{origin.path} is not stored in LFS at {origin.commit}")
        oid = oid.removeprefix("sha256:")
        if oid != sha256:
            raise BindRefused(f"{origin.path} at {origin.commit} has LFS sha256 {oid}, not {sha256}")
        size = row.get("size")
        return size if isinstance(size, int) else None
    raise BindRefused(f"{origin.path} is not in {origin.repo} at {origin.commit}")
