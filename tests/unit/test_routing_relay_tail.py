"""The relay keeps the last TAIL_KEEP bytes of a stream (usage is read from them) without copying
the tail on every chunk (issue 14), and the usage reader finds the last report in it."""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone

from routerd.routing.relay import TAIL_KEEP, Relay
from routerd.routing.work import usage_from_tail


class Sink:
    def __init__(self) -> None:
        self.out: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.out.append(data)


def test_the_tail_is_the_last_bytes_whatever_the_chunking() -> None:
    stream = b"".join(b"data: {\"i\": %d}\n\n" % i for i in range(2000))
    for size in (1, 7, 500, 9000, len(stream)):
        done: Deferred[bytes] = Deferred()
        sink = Sink()
        relay = Relay(sink, lambda d: d, lambda: b"", done)
        for i in range(0, len(stream), size):
            relay.dataReceived(stream[i:i + size])
        relay.connectionLost(Failure(ResponseDone()))
        tails: list[bytes] = []
        done.addCallback(tails.append)
        assert tails == [stream[-TAIL_KEEP:]], size
        assert b"".join(sink.out) == stream


def test_usage_comes_from_the_last_event_that_reports_it_even_after_a_mention_in_content() -> None:
    tail = (b'data: {"usage": {"prompt_tokens": 1, "completion_tokens": 2}}\n\n'
            b'data: {"choices": [{"delta": {"content": "the word \\"usage\\""}}]}\n\n'
            b"data: [DONE]\n\n")
    assert usage_from_tail(tail) == (1, 2)
    last = tail + b'data: {"usage": {"prompt_tokens": 5, "completion_tokens": 6}}\n\n'
    assert usage_from_tail(last) == (5, 6)
