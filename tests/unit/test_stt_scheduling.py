"""Selector-less STT scheduling (spec "Registration and health"; reference §6.6; scenarios 43-44)."""

from __future__ import annotations

import pytest

from routerd.catalog.model import Capabilities
from routerd.routing.stt import NoSTT, RoundRobinCounter, choose_stt, stt_candidates
from routerd.wire.records import ModelRecord
from routerd.wire.status import RuntimeStatus

STT = Capabilities(stt=True)
ME = "master"


def rec(node_id: str, filename: str = "whisper.kcpps", *, available: bool = True,
        disabled: bool = False, caps: Capabilities = STT) -> ModelRecord:
    stem = filename.removesuffix(".kcpps")
    return ModelRecord(local_id=stem, public_id=stem, node_id=node_id, filename=filename,
                       capabilities=caps, available=available, disabled=disabled)


def status(node_id: str, active: int = 0, queued: int = 0,
           loaded: str | None = None) -> RuntimeStatus:
    return RuntimeStatus(node_id=node_id, active_requests=active, queued_requests=queued,
                         active_stt_config=loaded)


def statuses(*items: RuntimeStatus) -> dict[str, RuntimeStatus]:
    return {s.node_id: s for s in items}


def pick(candidates: list[ModelRecord], stats: dict[str, RuntimeStatus],
         counter: RoundRobinCounter | None = None, *, own: str = ME,
         queue_locally: bool = True) -> tuple[str, str]:
    chosen = choose_stt(candidates, stats, own, counter or RoundRobinCounter(),
                        queue_locally=queue_locally)
    return chosen.node_id, chosen.filename


# -- scenario 43: the tiers, in order ----------------------------------------------------


def test_loaded_local_stt_wins_even_when_the_master_is_busy() -> None:
    candidates = [rec(ME), rec("a"), rec("b")]
    stats = statuses(status(ME, active=9, loaded="whisper.kcpps"), status("a"), status("b"))
    assert pick(candidates, stats) == (ME, "whisper.kcpps")


def test_loaded_remote_with_least_active_plus_queued_wins_over_an_idle_node() -> None:
    candidates = [rec(ME), rec("a"), rec("b"), rec("c")]
    stats = statuses(status(ME, active=1), status("a", 2, 1, loaded="whisper.kcpps"),
                     status("b", 1, 1, loaded="whisper.kcpps"), status("c"))
    assert pick(candidates, stats) == ("b", "whisper.kcpps")


def test_wholly_idle_node_wins_when_nothing_is_loaded() -> None:
    candidates = [rec(ME), rec("a"), rec("b")]
    stats = statuses(status(ME, active=1), status("a"), status("b", queued=1))
    assert pick(candidates, stats) == ("a", "whisper.kcpps")


def test_master_queues_locally_when_every_node_is_busy() -> None:
    candidates = [rec(ME), rec("a"), rec("b")]
    stats = statuses(status(ME, active=5, queued=5), status("a", 1), status("b", 1))
    assert pick(candidates, stats) == (ME, "whisper.kcpps")


def test_remote_loaded_config_must_be_the_candidates_own_file() -> None:
    candidates = [rec(ME), rec("a", "whisper.kcpps")]
    stats = statuses(status(ME, active=1), status("a", 1, loaded="other.kcpps"))
    assert pick(candidates, stats) == (ME, "whisper.kcpps")


def test_local_loaded_config_must_match_the_local_file() -> None:
    candidates = [rec(ME, "small.kcpps"), rec("a")]
    stats = statuses(status(ME, active=1, loaded="large.kcpps"), status("a"))
    assert pick(candidates, stats) == ("a", "whisper.kcpps")


def test_idle_tier_includes_local_candidates() -> None:
    candidates = [rec(ME), rec("z")]
    stats = statuses(status(ME), status("z"))
    assert pick(candidates, stats) == (ME, "whisper.kcpps")


def test_without_a_local_candidate_the_shortest_remote_queue_wins() -> None:
    """Reference §10: a routing-only master falls through to the shortest remote queue."""
    candidates = [rec("a"), rec("b")]
    stats = statuses(status(ME, active=3), status("a", 1, 4), status("b", 9, 2))
    assert pick(candidates, stats) == ("b", "whisper.kcpps")


# -- scenario 44: a node that does not queue locally ---------------------------------------


def test_equal_remote_queues_rotate_and_nodes_without_status_are_never_picked() -> None:
    candidates = [rec("legacy"), rec("a"), rec("b"), rec(ME)]
    stats = statuses(status("a", 3, 2), status("b", 8, 2), status(ME, 1))
    counter = RoundRobinCounter()
    picks = [pick(candidates, stats, counter, queue_locally=False)[0] for _ in range(4)]
    assert picks == ["a", "b", "a", "b"]


def test_node_without_status_is_excluded_even_when_idle_and_loaded() -> None:
    candidates = [rec("legacy"), rec("a")]
    stats = statuses(status("a", 4, 4))
    assert pick(candidates, stats, queue_locally=False) == ("a", "whisper.kcpps")


# -- ties and the shared counter --------------------------------------------------------------


def test_ties_sort_by_node_and_filename_and_share_one_counter() -> None:
    candidates = [rec("b"), rec("a", "y.kcpps"), rec("a", "x.kcpps")]
    counter = RoundRobinCounter()
    idle = statuses(status("a"), status("b"))
    assert [pick(candidates, idle, counter) for _ in range(3)] == [
        ("a", "x.kcpps"), ("a", "y.kcpps"), ("b", "whisper.kcpps")]
    assert counter.value == 3
    loaded = statuses(status("a", 1, loaded="x.kcpps"), status("b", 1, loaded="whisper.kcpps"))
    assert pick(candidates, loaded, counter) == ("b", "whisper.kcpps"), "counter 3 % 2 = 1"
    assert counter.value == 4


def test_local_picks_do_not_advance_the_counter() -> None:
    counter = RoundRobinCounter()
    pick([rec(ME)], statuses(status(ME, 1, loaded="whisper.kcpps")), counter)
    pick([rec(ME)], statuses(status(ME, 1)), counter)
    assert counter.value == 0


def test_duplicate_records_of_one_config_count_once() -> None:
    alias = ModelRecord(local_id="alias", public_id="alias", node_id="a", filename="w.kcpps",
                        capabilities=STT)
    candidates = [rec("a", "w.kcpps"), alias, rec("b", "w.kcpps")]
    counter = RoundRobinCounter()
    stats = statuses(status("a"), status("b"))
    assert [pick(candidates, stats, counter)[0] for _ in range(2)] == ["a", "b"]


# -- candidates and failure ----------------------------------------------------------------


def test_candidates_are_stt_capable_available_and_enabled() -> None:
    records = [rec("a"), rec("b", available=False), rec("c", disabled=True),
               rec("d", caps=Capabilities(llm=True))]
    assert [r.node_id for r in stt_candidates(records)] == ["a"]


def test_unavailable_and_disabled_configs_are_never_chosen() -> None:
    candidates = [rec("a", available=False), rec("b", disabled=True), rec("c")]
    stats = statuses(status("a", loaded="whisper.kcpps"), status("b"), status("c", 5, 5))
    assert pick(candidates, stats) == ("c", "whisper.kcpps")


@pytest.mark.parametrize("candidates, stats", [
    ([], {}),
    ([rec("legacy")], {}),
    ([rec(ME, caps=Capabilities(llm=True))], statuses(status(ME))),
])
def test_no_candidate_is_503(candidates: list[ModelRecord],
                             stats: dict[str, RuntimeStatus]) -> None:
    with pytest.raises(NoSTT) as caught:
        choose_stt(candidates, stats, ME, RoundRobinCounter())
    assert (caught.value.status, caught.value.type, caught.value.reason) == (
        503, "backend_error", "no compatible transcription configuration is available")


def test_slave_with_only_a_busy_local_candidate_and_no_remote_has_none() -> None:
    with pytest.raises(NoSTT):
        choose_stt([rec("s1")], statuses(status("s1", 1)), "s1", RoundRobinCounter(),
                   queue_locally=False)
