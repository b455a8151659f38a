"""Replay every recorded history in tests/histories/ against today's workflow code.

A failure here means a change to RemediationWorkflow or DetectorWorkflow is not
replay-safe: workflows already running would break on the next worker. Either
guard the change with ``workflow.patched(...)``, or, when breaking replay is
intended (nothing old is running), rerun ``python -m tests.histories.record``.

Two corpora: the previous release's four histories (written before abort by
cancellation, signals, continue-as-new, polled Jobs and the confirmed reboot: they prove
every ``workflow.patched`` branch is skipped on replay), and ``v2_*`` / ``v3_*`` /
``v4_*``, one history per workflow test scenario with the patched branches of its time
taken (v4: the reset beside the GPU Operator, validation that proves the node, NodeGone;
v5: leases, the detector's limits and node reports, aborts in the operands pause and the
quarantine write, jobs that never start or never finish; see test_patch_coverage.py).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from workflows import versions
from workflows.detector import DetectorWorkflow
from workflows.remediation import RemediationWorkflow

HISTORIES = Path(__file__).parent.parent / "histories"
FILES = sorted(HISTORIES.glob("*.json"))


def replayer() -> Replayer:
    return Replayer(workflows=[RemediationWorkflow, DetectorWorkflow],
                    data_converter=pydantic_data_converter)


PREVIOUS = {"remediation_reboot", "remediation_approved", "remediation_quarantine_release",
            "detector_ticks"}
CURRENT = {
    "v2_reboot", "v2_reset_then_reboot", "v2_thermal_recovered", "v2_thermal_escalated.run1",
    "v2_external_repaired_update", "v2_external_repaired_signal", "v2_approved_update",
    "v2_approved_signal", "v2_rejected", "v2_approval_timeout", "v2_rejected_signals",
    "v2_abort_mid_drain", "v2_drain_force", "v2_drain_release", "v2_drain_overdue",
    "v2_step_failure.run1", "v2_repeat_offender.run1", "v2_quarantine_hold.run1",
    "v2_quarantine_hold.run2", "v2_drain_continue_as_new.run1", "v2_dry_run",
    "v2_detector_pause_signal.run1", "v3_thermal_recovered", "v3_thermal_escalated.run1",
    "v3_repeat_offender.run1", "v4_reset_beside_operands", "v4_node_gone"}
# Recorded with every patched branch of its time taken (tests/histories/record.py SCENARIOS;
# test_patch_coverage.py: every patch id has a history).
V5 = {
    "v5_reboot", "v5_reset", "v5_abort_in_operands_pause", "v5_abort_in_quarantine_write",
    "v5_external_repaired_signal", "v5_repeat_offender_gated.run1",
    "v5_heat_watch_quarantined.run1", "v5_job_not_started", "v5_job_wait_last_look",
    "v5_heat_slot.run1", "v5_detector.run1", "remediation-v5-detector-hot.run1",
    "v5_reboot_not_back.run1", "v5_detector_mirror.run1", "v5_detector_woken.run1"}

# Recorded under the release marker (workflows/versions.py): one core_patch marker a run.
V7 = {"v7_reboot", "v7_detector.run1", "remediation-v7-detector-hot.run1",
      "v7_heat_watch_quarantined.run1", "v7_abort_in_quarantine_write",
      "v7_external_repaired_signal"}


def workflow_id(path: Path) -> str:
    """The file name up to its first dot (``.runN`` names one run of a continued one)."""
    return path.name.split(".", 1)[0]


def events(name: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads((HISTORIES / f"{name}.json").read_text())["events"]
    return events


def activity_types(name: str) -> list[str]:
    return [e["activityTaskScheduledEventAttributes"]["activityType"]["name"]
            for e in events(name) if "activityTaskScheduledEventAttributes" in e]


def markers(name: str) -> set[str]:
    """The patch IDs a history recorded (``workflow.patched`` that returned True)."""
    found = set()
    for e in events(name):
        attrs = e.get("markerRecordedEventAttributes")
        if attrs and attrs["markerName"] == "core_patch":
            found.add(json.loads(base64.b64decode(
                attrs["details"]["patch-data"]["payloads"][0]["data"]))["id"])
    return found


def test_the_recorded_histories_are_there():
    """None lost (a file ``record --missing`` adds is replayed by the glob as well)."""
    missing = (PREVIOUS | CURRENT | V5 | V7) - {f.stem for f in FILES}
    assert not missing, f"recorded histories gone: {sorted(missing)}"


def test_the_previous_corpus_took_no_patched_branch():
    """What proves the patched branches replay-safe: old histories without their markers."""
    for name in PREVIOUS - {"detector_ticks"}:
        assert "continue-as-new-in-loops" not in markers(name), name
        assert "run_node_job" in activity_types(name), name


def test_the_current_corpus_takes_the_patched_branches():
    """The scenarios recorded what they are named for (a recorder that silently took
    another path would leave a branch without a replay check)."""
    reboot = activity_types("v2_reboot")
    assert "poll_node_job" in reboot and "run_node_job" not in reboot
    assert "check_node_returned" in reboot
    assert {"jobs-polled-by-retry", "reboot-confirmed-by-the-node"} <= markers("v2_reboot")
    assert activity_types("v2_reset_then_reboot").count("poll_node_job") == 4
    for name in ("v2_thermal_escalated.run1", "v2_step_failure.run1",
                 "v2_repeat_offender.run1", "v2_quarantine_hold.run1",
                 "v2_drain_continue_as_new.run1", "v2_detector_pause_signal.run1"):
        assert "workflowExecutionContinuedAsNewEventAttributes" in events(name)[-1], name
    assert "policy-quarantine-awaits-approval" in markers("v2_repeat_offender.run1")
    for name in ("v3_thermal_recovered", "v3_thermal_escalated.run1"):
        assert "thermal-polled-by-retry" in markers(name), name
        assert "check_thermal" in activity_types(name), name
        assert "watch_thermal" not in activity_types(name), name
    assert "workflowExecutionContinuedAsNewEventAttributes" in \
        events("v3_thermal_escalated.run1")[-1]
    for name in ("v2_thermal_recovered", "v2_thermal_escalated.run1"):
        assert "watch_thermal" in activity_types(name), name
    assert "repeat-offender-counts-repairs" in markers("v3_repeat_offender.run1")
    assert {"reset-beside-gpu-operator", "validation-proves-the-node"} <= markers(
        "v4_reset_beside_operands")
    acts = activity_types("v4_reset_beside_operands")
    assert acts.index("pause_gpu_operands") < acts.index("restore_gpu_operands")
    assert "check_gpus_free" in acts and "read_node_health" in acts
    assert "node-gone-event" in markers("v4_node_gone")
    assert "record_event" in activity_types("v4_node_gone")
    assert "repeat-offender-counts-repairs" not in markers("v2_repeat_offender.run1")
    assert "workflowExecutionCanceledEventAttributes" in events("v2_abort_mid_drain")[-1]
    assert "drain-before-release-validation" in markers("v2_quarantine_hold.run2")
    signals = [e["workflowExecutionSignaledEventAttributes"]["signalName"]
               for e in events("v2_rejected_signals")
               if "workflowExecutionSignaledEventAttributes" in e]
    assert signals == ["approve", "aprove", "release"]
    assert "record_event" in activity_types("v2_rejected_signals")


def test_the_v5_corpus_takes_the_paths_it_is_named_for():
    """Each v5 scenario went where its patch ids are decided, not past them."""
    def signals(name: str) -> list[str]:
        return [e["workflowExecutionSignaledEventAttributes"]["signalName"]
                for e in events(name) if "workflowExecutionSignaledEventAttributes" in e]

    def last(name: str) -> str:
        return next(k for k in events(name)[-1] if k.endswith("EventAttributes"))

    for name in ("v5_abort_in_operands_pause", "v5_abort_in_quarantine_write"):
        assert last(name) == "workflowExecutionCanceledEventAttributes", name
    acts = activity_types("v5_abort_in_operands_pause")
    assert "pause_gpu_operands" in acts and "restore_gpu_operands" in acts
    assert "poll_node_job" not in acts, "aborted in the pause: no reset ran"
    # The quarantine was written, then the abort ended the run instead of its hand-over.
    assert "abort-carried-past-continue-as-new" in markers("v5_abort_in_quarantine_write")
    for name in ("v5_repeat_offender_gated.run1", "v5_heat_watch_quarantined.run1",
                 "v5_heat_slot.run1", "v5_detector.run1", "remediation-v5-detector-hot.run1",
                 "v5_reboot_not_back.run1", "v5_detector_mirror.run1"):
        assert last(name) == "workflowExecutionContinuedAsNewEventAttributes", name
    assert signals("v5_external_repaired_signal") == ["repaired"]
    assert signals("v5_heat_slot.run1") == ["slot_granted"]
    assert signals("remediation-v5-detector-hot.run1") == ["slot_granted"]
    assert {"node_report", "request_slot"} <= set(signals("v5_detector.run1"))
    assert "read_limits" in activity_types("v5_detector.run1")
    for name in ("v5_heat_slot.run1", "remediation-v5-detector-hot.run1"):
        assert "drain_node" in activity_types(name), name
    acts = activity_types("v5_reboot_not_back.run1")
    assert acts.index("check_node_returned") < acts.index("mark_out_of_service")
    assert "rewrite_state_mirror" in activity_types("v5_detector_mirror.run1")
    for name in ("v5_job_not_started", "v5_job_wait_last_look"):
        # The first round's validation failed as such; the second round healed the node.
        attrs = events(name)[-1]["workflowExecutionCompletedEventAttributes"]
        result = json.loads(base64.b64decode(attrs["result"]["payloads"][0]["data"]))
        assert (result["outcome"], result["attempts"]) == ("healthy", 2), (name, result)


def kinds(name: str) -> list[str]:
    return [next(k for k in e if k.endswith("EventAttributes")) for e in events(name)]


def test_a_run_under_this_release_shows_one_patch_marker_as_its_first_row():
    """The Temporal UI shows each core_patch marker as a timeline row named only
    "core_patch". A run under this release records one, the release's, right after its
    first workflow task, so a step is its activities and nothing else; the same scenarios
    recorded before the fold showed a marker per patched branch they passed."""
    for name in V7:
        assert markers(name) == {versions.RELEASE_PATCH}, name
        assert kinds(name).count("markerRecordedEventAttributes") == 1, name
        assert kinds(name)[3:5] == ["workflowTaskCompletedEventAttributes",
                                    "markerRecordedEventAttributes"], name
    for before in ("v5_reboot", "v5_detector.run1", "v5_external_repaired_signal"):
        assert kinds(before).count("markerRecordedEventAttributes") >= 5, before
    # The same paths as before the fold: the scenarios still went where they are named for.
    assert activity_types("v7_reboot") == activity_types("v6_reboot")
    assert "workflowExecutionCanceledEventAttributes" in \
        events("v7_abort_in_quarantine_write")[-1]
    assert "workflowExecutionContinuedAsNewEventAttributes" in \
        events("v7_heat_watch_quarantined.run1")[-1]


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
async def test_history_replays(path: Path):
    history = WorkflowHistory.from_json(workflow_id(path), path.read_text())
    assert len(history.events) > 10
    result = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.name}: {result.replay_failure}"


async def test_replay_catches_a_changed_workflow():
    """The check has teeth: a history whose commands differ from the code fails."""
    data = json.loads((HISTORIES / "remediation_reboot.json").read_text())
    for event in data["events"]:
        attrs = event.get("activityTaskScheduledEventAttributes")
        if attrs and attrs["activityType"]["name"] == "run_node_job":
            attrs["activityType"]["name"] = "some_other_activity"
            break
    else:
        pytest.fail("no run_node_job in the recorded remediation")
    history = WorkflowHistory.from_json("tampered", data)
    with pytest.raises(NondeterminismError):
        await replayer().replay_workflow(history)
