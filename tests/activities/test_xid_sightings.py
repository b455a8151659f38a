"""App-XID sightings across detector ticks (activities/xid_sightings.py), pure."""

from __future__ import annotations

import json

from activities.xid_sightings import (
    MAX_SIGHTINGS_PER_GPU,
    GpuXidTrack,
    Tracks,
    clear_sightings,
    dump_tracks,
    new_warnings,
    observe,
    parse_tracks,
    repeat_counts,
)
from policy.config import PolicySettings
from policy.models import Action, GpuReading, NodeReadings
from policy.rules import evaluate_node

POLICY = PolicySettings()
EVERY = PolicySettings.model_validate({"app_xid_escalation": {"burst_gap": 0}})
"""Counts every sighting as its own burst: the tests of what is a sighting use it."""
DAY = 86400.0
T0 = 1_800_000_000.0


def node(*gpus: GpuReading) -> NodeReadings:
    return NodeReadings(node="n1", gpus=list(gpus))


def g0(xid: int | None = None, counts: dict[int, int] | None = None) -> GpuReading:
    return GpuReading(gpu="0", uuid="GPU-0", xid=xid, xid_counts=counts)


def run(ticks: list[GpuReading], start: Tracks | None = None, step: float = 30.0,
        config: PolicySettings = POLICY) -> tuple[Tracks, float]:
    tracks: Tracks = dict(start or {})
    now = T0
    for reading in ticks:
        tracks = observe(tracks, node(reading), config, now)
        now += step
    return tracks, now - step


def counts(tracks: Tracks, now: float) -> dict[str, dict[int, int]]:
    return repeat_counts(tracks, EVERY, now)


def test_gauge_change_to_an_app_xid_is_one_sighting_however_long_it_shows() -> None:
    tracks, now = run([g0(13), g0(13), g0(13)])
    assert counts(tracks, now) == {"GPU-0": {13: 1}}
    assert tracks["GPU-0"].shown == 13


def test_every_new_gauge_value_is_a_sighting() -> None:
    tracks, now = run([g0(31), g0(13), g0(31)])
    assert counts(tracks, now) == {"GPU-0": {31: 2, 13: 1}}
    verdict = evaluate_node(node(g0(31)), POLICY, xid_repeats=counts(tracks, now))
    assert [(f.rule, f.action) for f in verdict.findings] == [
        ("xid-31-repeated", Action.DIAGNOSE)]


def test_gauge_reset_makes_the_same_value_new_again() -> None:
    # The exporter restarted (series gone, or 0 in "zero" mode), then 31 happened again.
    tracks, now = run([g0(31), g0(None), g0(31)])
    assert counts(tracks, now) == {"GPU-0": {31: 2}}
    tracks, now = run([g0(31), g0(0), g0(31)])
    assert counts(tracks, now) == {"GPU-0": {31: 2}}


def test_count_family_shows_repeats_of_the_same_xid() -> None:
    tracks, now = run([g0(13, {13: 1}), g0(13, {13: 3}), g0(13, {13: 5})])
    # 1 (the gauge change, also the first count) + 2 + 2
    assert counts(tracks, now) == {"GPU-0": {13: 5}}
    verdict = evaluate_node(node(g0(13)), POLICY, xid_repeats=counts(tracks, now))
    assert verdict.action == Action.DIAGNOSE


def test_gauge_change_and_count_rise_are_not_counted_twice() -> None:
    tracks, now = run([g0(None, {}), g0(13, {13: 1})])
    assert counts(tracks, now) == {"GPU-0": {13: 1}}
    # Two at once: the gauge shows the last, the counter both.
    tracks, now = run([g0(None, {}), g0(13, {13: 2})])
    assert counts(tracks, now) == {"GPU-0": {13: 2}}


def test_count_falling_as_the_exporter_window_slides_adds_nothing() -> None:
    tracks, now = run([g0(13, {13: 3}), g0(13, {13: 1}), g0(13, {})])
    assert counts(tracks, now) == {"GPU-0": {13: 3}}
    # ... and a later rise from the lower baseline (nothing in the window) is new.
    tracks, _ = run([g0(13, {13: 2})], start=tracks)
    assert counts(tracks, T0) == {"GPU-0": {13: 5}}


def test_hardware_xids_are_never_counted_or_stored() -> None:
    tracks, _ = run([g0(79, {79: 3}), g0(48, {48: 1})])
    assert tracks == {}


def test_an_app_xid_after_a_hardware_one_is_new() -> None:
    tracks, now = run([g0(13), g0(79), g0(13)])
    assert counts(tracks, now) == {"GPU-0": {13: 2}}


def test_sightings_age_out_of_the_window() -> None:
    tracks, _ = run([g0(31)])
    later = observe(tracks, node(g0(13)), POLICY, T0 + DAY + 1)
    assert counts(later, T0 + DAY + 1) == {"GPU-0": {13: 1}}
    assert [x for x, _ in later["GPU-0"].seen] == [13]


def test_overridden_xid_class_is_respected() -> None:
    config = PolicySettings.model_validate({"xid_overrides": {13: "none", 79: "app"}})
    tracks, _ = run([g0(13), g0(79)], config=config)
    assert [x for x, _ in tracks["GPU-0"].seen] == [79]


def test_a_gpu_missing_from_one_scrape_keeps_its_sightings() -> None:
    tracks, _ = run([g0(31)])
    other = GpuReading(gpu="1", uuid="GPU-1", xid=0)
    later = observe(tracks, node(other), POLICY, T0 + 60)
    assert counts(later, T0 + 60) == {"GPU-0": {31: 1}}


def test_sightings_per_gpu_are_bounded() -> None:
    ticks = [g0(13, {13: n}) for n in range(1, 200)]
    tracks, _ = run(ticks)
    assert len(tracks["GPU-0"].seen) == MAX_SIGHTINGS_PER_GPU


def test_clear_keeps_the_baseline_so_old_occurrences_are_not_recounted() -> None:
    tracks, now = run([g0(13, {13: 5})])
    cleared = clear_sightings(tracks, ["GPU-0"])
    assert counts(cleared, now) == {}
    again = observe(cleared, node(g0(13, {13: 5})), POLICY, now + 30)
    assert counts(again, now + 30) == {}
    again = observe(again, node(g0(13, {13: 6})), POLICY, now + 60)
    assert counts(again, now + 60) == {"GPU-0": {13: 1}}


def test_annotation_round_trip_and_damage() -> None:
    tracks, _ = run([g0(31, {31: 2})])
    text = dump_tracks(tracks)
    assert text is not None and parse_tracks(text) == tracks
    assert json.loads(text)["GPU-0"]["shown"] == 31
    assert dump_tracks({}) is None
    for bad in ("", "not json", "[1, 2]", '{"GPU-0": {"seen": "x"}}', None):
        assert parse_tracks(bad) == {}
    assert parse_tracks('{"GPU-0": {}}') == {"GPU-0": GpuXidTrack()}


def test_sightings_ticks_apart_are_one_burst_with_the_default_gap() -> None:
    """31, 13, 31 thirty seconds apart: one crashing job, not a failing GPU."""
    tracks, now = run([g0(31), g0(13), g0(31)])
    bursts = repeat_counts(tracks, POLICY, now)
    assert bursts == {"GPU-0": {31: 1, 13: 1}}
    assert evaluate_node(node(g0(31)), POLICY, xid_repeats=bursts).action == Action.APP
    # The same three an hour apart are separate bursts: 31 twice asks for a diagnostic.
    tracks, now = run([g0(31), g0(13), g0(31)], step=3600)
    bursts = repeat_counts(tracks, POLICY, now)
    assert bursts == {"GPU-0": {31: 2, 13: 1}}
    verdict = evaluate_node(node(g0(31)), POLICY, xid_repeats=bursts)
    assert [(f.rule, f.action) for f in verdict.findings] == [
        ("xid-31-repeated", Action.DIAGNOSE)]


def test_a_count_rise_of_many_at_once_is_one_burst() -> None:
    tracks, now = run([g0(13, {13: 9})])
    assert repeat_counts(tracks, POLICY, now) == {"GPU-0": {13: 1}}
    assert repeat_counts(tracks, EVERY, now) == {"GPU-0": {13: 9}}


def g(xid: int | None, index: str = "0") -> GpuReading:
    return GpuReading(gpu=index, uuid=f"GPU-{index}", xid=xid)


def tick(tracks: Tracks, readings: NodeReadings, now: float,
         config: PolicySettings = POLICY) -> tuple[Tracks, list[tuple[str, str, int]]]:
    """One detector tick as fleet.py runs it: observe, evaluate, then the new warnings."""
    after = observe(tracks, readings, config, now)
    verdict = evaluate_node(readings, config, xid_repeats=repeat_counts(after, config, now))
    found = new_warnings(tracks, after, verdict, config, now)
    return after, [(w.reason, w.finding.gpu, int(w.finding.value)) for w in found]


def test_an_unknown_xid_warns_once_while_the_gauge_keeps_showing_it() -> None:
    tracks, warned = tick({}, node(g(999)), T0)
    assert warned == [("UnknownXid", "0", 999)]
    for i in range(1, 4):
        tracks, warned = tick(tracks, node(g(999)), T0 + 30 * i)
        assert warned == []
    # The annotation remembers it, so a detector restart does not warn again either.
    assert parse_tracks(dump_tracks(tracks))["GPU-0"].shown == 999
    # Gone (exporter restart) and back: a new occurrence, a new warning.
    tracks, warned = tick(tracks, node(g(0)), T0 + 200)
    assert warned == [] and tracks == {}
    _, warned = tick(tracks, node(g(999)), T0 + 230)
    assert warned == [("UnknownXid", "0", 999)]


def test_an_unknown_xid_held_for_review_still_warns() -> None:
    held = PolicySettings(unknown_xid_action=Action.QUARANTINE)
    _, warned = tick({}, node(g(999)), T0, held)
    assert warned == [("UnknownXid", "0", 999)]


def test_catalog_xids_that_ask_for_a_human_warn_and_others_do_not() -> None:
    readings = node(g(159, "0"), g(165, "1"), g(79, "2"), g(13, "3"), g(43, "4"), g(None, "5"))
    tracks, warned = tick({}, readings, T0)
    assert sorted(warned) == [("XidAlert", "0", 159), ("XidAlert", "1", 165)]
    _, warned = tick(tracks, readings, T0 + 30)
    assert warned == []


def test_escalation_warns_at_each_new_burst_not_at_every_tick() -> None:
    tracks, warned = tick({}, node(g(31)), T0)
    assert warned == []
    tracks, _ = tick(tracks, node(g(0)), T0 + 30)  # exporter restart
    tracks, warned = tick(tracks, node(g(31)), T0 + 3600)
    assert warned == [("GPUDiagnosticNeeded", "0", 31)]
    for i in range(1, 4):  # still over the threshold, nothing new happened
        tracks, warned = tick(tracks, node(g(31)), T0 + 3600 + 30 * i)
        assert warned == []
