"""The repair ledger's pure parts (workflows/ledger.py), probation and lemons
(workflows/probation.py), and admission acting on them as `plan` shows it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from policy.models import Action, Finding, Verdict
from workflows.admission import Admission
from workflows.ledger import (
    MAX_ENTRY_BYTES,
    LedgerEntry,
    LedgerGpu,
    LedgerNote,
    StepTime,
    action_taken,
    entry_id,
    lemons,
    note_for,
    relapse,
    report,
    step_times,
)
from workflows.messages import DetectorState, FleetObservation
from workflows.probation import RULE_LEMON, RULE_PROBATION, decide, next_rung
from workflows.settings import DetectorSettings, LedgerSettings

T0 = datetime(2026, 11, 1, tzinfo=UTC)
WEEK = timedelta(days=7)


def entry(node: str = "n1", *, uid: str = "uid-1", at: timedelta = timedelta(0),
          minutes: int = 30, action: str = "reboot", outcome: str = "healthy",
          fault: str = "xid-79", serials: tuple[str, ...] = ("S1",),
          uuids: tuple[str, ...] = ("GPU-1",), wf: str = "") -> LedgerEntry:
    started = T0 + at
    finished = started + timedelta(minutes=minutes)
    wid = wf or f"remediation-{node}-{at.total_seconds()}"
    return LedgerEntry(
        id=entry_id(wid, started, finished), node=node, node_uid=uid,
        gpus=[LedgerGpu(index=str(i), uuid=u, serial=s)
              for i, (u, s) in enumerate(zip(uuids, serials, strict=False))],
        gpu_count=8, fault=fault, verdict_action=action, action=action, outcome=outcome,
        started=started, finished=finished, workflow_id=wid)


def verdict(node: str = "n1", action: Action = Action.RESET, serial: str = "S1",
            uuid: str = "GPU-1") -> Verdict:
    return Verdict(node=node, action=action, findings=[Finding(
        gpu="0", uuid=uuid, serial=serial, signal="DCGM_FI_DEV_XID_ERRORS", value=48,
        rule="xid-48", action=action)])


# ------------------------------------------------------------------ the entry


def test_the_worst_entry_within_its_bounds_fits_its_byte_bound() -> None:
    long = "x" * 100_000
    e = LedgerEntry(
        id=long, node=long, node_uid=long,
        gpus=[LedgerGpu(index=long, uuid=long, serial=long) for _ in range(100)],
        gpu_count=16, fault=long, verdict_action=long, action=long, outcome=long, why=long,
        started=T0, finished=T0, accounted_from=T0,
        steps=[StepTime(state=long, seconds=1e12) for _ in range(100)],
        attempts=10**9, workflow_id=long, relapse_of=long, relapse_by="node").bounded()
    assert len(e.model_dump_json(exclude_none=True).encode()) <= MAX_ENTRY_BYTES
    assert len(e.gpus) == 16 and len(e.steps) == 16


def test_step_times_sum_each_state_and_skip_healthy() -> None:
    marks = [(T0, "draining", "drain"), (T0 + timedelta(minutes=10), "repairing", "reboot"),
             (T0 + timedelta(minutes=20), "validating", "validate"),
             (T0 + timedelta(minutes=25), "repairing", "gpu-reset"),
             (T0 + timedelta(minutes=26), "healthy", "healthy")]
    steps = step_times(marks, T0 + timedelta(minutes=26))
    assert [(s.state, s.seconds) for s in steps] == [
        ("draining", 600), ("repairing", 660), ("validating", 300)]
    assert action_taken(marks, "reset", "healthy") == "reset"   # the last repair that ran
    assert action_taken(marks[:1], "reboot", "quarantined") == "quarantine"
    assert action_taken(marks[:1], "thermal", "healthy") == "thermal"
    held = [*marks[:1], (T0 + timedelta(minutes=5), "quarantined", "quarantined")]
    assert action_taken(held, "reboot", "healthy") == "quarantine"   # released by a human


def test_the_entry_id_is_stable_across_retries_and_differs_per_outcome() -> None:
    a = entry_id("remediation-n1", T0, T0 + WEEK)
    assert a == entry_id("remediation-n1", T0, T0 + WEEK)
    assert a != entry_id("remediation-n1", T0, T0 + WEEK + timedelta(seconds=1))


# ------------------------------------------------------------------ relapses


def test_a_node_flagged_again_within_the_window_relapses_its_repair() -> None:
    first = entry(at=timedelta(0))
    again = entry(at=timedelta(days=2))
    assert relapse(again, [first], WEEK) == (first.id, "node")
    late = entry(at=timedelta(days=8))
    assert relapse(late, [first], WEEK) == ("", "")


def test_only_a_return_to_service_can_relapse() -> None:
    held = entry(outcome="quarantined")
    assert relapse(entry(at=timedelta(days=1)), [held], WEEK) == ("", "")


def test_a_node_recreated_under_another_uid_relapses_by_its_gpus() -> None:
    first = entry(uid="uid-1", uuids=("GPU-1",), serials=("",))
    recreated = entry(uid="uid-2", uuids=("GPU-1",), serials=("",), at=timedelta(days=1))
    assert relapse(recreated, [first], WEEK) == (first.id, "node")
    other_machine = entry(uid="uid-3", uuids=("GPU-9",), serials=("",), at=timedelta(days=1))
    assert relapse(other_machine, [first], WEEK) == ("", "")


def test_a_gpu_moved_to_another_node_relapses_by_its_serial() -> None:
    first = entry("n1", uid="uid-1", uuids=("GPU-1",), serials=("S-42",))
    moved = entry("n7", uid="uid-7", uuids=("GPU-1b",), serials=("S-42",),
                  at=timedelta(days=3))
    assert relapse(moved, [first], WEEK) == (first.id, "gpu")


def test_the_latest_earlier_repair_is_the_one_relapsed() -> None:
    a = entry(at=timedelta(0))
    b = entry(at=timedelta(days=1))
    c = entry(at=timedelta(days=2))
    assert relapse(c, [b, a], WEEK)[0] == b.id


# ------------------------------------------------------------------ probation


def test_the_ladder() -> None:
    assert [next_rung(a) for a in ("reset", "reboot", "quarantine")] == [
        Action.REBOOT, Action.QUARANTINE, Action.QUARANTINE]


@pytest.mark.parametrize(("last", "flagged", "goes_to"), [
    ("reset", Action.RESET, Action.REBOOT),
    ("reboot", Action.REBOOT, Action.QUARANTINE),
    ("reboot", Action.RESET, Action.QUARANTINE),
    ("reset", Action.REBOOT, Action.REBOOT),   # already the next rung: unchanged
])
def test_a_relapse_in_probation_goes_to_the_next_rung(last: str, flagged: Action,
                                                      goes_to: Action) -> None:
    s = LedgerSettings()
    note = note_for(verdict(action=flagged), "uid-1", [entry(action=last)], T0)
    now = T0 + timedelta(hours=5)
    d = decide(verdict(action=flagged), note, now, s)
    assert d.verdict.action == goes_to
    if goes_to != flagged:
        assert d.why.startswith("probation:") and last in d.why and goes_to.value in d.why
        assert d.verdict.findings[0].rule == RULE_PROBATION
    else:
        assert d.why == ""


def test_after_probation_the_policys_action_stands() -> None:
    s = LedgerSettings(probation=timedelta(hours=24))
    note = note_for(verdict(), "uid-1", [entry(action="reset")], T0)
    d = decide(verdict(), note, T0 + timedelta(hours=25), s)
    assert d.verdict.action == Action.RESET and d.why == ""
    off = decide(verdict(), note, T0 + timedelta(hours=1), LedgerSettings(probation=timedelta(0)))
    assert off.verdict.action == Action.RESET


def test_probation_follows_the_node_not_its_name() -> None:
    """Another machine under the same name (no UID or GPU in common) is not on probation."""
    note = note_for(verdict(uuid="GPU-new", serial="S-new"), "uid-new",
                    [entry(uid="uid-old", uuids=("GPU-old",), serials=("S-old",))], T0)
    assert note.last_repair is None


# ------------------------------------------------------------------ lemons


def test_a_lemon_is_quarantined_for_review_with_the_evidence() -> None:
    s = LedgerSettings(lemon_faults=3, lemon_window=timedelta(days=30))
    earlier = [entry(f"n{i}", uid=f"uid-{i}", uuids=(f"GPU-{i}",), serials=("S-LEMON",),
                     at=timedelta(days=3 * i)) for i in range(3)]
    v = verdict("n9", serial="S-LEMON", uuid="GPU-9")
    now = T0 + timedelta(days=10)
    d = decide(v, note_for(v, "uid-9", earlier, now - s.lookback()), now, s)
    assert d.verdict.action == Action.QUARANTINE
    assert d.verdict.findings[0].rule == RULE_LEMON
    assert d.verdict.findings[0].serial == "S-LEMON"
    assert "4 faults" in d.why and "n0, n1, n2" in d.why and earlier[-1].id in d.why
    # Two earlier faults and this one: not over 3.
    d2 = decide(v, note_for(v, "uid-9", earlier[1:], now - s.lookback()), now, s)
    assert d2.verdict.action == Action.RESET


def test_a_serial_no_flagged_gpu_shows_changes_nothing() -> None:
    """A node claiming a lemon's serial on a healthy GPU: its verdict names another GPU, so
    the serial's record is never read for it, and no healthy node is ever acted on."""
    s = LedgerSettings(lemon_faults=1)
    earlier = [entry(serials=("S-X",)), entry(serials=("S-X",), at=timedelta(days=1))]
    v = verdict("n5", serial="S-OTHER", uuid="GPU-5")
    now = T0 + timedelta(days=2)
    d = decide(v, note_for(v, "uid-5", earlier, T0), now, s)
    assert d.verdict.action == Action.RESET and d.why == ""


def test_lemons_in_the_report_count_gpus_by_serial_and_nodes_and_show_conflicts() -> None:
    es = [entry("n1", uid="u1", serials=("S1",), at=timedelta(days=i)) for i in range(3)]
    es += [entry("n2", uid="u2", serials=("S2",), at=timedelta(days=i)) for i in range(2)]
    # S3 reported by two nodes in the same hour: one may claim another's GPU.
    es += [entry("n3", uid="u3", serials=("S3",), at=timedelta(days=5)),
           entry("n4", uid="u4", serials=("S3",), at=timedelta(days=5, minutes=10))]
    found = {(x.kind, x.key): x for x in lemons(es, faults=1, window=timedelta(days=30),
                                                 now=T0 + timedelta(days=6))}
    assert set(found) == {("gpu", "S1"), ("gpu", "S2"), ("gpu", "S3"), ("node", "u1"),
                          ("node", "u2")}
    assert found[("gpu", "S3")].conflict and not found[("gpu", "S1")].conflict
    assert found[("gpu", "S1")].faults == 3


# ------------------------------------------------------------------ the report


def test_the_report_over_a_period() -> None:
    a = entry(action="reset", fault="xid-48", minutes=20)
    b = entry(action="reset", fault="xid-48", at=timedelta(days=1), minutes=40)
    b = b.model_copy(update={"relapse_of": a.id, "relapse_by": "node"})
    c = entry("n2", uid="u2", serials=("S9",), action="reboot", fault="xid-79", minutes=60,
              at=timedelta(days=2))
    q = entry("n3", uid="u3", serials=("S8",), action="quarantine", outcome="quarantined",
              minutes=10, at=timedelta(days=3))
    r = report([a, b, c, q], since=T0, until=T0 + timedelta(days=30), lemon_faults=3,
               lemon_window=timedelta(days=30), fleet_gpus=80)
    per = {x.action: x for x in r.actions}
    assert per["reset"].repairs == 2 and per["reset"].mttr_seconds == 1800
    assert per["reset"].relapses == 1 and per["reset"].relapse_rate == 0.5
    assert per["reboot"].relapse_rate == 0.0
    assert per["quarantine"].mttr_seconds is None     # nothing returned to service
    assert [(f.action, f.fault, f.relapses) for f in r.faults] == [
        ("quarantine", "xid-79", 0), ("reboot", "xid-79", 0), ("reset", "xid-48", 1)]
    assert r.gpu_hours_lost == pytest.approx(8 * (20 + 40 + 60 + 10) / 60, abs=0.01)
    assert r.availability_lost == pytest.approx(r.gpu_hours_lost / (80 * 30 * 24), rel=1e-3)
    assert r.entries == 4


def test_a_quarantine_released_later_counts_once_in_the_report() -> None:
    held = entry(action="quarantine", outcome="quarantined", minutes=10, wf="wf-q")
    back = held.model_copy(update={
        "id": "e-back", "outcome": "healthy", "finished": held.started + timedelta(days=2),
        "accounted_from": held.finished})
    r = report([held, back], since=T0, until=T0 + timedelta(days=30), lemon_faults=3,
               lemon_window=timedelta(days=30))
    [q] = r.actions
    assert (q.action, q.repairs, q.mttr_seconds) == ("quarantine", 1, 2 * 86400)
    assert r.gpu_hours_lost == pytest.approx(8 * 48, abs=0.01)   # counted once

# ------------------------------------------------------------------ admission and plan


def _admission(note: LedgerNote | None, *, probation: bool = True) -> Admission:
    obs = FleetObservation(managed_nodes=10, readable_nodes=10, verdicts=[verdict()],
                           ledger={"n1": note} if note else {})
    return Admission(DetectorSettings(max_unavailable=2), DetectorState(leases_ready=True),
                     obs, T0 + timedelta(hours=2), probation=probation)


def test_admission_starts_the_next_rung_and_says_why() -> None:
    note = note_for(verdict(), "uid-1", [entry(action="reset")], T0)
    adm = _admission(note)
    [c] = adm.queue
    assert c.verdict.action == Action.REBOOT
    assert c.why.startswith("probation: reset for xid-79 returned the node")
    assert adm.blocked(c) is None
    # A detector run recorded before probation decides as it did.
    [old] = _admission(note, probation=False).queue
    assert old.verdict.action == Action.RESET and old.why == verdict().summary


def test_plan_shows_the_probation_decision() -> None:
    from worker.cli.plan import plan_from
    from worker.config import Settings

    note = note_for(verdict(), "uid-1", [entry(action="reset")], T0)
    obs = FleetObservation(managed_nodes=10, readable_nodes=10, verdicts=[verdict()],
                           ledger={"n1": note})
    plan = plan_from(Settings(detector=DetectorSettings(max_unavailable=2)), obs,
                     T0 + timedelta(hours=2))
    [start] = plan.start
    assert start.action == "reboot" and "probation" in start.reason


def test_the_why_reads_like_the_config() -> None:
    note = note_for(verdict(), "uid-1", [entry(action="reset")], T0)
    d = decide(verdict(), note, T0 + timedelta(hours=3, minutes=40), LedgerSettings())
    assert d.why == ("probation: reset for xid-79 returned the node 3h10m ago (within 24h of "
                     "probation) and it is flagged again (reset); next rung: reboot")


def test_a_quarantine_and_its_release_are_one_fault() -> None:
    held = entry(outcome="quarantined", action="quarantine", serials=("S-Q",), wf="wf-q")
    back = held.model_copy(update={
        "id": "e-back", "outcome": "healthy", "finished": held.finished + timedelta(days=2)})
    v = verdict(serial="S-Q")
    note = note_for(v, "uid-1", [held, back], T0)
    assert len(note.serial_faults["S-Q"]) == 1
    assert lemons([held, back], faults=1, window=timedelta(days=30),
                  now=T0 + timedelta(days=3)) == []
