"""One DCGM host engine per node, on the time-skipping server: where no standalone engine
(the GPU Operator's dcgm operand) runs, the validation pauses dcgm-exporter, whose embedded
engine would otherwise be a second one beside the Job's, and restores it as found."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from tests.workflows.fakes import FakeCluster, xid_verdict
from tests.workflows.test_remediation import remediate
from tests.workflows.test_repair_on_real_nodes import order
from workflows import errors
from workflows.messages import RemediationInput
from workflows.operands import OperandsState, OperandsWaitInput, deploy_label
from workflows.transitions import NodeState

DCGM, EXPORTER = deploy_label("dcgm"), deploy_label("dcgm-exporter")


@dataclass
class NoStandaloneEngine(FakeCluster):
    """The GPU Operator runs without its optional standalone dcgm operand."""

    def activities(self) -> list[Any]:
        base = {getattr(f, "__temporal_activity_definition").name: f
                for f in super().activities()}
        back = base["check_operands_back"]

        @activity.defn(name="check_operands_back")
        def check_operands_back(inp: OperandsWaitInput) -> OperandsState:
            if inp.labels == [DCGM]:
                with self.lock:
                    self.calls.append(("check_operands_back", inp))
                raise ApplicationError(f"no DaemonSet in namespace {inp.namespace} selects "
                                       f"{DCGM}=true", type=errors.OPERANDS_NOT_FOUND,
                                       non_retryable=True)
            result: OperandsState = back(inp)
            return result

        base["check_operands_back"] = check_operands_back
        return list(base.values())


async def test_without_a_standalone_engine_dcgm_exporter_is_paused_for_the_diagnostic(
        time_skipping_env) -> None:
    cluster = NoStandaloneEngine()
    node = cluster.node("e1")
    result = await remediate(time_skipping_env, cluster,
                             RemediationInput(node="e1", verdict=xid_verdict("e1")))
    assert result.outcome == NodeState.HEALTHY, result
    calls = order(cluster)
    at = calls.index("job:validate")
    assert calls[at - 3:at] == ["check_operands_back", "pause_gpu_operands",
                                "check_operands_gone"], calls
    assert calls[at + 1:] == ["restore_gpu_operands", "check_operands_back",
                              "read_node_health"], calls
    pause = [c[1] for c in cluster.calls if c[0] == "pause_gpu_operands"][-1]
    assert pause.operands == ["dcgm-exporter"]
    assert node.operand_labels[EXPORTER] == "true", "restored as found"
    restore = [c[1] for c in cluster.calls if c[0] == "restore_gpu_operands"][-1]
    assert restore.changed == {EXPORTER: "true"}


async def test_an_exporter_someone_else_turned_off_stays_off(time_skipping_env) -> None:
    cluster = NoStandaloneEngine()
    node = cluster.node("e2")
    node.operand_labels[EXPORTER] = "false"
    result = await remediate(time_skipping_env, cluster,
                             RemediationInput(node="e2", verdict=xid_verdict("e2")))
    assert result.outcome == NodeState.HEALTHY
    assert node.operand_labels[EXPORTER] == "false"
    assert "check_operands_gone" not in order(cluster)[-6:], "nothing of ours to wait for"
