"""Node names are DNS-1123 subdomains, checked before anything is written: by the CLI
before any call, and by the remediation's and the manual request's models."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from policy.models import Action, Verdict
from worker.cli import app
from workflows.ids import valid_node_name
from workflows.messages import ManualRemediation, RemediationInput

GOOD = ["n1", "gpu-node-03", "ip-10-0-1-23.ec2.internal", "a" * 253,
        "gke-pool-1-abc.us-central1-a.c.project.internal"]
BAD = {
    "": "empty",
    "gpu-node-1\r\nX-Injected: yes": "control characters (U+000D)",
    "gpu-node-1\x1b[31m": "control characters (U+001B)",
    "gpu\u202enode": "control characters (U+202E)",
    "Control-Plane-0": "lower-case",
    "a" * 254: "at most 253",
    "-node": "DNS-1123",
    "node-": "DNS-1123",
    "node..a": "DNS-1123",
    "node_1": "DNS-1123",
    "../../etc": "DNS-1123",
    "node 1": "DNS-1123",
    "nöde": "DNS-1123",
}


@pytest.mark.parametrize("name", GOOD)
def test_node_names_kubernetes_accepts_are_accepted(name: str) -> None:
    assert valid_node_name(name) is None


@pytest.mark.parametrize(("name", "why"), sorted(BAD.items()))
def test_other_names_are_refused_with_one_line_reason(name: str, why: str) -> None:
    reason = valid_node_name(name)
    assert reason is not None and why in reason
    assert "\n" not in reason and "\r" not in reason and "\x1b" not in reason


@pytest.mark.parametrize("name", sorted(BAD))
def test_the_messages_refuse_them(name: str) -> None:
    with pytest.raises(ValidationError, match="node"):
        ManualRemediation(node=name, action=Action.REBOOT, operator="alice", reason="r")
    with pytest.raises(ValidationError, match="node"):
        RemediationInput(node=name, verdict=Verdict(node="n1", action=Action.REBOOT))


def test_the_messages_keep_good_names() -> None:
    req = ManualRemediation(node="gpu-node-03", action=Action.REBOOT, operator="a", reason="r")
    assert req.node == "gpu-node-03"


@pytest.mark.parametrize("command", [
    ["remediate", "--action", "reboot", "-r", "why"], ["approve"], ["abort"], ["release"],
    ["quarantine"], ["reject"], ["repaired"], ["release-orphan"],
])
def test_the_cli_refuses_a_bad_name_before_any_call(command: list[str]) -> None:
    # No Temporal server answers at this address: reaching it would fail differently.
    where = len(command) if command[0] != "remediate" else 1
    args = [*command[:where], "Control-Plane-0\r\n", *command[where:],
            "-c", "/nonexistent/config.yaml"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.replace("│", " ").split())  # the box wraps lines
    assert "lower-case" in said or "control character" in said, said
    assert "cannot read" not in result.output and "Temporal" not in result.output
