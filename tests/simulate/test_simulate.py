"""`gpu-remediate simulate`: the production workflows on the time-skipping server against an
in-memory fleet. Small fleets, a few simulated days, a detector tick every five minutes: each
run takes seconds."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import activity as temporal_activity
from typer.testing import CliRunner

from worker.cli.commands import app
from worker.config import Settings
from worker.simulate import fleet as sim_fleet
from worker.simulate.faults import FaultModel
from worker.simulate.fleet import DAY
from worker.simulate.run import SimulationTooLarge, check_size, segment_seconds, simulate
from workflows import activity_refs
from workflows.settings import DetectorSettings

# A fault-heavy model: tens of faults a day on a fleet of tens of nodes, every outcome.
BUSY = FaultModel(rates_per_gpu_day={"gpu": 0.05, "hbm3": 0.03, "switch_cable": 0.02,
                                     "thermal": 0.01, "software": 0.01},
                  outcomes={"success": 0.7, "relapse": 0.15, "hang": 0.1, "node_lost": 0.05})
XID_ONLY = FaultModel(rates_per_gpu_day={"gpu": 0.05, "gsp": 0.02},
                      outcomes={"success": 1.0})


def settings(max_unavailable: int | str = 2, **kw: object) -> DetectorSettings:
    return Settings().detector_settings().model_copy(update={
        "interval": timedelta(minutes=5), "max_unavailable": max_unavailable, **kw})


def run(s: DetectorSettings, model: FaultModel, *, nodes: int = 30, days: float = 2,
        seed: int = 1, watchers: bool = False) -> dict:
    result = asyncio.run(simulate(s, model, nodes=nodes, gpus=8, domains=1, days=days,
                                  seed=seed, watchers=watchers))
    return result.model_dump(mode="json")


def test_the_simulator_serves_every_activity_the_workflows_call() -> None:
    """The production workflows call activities by name: the in-memory fleet answers every
    one, and defines no other (no second implementation of a decision)."""
    wanted = {v.__temporal_activity_definition.name  # type: ignore[attr-defined]
              for v in vars(activity_refs).values()
              if hasattr(v, "__temporal_activity_definition")}
    fleet = sim_fleet.SimFleet(nodes=1, gpus=8, domains=1, faults=[], model=FaultModel(),
                               settings=settings(), start=None)  # type: ignore[arg-type]
    served = {a.__temporal_activity_definition.name for a in fleet.activities()}
    assert served == wanted


def test_same_seed_same_json_and_the_faults_go_through_the_policy() -> None:
    one = run(settings(), BUSY, nodes=20, days=1.25)
    two = run(settings(), BUSY, nodes=20, days=1.25)
    assert one == two
    assert one["faults_total"] >= 5
    # XID 79 is the policy's reboot, XID 74 and the HBM3 remap its reset, heat its cordon.
    assert set(one["mttr_by_action"]) <= {"reboot", "reset", "thermal", "quarantine"}
    assert one["remediations_started"] >= 3
    # The run ends on the detector's tick grid: one tick every 5 minutes, exactly.
    assert one["detector_ticks"] == 1.25 * 24 * 12


def test_the_run_ends_on_the_tick_grid_whatever_the_server_clock_drifts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The test server's clock also moves while work runs. Each observation here holds it
    for 0.25 s of real time, so 60 ticks of 10 s drift past a whole tick: a run ended on
    the server's clock would see a tick fewer, one ended on the grid sees all 60, and the
    same JSON as a run without the delay."""
    s = settings(interval=timedelta(seconds=10))
    days = 60 * 10 / 86_400
    quick = run(s, BUSY, nodes=20, days=days)
    ticked = sim_fleet.SimFleet.ticked

    def slow(self: sim_fleet.SimFleet) -> float:
        time.sleep(0.25)
        return ticked(self)

    monkeypatch.setattr(sim_fleet.SimFleet, "ticked", slow)
    slowed = run(s, BUSY, nodes=20, days=days)
    assert slowed["detector_ticks"] == quick["detector_ticks"] == 60
    assert slowed == quick


def test_a_remediation_does_not_gather_the_drift_of_its_steps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each activity of a remediation here holds the server's clock for 0.05 s of real time
    (a loaded machine): a reboot's forty-odd steps drift seconds past their tick. Its
    moments (claim, return, release, so its MTTR) are still those of a run without the
    delay, because each counts from its own previous step, not from the tick."""
    s = settings(interval=timedelta(minutes=10))
    quick = run(s, BUSY, nodes=20, days=0.3, seed=3)
    now = sim_fleet.SimFleet.now

    def slow(self: sim_fleet.SimFleet) -> float:
        if temporal_activity.info().workflow_type != "DetectorWorkflow":
            time.sleep(0.05)
        return now(self)

    monkeypatch.setattr(sim_fleet.SimFleet, "now", slow)
    slowed = run(s, BUSY, nodes=20, days=0.3, seed=3)
    assert quick["mttr_by_action"]["reboot"]["count"] >= 1
    assert slowed == quick


@pytest.mark.parametrize(("seed", "model", "budget"), [
    (1, BUSY, 1), (2, BUSY, 2), (3, XID_ONLY, "10%")])
def test_out_of_service_never_exceeds_the_budget(seed: int, model: FaultModel,
                                                 budget: int | str) -> None:
    r = run(settings(budget), model, nodes=30, days=1.5, seed=seed)
    assert r["budget"] == (3 if budget == "10%" else budget)
    # Pressed: more faults than the budget could take at once.
    assert r["faults_total"] > r["budget"]
    assert r["max_out_of_service"] <= r["budget"]
    # The fleet's own count of nodes in out-of-service states says the same.
    assert r["max_out_of_service_by_state"] <= r["budget"]
    assert r["max_out_of_service"] >= 1
    if budget == 1:
        # The budget was full at some tick: nodes waited for a slot.
        assert r["max_waiting"] >= 1


def test_node_watchers_wake_the_detector_at_the_fault_and_change_nothing_else() -> None:
    """With node watchers (a config with reports.enabled) a kernel-log XID wakes a node-only
    tick at its onset: the XID repairs start sooner than the full tick would have found them,
    heat and HBM3 (no XID line) wait for the full tick as before, the faults are the same,
    the budget holds, and the same seed gives the same JSON."""
    s = settings(interval=timedelta(minutes=10))
    scraped = asyncio.run(simulate(s, BUSY, nodes=30, gpus=8, domains=1, days=2, seed=3))
    watched = [run(s, BUSY, nodes=30, days=2, seed=3, watchers=True) for _ in range(2)]
    assert watched[0] == watched[1]
    w, plain = watched[0], scraped.model_dump(mode="json")
    assert (w["node_watchers"], plain["node_watchers"]) == (True, False)
    assert w["node_ticks"] > 0 and plain["node_ticks"] == 0
    assert w["detector_ticks"] == plain["detector_ticks"] == 2 * 24 * 6
    assert w["faults_by_cause"] == plain["faults_by_cause"]
    assert w["mttr_by_action"]["reboot"]["mean_s"] < plain["mttr_by_action"]["reboot"]["mean_s"]
    assert w["mttr_by_action"]["thermal"] == plain["mttr_by_action"]["thermal"]
    assert w["max_out_of_service"] <= w["budget"]


def test_compare_runs_both_configs_on_the_same_faults(tmp_path: Path) -> None:
    one = tmp_path / "one.yaml"
    five = tmp_path / "five.yaml"
    one.write_text("detector: {interval: 300, max_unavailable: 1}\n", encoding="utf-8")
    (tmp_path / "tls.pem").write_text("", encoding="utf-8")
    five.write_text("detector: {interval: 300, max_unavailable: 5}\n"
                    f"reports: {{enabled: true, tls_cert: {tmp_path / 'tls.pem'}, "
                    f"tls_key: {tmp_path / 'tls.pem'}}}\n", encoding="utf-8")
    faults = tmp_path / "faults.yaml"
    faults.write_text(json.dumps({"rates_per_gpu_day": {"gpu": 0.02},
                                  "outcomes": {"success": 1.0}}), encoding="utf-8")
    result = CliRunner().invoke(app, [
        "simulate", "-c", str(one), "--compare", str(five), "--nodes", "20", "--days", "1",
        "--faults", str(faults), "-o", "json"])
    assert result.exit_code == 0, result.output
    both = json.loads(result.stdout)
    assert set(both) == {"config", "compare"}
    a, b = both["config"], both["compare"]
    assert (a["config"], b["config"]) == (str(one), str(five))
    assert (a["budget"], b["budget"]) == (1, 5)
    assert (a["node_watchers"], b["node_watchers"]) == (False, True)  # its reports.enabled
    assert a["faults_by_cause"] == b["faults_by_cause"]
    assert a["faults_total"] > 0

    table = CliRunner().invoke(app, [
        "simulate", "-c", str(one), "--compare", str(five), "--nodes", "20", "--days", "1",
        "--faults", str(faults)])
    assert table.exit_code == 0, table.output
    assert "max out of service (as the budget counts)" in table.stdout
    assert str(five) in table.stdout


def test_a_run_too_large_for_memory_is_refused_before_it_starts() -> None:
    s = Settings().detector_settings()  # a tick every 30 s
    with pytest.raises(SimulationTooLarge, match=r"--nodes 10000 --days 300: needs about"):
        check_size(FaultModel(), s, nodes=10_000, gpus=8, days=300, memory=8 * 2**30)
    assert check_size(FaultModel(), s, nodes=30, gpus=8, days=2, memory=8 * 2**30) > 0
    result = CliRunner().invoke(app, ["simulate", "--nodes", "10000000", "--days", "30"])
    assert result.exit_code == 2
    assert "--nodes 10000000" in result.output


def test_a_bad_fault_model_is_a_usage_error_naming_the_field(tmp_path: Path) -> None:
    faults = tmp_path / "faults.yaml"
    faults.write_text("rates_per_gpu_day: {gpu: -1}\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["simulate", "--faults", str(faults)])
    assert result.exit_code == 2
    assert "rates_per_gpu_day.gpu" in result.output


# ------------------------------------------------------------------ segments
# A run over several test servers (--segment-days): each server's cost per task grows with
# every task it ran, so a long run hands its workflows over to a fresh server at a quiet
# tick (worker/simulate/run.py).

MIXED = FaultModel(rates_per_gpu_day={"gpu": 0.001, "hbm3": 0.002, "thermal": 0.0003,
                                      "sram": 0.0005},
                   outcomes={"success": 0.8, "relapse": 0.1, "hang": 0.05, "node_lost": 0.05},
                   hbm3_remapped=0.5)


def test_segment_length_is_automatic_for_long_runs_and_off_for_short_ones() -> None:
    ten_minutes = settings(interval=timedelta(minutes=10))
    big = {"nodes": 10_000, "gpus": 8, "days": 30.0}
    auto = segment_seconds(FaultModel(), ten_minutes, **big, segment_days=None)
    assert auto is not None and 0.5 * DAY <= auto <= 2 * DAY
    assert segment_seconds(FaultModel(), ten_minutes, **big, segment_days=3) == 3 * DAY
    assert segment_seconds(FaultModel(), ten_minutes, **big, segment_days=0) is None
    assert segment_seconds(FaultModel(), ten_minutes, **big, segment_days=30) is None
    # The test runs above: one server, as before.
    assert segment_seconds(BUSY, settings(), nodes=30, gpus=8, days=2,
                           segment_days=None) is None


def test_a_handover_waits_for_a_quiet_fleet() -> None:
    """Due at the first full tick at or past the boundary, and only while every node present
    is healthy or quarantined: a heat cordon, a drain or a repair in flight is not quiet."""
    fleet = sim_fleet.SimFleet(nodes=4, gpus=8, domains=1, faults=[], model=FaultModel(),
                               settings=settings(), start=None)  # type: ignore[arg-type]

    async def go(at: float) -> bool:
        return True

    fleet.handover_at, fleet.hand_over = 600.0, go
    fleet.ticks = 2  # the next full tick is at 600 s
    assert fleet.handover_due()
    fleet.node(fleet.name(1)).state = sim_fleet.NodeState.QUARANTINED
    assert fleet.handover_due()
    for busy in (sim_fleet.NodeState.CORDONED, sim_fleet.NodeState.DRAINING,
                 sim_fleet.NodeState.REPAIRING, sim_fleet.NodeState.VALIDATING,
                 sim_fleet.NodeState.AWAITING_APPROVAL):
        fleet.node(fleet.name(2)).state = busy
        assert not fleet.handover_due(), busy
    fleet.gone.add(2)  # a lost machine's remediation ends with it
    assert fleet.handover_due()
    fleet.ticks = 1  # before the boundary
    assert not fleet.handover_due()
    fleet.ticks, fleet.hand_over = 2, None  # one server
    assert not fleet.handover_due()


def _caught(monkeypatch: pytest.MonkeyPatch) -> list[sim_fleet.SimFleet]:
    """The fleets the runs build (to look at the nodes after a run)."""
    fleets: list[sim_fleet.SimFleet] = []
    init = sim_fleet.SimFleet.__init__

    def keep(self: sim_fleet.SimFleet, *args: object, **kw: object) -> None:
        init(self, *args, **kw)  # type: ignore[arg-type]
        fleets.append(self)

    monkeypatch.setattr(sim_fleet.SimFleet, "__init__", keep)
    return fleets


def test_segments_same_seed_same_json_and_a_quarantine_is_held_across_handovers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Three servers of half a day each: the same seed gives the same JSON; a node
    quarantined on the first server is counted once, stays quarantined on the last (its
    hold was carried, and nothing remediates it again) and the last detector still holds
    its lease."""
    fleets = _caught(monkeypatch)
    s = settings(interval=timedelta(minutes=10))
    one, two = (asyncio.run(simulate(s, BUSY, nodes=30, gpus=8, domains=1, days=1.5,
                                     seed=3, segment_days=0.5)).model_dump(mode="json")
                for _ in range(2))
    assert one == two
    assert one["segments"] == 3 and len(one["handovers_at_s"]) == 2
    # Each handover at a full tick, at or after its boundary (half a day past the last).
    last = 0.0
    for at in one["handovers_at_s"]:
        assert at % 600 == 0 and at >= last + DAY / 2
        last = at
    fleet = fleets[-1]
    early = [n for n, at in fleet.quarantined_at.items() if at < one["handovers_at_s"][0]]
    assert early, "a quarantine before the first handover (the seed's)"
    node = fleet.nodes[fleet.index_of(early[0])]
    assert node.state == sim_fleet.NodeState.QUARANTINED
    assert len(node.history) == 1, "claimed once: never remediated again after a handover"
    assert one["quarantines"] == one["outcomes"]["quarantined"] == len(fleet.quarantined_at)
    assert one["quarantined_held"] == one["quarantines"] >= 1
    assert one["max_out_of_service"] <= one["budget"]


@pytest.mark.parametrize(("seed", "model", "budget"), [(1, BUSY, 1), (2, XID_ONLY, 2)])
def test_segments_keep_out_of_service_within_the_budget(seed: int, model: FaultModel,
                                                        budget: int) -> None:
    s = settings(budget, interval=timedelta(minutes=10))
    r = asyncio.run(simulate(s, model, nodes=30, gpus=8, domains=1, days=1.5,
                             seed=seed, segment_days=0.5)).model_dump(mode="json")
    assert r["segments"] >= 3
    assert r["faults_total"] > r["budget"] == budget
    assert 1 <= r["max_out_of_service"] <= r["budget"]
    assert r["max_out_of_service_by_state"] <= r["budget"]


def test_a_run_over_segments_matches_the_run_on_one_server() -> None:
    """200 nodes x 4 days, on one server and on four (a day each): the same faults, the
    same remediations and quarantines, the budget held; the handover waits for a quiet
    tick and the next server observes that tick again, so nothing moves in time."""
    s = settings(2, interval=timedelta(hours=1))
    whole, split = (asyncio.run(simulate(s, MIXED, nodes=200, gpus=8, domains=1, days=4,
                                         seed=1, segment_days=d)).model_dump(mode="json")
                    for d in (0, 1))
    assert (whole["segments"], split["segments"]) == (1, 4)
    assert split["faults_by_cause"] == whole["faults_by_cause"]
    assert split["quarantines"] == whole["quarantines"] >= 1
    assert split["remediations_started"] == whole["remediations_started"]
    assert split["max_out_of_service"] <= split["budget"] == 2
    differ = {k for k in whole if whole[k] != split[k]}
    assert differ == {"segments", "handovers_at_s"}, differ
