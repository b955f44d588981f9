"""Memory goes back to the system once a crowd of requests has gone (issue 14)."""

from __future__ import annotations

from twisted.internet.task import Clock

from routerd.serve.memory import Trimmer, malloc_trim


def test_trims_once_after_a_crowd_has_all_left_and_not_after_ordinary_traffic() -> None:
    clock = Clock()
    trims: list[int] = []
    trimmer = Trimmer(clock, lambda: trims.append(1), crowd=3, delay=1.0)
    for active in (1, 2):
        trimmer.entered(active)
    trimmer.left(1)
    trimmer.left(0)
    clock.advance(5)
    assert trims == [], "two requests are no crowd"
    for active in (1, 2, 3):
        trimmer.entered(active)
    trimmer.left(2)
    clock.advance(5)
    assert trims == [], "not while requests remain"
    trimmer.left(0)
    trimmer.left(0)
    clock.advance(0.5)
    assert trims == []
    clock.advance(0.5)
    assert trims == [1], "once, a delay after the last one left"
    trimmer.entered(1)
    trimmer.left(0)
    clock.advance(5)
    assert trims == [1], "the crowd is forgotten once trimmed"


def test_the_glibc_trim_can_be_called() -> None:
    if malloc_trim is not None:
        malloc_trim()
