"""One GPU held alone (gpu_isolation: dra): a DeviceTaintRule keeps it out of scheduling
(NoSchedule, then NoExecute where its claim must go) while the node stays in service,
then a validation pinned to that GPU (a Job with a ResourceClaim for exactly that device):
it passes, the rule goes; it fails, or the catalog holds the fault without one, the rule
stays as a per-GPU quarantine until an operator's release (an abort removes it).
"""

from __future__ import annotations

from typing import Literal

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows import versions

with workflow.unsafe.imports_passed_through():
    from workflows import activity_refs as act
    from workflows.isolation import GpuIsolationView, GpuTaintInput, IsolateGpuInput, IsolationPlan
    from workflows.messages import RemediationResult
    from workflows.transitions import NodeState, Outcome, Step

from workflows.steps.base import RemediationBase, _cause


class GpuIsolationSteps(RemediationBase):
    async def _isolate_gpu(self, plan: IsolationPlan) -> RemediationResult | None:
        """Hold one GPU out of scheduling with a DeviceTaintRule; the node is not claimed,
        cordoned or drained. None: no rule could be made, so the whole-node path follows
        (a Warning Event says why)."""
        node, info = self.inp.node, workflow.info()
        await self._confirm_lease("the GPU isolation")
        rule_of = next((f.rule for f in self.inp.verdict.findings if f.uuid == plan.uuid), "")
        self._plan(f"isolate GPU {plan.gpu} ({plan.uuid}) with a DeviceTaintRule, NoSchedule"
                   + (", then NoExecute" if plan.evict else "") + f": {plan.why}")
        got = await self._node_call(
            act.isolate_gpu,
            IsolateGpuInput(node=node, uuid=plan.uuid, gpu=plan.gpu, value=rule_of,
                            reason=self.view.reason, workflow_id=info.workflow_id,
                            dry_run=self.inp.dry_run),
            summary=f"isolate GPU {plan.gpu} of {node}")
        if not got.isolated:
            self._plan(f"whole node: GPU {plan.gpu} cannot be isolated: {got.why_not}")
            await self._tell("GpuIsolationUnavailable",
                             f"GPU {plan.gpu} ({plan.uuid}) of {node} cannot be isolated: "
                             f"{got.why_not}; the whole node is remediated instead")
            return None
        self.view.gpu_isolation = GpuIsolationView(
            rule=got.rule, api_version=got.api_version, device=got.device, gpu=plan.gpu,
            uuid=plan.uuid, effect="NoSchedule", owner=info.workflow_id,
            reason=self.view.reason)
        self._set(NodeState.HEALTHY, Step.GPU_ISOLATED)
        self._details(f"GPU {plan.gpu} isolated: DeviceTaintRule {got.rule} (NoSchedule)")
        await self._note_event("GpuIsolated",
                               f"GPU {plan.gpu} ({plan.uuid}, device {got.device}): "
                               f"DeviceTaintRule {got.rule} NoSchedule, owner "
                               f"{info.workflow_id}: {self.view.reason}; {node} stays "
                               "schedulable for its other GPUs")
        if plan.evict:
            await self._gpu_taint("NoExecute")
            await self._note_event("GpuIsolationEvicts",
                                   f"DeviceTaintRule {got.rule} NoExecute: the claim using "
                                   f"GPU {plan.gpu} must go ({plan.why})")
        held_why = ""
        if versions.patched("gpu-validation-pinned"):
            if plan.then == "validate":
                passed, held_why = await self._validate_gpu(plan, got.rule, got.device)
                if passed:
                    return await self._gpu_validated(plan, got.rule, got.device, held_why)
            else:
                held_why = (f"the catalog holds this fault without validation: "
                            f"{plan.why}")
        # Held as a per-GPU quarantine until an operator's release (docs/operations.md).
        self._set(NodeState.HEALTHY, Step.GPU_QUARANTINED)
        self._details(f"GPU {plan.gpu} ({got.device}) held by DeviceTaintRule {got.rule}. "
                      f"Release it with `gpu-remediate release {node} -r REASON`.")
        if held_why:
            await self._tell("GpuQuarantined",
                             f"GPU {plan.gpu} ({plan.uuid}, device {got.device}) of {node} "
                             f"stays isolated by DeviceTaintRule {got.rule} until an "
                             f"operator's release: {held_why}"[:1000])
        if self.inp.dry_run:
            return RemediationResult(node=node, outcome=Outcome.QUARANTINED, attempts=0,
                                     message=f"GPU {plan.gpu} would be isolated by "
                                             f"DeviceTaintRule {got.rule}")
        await workflow.wait_condition(lambda: self.release_order is not None)
        order = self.release_order
        assert order is not None
        await self._gpu_taint(None)
        why = (f"GPU {plan.gpu} ({got.device}) released by {order.operator}: {order.reason}; "
               f"DeviceTaintRule {got.rule} removed")
        self.view.gpu_isolation = None
        self._set(NodeState.HEALTHY, Step.HEALTHY)
        await self._release_call(Outcome.HEALTHY, why, self._acknowledged_xids(),
                                 node_untouched=True)
        self.released = True
        self._details(f"{Outcome.HEALTHY}: {why}")
        return RemediationResult(node=node, outcome=Outcome.HEALTHY, attempts=0, message=why)

    async def _validate_gpu(self, plan: IsolationPlan, rule: str,
                            device: str) -> tuple[bool, str]:
        """The validation pinned to the GPU: a Job whose pod gets exactly that device
        through a ResourceClaim tolerating our taint, dcgmi diag on that GPU only. (passed,
        why): the evidence, or why the GPU is held."""
        self._set(NodeState.HEALTHY, Step.VALIDATE)
        if no_engine := await self._no_standalone_host_engine():
            self._plan(f"no pinned validation: {no_engine}")
            return False, no_engine
        result = await self._job("validate", 1, pinned=(plan.gpu, plan.uuid))
        if self.inp.dry_run:
            return False, ""  # what it would run is in the plan
        if result.succeeded:
            return True, result.evidence or result.message
        await self._tell("GpuValidationFailed",
                         f"GPU {plan.gpu} ({plan.uuid}, device {device}) of {self.inp.node} "
                         f"failed its pinned validation; DeviceTaintRule {rule} kept: "
                         f"{result.message}"[:1000])
        return False, f"its pinned validation failed: {result.message}"

    async def _no_standalone_host_engine(self) -> str:
        """Why a pinned validation cannot run here, or "". On a GPU Operator node the diag
        needs the standalone DCGM host engine (the ``dcgm`` operand): without it the
        engine is dcgm-exporter's own, which the node's seven serving GPUs need and which
        the per-GPU path never pauses; the Job would wait out its deadline for nothing."""
        op = self.inp.settings.gpu_operator
        if "dcgm-exporter" not in op.operands or self.inp.dry_run:
            return ""  # the node's GPU software is not the GPU Operator's
        why = ("no standalone DCGM host engine on the node (the GPU Operator's dcgm "
               "operand): the diagnostic would need dcgm-exporter, whose embedded engine "
               "serves the node's other GPUs, paused")
        if "dcgm" not in op.operands:
            return why
        missing = await self._standalone_host_engine_missing()
        return f"{why} ({missing})"[:500] if missing else ""

    async def _gpu_validated(self, plan: IsolationPlan, rule: str, device: str,
                             evidence: str) -> RemediationResult:
        node = self.inp.node
        await self._gpu_taint(None)
        why = (f"GPU {plan.gpu} ({device}) passed its pinned validation ({evidence}); "
               f"DeviceTaintRule {rule} removed")[:2000]
        self.view.gpu_isolation = None
        self._set(NodeState.HEALTHY, Step.HEALTHY)
        await self._note_event("GpuValidated", f"GPU {plan.gpu} ({plan.uuid}) of {node}: "
                               + why[:900])
        await self._release_call(Outcome.HEALTHY, why, self._acknowledged_xids(),
                                 node_untouched=True)
        self.released = True
        self._details(f"{Outcome.HEALTHY}: {why}")
        return RemediationResult(node=node, outcome=Outcome.HEALTHY, attempts=1, message=why)

    async def _gpu_taint(self, effect: Literal["NoSchedule", "NoExecute"] | None) -> None:
        iso = self.view.gpu_isolation
        assert iso is not None
        done = await self._node_call(
            act.set_gpu_taint,
            GpuTaintInput(rule=iso.rule, api_version=iso.api_version, node=self.inp.node,
                          effect=effect, dry_run=self.inp.dry_run),
            summary=f"DeviceTaintRule {iso.rule}: " + (effect or "remove"),
            check_cancel=effect is not None)
        self._details(done)
        if effect is not None:
            self.view.gpu_isolation = iso.model_copy(update={"effect": effect})

    async def _abort_gpu_isolation(self) -> None:
        """An abort of a per-GPU remediation: its rule goes (the node was never touched)."""
        iso = self.view.gpu_isolation
        assert iso is not None
        why = self._abort_reason()
        self._set(NodeState.HEALTHY, Step.ABORTED)
        # The pinned validation's Job and its ResourceClaim go before the rule.
        await self._delete_job_in_progress()
        try:
            await self._gpu_taint(None)
        except ActivityError as err:
            workflow.logger.warning("could not remove %s: %s", iso.rule, _cause(err))
        self.view.gpu_isolation = None
        await self._release_call(Outcome.ABORTED, f"{why}; DeviceTaintRule {iso.rule} removed",
                                 self._acknowledged_xids(), node_untouched=True)
        self.released = True
