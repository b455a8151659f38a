"""Admission as pure code: budget, pools, quarantine cap, priority, breaker, leases.

Slots are counted from the detector's record (its leases). Most rules here are written
with the fleet's remediations as node states; ``admission`` turns those into the record a
detector would hold for them (one lease each, a heat cordon's outside the budget), so the
rules are checked against leases. ``leases=False`` checks a detector run recorded before
leases (labels and pending starts), which replays as it ran."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from policy.models import Action
from tests.workflows.fakes import xid_verdict
from workflows.admission import Admission
from workflows.leases import Lease
from workflows.messages import DetectorState, FleetObservation, NodeStatus, PendingStart
from workflows.settings import DetectorSettings
from workflows.transitions import NodeState

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def recorded(state: DetectorState, obs: FleetObservation, now: datetime = NOW) -> None:
    """The record a detector holds for the remediations ``obs`` shows: one lease each (a
    heat cordon's outside the budget), with the state Temporal reports; leases of nodes no
    longer shown end (their remediation closed). A lease already held keeps its slot."""
    shown = {r.node: r for r in obs.remediating}
    for node in [n for n in state.leases if n not in shown]:
        del state.leases[node]
    for node, r in shown.items():
        lease = state.leases.get(node)
        if lease is None:
            state.leases[node] = Lease(node=node, token="t", granted_at=now,
                                       workflow_id=f"remediation-{node}",
                                       slot=r.state != NodeState.CORDONED, state=r.state,
                                       pool=obs.pool_of.get(node, ""))
        else:
            lease.state = r.state


def admission(settings: DetectorSettings, state: DetectorState, obs: FleetObservation,
              now: datetime = NOW, *, leases: bool = True) -> Admission:
    if leases:
        recorded(state, obs, now)
    return Admission(settings, state, obs, now, leases=leases)


def decide(settings: DetectorSettings, obs: FleetObservation,
           state: DetectorState | None = None, *,
           leases: bool = True) -> tuple[list[str], list[str]]:
    adm = admission(settings, state or DetectorState(), obs, NOW, leases=leases)
    started, waiting = [], []
    for c in adm.queue:
        why = adm.blocked(c)
        if why is None:
            adm.admit(c)
            started.append(c.node)
        else:
            waiting.append(f"{c.node}: {why}")
    return started, waiting


def obs(verdicts: list, remediating: list | None = None, managed: int = 10,
        pools: dict[str, str] | None = None) -> FleetObservation:
    pool_of = pools or {}
    sizes: dict[str, int] = {}
    for p in pool_of.values():
        sizes[p] = sizes.get(p, 0) + 1
    return FleetObservation(managed_nodes=managed, readable_nodes=managed, verdicts=verdicts,
                            remediating=remediating or [], pool_of=pool_of, pool_sizes=sizes)


def test_before_leases_the_budget_counted_labelled_nodes_and_pending_starts() -> None:
    state = DetectorState(pending=[PendingStart(node="n9", at=NOW - timedelta(seconds=5))])
    o = obs([xid_verdict("n1"), xid_verdict("n2")],
            [NodeStatus(node="n8", state=NodeState.REPAIRING)])
    started, waiting = decide(DetectorSettings(max_unavailable=3), o, state, leases=False)
    assert started == ["n1"]
    assert waiting == ["n2: budget full (3/3)"]


def test_before_leases_a_stale_pending_start_freed_its_slot_after_the_grace_period() -> None:
    state = DetectorState(pending=[PendingStart(node="n9", at=NOW - timedelta(minutes=6))])
    started, _ = decide(DetectorSettings(max_unavailable=1), obs([xid_verdict("n1")]), state,
                        leases=False)
    assert started == ["n1"]


def test_quarantined_nodes_hold_no_slot_but_count_against_the_quarantine_cap() -> None:
    """Any start may end in quarantine (a failed repair), so at the cap none starts."""
    q = [NodeStatus(node="n7", state=NodeState.QUARANTINED)]
    o = obs([xid_verdict("n1", 64, Action.QUARANTINE), xid_verdict("n2")], q)
    started, waiting = decide(DetectorSettings(max_unavailable=2, max_quarantined=2), o)
    assert started == ["n1"], "quarantined nodes hold no budget slot"
    assert waiting == ["n2: quarantine cap reached (2/2)"], "n1's start counts toward it"
    o = obs([xid_verdict("n2")], [*q, NodeStatus(node="n8", state=NodeState.QUARANTINED)])
    _, waiting = decide(DetectorSettings(max_unavailable=2, max_quarantined=2), o)
    assert waiting == ["n2: quarantine cap reached (2/2)"]


def test_the_quarantine_cap_is_on_by_default_and_never_below_one() -> None:
    assert DetectorSettings().max_quarantined == "5%"
    o = obs([xid_verdict("n2")], [NodeStatus(node="n7", state=NodeState.QUARANTINED)],
            managed=10)
    _, waiting = decide(DetectorSettings(max_unavailable=2), o)
    assert waiting == ["n2: quarantine cap reached (1/1)"]
    started, _ = decide(DetectorSettings(max_unavailable=2), obs([xid_verdict("n2")], [
        NodeStatus(node="n7", state=NodeState.QUARANTINED)], managed=40))
    assert started == ["n2"], "5% of 40 is 2"


def _quarantined(*nodes: str) -> list[NodeStatus]:
    return [NodeStatus(node=n, state=NodeState.QUARANTINED) for n in nodes]


def test_the_outcome_breaker_trips_on_remediations_ending_in_quarantine() -> None:
    """A broken Job template quarantines every node it touches: three new quarantines
    within the hour stop admissions, whatever the budget, until resume."""
    settings = DetectorSettings(max_unavailable=5, max_quarantined=None)
    state = DetectorState()
    # The first observation only learns who is quarantined already.
    decide(settings, obs([], _quarantined("old1", "old2", "old3")), state)
    assert state.recently_quarantined == {} and not state.breaker_open
    for tick, q in enumerate((["a"], ["a", "b"])):
        adm = admission(settings, state, obs([], _quarantined("old1", "old2", "old3", *q)),
                        NOW + timedelta(minutes=10 * (tick + 1)))
        assert not state.breaker_open, adm
    started, waiting = decide(settings, obs([xid_verdict("n1")], _quarantined(
        "old1", "old2", "old3", "a", "b", "c")), state)
    assert state.breaker_open and started == [] and waiting == ["n1: breaker open"]
    assert state.breaker_reason.startswith(
        "3 remediations ended in quarantine within 1:00:00 (a, b, c; limit 3)")
    assert state.breaker_nodes == ["a", "b", "c"], "the nodes that tripped it, not n1"


def test_quarantines_outside_the_window_or_released_do_not_count() -> None:
    settings = DetectorSettings(max_unavailable=5, max_quarantined=None,
                                breaker_quarantine_window=timedelta(minutes=30))
    state = DetectorState(quarantined_seen=[])
    for minutes, q in ((0, ["a"]), (20, ["b"]), (40, ["b", "c"]), (45, ["c", "d"])):
        admission(settings, state, obs([], _quarantined(*q)), NOW + timedelta(minutes=minutes))
    # a (at 0) left the window; b, c, d are within it: three, at the limit.
    assert sorted(state.recently_quarantined) == ["b", "c", "d"] and state.breaker_open
    off = DetectorState(quarantined_seen=[])
    for minutes, q in ((0, ["a"]), (1, ["a", "b"]), (2, ["a", "b", "c"])):
        admission(settings.model_copy(update={"breaker_max_quarantines": 0}), off,
                  obs([], _quarantined(*q)), NOW + timedelta(minutes=minutes))
    assert not off.breaker_open, "0 turns the outcome breaker off"


def test_pool_limits_apply_under_the_fleet_limit() -> None:
    pools = {"a1": "a", "a2": "a", "a3": "a", "a4": "a", "b1": "b", "b2": "b"}
    o = obs([xid_verdict(n) for n in ("a1", "a2", "b1", "b2")], pools=pools, managed=6)
    settings = DetectorSettings(max_unavailable=3, pool_label="pool",
                                breaker_max_flagged_percent=100,
                                pool_max_unavailable={"a": "25%", "*": 1})
    started, waiting = decide(settings, o)
    assert started == ["a1", "b1"]
    assert waiting == ["a2: pool a full (1/1)", "b2: pool b full (1/1)"]


def test_most_severe_first_then_longest_waiting() -> None:
    state = DetectorState(first_seen={"old": NOW - timedelta(hours=1), "new": NOW})
    o = obs([xid_verdict("new", 79), xid_verdict("old", 79),
             xid_verdict("q", 64, Action.QUARANTINE), xid_verdict("r", 48, Action.RESET)])
    started, waiting = decide(DetectorSettings(max_unavailable=2, max_quarantined=None), o, state)
    assert started == ["q", "old"]
    assert [w.split(":")[0] for w in waiting] == ["new", "r"]


def test_breaker_trips_on_many_newly_flagged_nodes_and_blocks_every_start() -> None:
    state = DetectorState()
    o = obs([xid_verdict(f"n{i}") for i in range(5)], managed=10)
    started, waiting = decide(DetectorSettings(max_unavailable=5,
                                               breaker_max_flagged_percent=30), o, state)
    assert started == [] and len(waiting) == 5
    assert state.breaker_open and "5 of 10" in state.breaker_reason
    assert state.breaker_nodes == [f"n{i}" for i in range(5)], "each gets an Event"


def test_unreadable_nodes_count_toward_neither_side_of_the_breaker() -> None:
    o = obs([xid_verdict(f"n{i}") for i in range(3)], managed=100)
    o.readable_nodes = 50
    state = DetectorState()
    decide(DetectorSettings(max_unavailable=5, breaker_max_flagged_percent=5), o, state)
    assert state.breaker_open, "3 of 50 readable is 6%, over 5%"


def test_breaker_window_catches_a_fault_spreading_over_several_ticks() -> None:
    settings = DetectorSettings(max_unavailable=10, breaker_max_flagged_percent=30,
                                breaker_window=timedelta(minutes=10))
    state = DetectorState()
    for tick, nodes in enumerate((["n0", "n1"], ["n2"], ["n3"])):
        at = NOW + timedelta(minutes=tick)
        Admission(settings, state, obs([xid_verdict(n) for n in nodes]), at)
    assert state.breaker_open, "4 of 10 nodes within 10 minutes is over 30%"
    assert "within 0:10:00" in state.breaker_reason


def test_without_a_window_the_same_spread_does_not_trip() -> None:
    settings = DetectorSettings(max_unavailable=10, breaker_max_flagged_percent=30)
    state = DetectorState()
    for tick, nodes in enumerate((["n0", "n1"], ["n2"], ["n3"])):
        Admission(settings, state, obs([xid_verdict(n) for n in nodes]),
                  NOW + timedelta(minutes=tick))
    assert not state.breaker_open


def test_flags_older_than_the_window_are_forgotten() -> None:
    settings = DetectorSettings(max_unavailable=10, breaker_max_flagged_percent=30,
                                breaker_window=timedelta(minutes=5))
    state = DetectorState()
    for tick, nodes in enumerate((["n0", "n1"], ["n2"], ["n3"])):
        Admission(settings, state, obs([xid_verdict(n) for n in nodes]),
                  NOW + timedelta(minutes=10 * tick))
    assert not state.breaker_open


def test_shards_split_the_fleet_disjointly_and_merge_back() -> None:
    from workflows.ids import shard_of
    from workflows.messages import merge_observations

    names = [f"gpu-node-{i:05d}" for i in range(1, 1001)]
    buckets = [[n for n in names if shard_of(n, 3) == s] for s in range(3)]
    assert sorted(n for b in buckets for n in b) == names
    assert all(250 < len(b) < 420 for b in buckets), [len(b) for b in buckets]
    parts = [FleetObservation(managed_nodes=len(b), readable_nodes=len(b) - 1,
                              verdicts=[xid_verdict(b[0])], errors=[f"{b[1]}: down"],
                              remediating=[NodeStatus(node=b[2], state=NodeState.DRAINING)],
                              pool_sizes={"a": len(b)}, pool_gpus={"a": 8 * len(b)})
             for b in buckets]
    merged = merge_observations(parts)
    assert merged.managed_nodes == 1000 and merged.readable_nodes == 997
    assert len(merged.verdicts) == 3 and len(merged.remediating) == 3
    assert merged.pool_sizes == {"a": 1000} and merged.pool_gpus == {"a": 8000}


def test_an_operators_request_is_not_held_back_by_the_quarantine_cap() -> None:
    from workflows.messages import ManualRemediation

    state = DetectorState(manual=[ManualRemediation(node="n3", action=Action.RESET,
                                                    operator="bob", reason="NaNs")])
    o = obs([xid_verdict("n2")], [NodeStatus(node="n7", state=NodeState.QUARANTINED)])
    started, waiting = decide(DetectorSettings(max_unavailable=3), o, state)
    assert started == ["n3"]
    assert waiting == ["n2: quarantine cap reached (1/1)"]


# ------------------------------------------------------------------ heat


def hot(node: str) -> object:
    return xid_verdict(node, 0, Action.THERMAL)


def seen_hot(*nodes: str, ago: timedelta = timedelta(minutes=5)) -> DetectorState:
    return DetectorState(first_seen={n: NOW - ago for n in nodes})


def test_heat_is_cordoned_with_the_drain_budget_full_under_its_own_cap() -> None:
    """A cordon does not drain: a hot node does not wait behind repairs for a slot, and
    it takes none; the cap (10% of 20 nodes: 2) counts cordoned nodes and its starts."""
    o = obs([hot("h1"), hot("h2"), hot("h3"), xid_verdict("n1")],
            [NodeStatus(node="d1", state=NodeState.DRAINING),
             NodeStatus(node="c1", state=NodeState.CORDONED)], managed=20)
    started, waiting = decide(DetectorSettings(max_unavailable=1), o,
                              seen_hot("h1", "h2", "h3", "n1"))
    assert started == ["h1"], waiting
    assert waiting == ["n1: budget full (1/1)", "h2: thermal cordon cap reached (2/2)",
                       "h3: thermal cordon cap reached (2/2)"]


def test_heat_waits_out_its_debounce_and_zero_means_the_first_reading() -> None:
    o = obs([hot("h1")])
    _, waiting = decide(DetectorSettings(), o, seen_hot("h1", ago=timedelta(seconds=20)))
    assert waiting == ["h1: hot for 20s of the 60s debounce"]
    started, _ = decide(DetectorSettings(), o, seen_hot("h1", ago=timedelta(seconds=60)))
    assert started == ["h1"]
    started, _ = decide(DetectorSettings(thermal_debounce=timedelta(0)), o)
    assert started == ["h1"], "first reading"
    # A break in the readings starts the count again (first_seen forgets the node).
    state = seen_hot("h1", ago=timedelta(minutes=5))
    decide(DetectorSettings(), obs([]), state)
    _, waiting = decide(DetectorSettings(), o, state)
    assert waiting == ["h1: hot for 0s of the 60s debounce"]


def test_heat_in_the_budget_when_configured_so() -> None:
    s = DetectorSettings(max_unavailable=1, cordoned_counts_against_budget=True)
    o = obs([hot("h1")], [NodeStatus(node="c1", state=NodeState.CORDONED)])
    _, waiting = decide(s, o, seen_hot("h1"))
    assert waiting == ["h1: budget full (1/1)"]


def test_a_heat_cordon_that_must_drain_waits_for_a_slot_first_in_line() -> None:
    """Its request comes before any new start; granted, the slot is held until the node's
    label leaves 'cordoned' (the remediation writes 'draining' after the grant)."""
    cordoned = NodeStatus(node="c1", state=NodeState.CORDONED)
    state = DetectorState(slot_requests={"c1": NOW - timedelta(minutes=1)})
    busy = [cordoned, NodeStatus(node="d1", state=NodeState.DRAINING)]
    _, waiting = decide(DetectorSettings(max_unavailable=1), obs([xid_verdict("n1")], busy),
                        state)
    assert waiting == ["c1: budget full (1/1)", "n1: budget full (1/1)"]
    assert "c1" in state.slot_requests, "the request stands while it waits"
    # The slot frees: c1 first; the detector's grant makes its lease take a slot.
    started, waiting = decide(DetectorSettings(max_unavailable=1),
                              obs([xid_verdict("n1")], [cordoned]), state)
    assert started == ["c1"] and waiting == ["n1: budget full (1/1)"]
    assert state.slot_requests == {}
    state.leases["c1"].slot = True
    _, waiting = decide(DetectorSettings(max_unavailable=1),
                        obs([xid_verdict("n1")], [cordoned]), state)
    assert waiting == ["n1: budget full (1/1)"], "still cordoned: the granted slot is held"
    started, _ = decide(DetectorSettings(max_unavailable=2), obs(
        [xid_verdict("n1")], [NodeStatus(node="c1", state=NodeState.DRAINING)]), state)
    assert started == ["n1"], "draining, it holds one slot of two"


def test_a_slot_request_for_a_node_not_cordoned_is_dropped() -> None:
    """A stray client's request (or one whose remediation ended) grants nothing."""
    state = DetectorState(slot_requests={"x1": NOW, "h9": NOW})
    started, _ = decide(DetectorSettings(max_unavailable=5), obs(
        [], [NodeStatus(node="h9", state=NodeState.HEALTHY)]), state)
    assert started == [] and state.slot_requests == {}


def test_a_heat_cordon_holding_a_slot_is_granted_its_drain_at_once() -> None:
    """Cordons counted in the budget (or the setting changed while one waited): the
    cordon's own slot is the drain's; a full budget does not keep it waiting on itself."""
    s = DetectorSettings(max_unavailable=1, cordoned_counts_against_budget=True)
    state = DetectorState(slot_requests={"c1": NOW})
    started, _ = decide(s, obs([], [NodeStatus(node="c1", state=NodeState.CORDONED)]), state)
    assert started == ["c1"]
