"""The pure replica choice (``routerd.registry.replica_choice``, issue 33): properties under Hypothesis.

* affinity never leaves the chosen replica above the load bound (``c ×`` the mean load counting the
  request, rounded up to a whole job; or, when even the least loaded replica cannot stay under it,
  no more than that replica);
* with equal loads a key always lands on the same replica, whatever the candidates' order;
* removing a replica moves only the keys that were on it;
* a key whose replica is over the bound moves, and stays on the new replica afterwards;
* least_loaded picks a least loaded replica and breaks ties by the rotation turn, never by list order;
* the history keeps at most its cap, dropping the least recently used key.
"""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from routerd.registry.replica_choice import (
    TIE_TOLERANCE_S,
    AffinityHistory,
    Candidate,
    affinity,
    key_hash,
    least_loaded,
    rendezvous_order,
)

IDS = [f"node-{i}:llm" for i in range(8)]

loads = st.floats(min_value=0.0, max_value=500.0, allow_nan=False, allow_infinity=False)
costs = st.floats(min_value=0.01, max_value=50.0, allow_nan=False, allow_infinity=False)
bounds = st.floats(min_value=1.0, max_value=3.0, allow_nan=False, allow_infinity=False)
keys = st.text(min_size=1, max_size=40).map(key_hash)


@st.composite
def replica_sets(draw: st.DrawFn, min_size: int = 1) -> list[Candidate]:
    count = draw(st.integers(min_value=min_size, max_value=len(IDS)))
    ids = draw(st.permutations(IDS))[:count]
    cost = draw(costs)
    return [Candidate(replica, draw(loads), cost) for replica in ids]


def _bound_holds(chosen: Candidate, candidates: list[Candidate], c: float) -> bool:
    """Computed here from the definition, not with the module's own helper."""
    total = sum(x.load for x in candidates) + chosen.cost
    mean = total / len(candidates)
    least = min(x.load for x in candidates)
    after = chosen.load + chosen.cost
    jobs = math.ceil(c * mean / chosen.cost - 1e-9)
    return after <= jobs * chosen.cost + 1e-6 or after <= least + chosen.cost + 1e-6


@given(replica_sets(), keys, bounds, st.one_of(st.none(), st.sampled_from(IDS)))
def test_affinity_never_leaves_the_chosen_replica_above_the_load_bound(
        candidates: list[Candidate], hashed: str, c: float, last: str | None) -> None:
    choice = affinity(hashed, candidates, last, c)
    chosen = next(x for x in candidates if x.id == choice.id)
    assert _bound_holds(chosen, candidates, c)


@given(st.lists(keys, min_size=1, max_size=200), st.integers(min_value=2, max_value=8), bounds, costs)
def test_affinity_over_a_stream_of_requests_keeps_every_replica_within_the_bound(
        stream: list[str], count: int, c: float, cost: float) -> None:
    """Placing a stream of equal jobs one after another (none ending): after each placement the
    replica that took it holds at most ⌈c × the mean⌉ jobs (the integral algorithm's capacity)."""
    load = {replica: 0.0 for replica in IDS[:count]}
    history = AffinityHistory(1000)
    for hashed in stream:
        candidates = [Candidate(replica, value, cost) for replica, value in load.items()]
        choice = affinity(hashed, candidates, history.get(hashed), c)
        chosen = next(x for x in candidates if x.id == choice.id)
        assert _bound_holds(chosen, candidates, c)
        history.put(hashed, choice.id)
        load[choice.id] += cost
        placed = round(sum(load.values()) / cost)
        assert round(load[choice.id] / cost) <= math.ceil(c * placed / count - 1e-9)


@given(replica_sets(), keys, st.floats(min_value=0.0, max_value=100.0), bounds, st.randoms())
def test_with_equal_loads_a_key_always_lands_on_the_same_replica(
        candidates: list[Candidate], hashed: str, level: float, c: float, rng: object) -> None:
    equal = [Candidate(x.id, level, 1.0) for x in candidates]
    first = affinity(hashed, equal, None, c)
    shuffled = list(equal)
    rng.shuffle(shuffled)  # type: ignore[attr-defined]
    assert affinity(hashed, shuffled, None, c).id == first.id
    assert first.id == rendezvous_order(hashed, [x.id for x in equal])[0]
    again = affinity(hashed, shuffled, first.id, c)
    assert (again.id, again.reason) == (first.id, "affinity_hit")


@given(replica_sets(min_size=2), st.lists(keys, min_size=1, max_size=50, unique=True), bounds, st.data())
def test_removing_a_replica_moves_only_its_keys(
        candidates: list[Candidate], stream: list[str], c: float, data: st.DataObject) -> None:
    equal = [Candidate(x.id, 3.0, 1.0) for x in candidates]
    gone = data.draw(st.sampled_from([x.id for x in equal]))
    left = [x for x in equal if x.id != gone]
    for hashed in stream:
        before = affinity(hashed, equal, None, c).id
        after_fresh = affinity(hashed, left, None, c)
        after_remembered = affinity(hashed, left, before, c)
        if before != gone:
            assert after_fresh.id == before, "a key not on the removed replica moved"
            assert (after_remembered.id, after_remembered.reason) == (before, "affinity_hit")
        else:
            assert after_remembered.reason == "affinity_gone"


@given(keys, costs, st.floats(min_value=1.0, max_value=1.9))
def test_a_key_over_the_bound_moves_and_stays_moved(hashed: str, cost: float, c: float) -> None:
    """Two replicas (a bound of c ≥ 2 can never be exceeded by one of two)."""
    ids = IDS[:2]
    home = rendezvous_order(hashed, ids)[0]
    other = ids[1] if home == ids[0] else ids[0]
    history = AffinityHistory(10)
    history.put(hashed, home)
    # the home replica is far over the bound: the key moves to the other one
    heavy = [Candidate(home, 100.0 * cost, cost), Candidate(other, 0.0, cost)]
    moved = affinity(hashed, heavy, history.get(hashed), c)
    assert (moved.id, moved.reason, moved.left) == (other, "affinity_moved", home)
    history.put(hashed, moved.id)
    # the loads even out again: the key stays where it moved, not back home
    even = [Candidate(home, 5.0, cost), Candidate(other, 5.0, cost)]
    stay = affinity(hashed, even, history.get(hashed), c)
    assert (stay.id, stay.reason) == (other, "affinity_hit")


@given(replica_sets(), st.integers(min_value=0, max_value=1000))
def test_least_loaded_picks_a_replica_with_the_least_load(candidates: list[Candidate], turn: int) -> None:
    choice = least_loaded(candidates, turn)
    assert choice.load <= min(x.load for x in candidates) + TIE_TOLERANCE_S


@given(st.integers(min_value=2, max_value=8), st.floats(min_value=0.0, max_value=100.0), st.randoms())
def test_least_loaded_ties_are_broken_by_rotation_not_list_order(
        count: int, level: float, rng: object) -> None:
    """Equal loads: consecutive turns visit every tied replica once, whatever order they are listed in."""
    tied = [Candidate(replica, level, 1.0) for replica in IDS[:count]]
    seen = []
    for turn in range(count):
        listed = list(tied)
        rng.shuffle(listed)  # type: ignore[attr-defined]
        choice = least_loaded(listed, turn)
        assert choice.reason == "tie_rotation"
        seen.append(choice.id)
    assert sorted(seen) == sorted(x.id for x in tied)


@given(st.lists(keys, min_size=1, max_size=100), st.integers(min_value=1, max_value=10))
def test_history_keeps_at_most_its_cap_dropping_the_least_recently_used(stream: list[str], cap: int) -> None:
    history = AffinityHistory(cap)
    for hashed in stream:
        history.put(hashed, "node-0:llm")
        assert len(history) <= cap
    assert history.get(stream[-1]) == "node-0:llm"
    recent = list(dict.fromkeys(reversed(stream)))[:cap]
    dropped = [k for k in set(stream) if k not in recent]
    assert all(history.get(k) is None for k in dropped)


def test_key_hash_never_carries_the_key() -> None:
    hashed = key_hash("header:alice-session-42")
    assert len(hashed) == 16 and "alice" not in hashed
    assert hashed == key_hash("header:alice-session-42") != key_hash("header:alice-session-43")
