"""Steps and outcomes are enums (workflows/transitions.py) whose values are the strings that
travel: the payloads that carry them are byte for byte what the plain strings made, and every
step and outcome in the recorded histories decodes."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.contrib.pydantic import pydantic_data_converter

from policy.models import Action
from workflows.messages import (
    HistoryEntry,
    ReleaseInput,
    RemediationResult,
    RemediationView,
    StateInput,
    Transition,
)
from workflows.transitions import NodeState, Outcome, Step

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
HISTORIES = Path(__file__).parent.parent / "histories"

# What these messages encoded to while steps and outcomes were plain strings.
BEFORE = {
    "view": '{"node":"n1","state":"draining","step":"drain-overdue","action":"reboot",'
            '"reason":"XID 79","dry_run":false,"attempt":0,"since":null,"pods_left":0,'
            '"blocking_pdb":"","blocked_since":null,"previously_cordoned":false,"plan":[],'
            '"transitions":[{"at":"2026-01-02T03:04:05Z","state":"draining","step":"drain",'
            '"note":""},{"at":"2026-01-02T03:04:05Z","state":"draining",'
            '"step":"drain-overdue","note":""}],"rejected_commands":[],"runs":1,"lease_scope":"node"}',
    "state": '{"node":"n1","state":"repairing","reason":"XID 79","step":"gpu-reset",'
             '"now":"2026-01-02T03:04:05Z","attempt":0,"event_reason":"RepairStarted",'
             '"event_message":"m","event_type":"Normal","dry_run":false,"uid":""}',
    "release": '{"node":"n1","outcome":"aborted","uncordon":true,"history":{'
               '"started":"2026-01-02T03:04:05Z","finished":"2026-01-02T03:04:05Z",'
               '"action":"reboot","reason":"XID 79","outcome":"aborted: by bob: x",'
               '"workflow_id":"","by":"","repaired":null},"acknowledged_xids":{},'
               '"event_reason":"RemediationAborted","event_message":"aborted: x",'
               '"dry_run":false,"claim_unconfirmed":false,"uid":"","run_id":""}',
    "released": '{"node":"n1","outcome":"released","attempts":0,"message":"m"}',
    "quarantined": '{"node":"n1","outcome":"quarantined","attempts":2,"message":"m"}',
    "healthy": '{"node":"n1","outcome":"healthy","attempts":1,"message":"m"}',
}
# Fields added since (with defaults): left out of the comparison, absent from what an earlier
# worker wrote.
ADDED = {"view": {"quarantine_ordered_by", "quarantine_policy_reason", "gpu_isolation"},
         "release": {"node_untouched"}}


def samples() -> dict[str, BaseModel]:
    return {
        "view": RemediationView(
            node="n1", state=NodeState.DRAINING, step=Step.DRAIN_OVERDUE, action=Action.REBOOT,
            reason="XID 79", dry_run=False,
            transitions=[Transition(at=T0, state=NodeState.DRAINING, step=Step.DRAIN),
                         Transition(at=T0, state=NodeState.DRAINING, step=Step.DRAIN_OVERDUE)]),
        "state": StateInput(node="n1", state=NodeState.REPAIRING, reason="XID 79",
                            step=Step.GPU_RESET, now=T0, event_reason="RepairStarted",
                            event_message="m"),
        "release": ReleaseInput(
            node="n1", outcome=Outcome.ABORTED, uncordon=True,
            history=HistoryEntry(started=T0, finished=T0, action="reboot", reason="XID 79",
                                 outcome=f"{Outcome.ABORTED}: by bob: x"),
            event_reason="RemediationAborted", event_message=f"{Outcome.ABORTED}: x"),
        "released": RemediationResult(node="n1", outcome=Outcome.RELEASED, attempts=0,
                                      message="m"),
        "quarantined": RemediationResult(node="n1", outcome=Outcome.QUARANTINED, attempts=2,
                                         message="m"),
        "healthy": RemediationResult(node="n1", outcome=Outcome.HEALTHY, attempts=1,
                                     message="m"),
    }


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_a_payload_is_byte_for_byte_what_the_strings_made(name: str) -> None:
    model, added = samples()[name], ADDED.get(name, set())
    assert model.model_dump_json(exclude=added) == BEFORE[name]
    payload = pydantic_data_converter.payload_converter.to_payloads([model])[0]
    assert {k: v for k, v in json.loads(payload.data).items() if k not in added} == \
        json.loads(BEFORE[name])
    # What an earlier worker wrote decodes to the enums and encodes back the same.
    again = type(model).model_validate_json(BEFORE[name])
    assert again == model and again.model_dump_json(exclude=added) == BEFORE[name]


def test_the_values_are_the_strings_that_travel() -> None:
    assert f"{Step.DRAIN_OVERDUE}" == str(Step.DRAIN_OVERDUE) == "drain-overdue"
    assert f"{Outcome.QUARANTINED}: why" == "quarantined: why"
    assert {o.value for o in Outcome} <= {s.value for s in Step}, \
        "a remediation that gives its node back ends in the step named by its outcome"
    assert Outcome.HEALTHY == NodeState.HEALTHY and Outcome.QUARANTINED == NodeState.QUARANTINED


def _payloads(node: Any) -> Iterator[Any]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "data" and isinstance(value, str):
                with contextlib.suppress(ValueError):
                    yield json.loads(base64.b64decode(value))
            else:
                yield from _payloads(value)
    elif isinstance(node, list):
        for item in node:
            yield from _payloads(item)


def _fields(node: Any, key: str) -> Iterator[tuple[dict[str, Any], Any]]:
    if isinstance(node, dict):
        if key in node:
            yield node, node[key]
        for value in node.values():
            yield from _fields(value, key)
    elif isinstance(node, list):
        for item in node:
            yield from _fields(item, key)


def test_every_recorded_step_and_outcome_decodes() -> None:
    steps: set[str] = set()
    outcomes: set[str] = set()
    for path in sorted(HISTORIES.glob("*.json")):
        for payload in _payloads(json.loads(path.read_text())):
            # A lease confirmation's "step" is the words of what it comes before, not a Step.
            steps |= {v for msg, v in _fields(payload, "step") if "token" not in msg}
            # A release's and a result's outcome (not a drain's or a thermal watch's).
            outcomes |= {v for msg, v in _fields(payload, "outcome")
                         if "uncordon" in msg or "attempts" in msg}
    assert steps and outcomes
    assert all(Step(s) for s in steps), steps
    assert all(Outcome(o) for o in outcomes), outcomes
    assert {"claimed", "drain", "validate", "quarantined", "release-validate"} <= steps


def test_history_entries_count_repairs_by_outcome() -> None:
    entry = HistoryEntry(started=T0, action="reboot", reason="r",
                         outcome=f"{Outcome.QUARANTINED}: validation failed")
    assert entry.counts_as_repair()
    assert not entry.model_copy(update={"outcome": f"{Outcome.RELEASED}: rejected"}
                                ).counts_as_repair()
