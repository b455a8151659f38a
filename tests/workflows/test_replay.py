"""Replay every recorded history in tests/histories/ against today's workflow code.

A failure here means a change to RemediationWorkflow or DetectorWorkflow is not
replay-safe: workflows already running would break on the next worker. Either
guard the change with ``workflow.patched(...)``, or, when breaking replay is
intended (nothing old is running), rerun ``python -m tests.histories.record``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from workflows.detector import DetectorWorkflow
from workflows.remediation import RemediationWorkflow

HISTORIES = Path(__file__).parent.parent / "histories"
FILES = sorted(HISTORIES.glob("*.json"))


def replayer() -> Replayer:
    return Replayer(workflows=[RemediationWorkflow, DetectorWorkflow],
                    data_converter=pydantic_data_converter)


def test_the_recorded_histories_are_there():
    assert {f.stem for f in FILES} >= {
        "remediation_reboot", "remediation_approved", "remediation_quarantine_release",
        "detector_ticks"}


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
async def test_history_replays(path: Path):
    history = WorkflowHistory.from_json(path.stem, path.read_text())
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
