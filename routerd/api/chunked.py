"""A chunked request body under the framing rules h11 and nginx read it by.

twisted.web's chunked decoder ends a trailer line at the first CRLF only, so in ``0\\r\\n\\n`` the
bare LF starts a "trailer" that runs into the next request's head: twisted.web read a second
request as trailer fields of the first, where h11 and nginx see two requests.  Two readers
splitting one stream differently is how requests are smuggled past a proxy, so a bare CR or LF in
the trailer section is malformed framing here: the request is refused (400) and the connection
closed.  :func:`strict_chunked` swaps the decoder of a request twisted.web is about to read.

Twisted internals used (``_ChunkedTransferDecoder``, its ``_buffer``, ``_start`` and
``_dataReceived_TRAILER``, ``HTTPChannel._transferDecoder``) are those of the Twisted range pinned
in pyproject.toml; tests/unit/test_chunked_framing.py fails if they move.
"""

from __future__ import annotations

from typing import Any

from twisted.web.http import _ChunkedTransferDecoder, _MalformedChunkedDataError


class StrictChunkedDecoder(_ChunkedTransferDecoder):
    """twisted.web's decoder, refusing a bare CR or LF in the trailer section."""

    def _dataReceived_TRAILER(self) -> bool:  # noqa: N802 - Twisted's name
        buffer = self._buffer
        end = buffer.find(b"\r\n", self._start)
        line = buffer[:end] if end >= 0 else buffer[:-1] if buffer.endswith(b"\r") else buffer
        if b"\n" in line or b"\r" in line:
            raise _MalformedChunkedDataError("bare CR or LF in the chunked trailer section")
        return bool(super()._dataReceived_TRAILER())


def strict_chunked(channel: Any) -> None:
    """Give ``channel`` (an ``HTTPChannel`` whose request head is complete) the strict decoder
    when its request body is chunked."""
    decoder = getattr(channel, "_transferDecoder", None)
    if type(decoder) is _ChunkedTransferDecoder:
        channel._transferDecoder = StrictChunkedDecoder(decoder.dataCallback, decoder.finishCallback)


__all__ = ["StrictChunkedDecoder", "strict_chunked"]
