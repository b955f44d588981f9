"""A request body already in memory, as an ``IBodyProducer`` for twisted's ``Agent``; and the
JSON of a body or an answer, decoded once.

``FileBodyProducer`` streams through a cooperator task; a buffered body is
written in one call instead, which keeps the proxy's per-request cost low.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IConsumer
from twisted.web.iweb import IBodyProducer
from zope.interface import implementer


@implementer(IBodyProducer)
class BytesProducer:
    def __init__(self, body: bytes) -> None:
        self.body = body
        self.length = len(body)

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        consumer.write(self.body)
        return succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


def json_loads(raw: bytes) -> Any:
    """``json.loads(raw)``: the same value, or the same error.

    ``json.loads`` sniffs a bytes document's encoding (UTF-8, -16 or -32) before decoding it, about
    six calls each time; a document that opens with ``{`` and then a byte other than NUL is UTF-8
    to that sniff (tests/unit/test_routing_body.py holds it to ``json.loads``), so it is decoded
    here as ``json.loads`` would decode it, by the decoder ``json.loads`` hands a text that opens
    with ``{`` (no BOM) when given no options (ops.py: 33 opcodes a document fewer, 66 a request).
    A request's body and its answer are parsed this way."""
    if raw[:1] == b"{" and raw[1:2] != b"\x00":
        return _decode(raw.decode("utf-8", "surrogatepass"))
    return json.loads(raw)


def json_loads_text(text: str) -> Any:
    """``json.loads(text)`` for a ``str``: the same value, or the same error (the decoder it hands
    a text that does not open with a BOM; ops.py: 33 opcodes a document fewer)."""
    if text[:1] == "\ufeff":
        return json.loads(text)  # its own error for a BOM
    return _decode(text)


#: What ``json.loads`` decodes a ``str`` with when given no options (its ``_default_decoder``).
_decode = json.JSONDecoder().decode
