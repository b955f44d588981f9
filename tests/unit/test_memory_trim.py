"""Memory goes back to the system once a crowd of requests has gone."""

from __future__ import annotations

from twisted.internet.task import Clock

from routerd.inference.memory import Trimmer, malloc_trim


def test_trims_once_after_a_crowd_has_all_left_and_not_after_ordinary_traffic() -> None:
    clock = Clock()
    trims: list[int] = []
    trimmer = Trimmer(clock, lambda: trims.append(1), crowd=3, delay=1.0, collect=lambda: None)
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


def test_the_crowds_reference_cycles_are_collected_before_the_trim_even_without_glibc() -> None:
    clock = Clock()
    steps: list[str] = []
    for trim in (lambda: steps.append("trim"), None):
        trimmer = Trimmer(clock, trim, crowd=2, delay=1.0, collect=lambda: steps.append("collect"))
        trimmer.entered(1)
        trimmer.entered(2)
        trimmer.left(1)
        trimmer.left(0)
        clock.advance(1.0)
    assert steps == ["collect", "trim", "collect"]


def test_the_default_collection_frees_an_unreachable_cycle() -> None:
    import gc
    import weakref

    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.disable()
    try:
        clock = Clock()
        trimmer = Trimmer(clock, None, crowd=1, delay=0.0)
        trimmer.entered(1)
        trimmer.left(0)
        assert gone() is not None
        clock.advance(0)
        assert gone() is None
    finally:
        gc.enable()
