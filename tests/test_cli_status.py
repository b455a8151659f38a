"""`gpu-remediate status`: who ordered a quarantine shows apart, an operator (named, with
their reason) and the policy (with its reason), under the table, in the one-node view and in
JSON."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

import pytest
import typer
from rich.console import Console

from policy.models import Action
from worker.cli import commands as cli
from workflows.messages import OperatorCommand, RemediationView
from workflows.transitions import NodeState, Step


def rendered(call: Callable[[], object], console: Console = cli.out) -> str:
    with console.capture() as captured, contextlib.suppress(typer.Exit):
        call()
    return captured.get()


def quarantined(**fields: Any) -> RemediationView:
    return RemediationView.model_validate({
        "node": "gpu-node-07", "state": NodeState.QUARANTINED, "step": Step.QUARANTINED,
        "action": Action.REBOOT, "reason": "XID 79", "dry_run": False, **fields})


@pytest.fixture
def answering(monkeypatch: pytest.MonkeyPatch) -> Callable[[Any], None]:
    def answer(view: Any) -> None:
        monkeypatch.setattr(cli, "with_client", lambda config, work, hint=None, needs="write":
                            [] if work is cli._open_incidents else view)
        monkeypatch.setattr(cli, "_print_ui_link", lambda config, node: None)
    return answer


def test_an_operators_order_is_named_with_their_reason(answering: Any) -> None:
    answering(quarantined(quarantine_ordered_by=OperatorCommand(operator="carol",
                                                                reason="fan failure")))
    printed = rendered(lambda: cli.status("gpu-node-07", "table", False, None))
    assert "quarantine ordered by operator carol: fan failure" in printed
    assert "the policy" not in printed


def test_the_policys_order_is_shown_as_the_policys(answering: Any) -> None:
    why = "repeat offender: 3 repairs within 7 days, 0:00:00"
    answering(quarantined(quarantine_policy_reason=why))
    printed = rendered(lambda: cli.status("gpu-node-07", "table", False, None))
    assert f"quarantine ordered by the policy: {why}" in printed
    assert "operator" not in printed


def test_the_list_names_who_ordered_each_quarantine(answering: Any) -> None:
    answering([quarantined(quarantine_ordered_by=OperatorCommand(operator="carol",
                                                                 reason="fan")),
               quarantined(node="gpu-node-08", quarantine_policy_reason="repeat offender"),
               quarantined(node="gpu-node-09"),
               {"node": "gpu-node-10", "state": "draining"}])
    lines = rendered(lambda: cli.status(None, "table", False, None)).splitlines()
    assert "gpu-node-07: quarantine ordered by operator carol: fan" in lines
    assert "gpu-node-08: quarantine ordered by the policy: repeat offender" in lines
    assert not [line for line in lines if line.startswith(("gpu-node-09:", "gpu-node-10:"))]


def test_both_orders_show_and_json_carries_both_fields(
        answering: Any, capsys: pytest.CaptureFixture[str]) -> None:
    view = quarantined(quarantine_ordered_by=OperatorCommand(operator="dave", reason="rma"),
                       quarantine_policy_reason="still hot after 1:00:00")
    answering(view)
    printed = rendered(lambda: cli.status("gpu-node-07", "table", False, None))
    assert "quarantine ordered by operator dave: rma" in printed
    assert "quarantine ordered by the policy: still hot after 1:00:00" in printed
    cli.status("gpu-node-07", "json", False, None)
    shown = json.loads(capsys.readouterr().out)
    assert shown["quarantine_ordered_by"] == {"operator": "dave", "reason": "rma"}
    assert shown["quarantine_policy_reason"] == "still hot after 1:00:00"


def test_a_view_from_a_worker_without_the_fields_shows_no_order() -> None:
    """A worker of the previous release answers without them: they decode as no order."""
    older = quarantined().model_dump(mode="json")
    del older["quarantine_ordered_by"], older["quarantine_policy_reason"]
    view = RemediationView.model_validate_json(json.dumps(older))
    assert view.quarantine_ordered_by is None and view.quarantine_policy_reason is None
    assert cli._quarantine_orders(view) == []


def test_a_name_recorded_unverified_is_shown_with_its_mark_everywhere(
        answering: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """The mark is the workflow's (workflows/operator_identity.py): the CLI shows the name as
    recorded, in the one-node view, the list and JSON, never cutting the mark off."""
    order = OperatorCommand(operator="carol (unverified)", reason="fan failure")
    answering(quarantined(quarantine_ordered_by=order))
    printed = " ".join(rendered(lambda: cli.status("gpu-node-07", "table", False, None)).split())
    assert "quarantine ordered by operator carol (unverified): fan failure" in printed
    answering([quarantined(quarantine_ordered_by=order)])
    listed = " ".join(rendered(lambda: cli.status(None, "table", False, None)).split())
    assert "gpu-node-07: quarantine ordered by operator carol (unverified): fan failure" in listed
    answering(quarantined(quarantine_ordered_by=order))
    capsys.readouterr()
    with contextlib.suppress(typer.Exit):
        cli.status("gpu-node-07", "json", False, None)
    shown = json.loads(capsys.readouterr().out)
    assert shown["quarantine_ordered_by"]["operator"] == "carol (unverified)"
