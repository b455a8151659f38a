"""Validation that proves something: every GPU free first (the device plugin restarted once
where one stays held), the diagnostic Job on one DCGM host engine, then the node's health
read again; the node Jobs themselves (named per run and attempt, polled by retry); the
evictions before a released node is validated; the XIDs a node shows at its release.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Literal

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

from workflows import versions

with workflow.unsafe.imports_passed_through():
    from policy.models import SEVERITY, Action
    from policy.rules import SIG_XID, gpu_key
    from workflows import activity_refs as act
    from workflows import errors
    from workflows.messages import (
        GPU_UUID,
        DrainInput,
        GpusFree,
        GpusFreeInput,
        NodeHealthInput,
        NodeJobInput,
        NodeJobResult,
    )
    from workflows.operands import DevicePluginInput, OperandsInput, OperandsWaitInput, deploy_label

from workflows.steps.base import (
    ABORT_READ_RETRY,
    NODE_CALL,
    RemediationBase,
    _cause,
    _minutes,
    _timed_out,
)
from workflows.steps.drain import DRAIN_RETRY


def node_job_name(kind: str, node: str, run_id: str, attempt: int) -> str:
    """A Job name unique per run and attempt (so a retried activity adopts its own Job and
    never an earlier run's), at most 63 characters (the Job controller copies it into a
    label) and a valid DNS subdomain even where a long node name is cut after a dot.

    The run is named by a hash of its whole ID: run IDs are time-ordered UUIDs, so runs
    started within about a minute share their first eight characters.
    """
    run = hashlib.sha256(run_id.encode()).hexdigest()[:8]
    return f"gr-{kind}-{node}"[:50].rstrip("-.") + f"-{run}-{attempt}"


class ValidationSteps(RemediationBase):
    def _job_poll_retry(self) -> RetryPolicy:
        """A node Job looked at every job_poll_interval (each look a short activity)."""
        every = self.inp.settings.job_poll_interval
        return RetryPolicy(initial_interval=every, backoff_coefficient=1.0,
                           maximum_interval=every,
                           non_retryable_error_types=[*errors.NOT_RETRIED,
                                                      errors.JOB_TEMPLATE_REFUSED])

    async def _validate(self, attempt: int,
                        released_xids: dict[str, int] | None = None) -> NodeJobResult:
        """Validation that proves something: every expected GPU free first (a GPU the
        device plugin still holds unhealthy, or a GPU-requesting DaemonSet, is named as
        the reason instead of a Job that cannot start), the Job's dcgmi evidence, then
        the exporter read again: the node is not returned while a fault still shows."""
        if not versions.patched("validation-proves-the-node"):
            return await self._job("validate", attempt)
        s = self.inp.settings
        if not self.inp.dry_run and self.gpus > 0:
            free = await self._gpus_free()
            if isinstance(free, str):
                return NodeJobResult(succeeded=False, job_name="",
                                     message=f"not every GPU free for validation within "
                                             f"{s.gpus_free_timeout}: {free}")
        # One DCGM host engine per node: the standalone one (the GPU Operator's dcgm
        # operand) where it runs; else dcgm-exporter, whose embedded engine it would be,
        # is paused for the diagnostic and restored exactly as found, like the reset's
        # operands. The Job activity picks the engine from what runs on the node and
        # never creates the Job beside the exporter's.
        op = s.gpu_operator
        exporter = "dcgm-exporter"
        pause_exporter = False
        if (exporter in op.operands and not self.inp.dry_run
                and versions.patched("one-dcgm-host-engine")):
            pause_exporter = True
            if "dcgm" in op.operands:
                missing = await self._standalone_host_engine_missing()
                if missing:
                    workflow.logger.info("no standalone DCGM host engine on %s: %s",
                                         self.inp.node, missing)
                else:
                    pause_exporter = False
            if not pause_exporter:
                self._plan("validate on the node's standalone DCGM host engine (the GPU "
                           "Operator's dcgm operand, hostPort 5555)")
            else:
                self._plan("no standalone DCGM host engine: pause dcgm-exporter (its "
                           "embedded engine) for the diagnostic, run the Job's own as root, "
                           "restore the exporter as found")
                self._pausing_operands()
                paused = await self._node_call(
                    act.pause_gpu_operands,
                    OperandsInput(node=self.inp.node, operands=[exporter],
                                  namespace=op.namespace),
                    summary=f"pause dcgm-exporter on {self.inp.node} for validation",
                    check_cancel=False)
                self.operands_paused = paused
                self._check_cancelled()
                self._details(f"DCGM host engine: the Job's own; {paused.message}")
                if paused.changed:
                    gone = await self._wait_for(
                        act.check_operands_gone,
                        OperandsWaitInput(node=self.inp.node, labels=sorted(paused.changed),
                                          namespace=op.namespace),
                        op.stop_timeout, f"wait for dcgm-exporter to leave {self.inp.node}")
                    if isinstance(gone, str):
                        await self._restore_operands()
                        return NodeJobResult(succeeded=False, job_name="", message=(
                            f"dcgm-exporter did not stop within {op.stop_timeout} for the "
                            f"validation's host engine: {gone}"))
        check = await self._job("validate", attempt)
        if pause_exporter:
            changed = sorted(self.operands_paused.changed) if self.operands_paused else []
            await self._restore_operands()
            if changed:
                back = await self._wait_for(
                    act.check_operands_back,
                    OperandsWaitInput(node=self.inp.node, labels=changed,
                                      namespace=op.namespace, expected_gpus=self.gpus),
                    op.start_timeout, f"wait for dcgm-exporter on {self.inp.node}")
                if isinstance(back, str):
                    # The health read below finds out whether the exporter answers.
                    self._details(f"dcgm-exporter not back within {op.start_timeout}: "
                                  f"{back}")
        if not check.succeeded or self.inp.dry_run:
            return check
        self._plan("read the node's DCGM health again; return it only if no fault shows")
        health = await self._node_call(
            act.read_node_health,
            NodeHealthInput(node=self.inp.node, policy=self.inp.policy,
                            acknowledged={**self._acknowledged_xids(),
                                          **(released_xids or {})}),
            summary=f"read {self.inp.node}'s DCGM health after validation")
        if not health.readable:
            return check.model_copy(update={
                "succeeded": False,
                "message": f"validation passed, but the exporter does not answer: "
                           f"{health.message}"})
        faults = [f for f in (health.verdict.findings if health.verdict else [])
                  if SEVERITY[f.action] >= SEVERITY[Action.RESET]]
        if faults:
            shown = "; ".join(f"{f.rule} on GPU {f.gpu}" for f in faults[:3])
            return check.model_copy(update={
                "succeeded": False,
                "message": f"validation passed, but DCGM still reports: {shown}"})
        return check

    async def _xids_shown_at_release(self, acked: dict[str, int], *,
                                     aborting: bool = False) -> dict[str, int]:
        """The XIDs the exporter shows when an operator releases the node. An XID is an
        event and dcgm-exporter keeps showing the last one until another comes, so a
        fault repaired by hand would show for ever: the release acknowledges what shows
        now (recorded on success, so the detector does not remediate it again), and only
        an XID that comes after it, or a fault that is a state (ECC, row remapping), keeps
        the node out after its validation.

        ``aborting``: an abort acknowledges them too, or the detector would start the
        same remediation again on its next tick. Best effort there (a few tries, nothing
        acknowledged if the node cannot be read): the give-back must not wait on it."""
        if self.inp.dry_run or not versions.patched("validation-proves-the-node"):
            return {}
        if aborting and not versions.patched("abort-acknowledges-shown-xids"):
            return {}
        arg = NodeHealthInput(node=self.inp.node, policy=self.inp.policy,
                              acknowledged={**self._acknowledged_xids(), **acked})
        summary = f"read the XIDs {self.inp.node} shows at its release"
        if aborting:
            try:
                health = await self._call(
                    act.read_node_health, arg, timeout=NODE_CALL, heartbeat=False,
                    summary=summary, check_cancel=False, retry=ABORT_READ_RETRY)
            except ActivityError as err:
                workflow.logger.warning("could not read %s's XIDs at the abort: %s",
                                        self.inp.node, _cause(err))
                return {}
        else:
            health = await self._node_call(act.read_node_health, arg, summary=summary)
        shown = {gpu_key(f): int(f.value) for f in
                 (health.verdict.findings if health.readable and health.verdict else [])
                 if f.signal == SIG_XID and f.value}
        if shown:
            self._plan(f"the {'abort' if aborting else 'release'} acknowledges the XIDs "
                       "the node shows now: "
                       + ", ".join(f"XID {x} on {g}" for g, x in sorted(shown.items())))
        return shown

    async def _gpus_free(self) -> GpusFree | str:
        """Wait for every expected GPU to be allocatable and free (the reason as a string
        on timeout). The NVIDIA device plugin keeps a GPU that had a critical XID unhealthy
        until it restarts, and a release or a repair that turned no operand off restarts
        nothing: when GPUs are still short after ``device_plugin_restart_after``, its pod
        on the node is evicted once (the DaemonSet starts a new one), and a GPU still
        short as long again after that is really unhealthy: the reason comes back then,
        not at ``gpus_free_timeout``."""
        s = self.inp.settings
        look = GpusFreeInput(node=self.inp.node, uid=self.uid, expected_gpus=self.gpus)
        summary = f"wait for {self.gpus} free GPUs on {self.inp.node}"
        grace = s.gpu_operator.device_plugin_restart_after
        if grace is None or grace >= s.gpus_free_timeout or not s.gpu_operator.operands:
            return await self._wait_for(act.check_gpus_free, look, s.gpus_free_timeout,
                                        summary)
        free = await self._wait_for(act.check_gpus_free, look, grace, summary)
        if not isinstance(free, str):
            return free
        restart = await self._node_call(
            act.restart_device_plugin,
            DevicePluginInput(node=self.inp.node, uid=self.uid,
                              namespace=s.gpu_operator.namespace, expected_gpus=self.gpus),
            summary=f"restart the device plugin on {self.inp.node}")
        self._details(restart.message)
        left = s.gpus_free_timeout - grace
        return await self._wait_for(act.check_gpus_free, look,
                                    min(left, grace) if restart.evicted else left, summary)

    async def _clear_for_validation(self) -> str:
        """Evict what is still on a quarantined node before validating it: a quarantine
        ordered mid-drain (or a failed step) can leave pods, and validation needs every
        GPU. Returns why not, or "" once the node is empty."""
        d = self.inp.settings.drain
        started = workflow.now()
        # Reports back off as the drain's do (doubling up to report_max), and the wait ends
        # before the run's history outgrows history_events_per_run: a drain deadline of a
        # day or more once reached Temporal's 51,200-event limit here.
        bounded = versions.patched("release-clear-bounded")
        report_after = d.report_after
        while True:
            result = await self._call(
                act.drain_node,
                DrainInput(node=self.inp.node, settings=d, report_after=report_after,
                           dry_run=self.inp.dry_run, uid=self.uid),
                timeout=max(timedelta(minutes=10), report_after + timedelta(minutes=5)),
                heartbeat=True, retry=DRAIN_RETRY,
                summary=f"evict what is left on {self.inp.node} before validation")
            self.view.pods_left = len(result.remaining)
            if result.outcome in ("drained", "planned"):
                return ""
            if workflow.now() - started >= d.deadline:
                return (f"{len(result.remaining)} pods still on the node after {d.deadline} "
                        f"({result.left_summary()})")
            if bounded:
                if workflow.info().get_current_history_length() >= \
                        self.inp.settings.history_events_per_run:
                    return (f"{len(result.remaining)} pods still on the node after "
                            f"{_minutes(workflow.now() - started)} "
                            f"({result.left_summary()}); release again to keep evicting")
                report_after = min(report_after * 2, max(d.report_max, d.report_after))
            await workflow.sleep(d.retry_interval, summary="before the next eviction round")

    async def _standalone_host_engine_missing(self) -> str:
        """Why the node runs no standalone DCGM host engine (the GPU Operator's ``dcgm``
        operand, which the settings list), or "" where it does: the look for its pod."""
        op = self.inp.settings.gpu_operator
        try:
            await self._call(
                act.check_operands_back,
                OperandsWaitInput(node=self.inp.node, labels=[deploy_label("dcgm")],
                                  namespace=op.namespace),
                timeout=timedelta(minutes=1), heartbeat=False,
                retry=RetryPolicy(maximum_attempts=1),
                summary=f"look for a standalone DCGM host engine on {self.inp.node}")
        except ActivityError as err:
            return _cause(err) or "no dcgm pod found"
        return ""

    async def _job(self, kind: Literal["validate", "gpu-reset", "reboot"],
                   attempt: int, pinned: tuple[str, str] | None = None) -> NodeJobResult:
        """``pinned``: (GPU index, UUID) of a validation pinned to one GPU (per-GPU
        isolation): its own ResourceClaim for that device, diag on that GPU only."""
        s = self.inp.settings
        name = node_job_name(kind, self.inp.node, workflow.info().run_id, attempt)
        if pinned is not None:
            name = node_job_name(f"{kind}-gpu{pinned[0]}", self.inp.node,
                                 workflow.info().run_id, attempt)
        gpu_index = None
        gpu_uuids: list[str] = []
        if kind == "gpu-reset" and s.reset_scope == "gpu":
            gpus = sorted({f.gpu for f in self.inp.verdict.findings if f.gpu.isdecimal()})
            gpu_index = gpus[0] if len(gpus) == 1 else None
            if gpu_index is not None and versions.patched("reset-by-uuid"):
                # By UUID, which survives re-enumeration; the index only when the exporter
                # gave none (or one that is no UUID: the exporter's text is the node's).
                uuids = sorted({f.uuid for f in self.inp.verdict.findings
                                if f.gpu == gpu_index and GPU_UUID.fullmatch(f.uuid)})
                gpu_uuids = uuids if len(uuids) == 1 else []
        target = (f" on GPU {gpu_uuids[0]}" if gpu_uuids
                  else f" on GPU {gpu_index}" if gpu_index is not None else "")
        if pinned is not None:
            gpu_index, gpu_uuids = pinned[0], [pinned[1]]
            self._plan(f"run {kind} Job {name} on {self.inp.node} pinned to GPU {pinned[0]} "
                       f"({pinned[1]}) through ResourceClaim {name}")
        else:
            self._plan(f"run {kind} Job {name} on {self.inp.node}"
                       + (f" requesting all {self.gpus} GPUs" if kind == "validate" else "")
                       + (target if kind == "gpu-reset" else ""))
        job = NodeJobInput(node=self.inp.node, kind=kind, name=name,
                           template=s.job_templates.for_kind(kind), gpus=self.gpus,
                           gpu_index=gpu_index, dry_run=self.inp.dry_run,
                           gpu_uuids=gpu_uuids,
                           device_uuid=pinned[1] if pinned is not None else "")
        if not versions.patched("jobs-polled-by-retry"):
            return await self._call(
                act.run_node_job, job, timeout=s.job_timeout,
                heartbeat=True, summary=f"{kind} job on {self.inp.node}")
        # Polled by retry: each look is a short activity, the wait between looks is the
        # retry interval (no worker slot, no history events). The Job's own deadline fails
        # it first; the schedule-to-close timeout is the backstop.
        self.job_in_progress = job
        try:
            result = await self._call(
                act.poll_node_job, job, timeout=timedelta(minutes=1),
                heartbeat=False, summary=f"{kind} job on {self.inp.node}",
                retry=self._job_poll_retry(), schedule_to_close=s.job_timeout)
        except ActivityError as err:
            cause = err.cause
            if (isinstance(cause, ApplicationError) and cause.type == errors.JOB_NOT_STARTED
                    and versions.patched("job-not-started-reported")):
                # The image cannot be pulled: the step never ran, said as such.
                self.job_in_progress = None
                return NodeJobResult(succeeded=False, job_name=name, message=str(cause))
            if not _timed_out(err):
                raise
            last = _cause(err) if versions.patched("job-wait-says-last-look") else ""
            result = NodeJobResult(succeeded=False, job_name=name,
                                   message=f"{kind} Job {name} did not finish within "
                                           f"{s.job_timeout}" + (f": {last}" if last else ""))
        self.job_in_progress = None
        return result
