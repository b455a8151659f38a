"""What the detector keeps of node reports, and how an observation merges them
(workflows/reports.py): the node's own readings only, the policy still decides."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from policy.config import PolicySettings
from policy.models import Action, GpuReading, NodeReadings
from policy.rules import evaluate_node
from tests.workflows.fakes import xid_verdict
from workflows.messages import FleetObservation, NodeReport, NodeStatus
from workflows.reports import (
    MAX_REPORTING_NODES,
    MAX_REPORTS_PER_NODE,
    NODE_TICK_GAP,
    REPORT_TTL,
    current_reports,
    due_for_node_tick,
    keep_report,
    merge_node_observation,
    merge_reports,
    pci_slot,
    reports_by_node,
    reports_for_observation,
)
from workflows.transitions import NodeState

T0 = datetime(2026, 12, 6, 3, 0, tzinfo=UTC)
POLICY = PolicySettings()


def report(node: str = "node-a", xid: int = 79, gpu: str = "0", at: datetime = T0,
           line: str = "") -> NodeReport:
    return NodeReport(node=node, xid=xid, gpu=gpu, at=at, line=line)


def readings(node: str = "node-a", xid: int | None = None) -> NodeReadings:
    return NodeReadings(node=node, gpus=[
        GpuReading(gpu=str(i), uuid=f"GPU-{node}-{i}", pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
                   xid=xid if i == 0 else None) for i in range(2)])


def test_a_repeat_refreshes_one_report_instead_of_piling_up() -> None:
    held: list[NodeReport] = []
    for s in range(100):
        held = keep_report(held, report(at=T0 + timedelta(seconds=s)), T0 + timedelta(seconds=s))
    assert len(held) == 1 and held[0].at == T0 + timedelta(seconds=99)


def test_kept_reports_are_bounded_per_node_and_across_nodes() -> None:
    held: list[NodeReport] = []
    for i in range(50):
        held = keep_report(held, report(xid=i + 1), T0)
    assert len(held) == MAX_REPORTS_PER_NODE
    assert {r.xid for r in held} == set(range(50 - MAX_REPORTS_PER_NODE + 1, 51))
    for n in range(MAX_REPORTING_NODES + 40):
        at = T0 + timedelta(milliseconds=n)
        held = keep_report(held, report(node=f"n{n:04d}", at=at), at)
    nodes = {r.node for r in held}
    assert len(nodes) == MAX_REPORTING_NODES and "node-a" not in nodes


def test_a_report_from_the_future_counts_from_now() -> None:
    held = keep_report([], report(at=T0 + timedelta(days=365)), T0)
    assert held[0].at == T0
    assert reports_for_observation(held, T0 + REPORT_TTL + timedelta(seconds=1)) == []


def test_old_reports_and_reports_of_nodes_in_remediation_are_not_observed() -> None:
    held = keep_report([], report(node="old"), T0)
    held = keep_report(held, report(node="busy", at=T0 + timedelta(seconds=90)),
                       T0 + timedelta(seconds=90))
    held = keep_report(held, report(node="fresh", at=T0 + timedelta(seconds=90)),
                       T0 + timedelta(seconds=90))
    now = T0 + REPORT_TTL + timedelta(seconds=1)
    assert [r.node for r in reports_for_observation(held, now, busy={"busy"})] == ["fresh"]
    # What the detector keeps loses them too: the node's report never outlives its remediation.
    kept = current_reports(held, now, busy={"busy"})
    assert [r.node for r in kept] == ["fresh"]
    assert [r.node for r in reports_for_observation(kept, now)] == ["fresh"]


def test_the_observation_gets_reports_without_their_lines() -> None:
    held = keep_report([], report(line="NVRM: Xid (PCI:0000:18:00): 79, " + "x" * 400), T0)
    [sent] = reports_for_observation(held, T0)
    assert (sent.line, sent.xid, sent.gpu) == ("", 79, "0")
    assert held[0].line.startswith("NVRM")  # kept for the detector's view


def test_a_reported_xid_flags_the_node_before_its_exporter_shows_it() -> None:
    before = evaluate_node(readings(), POLICY)
    assert before.action == Action.NONE
    merged, acked = merge_reports(readings(), {}, [report(gpu="GPU-node-a-1")], POLICY)
    verdict = evaluate_node(merged, POLICY, acknowledged_xids=acked)
    assert verdict.action == Action.REBOOT
    assert [(f.gpu, f.value) for f in verdict.findings] == [("1", 79.0)]


def test_another_nodes_report_changes_nothing() -> None:
    merged, acked = merge_reports(readings("node-b"), {"GPU-node-b-0": 79},
                                  [report(node="node-a")], POLICY)
    assert merged == readings("node-b") and acked == {"GPU-node-b-0": 79}


def test_the_gpu_is_found_by_index_uuid_or_the_kernel_lines_pci_address() -> None:
    for name in ("1", "GPU-node-a-1", "00000000:19:00.0", "PCI:0000:19:00", "0000:19:00"):
        merged, _ = merge_reports(readings(), {}, [report(gpu=name)], POLICY)
        assert [g.xid for g in merged.gpus] == [None, 79], name


def test_a_gpu_the_exporter_no_longer_lists_is_added_with_its_xid() -> None:
    merged, _ = merge_reports(readings(), {}, [report(gpu="00000000:3B:00.0")], POLICY)
    assert len(merged.gpus) == 3
    assert merged.gpus[2].pci_bus_id == "00000000:3B:00.0" and merged.gpus[2].xid == 79
    assert evaluate_node(merged, POLICY).action == Action.REBOOT


def test_the_most_severe_of_several_reports_for_one_gpu_counts() -> None:
    reports = [report(xid=79, at=T0), report(xid=13, at=T0 + timedelta(seconds=1))]
    merged, _ = merge_reports(readings(), {}, reports, POLICY)
    assert merged.gpus[0].xid == 79


def test_a_reported_repeat_of_an_acknowledged_xid_is_seen() -> None:
    # The exporter's gauge still shows the XID 79 a past remediation acknowledged: silent.
    acked = {"GPU-node-a-0": 79}
    assert evaluate_node(readings(xid=79), POLICY, acknowledged_xids=acked).action == Action.NONE
    # The kernel printed it again: the report is younger than that remediation.
    merged, still = merge_reports(readings(xid=79), acked, [report(gpu="0")], POLICY)
    assert still == {}
    assert evaluate_node(merged, POLICY, acknowledged_xids=still).action == Action.REBOOT


def test_an_acknowledgement_of_another_gpu_stays() -> None:
    acked = {"GPU-node-a-1": 48}
    _, still = merge_reports(readings(), acked, [report(gpu="0")], POLICY)
    assert still == acked


def test_an_application_xid_report_alone_asks_for_no_node_action() -> None:
    merged, acked = merge_reports(readings(), {}, [report(xid=13)], POLICY)
    assert evaluate_node(merged, POLICY, acknowledged_xids=acked).action not in (
        Action.RESET, Action.REBOOT, Action.QUARANTINE)


def test_grouping_and_pci_spellings() -> None:
    grouped = reports_by_node([report(node="a"), report(node="b"), report(node="a", xid=48)])
    assert {k: len(v) for k, v in grouped.items()} == {"a": 2, "b": 1}
    assert pci_slot("00000000:18:00.0") == pci_slot("PCI:0000:18:00") == (0, 0x18, 0)
    assert pci_slot("GPU-1234") is None and pci_slot("0") is None


def test_a_long_kernel_line_is_cut_not_refused() -> None:
    r = report(line="x" * 5000)
    assert len(r.line) == 512 and r.line.endswith("…")


def test_a_node_only_tick_observes_each_woken_node_at_most_once_per_gap() -> None:
    held = [report("node-a"), report("node-b"), report("node-c")]
    assert due_for_node_tick({"node-a", "node-b"}, held, {}, T0) == ["node-a", "node-b"]
    last = {"node-a": T0}
    assert due_for_node_tick({"node-a", "node-b"}, held, last, T0 + NODE_TICK_GAP / 2) == [
        "node-b"], "node-a had its tick within the gap: its report waits for the full tick"
    assert due_for_node_tick({"node-a"}, held, last, T0 + NODE_TICK_GAP) == ["node-a"]
    # Woken but no report held (dropped: the node is in remediation): nothing to observe.
    assert due_for_node_tick({"node-d"}, held, {}, T0) == []
    # A name that is not a node name (any Temporal client can signal) is never observed.
    odd = [report("a,metadata.name!=b"), report("UPPER")]
    assert due_for_node_tick({"a,metadata.name!=b", "UPPER"}, odd, {}, T0) == []


def test_a_node_only_observation_replaces_only_its_nodes_entries() -> None:
    base = FleetObservation(
        managed_nodes=40, readable_nodes=38, managed_gpus=320,
        verdicts=[xid_verdict("node-a"), xid_verdict("node-b")],
        remediating=[NodeStatus(node="node-c", state=NodeState.DRAINING)],
        errors=["node-a: stale", "node-z: exporter down"], pool_of={"node-a": "p1"},
        pool_sizes={"p1": 20, "p2": 20}, gpus_of={"node-a": 8, "node-b": 8},
        domain_sizes={"rack": {"r1": 20, "r2": 20}})
    # The fresh look at node-a finds it healthy and says node-b is flagged (a fake shard
    # could): only node-a's entries change.
    fresh = FleetObservation(managed_nodes=1, readable_nodes=1, managed_gpus=8,
                             verdicts=[xid_verdict("node-b")], gpus_of={"node-a": 4},
                             pool_sizes={"p1": 1}, domain_sizes={"rack": {"r1": 1}})
    merged = merge_node_observation(base, fresh, ["node-a"])
    assert [v.node for v in merged.verdicts] == ["node-b"]
    assert merged.errors == ["node-z: exporter down"]
    assert merged.pool_of == {} and merged.gpus_of == {"node-a": 4, "node-b": 8}
    # Fleet-wide figures stay the full observation's: one node's look cannot say them.
    assert (merged.managed_nodes, merged.readable_nodes, merged.managed_gpus) == (40, 38, 320)
    assert merged.pool_sizes == {"p1": 20, "p2": 20}
    assert merged.domain_sizes == {"rack": {"r1": 20, "r2": 20}}
    assert [r.node for r in merged.remediating] == ["node-c"]
    flagged = merge_node_observation(base, FleetObservation(
        managed_nodes=1, readable_nodes=1, verdicts=[xid_verdict("node-c", 48)]), ["node-c"])
    assert [v.node for v in flagged.verdicts] == ["node-a", "node-b", "node-c"]
    assert flagged.remediating == [], "node-c's fresh look shows no state label"
