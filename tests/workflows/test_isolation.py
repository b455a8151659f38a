"""The per-GPU isolation decision (workflows/isolation.py): pure, shared by the workflow
and the plan."""

from __future__ import annotations

import pytest

from policy.models import Action, Finding, Verdict
from workflows.isolation import POLICY, GpuIsolation, IsolationDecision, IsolationPlan, rule_name

UUID = "GPU-5d1a3c2e-8d0b-4c1e-9a57-6b1f3c2d9e41"
OTHER = "GPU-7e2b4d3f-9e1c-4d2f-8b68-7c2e4d3e0f52"


def finding(action: Action, gpu: str = "3", uuid: str = UUID, rule: str = "r") -> Finding:
    return Finding(gpu=gpu, uuid=uuid, signal="xid", value=48, rule=rule, action=action)


def verdict(action: Action, *findings: Finding) -> Verdict:
    return Verdict(node="gpu-node-01", action=action,
                   findings=list(findings) or [finding(action)])


DRA = IsolationDecision(GpuIsolation.DRA)


def test_off_is_always_the_whole_node() -> None:
    assert IsolationDecision(GpuIsolation.OFF).decide(verdict(Action.RESET)) == \
        "remediation.gpu_isolation is off"


@pytest.mark.parametrize(("action", "evict", "then"), [
    (Action.RESET, True, "validate"),
    (Action.QUARANTINE, True, "quarantine"),
    (Action.APP, False, "validate"),
])
def test_one_gpu_faults_are_isolated_as_the_policy_says(action: Action, evict: bool,
                                                        then: str) -> None:
    plan = DRA.decide(verdict(action))
    assert isinstance(plan, IsolationPlan)
    assert (plan.gpu, plan.uuid, plan.evict, plan.then) == ("3", UUID, evict, then)
    assert plan.why == POLICY[action].why


@pytest.mark.parametrize("action", [Action.REBOOT, Action.THERMAL, Action.DIAGNOSE])
def test_node_wide_actions_take_the_whole_node_path(action: Action) -> None:
    assert DRA.decide(verdict(action)) == f"action {action.value} is a whole-node repair"


def test_a_second_sick_gpu_makes_it_the_nodes_problem() -> None:
    v = verdict(Action.RESET, finding(Action.RESET), finding(Action.APP, gpu="5", uuid=OTHER))
    assert DRA.decide(v) == "the fault is on 2 GPUs, not one"


def test_a_harmless_finding_on_another_gpu_does_not_count() -> None:
    noise = finding(Action.NONE, gpu="6", uuid=OTHER)
    assert isinstance(DRA.decide(verdict(Action.RESET, finding(Action.RESET), noise)),
                      IsolationPlan)


@pytest.mark.parametrize("uuid", ["", "3", "GPU-../../etc", "MIG-5d1a3c2e-8d0b"])
def test_without_a_gpu_uuid_the_device_cannot_be_named(uuid: str) -> None:
    assert DRA.decide(verdict(Action.RESET, finding(Action.RESET, uuid=uuid))) == \
        "the exporter gave no GPU UUID for the fault"


def test_rule_names_are_dns_subdomains_within_253() -> None:
    assert rule_name("gpu-node-01", "gpu-3") == "gpu-remediate.gpu-3.gpu-node-01"
    long = rule_name("n" * 300, "gpu-3")
    assert len(long) <= 253 and long.startswith("gpu-remediate.gpu-3.")
