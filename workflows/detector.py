"""DetectorWorkflow: the singleton that observes the fleet and admits remediations.

Each tick: one activity observes the whole fleet (list nodes, scrape, evaluate);
then, in workflow code, admission under the budget and the circuit breaker, and
remediation children started with ParentClosePolicy.ABANDON so they outlive
every continue-as-new of this workflow. The detector is the only admitter: each
start holds a lease (workflows/leases.py) for the remediation's whole life, freed
only when Temporal says the remediation closed cleanly, so a slow claim, a crash
or a node rewriting its own labels never lets more nodes out of service than the
budget.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import (
    RawValue,
    RetryPolicy,
    SearchAttributePair,
    TypedSearchAttributes,
    VersioningBehavior,
)
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    FailureError,
    WorkflowAlreadyStartedError,
)

from workflows import versions

with workflow.unsafe.imports_passed_through():
    from policy.models import Action, Verdict
    from workflows import activity_refs as act
    from workflows import errors
    from workflows.admission import Admission
    from workflows.commands import checked_command
    from workflows.ids import (
        CONFIRM_LEASE_UPDATE,
        REQUEST_SLOT_SIGNAL,
        SLOT_GRANTED_SIGNAL,
        remediation_workflow_id,
    )
    from workflows.incidents import (
        DomainIncident,
        IncidentCordon,
        IncidentCordonResult,
        IncidentWatch,
        find,
        prune_closed,
    )
    from workflows.isolation import GpuIsolation
    from workflows.leases import (
        CLEAN_CLOSE,
        Lease,
        LeaseAnswer,
        LeaseCheck,
        LeaseScope,
        widened,
    )
    from workflows.leases import check as check_lease
    from workflows.limits import LimitsSettings, violations
    from workflows.messages import (
        AdmissionReport,
        DetectorInput,
        DetectorView,
        DomainUse,
        FleetObservation,
        GpuUse,
        IncidentCommand,
        ManualRemediation,
        MirrorRepair,
        NodeReport,
        ObserveInput,
        OperatorAck,
        OperatorCommand,
        OrphanRelease,
        PendingStart,
        RejectedCommand,
        RemediationInput,
        RunningRemediations,
        RunningRemediationsInput,
        SlotGrant,
        SlotRequest,
        merge_observations,
    )
    from workflows.operator_identity import OPERATOR_MARK_PATCH, shown_operator
    from workflows.reports import (
        MAX_NODE_TICK_NODES,
        NODE_REPORT_PATCH,
        NODE_REPORT_SIGNAL,
        NODE_TICK_GAP,
        NODE_TICK_PATCH,
        current_reports,
        due_for_node_tick,
        keep_report,
        merge_node_observation,
        reports_for_observation,
    )
    from workflows.search_attributes import GPU_NODE, REMEDIATION_ACTION, REMEDIATION_STATE
    from workflows.settings import DetectorSettings, domain_name
    from workflows.transitions import NodeState
    from workflows.ui_text import plain

NODE_ACTIONS = (Action.THERMAL, Action.RESET, Action.REBOOT, Action.QUARANTINE)
# A run that did not continue from another asks visibility for running remediations first;
# histories recorded before that look-up replay without it.
THERMAL_OUTSIDE_PATCH = "thermal-cordons-outside-budget"
# Probation and lemons change a flagged node's action from the repair ledger
# (workflows/probation.py); a run recorded before them replays without.
PROBATION_PATCH = "probation-at-admission"
SEED_PENDING_PATCH = "detector-seeds-pending-from-visibility"
# Slots are leases held for a remediation's life (runs recorded before count labels).
LEASES_PATCH = "slots-are-leases"
# The worker's config is the ceiling of every reconfigure (runs recorded before: unbounded).
LIMITS_PATCH = "detector-bounded-by-limits"
# Fault domain budgets, GPU budgets and domain incidents (runs recorded before had none).
DOMAINS_PATCH = "fault-domains-and-incidents"
# A verdict the remediation isolates on one GPU gets a GPU-scoped lease (no node slot);
# asked only where gpu_isolation is dra, so runs recorded without it replay without a marker.
GPU_LEASE_PATCH = "gpu-scoped-leases"
# The admission report carries the GPUs out of service (fleet and each fault domain) and
# the isolated GPUs, for their metrics: a report then changes when only they do.
GPU_COUNT_PATCH = "gpu-counts-reported"
# A cordon of ours on a node someone else had cordoned is marked so: never uncordoned.
NOT_OURS = "!"
_NO_PAYLOAD = RawValue(Payload())


@workflow.defn
class DetectorWorkflow:
    @workflow.init
    def __init__(self, inp: DetectorInput) -> None:
        self.settings = inp.settings
        self.state = inp.state
        self.budget = 0
        self.in_flight: list[str] = []
        self.waiting: list[str] = []
        self.last_tick: datetime | None = None
        self.last_errors: list[str] = []
        self.last_report: AdmissionReport | None = None
        self.wake = False
        # Heat cordons outside the drain budget (a run recorded before: as it ran).
        self.thermal_outside = True
        self.probation = True
        # Carried from the previous run, so validators and sharding are right before
        # this run's first observation (which may fail).
        self.orphans: list[str] = list(inp.state.orphans)
        self.last_managed = inp.state.last_managed
        # Nodes in remediation (label state, or "starting" for a pending start), for the
        # remediate validator.
        self.busy: dict[str, str] = dict(inp.state.busy)
        # Children started by this run; a closed one no longer needs its pending slot.
        self.children: dict[str, workflow.ChildWorkflowHandle] = {}
        self.rejected: list[RejectedCommand] = list(inp.state.rejected)
        # Pending starts learnt from visibility (not our children): while any is pending,
        # each tick asks again which still run, as _closed_children does for ours.
        self.seeded: set[str] = set()
        # Nodes whose remediation-<node> was found running when this detector started it.
        self.elsewhere: set[str] = set()
        # Slots are leases (a run recorded before them: labels, as it ran).
        self.leases_mode = False
        # The worker's limits (read from its own config file at the start of each run),
        # and why the settings this run was given are past them (admits nothing then).
        self.limits: LimitsSettings | None = None
        self.bounded = False
        self.over_limits: list[str] = []
        # Faults nodes reported about themselves (workflows/reports.py), carried across
        # continue-as-new.
        self.reports: list[NodeReport] = list(inp.state.reports)
        # Woken by node reports alone (a node-only tick may do), when each node last had
        # one, and the observation such a tick completes (the last full one, with the
        # fresh entries of the nodes observed since).
        self.report_wake = False
        self.reported: set[str] = set()
        self.node_ticks: dict[str, datetime] = {}
        self.last_full: FleetObservation | None = None
        # State labels that disagreed with the record at the last tick ("label->record"):
        # rewritten when the same disagreement is seen twice (a write in flight is not one).
        self.mismatches: dict[str, str] = {}
        # Each fault domain's use of its budget at the last tick (the view).
        self.domain_uses: list[DomainUse] = []
        # The fleet's GPUs out of service at the last tick (the view and its details).
        self.gpu_use: GpuUse | None = None

    pinned = False
    """True in PinnedDetectorWorkflow: what a versioned worker registers."""

    # ------------------------------------------------------------ operator messages

    @workflow.query(description="Budget, in-flight and waiting nodes, breaker and pause state.")
    def view(self) -> DetectorView:
        return DetectorView(
            paused=self.state.paused, breaker_open=self.state.breaker_open,
            breaker_reason=self.state.breaker_reason, budget=self.budget,
            in_flight=self.in_flight, waiting=self.waiting,
            last_tick=self.last_tick,
            last_errors=self.last_errors, ticks_total=self.state.ticks_total,
            started_total=self.state.started_total, orphans=self.orphans,
            rejected_commands=self.rejected,
            leases=sorted(self.state.leases.values(), key=lambda lease: lease.node),
            quarantined=sorted(n for n, lease in self.state.leases.items() if lease.quarantined),
            incidents=sorted(self.state.incidents.values(),
                             key=lambda i: (i.closed_at is not None, i.opened_at, i.key)),
            domains=self.domain_uses,
            gpus=self.gpu_use,
        )

    @workflow.query(name="carry", description="The input this detector would continue as "
                                              "new with now (read-only).")
    def carry(self) -> DetectorInput:
        """What a continue-as-new carries: the settings and the state, with what the next
        run needs before its first observation. Changes nothing (also a query: a detector
        started elsewhere from this answer goes on as after a continue-as-new)."""
        st = self.state.model_copy(update={
            "last_managed": self.last_managed, "busy": self.busy, "orphans": self.orphans,
            "rejected": self.rejected,
            "reports": current_reports(self.reports, workflow.now(), self.busy)})
        return DetectorInput(settings=self.settings, state=st)

    @workflow.query(name="settings", description="The detector's effective settings.")
    def effective_settings(self) -> DetectorSettings:
        return self.settings

    @workflow.update(description="Stop admitting new remediations; running ones continue. "
                                 "Payload: {\"operator\": \"you\", \"reason\": \"why\"}.")
    async def pause(self, cmd: OperatorCommand) -> OperatorAck:
        return self._do_pause(cmd)

    def _do_pause(self, cmd: OperatorCommand) -> OperatorAck:
        cmd = cmd.model_copy(update={"operator": self._who(cmd.operator)})
        self.state.paused, self.state.paused_by = True, f"{cmd.operator}: {cmd.reason}"
        return self._ack(f"paused by {cmd.operator}")

    @pause.validator
    def _check_pause(self, cmd: OperatorCommand) -> None:
        if self.state.paused:
            raise ApplicationError(f"already paused ({self.state.paused_by})", type=errors.REJECTED)

    @workflow.update(description="Resume admissions and close a tripped circuit breaker. "
                                 "Payload: {\"operator\": ..., \"reason\": ...}.")
    async def resume(self, cmd: OperatorCommand) -> OperatorAck:
        return self._do_resume(cmd)

    def _do_resume(self, cmd: OperatorCommand) -> OperatorAck:
        was = "breaker closed" if self.state.breaker_open else "resumed"
        self.state.paused = False
        self.state.paused_by = ""
        self.state.breaker_open = False
        self.state.breaker_reason = ""
        self.state.breaker_nodes = []
        self.state.recently_flagged = {}  # the operator has seen these: count afresh
        self.state.recently_quarantined = {}
        self.wake = True
        return self._ack(f"{was} by {self._who(cmd.operator)}")

    @resume.validator
    def _check_resume(self, cmd: OperatorCommand) -> None:
        if not self.state.paused and not self.state.breaker_open:
            raise ApplicationError("not paused and the breaker is closed: nothing to resume",
                                   type=errors.REJECTED)

    # pause and resume are also signals (the UI's "Send a Signal", automation), checked by
    # the same validators; a rejected or unknown signal is kept in the view and the log.

    @workflow.signal(name="pause", description="Same as the pause update, as a signal.")
    def pause_signal(self, raw: RawValue = _NO_PAYLOAD) -> None:
        self._signal("pause", raw, self._check_pause, self._do_pause)

    @workflow.signal(name="resume", description="Same as the resume update, as a signal.")
    def resume_signal(self, raw: RawValue = _NO_PAYLOAD) -> None:
        self._signal("resume", raw, self._check_resume, self._do_resume)

    @workflow.signal(dynamic=True, description="Any other signal name is recorded as rejected.")
    def other_signal(self, name: str, args: Sequence[RawValue]) -> None:
        self._reject_signal(name, None, f"unknown signal {name!r}; signals are pause, resume")

    @workflow.signal(name=REQUEST_SLOT_SIGNAL,
                     description="From a remediation: a node cordoned for heat outside the "
                                 "budget must be drained and asks for a slot. Payload: "
                                 "{\"node\": ..., \"reason\": ...}.")
    def request_slot(self, raw: RawValue = _NO_PAYLOAD) -> None:
        try:
            req = SlotRequest.model_validate(workflow.payload_converter().from_payload(
                raw.payload))
        except Exception as err:  # a stray client's payload: recorded, never raised
            self._reject_signal(REQUEST_SLOT_SIGNAL, None, f"bad slot request: {err}"[:500])
            return
        if self.leases_mode:
            refused = self._lease_refusal(req.node, req.token)
            if refused:
                self._reject_signal(REQUEST_SLOT_SIGNAL, None, f"slot request for {req.node} "
                                                               f"refused: {refused}")
                return
        # Granted only while the node holds a heat cordon's lease (labelled cordoned, for
        # a detector run recorded before leases): any other request is dropped.
        if req.node not in self.state.slot_requests:
            self.state.slot_requests = {**self.state.slot_requests, req.node: workflow.now()}
            workflow.logger.info("%s asks for a drain slot: %s", req.node, req.reason)
        self.wake = True

    @workflow.signal(name=NODE_REPORT_SIGNAL,
                     description="Internal — sent by the worker, not by people: a fault a "
                                 "node's watcher reported about itself (its token bound to "
                                 "that node). Wakes the detector; the next observation of "
                                 "that node and the budget decide. Payload: NodeReport.")
    def node_report(self, raw: RawValue = _NO_PAYLOAD) -> None:
        if not versions.patched(NODE_REPORT_PATCH):
            # Recorded before this handler: the signal was unknown, and replays so.
            self.other_signal(NODE_REPORT_SIGNAL, [raw])
            return
        try:
            report = NodeReport.model_validate(
                workflow.payload_converter().from_payload(raw.payload))
        except Exception as err:  # a stray client's payload: recorded, never raised
            self._reject_signal(NODE_REPORT_SIGNAL, None, f"bad node report: {err}"[:500])
            return
        if versions.patched(NODE_TICK_PATCH):
            if report.node in self.busy:
                return  # its remediation handles what it reported: nothing to wake for
            self.reports = keep_report(self.reports, report, workflow.now())
            # Observed alone at once where it can be (_between_ticks), else a full tick.
            self.reported.add(report.node)
            self.report_wake = True
            return
        self.reports = keep_report(self.reports, report, workflow.now())
        self.wake = True

    def _signal(self, name: str, raw: RawValue, check: Callable[[OperatorCommand], None],
                apply: Callable[[OperatorCommand], OperatorAck]) -> None:
        cmd, refused = checked_command(raw, check)
        if refused is not None or cmd is None:
            self._reject_signal(name, cmd, refused or "no command")
            return
        workflow.logger.info("signal %s applied: %s", name, apply(cmd).message)

    def _reject_signal(self, name: str, cmd: OperatorCommand | None, why: str) -> None:
        who = self._who(cmd.operator[:100]) if cmd else ""
        self.rejected = [*self.rejected, RejectedCommand(
            at=workflow.now(), name=name[:100], operator=who, why=why[:500])][-20:]
        workflow.logger.warning("signal %s%s rejected: %s", name[:100],
                                f" from {who}" if who else "", why[:500])

    @workflow.update(name=CONFIRM_LEASE_UPDATE,
                     description="Internal — sent by a remediation before each disruptive "
                                 "step, not by people: is its lease live?")
    async def confirm_lease(self, chk: LeaseCheck) -> LeaseAnswer:
        lease = self.state.leases.get(chk.node)
        if lease is None:  # a detector run recorded before leases: labels count
            return LeaseAnswer(live=True, why="this detector run counts labels")
        if lease.adopted and not lease.token and chk.token:
            lease.token = chk.token  # learnt at the first confirmation (see workflows/leases.py)
        lease.confirmed_at = workflow.now()
        return LeaseAnswer(live=True)

    @confirm_lease.validator
    def _check_confirm_lease(self, chk: LeaseCheck) -> None:
        # Refused here, so a stray client's guesses never grow this workflow's history.
        if not self.leases_mode:
            return
        if not self.state.leases_ready:
            # Just started: what runs is not adopted yet. Ask again, not a refusal.
            raise ApplicationError("the detector is starting: it has not yet adopted the "
                                   "remediations already running", type=errors.DETECTOR_NOT_RUNNING)
        answer = check_lease(self.state.leases, chk)
        if not answer.live:
            raise ApplicationError(answer.why, type=errors.LEASE_REFUSED)

    def _lease_refusal(self, node: str, token: str) -> str:
        """Why a grant or request carrying ``token`` does not match ``node``'s lease."""
        answer = check_lease(self.state.leases, LeaseCheck(node=node, token=token))
        if answer.live and not self.state.leases[node].token and token:
            self.state.leases[node].token = token
        return "" if answer.live else answer.why

    @workflow.update(description="Remediate a node now, through the same budget.")
    async def remediate(self, req: ManualRemediation) -> OperatorAck:
        req = req.model_copy(update={"operator": self._who(req.operator)})
        self.state.manual = [*self.state.manual, req]
        self.wake = True
        return self._ack(f"{req.node} queued for {req.action.value} by {req.operator}")

    @remediate.validator
    def _check_remediate(self, req: ManualRemediation) -> None:
        if req.action not in NODE_ACTIONS:
            raise ApplicationError(
                f"action {req.action.value} is not a node action; use one of "
                f"{', '.join(a.value for a in NODE_ACTIONS)}", type=errors.REJECTED)
        if any(m.node == req.node for m in self.state.manual):
            raise ApplicationError(f"{req.node} is already queued", type=errors.REJECTED)
        # Every slot holder (in_flight) is also in busy, which adds quarantined nodes.
        if req.node in self.busy:
            raise ApplicationError(f"{req.node} is already in remediation "
                                   f"({self.busy[req.node]})",
                                   type=errors.REJECTED)

    @workflow.update(description="Release a node left in remediation by a workflow that is "
                                 "gone (terminated): remove our label and taint, uncordon if "
                                 "we cordoned it.")
    async def release_orphan(self, req: OrphanRelease) -> OperatorAck:
        req = req.model_copy(update={"operator": self._who(req.operator)})
        lease = self.state.leases.get(req.node)
        try:
            await workflow.execute_activity(
                act.release_orphan, req, start_to_close_timeout=timedelta(minutes=2),
                retry_policy=RetryPolicy(maximum_attempts=5, non_retryable_error_types=[
                    errors.NOT_FOUND, errors.NOT_ORPHAN]),
                summary=f"release orphan {req.node}")
        except ActivityError as err:
            cause = err.cause
            # An orphan lease whose node shows nothing of ours (its claim never landed):
            # nothing to release on the node, the record's slot is what the operator frees.
            if not (lease is not None and lease.orphan and isinstance(cause, ApplicationError)
                    and cause.type == errors.NOT_ORPHAN):
                raise
        if lease is not None and lease.orphan:
            del self.state.leases[req.node]
        self.orphans = [n for n in self.orphans if n != req.node]
        self.wake = True
        return self._ack(f"{req.node} released by {req.operator}")

    @release_orphan.validator
    def _check_release_orphan(self, req: OrphanRelease) -> None:
        lease = self.state.leases.get(req.node)
        if req.node not in self.orphans and not (lease is not None and lease.orphan):
            raise ApplicationError(
                f"{req.node} is not an orphan (orphans: {', '.join(self.orphans) or 'none'}); "
                "a running remediation is released with `gpu-remediate release` or `abort`",
                type=errors.REJECTED)

    @workflow.update(description="Resolve a domain incident: the shared part is fixed. Its "
                                 "nodes whose faults cleared are uncordoned; any still "
                                 "flagged are remediated one by one through the budget. "
                                 "Payload: {\"domain\": ..., \"operator\": ..., "
                                 "\"reason\": ...}.")
    async def resolve_incident(self, cmd: IncidentCommand) -> OperatorAck:
        inc, _ = find(self.state.incidents, cmd.domain)
        assert inc is not None  # the validator saw it
        cmd = cmd.model_copy(update={"operator": self._who(cmd.operator)})
        inc.closed_at = workflow.now()
        inc.closed_by = f"resolved by {cmd.operator}: {cmd.reason}"
        self.wake = True
        return self._ack(f"incident {inc.label}={domain_name(inc.domain)} resolved by "
                         f"{cmd.operator}")

    @resolve_incident.validator
    def _check_resolve_incident(self, cmd: IncidentCommand) -> None:
        self._incident_named(cmd)

    @workflow.update(description="Release a domain incident: remediate its nodes one by one "
                                 "after all (each through every budget). It stays open until "
                                 "its faults clear. Payload: as resolve_incident.")
    async def release_incident(self, cmd: IncidentCommand) -> OperatorAck:
        inc, _ = find(self.state.incidents, cmd.domain)
        assert inc is not None
        cmd = cmd.model_copy(update={"operator": self._who(cmd.operator)})
        inc.released_by = f"{cmd.operator}: {cmd.reason}"
        self.wake = True
        return self._ack(f"incident {inc.label}={domain_name(inc.domain)} released by "
                         f"{cmd.operator}: its nodes are remediated one by one")

    @release_incident.validator
    def _check_release_incident(self, cmd: IncidentCommand) -> None:
        inc = self._incident_named(cmd)
        if inc.released_by:
            raise ApplicationError(f"incident {inc.key} is already released "
                                   f"({inc.released_by})", type=errors.REJECTED)

    def _incident_named(self, cmd: IncidentCommand) -> DomainIncident:
        if not cmd.reason.strip():
            raise ApplicationError("a reason is required (-r/--reason)", type=errors.REJECTED)
        inc, why = find(self.state.incidents, cmd.domain)
        if inc is None:
            raise ApplicationError(why, type=errors.REJECTED)
        return inc

    @workflow.update(description="Replace the detector's settings (budget, interval, dry-run, "
                                 "policy, remediation) from the next tick on.")
    async def reconfigure(self, settings: DetectorSettings) -> OperatorAck:
        before = self.settings
        self.settings = settings
        self.over_limits = []
        self.wake = True
        changed = [k for k in type(settings).model_fields
                   if getattr(before, k) != getattr(settings, k)]
        return self._ack("reconfigured: " + (", ".join(changed) or "no change"))

    @reconfigure.validator
    def _check_reconfigure(self, settings: DetectorSettings) -> None:
        # The config is the ceiling: tighter is always accepted, looser only within the
        # worker's limits (workflows/limits.py), read from its own file, never a client's.
        if not self.bounded:
            return
        if self.limits is None:
            raise ApplicationError("the worker's limits have not been read yet (its config "
                                   "file): nothing can be reconfigured until they are",
                                   type=errors.REJECTED)
        over = violations(settings, self.limits)
        if over:
            raise ApplicationError("refused, past the worker's limits: "
                                   + "; ".join(str(v) for v in over)[:1500],
                                   type=errors.REJECTED)

    def _ack(self, message: str) -> OperatorAck:
        return OperatorAck(state=NodeState.HEALTHY, message=message)

    def _who(self, operator: str) -> str:
        """An operator's name as this detector records it: marked unverified unless its
        own settings say the server authenticates callers; as before in older histories."""
        if not versions.patched(OPERATOR_MARK_PATCH):
            return operator
        return shown_operator(operator, self.settings.remediation.server_authorizes)

    # ------------------------------------------------------------ the loop

    @workflow.run
    async def run(self, inp: DetectorInput) -> None:
        versions.begin()  # this release's one marker, the run's first row (versions.py)
        ticks = 0
        # A detector that did not continue from another (the first, one started again after
        # `detector stop`, or after termination) does not know its predecessor's starts.
        seeded = workflow.info().continued_run_id is not None or \
            not versions.patched(SEED_PENDING_PATCH)
        self.thermal_outside = versions.patched(THERMAL_OUTSIDE_PATCH)
        self.probation = versions.patched(PROBATION_PATCH)
        self.leases_mode = versions.patched(LEASES_PATCH)
        self.bounded = versions.patched(LIMITS_PATCH)
        if self.bounded:
            await self._read_limits()
        if self.leases_mode:
            seeded = True  # leases adopt what runs instead (see _refresh_leases)
        while True:
            # An update that arrives during this tick wakes the next one at once.
            self.wake = False
            # Reports so far are this tick's observation's; those that land during it wake
            # a node-only tick after it.
            self.report_wake, self.reported = False, set()
            # Children known closed before the observation: their labels in it are the truth.
            closed = self._closed_children()
            if not seeded:
                seeded = await self._seed_pending()
            elif self.seeded:
                closed |= await self._seeded_closed()
            if self.leases_mode:
                # Until what already runs is adopted, admitting could overrun the budget.
                obs = await self._observe() if await self._adopt() else None
                if obs is not None:
                    self._refresh_leases(obs)
            else:
                # Until they are known, admitting could overrun the budget: observe nothing.
                obs = await self._observe() if seeded else None
            if obs is not None:
                await self._admit(obs, closed)
            self.last_full = obs if self.leases_mode else None
            ticks += 1
            self.state.ticks_total += 1
            ticks += await self._between_ticks()
            if ticks >= self.settings.ticks_per_run or \
                    workflow.info().is_continue_as_new_suggested():
                await workflow.wait_condition(workflow.all_handlers_finished)
                # Pinned (a versioned worker registers PinnedDetectorWorkflow): the next
                # run starts on the deployment's current version and is pinned there.
                workflow.continue_as_new(
                    self.carry(),
                    initial_versioning_behavior=(
                        workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE
                        if self.pinned else None))

    async def _between_ticks(self) -> int:
        """Wait for the next full tick: the interval, or a wake. Woken by node reports alone
        (NODE_TICK_PATCH), observe just the reported nodes and admit them at once, then wait
        on for the rest of the interval: the fleet is still observed whole at its interval.
        Returns the node-only ticks run."""
        due = workflow.now() + self.settings.interval
        timeout, ran = self.settings.interval, 0
        while True:
            try:
                await workflow.wait_condition(lambda: self.wake or self.report_wake,
                                              timeout=timeout,
                                              timeout_summary="next fleet observation")
            except TimeoutError:
                return ran  # due: the full tick takes any report too
            if self.wake or not self.report_wake:
                return ran
            self.report_wake = False
            nodes = self._due_for_node_tick()
            if nodes is None:
                return ran  # a full tick observes them
            if nodes:
                await self._node_tick(nodes)
                ran += 1
            timeout = due - workflow.now()
            if timeout <= timedelta(0) or workflow.info().is_continue_as_new_suggested():
                return ran

    def _due_for_node_tick(self) -> list[str] | None:
        """The reported nodes a node-only tick observes now ([]: none due, each had one
        within NODE_TICK_GAP; its report waits for the full tick), or None: a full tick
        instead (no full observation to complete yet, or too many nodes at once)."""
        if self.last_full is None:
            return None
        now = workflow.now()
        self.reports = current_reports(self.reports, now, self.busy)
        self.node_ticks = {n: t for n, t in self.node_ticks.items() if now - t < NODE_TICK_GAP}
        nodes = due_for_node_tick(self.reported, self.reports, self.node_ticks, now)
        self.reported = set()
        if len(nodes) > MAX_NODE_TICK_NODES:
            return None
        self.node_ticks.update({n: now for n in nodes})
        return nodes

    async def _node_tick(self, nodes: list[str]) -> None:
        """Observe ``nodes`` alone (a fresh evaluation of each: its exporter, its record, its
        reports) and admit them under the leases' budget, the rest of the fleet as the last
        full observation saw it (workflows/reports.py, ``merge_node_observation``). Only
        these nodes can start; nothing waits before their start but their observation."""
        closed = self._closed_children()
        fresh = await self._observe(nodes)
        if fresh is None or self.last_full is None:
            return
        obs = merge_node_observation(self.last_full, fresh, nodes)
        self.last_full = obs
        await self._admit(obs, closed, only=set(nodes))

    async def _running_remediations(self, summary: str) -> RunningRemediations:
        return await workflow.execute_activity(
            act.list_running_remediations,
            RunningRemediationsInput(task_queue=workflow.info().task_queue),
            start_to_close_timeout=timedelta(minutes=1),
            retry_policy=RetryPolicy(maximum_attempts=3),
            summary=summary)

    async def _already_running(self, summary: str) -> RunningRemediations | None:
        """The remediations running on this task queue, or None (said in the details)
        while visibility cannot answer: nothing is admitted meanwhile."""
        try:
            return await self._running_remediations(summary)
        except ActivityError as err:
            self.last_errors = [f"listing running remediations failed: {err.cause or err}; "
                                "admitting nothing until it answers"]
            workflow.set_current_details(f"**{self.last_errors[0]}**")
            return None

    async def _seed_pending(self) -> bool:
        """Hold a pending slot for every remediation already running on our task queue.

        Those whose claim has not landed carry no label yet, so the observation cannot
        count them. Like this run's own starts, each holds its slot until the observation
        shows its label (the truth), its workflow is known closed, or the pending grace
        passes. False (and nothing admitted) while visibility cannot answer.
        """
        found = await self._already_running("remediations started before this detector")
        if found is None:
            return False
        now, st = workflow.now(), self.state
        known = {p.node for p in st.pending}
        fresh = sorted({r.node for r in found.remediations} - known)
        st.pending = [*st.pending, *(PendingStart(node=n, at=now) for n in fresh)]
        self.seeded = set(fresh)
        for n in fresh:
            self.busy.setdefault(n, "starting")
        if found.truncated:
            workflow.logger.warning("only the first %d running remediations were listed",
                                    len(found.remediations))
        workflow.logger.info("%d remediations already running: %s", len(fresh),
                             ", ".join(fresh[:20]))
        return True

    async def _read_limits(self) -> None:
        """The worker's limits, from its own config file. A run whose settings (given by
        whoever started it) are past them admits nothing until a reconfigure within them:
        a stray client cannot start a looser detector than the config allows."""
        try:
            self.limits = await workflow.execute_activity(
                act.read_limits, start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=5), summary="read the worker's limits")
        except ActivityError as err:
            self.over_limits = [f"the worker's limits could not be read: {err.cause or err}"]
            return
        self.over_limits = [str(v) for v in violations(self.settings, self.limits)]
        if self.over_limits:
            workflow.logger.warning("settings past the worker's limits: %s",
                                    "; ".join(self.over_limits))

    async def _adopt(self) -> bool:
        """A detector that did not continue from one with leases first adopts every
        remediation running on its task queue: each holds a slot until it closes, and its
        token is learnt at its first confirmation. False (admit nothing) until visibility
        answers."""
        st, now = self.state, workflow.now()
        if not st.leases_ready:
            found = await self._already_running("adopt the remediations already running")
            if found is None:
                return False
            for r in found.remediations:
                if r.node not in st.leases:
                    st.leases[r.node] = Lease(
                        node=r.node, token="", granted_at=r.started or now,
                        workflow_id=r.workflow_id, state=_node_state(r.state), adopted=True)
            if found.truncated:
                workflow.logger.warning("only the first %d running remediations were listed",
                                        len(found.remediations))
            st.leases_ready = True
            workflow.logger.info("%d running remediations adopted: %s",
                                 len(found.remediations),
                                 ", ".join(r.node for r in found.remediations[:20]))
        return True

    async def _rewrite_mirrors(self, obs: FleetObservation) -> None:
        """The record wins over a node's state label: a label that says another state than
        its lease (forged, wiped, edited by the node) is rewritten, with a StateMismatch
        Event, once the same disagreement shows at two ticks running (the remediation's
        own write and the search attribute it reads from land a moment apart)."""
        now: dict[str, str] = {}
        shown: dict[str, str] = {}
        for r in obs.remediating:
            lease = self.state.leases.get(r.node)
            if lease is None or lease.orphan or lease.state == NodeState.HEALTHY:
                continue
            if r.label != lease.state.value:
                now[r.node] = f"{r.label}->{lease.state.value}"
                shown[r.node] = r.label
        due = sorted(n for n, pair in now.items() if self.mismatches.get(n) == pair)
        self.mismatches = now
        if not due or not versions.patched("state-mirror-rewritten"):
            return
        for node in due[:10]:
            lease = self.state.leases[node]
            try:
                await workflow.execute_activity(
                    act.rewrite_state_mirror,
                    MirrorRepair(node=node, state=lease.state, shown=shown[node],
                                 workflow_id=lease.workflow_id),
                    start_to_close_timeout=timedelta(minutes=1),
                    retry_policy=RetryPolicy(maximum_attempts=3),
                    summary=f"rewrite {node}'s state label from the record")
            except ActivityError as err:
                workflow.logger.warning("could not rewrite %s's state label: %s", node,
                                        err.cause or err)
            self.mismatches.pop(node, None)

    def _lease_workflows(self) -> list[str]:
        return sorted({lease.workflow_id for lease in self.state.leases.values()
                       if lease.workflow_id and not lease.orphan})

    def _refresh_leases(self, obs: FleetObservation) -> None:
        """The record brought up to date with what Temporal said, in the observation, of
        each lease holder's workflow: running (its state, from the RemediationState search
        attribute the remediation writes), closed cleanly (completed, or cancelled: its
        cleanup ran) and its lease ends, or closed any other way and its lease is an
        orphan's, which keeps its slot until an operator releases the node. A lease not
        looked up (started since) is kept as it is."""
        st = self.state
        by_id = {h.workflow_id: h for h in obs.lease_holders}
        for node, lease in sorted(st.leases.items()):
            h = by_id.get(lease.workflow_id)
            if h is None or lease.orphan:
                continue
            if h.status == "RUNNING":
                lease.state = _node_state(h.state, lease.state)
            elif h.status in CLEAN_CLOSE:
                del st.leases[node]
                workflow.logger.info("lease of %s ended: %s %s", node, lease.workflow_id,
                                     h.status.lower())
            else:
                lease.orphan = (f"{lease.workflow_id} {h.status.lower().replace('_', ' ')} "
                                "without giving the node back")
                workflow.logger.warning("lease of %s kept as an orphan's: %s", node,
                                        lease.orphan)

    async def _seeded_closed(self) -> set[str]:
        """Seeded nodes whose remediation no longer runs (asked before the observation,
        so their labels in it are the truth). Visibility may lag: a closed one still
        listed keeps its slot a little longer, never the reverse."""
        self.seeded &= {p.node for p in self.state.pending}
        if not self.seeded:
            return set()
        try:
            found = await self._running_remediations("which earlier remediations still run")
        except ActivityError as err:
            workflow.logger.warning("list_running_remediations failed: %s", err.cause or err)
            return set()  # they keep their slots
        if found.truncated:
            return set()  # an unlisted one may still run
        gone = self.seeded - {r.node for r in found.remediations}
        self.seeded -= gone
        return gone

    async def _observe(self, nodes: Sequence[str] = ()) -> FleetObservation | None:
        """The fleet's observation, or (``nodes``: a node-only tick) just those nodes'."""
        s = self.settings
        # Past the shard size, several activities observe disjoint parts of the fleet in
        # parallel (they spread over worker replicas); below it, one does.
        shards = 1 if nodes else max(1, -(-self.last_managed // s.observe_shard_size))
        leases = self._lease_workflows() if self.leases_mode and not nodes else []
        self.reports = current_reports(self.reports, workflow.now(), self.busy)
        reports = [r for r in reports_for_observation(self.reports, workflow.now())
                   if not nodes or r.node in nodes]
        try:
            parts = await asyncio.gather(*(workflow.execute_activity(
                act.observe_fleet, ObserveInput(policy=s.policy, pool_label=s.pool_label,
                                                shard=i, shards=shards,
                                                track_xid_repeats=not s.dry_run,
                                                lease_workflows=leases if i == 0 else [],
                                                lease_task_queue=workflow.info().task_queue
                                                if leases and i == 0 else "",
                                                reports=reports,
                                                ledger_lookback=s.ledger.lookback()
                                                if self.probation else timedelta(0),
                                                domain_labels=s.domain_labels(),
                                                nodes=list(nodes)),
                task_queue=s.observe_task_queue,
                start_to_close_timeout=s.observe_timeout,
                heartbeat_timeout=s.observe_heartbeat_timeout,
                retry_policy=RetryPolicy(maximum_attempts=2),
                summary=(plain(f"scrape and evaluate {', '.join(nodes)} (reported)", 200)
                         if nodes else "scrape and evaluate the fleet" if shards == 1
                         else f"scrape and evaluate shard {i + 1}/{shards}"),
            ) for i in range(shards)))
        except ActivityError as err:
            # No data, no action: a failed observation (of any shard: the budget needs
            # every labelled node) admits nothing this tick.
            self.last_errors = [f"observation failed: {err.cause or err}"]
            workflow.set_current_details(f"**observation failed**: {err.cause or err}")
            return None
        obs = parts[0] if len(parts) == 1 else merge_observations(list(parts))
        if not nodes:
            self.last_managed = obs.managed_nodes
        return obs

    def _closed_children(self) -> set[str]:
        closed = {n for n, h in self.children.items() if h.done()}
        for n in sorted(closed):
            handle = self.children.pop(n)
            if not handle.cancelled():
                handle.exception()  # retrieved: a failed child is not an error of ours
        return closed

    async def _admit(self, obs: FleetObservation, closed: set[str] | None = None,
                     only: set[str] | None = None) -> None:
        st = self.state
        self.last_tick = workflow.now()
        self.last_errors = obs.errors[:10]
        self.orphans = obs.orphans
        domains = self._domains_on()
        adm = Admission(self.settings, st, obs, self.last_tick, closed or set(),
                        thermal_outside=self.thermal_outside, leases=self.leases_mode,
                        probation=self.probation, domains=domains,
                        gpu_scope=self._gpu_scope_on())
        if only is not None:
            # A node-only tick starts only the reported nodes; the others' verdicts are the
            # last full observation's: counted, never acted on (they wait as they were).
            adm.queue = [c for c in adm.queue if c.node in only]
        if self.leases_mode:
            self.orphans = sorted(set(obs.orphans) | {n for n, lease in st.leases.items()
                                                      if lease.orphan})
            if only is None:  # labels seen at full ticks only (two looks, the same)
                await self._rewrite_mirrors(obs)
        if domains:
            self.domain_uses = adm.domain_uses()
            if adm.watch is not None:
                await self._follow_incidents(adm.watch)
        self.busy = adm.busy
        self.budget = adm.budget
        waiting = [] if only is None else \
            [w for w in self.waiting if w.split(" (", 1)[0] not in only]
        for c in adm.queue:
            why = adm.blocked(c)
            if why is None and self.over_limits:
                why = "settings past the worker's limits (reconfigure within them)"
            if why is not None:
                waiting.append(f"{c.node} ({c.label}: {why})")
                continue
            if c.escalation:
                if await self._grant_slot(c.node, obs.gpus_of.get(c.node, 0)):
                    adm.admit(c)
                else:
                    st.slot_requests.pop(c.node, None)
                continue
            if c.node in st.incident_cordons and not await self._uncordon_before_start(c.node):
                waiting.append(f"{c.node} ({c.verdict.action.value}: its incident cordon "
                               "could not be lifted before its remediation; tried again)")
                continue
            if await self._start(c.verdict, c.who, c.why, slot=not adm.outside_budget(c),
                                 pool=obs.pool_of.get(c.node, ""),
                                 domains={label: adm.domain_of(c.node, label)
                                          for label in self.settings.domain_labels()},
                                 gpus=obs.gpus_of.get(c.node, 0), scope=adm.scope_of(c)):
                adm.admit(c)
            else:
                # remediation-<node> already runs, started by someone else (a CLI, an earlier
                # detector): it holds a slot like ours, and an operator is told.
                adm.admit(c)
                self.elsewhere.add(c.node)
        # Shown for as long as such a start holds its slot (until the node's label shows
        # or the pending grace passes).
        self.elsewhere &= {n for n, b in adm.busy.items() if b == "starting"}
        self.last_errors = [*self.last_errors, *(
            f"{n}: {remediation_workflow_id(n)} already runs, not started by this detector: "
            "counted in the budget" for n in sorted(self.elsewhere))]
        self.in_flight = adm.in_use
        self.waiting = waiting
        self.gpu_use = adm.gpu_use()
        if domains:  # again, with this tick's starts
            self.domain_uses = adm.domain_uses()
        self._show(obs, adm.in_use)
        open_ = sorted((i for i in st.incidents.values() if i.closed_at is None),
                       key=lambda i: i.key)
        report = AdmissionReport(budget=self.budget, in_use=len(adm.in_use),
                                 waiting=len(waiting), breaker_open=st.breaker_open,
                                 paused=st.paused, breaker_reason=st.breaker_reason,
                                 breaker_nodes=st.breaker_nodes,
                                 incidents=[i.key for i in open_],
                                 incident_nodes={i.key: i.nodes for i in open_})
        if versions.patched(GPU_COUNT_PATCH):
            report.gpus, report.domains = self.gpu_use, self.domain_uses
        if report != self.last_report:
            try:
                await workflow.execute_activity(
                    act.report_admission, report, task_queue=self.settings.observe_task_queue,
                    start_to_close_timeout=timedelta(seconds=30),
                    retry_policy=RetryPolicy(maximum_attempts=3),
                    summary="publish budget figures")
            except ActivityError as err:
                # Metrics are not worth the detector: log, and publish again next tick.
                workflow.logger.warning("report_admission failed: %s", err.cause or err)
                self.last_errors = [*self.last_errors, f"report failed: {err.cause or err}"]
            else:
                self.last_report = report

    def _gpu_scope_on(self) -> bool:
        """GPU-scoped leases, where the remediations isolate GPUs (gpu_isolation: dra)."""
        if self.settings.remediation.gpu_isolation != GpuIsolation.DRA or not self.leases_mode:
            return False
        return versions.patched(GPU_LEASE_PATCH)

    def _domains_on(self) -> bool:
        """Fault domains, GPU budgets and incidents, where any is configured or an incident
        is carried (a detector run recorded before them had none)."""
        s, st = self.settings, self.state
        if not (s.fault_domains or s.max_unavailable_gpus is not None or st.incidents
                or st.incident_cordons or (s.pool_label and s.pool_max_unavailable_gpus)):
            return False
        return versions.patched(DOMAINS_PATCH)

    async def _follow_incidents(self, watch: IncidentWatch) -> None:
        """Act on the tick's incident decision: cordon the nodes that joined an incident,
        uncordon ours that no incident holds any more. An activity only when something
        changed, so an idle tick costs nothing more."""
        st = self.state
        for inc in watch.opened:
            workflow.logger.warning("domain incident %s opened: %s", inc.key, inc.reason)
        for inc in watch.closed:
            workflow.logger.info("domain incident %s closed: %s", inc.key, inc.closed_by)
        st.incidents = prune_closed(st.incidents)
        for key, nodes in sorted(watch.to_cordon.items()):
            if self.settings.dry_run:
                continue  # dry-run changes nothing: the incident is shown, not acted on
            result = await self._incident_cordon(IncidentCordon(
                key=key, reason=st.incidents[key].reason, cordon=nodes))
            if result is not None:
                st.incident_cordons.update({n: key for n in result.cordoned})
                st.incident_cordons.update({n: NOT_OURS + key for n in result.already})
        theirs = [n for n in watch.to_uncordon if st.incident_cordons[n].startswith(NOT_OURS)]
        for n in theirs:
            del st.incident_cordons[n]
        ours = [n for n in watch.to_uncordon if n not in theirs]
        if ours:
            result = await self._incident_cordon(IncidentCordon(
                key=", ".join(sorted({st.incident_cordons[n] for n in ours})),
                reason="its fault cleared", uncordon=ours))
            for n in result.uncordoned if result is not None else []:
                st.incident_cordons.pop(n, None)

    async def _uncordon_before_start(self, node: str) -> bool:
        """A node an incident held, about to be remediated on its own: our cordon comes
        off first, so its remediation's claim sees the node as we found it (and returns it
        uncordoned). False: it could not, and the node waits."""
        key = self.state.incident_cordons[node]
        if key.startswith(NOT_OURS) or self.settings.dry_run:
            del self.state.incident_cordons[node]
            return True
        result = await self._incident_cordon(IncidentCordon(
            key=key, reason="remediated on its own now", uncordon=[node]))
        if result is None or node not in result.uncordoned:
            return False
        del self.state.incident_cordons[node]
        return True

    async def _incident_cordon(self, req: IncidentCordon) -> IncidentCordonResult | None:
        try:
            return await workflow.execute_activity(
                # On the workflow's own queue (every worker registers it): the observe
                # queue's worker runs only the tick's two activities.
                act.cordon_for_incident, req,
                start_to_close_timeout=timedelta(minutes=2),
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary=("cordon" if req.cordon else "uncordon")
                + f" for domain incident {plain(req.key, 200)}")
        except ActivityError as err:
            workflow.logger.warning("incident cordon failed: %s", err.cause or err)
            self.last_errors = [*self.last_errors,
                                f"incident cordon failed: {err.cause or err}"[:500]]
            return None

    async def _grant_slot(self, node: str, gpus: int = 0) -> bool:
        """Tell a heat cordon's remediation it may drain, or a GPU-scoped one that it may
        take the whole node. With leases, its lease takes a slot from now for the rest of
        its life (a GPU-scoped lease becomes the node's, ``gpus`` GPUs); before them, the
        slot was held until its label left 'cordoned' (or the pending grace passed)."""
        lease = self.state.leases.get(node) if self.leases_mode else None
        try:
            await workflow.get_external_workflow_handle(remediation_workflow_id(node)).signal(
                SLOT_GRANTED_SIGNAL, *([SlotGrant(token=lease.token)] if lease else []))
        except FailureError as err:
            workflow.logger.warning("%s asked for a drain slot but cannot be told: %s",
                                    remediation_workflow_id(node), err)
            return False
        if lease is not None:
            self.state.leases[node] = widened(lease, gpus)
            return True
        self.state.pending = [*self.state.pending,
                              PendingStart(node=node, at=workflow.now(), escalation=True)]
        return True

    async def _start(self, verdict: Verdict, who: str, why: str, *, slot: bool = True,
                     pool: str = "", domains: dict[str, str] | None = None,
                     gpus: int = 0, scope: LeaseScope = "node") -> bool:
        s, st = self.settings, self.state
        node = verdict.node
        wid = remediation_workflow_id(node)
        token = ""
        if self.leases_mode:
            # Granted before the start: the lease holds the slot from this instant on.
            token = str(workflow.uuid4())
            # A GPU-scoped lease takes one GPU and no slot until it is widened.
            one_gpu = scope == "gpu"
            slot = slot and not one_gpu
            st.leases[node] = Lease(node=node, token=token, granted_at=workflow.now(),
                                    workflow_id=wid, slot=slot, requested_by=who[:253],
                                    pool=pool, domains=domains or {},
                                    gpus=1 if one_gpu else gpus, scope=scope)
        try:
            handle = await workflow.start_child_workflow(
                "RemediationWorkflow",
                RemediationInput(node=node, verdict=verdict, settings=s.remediation,
                                 policy=s.policy, dry_run=s.dry_run, requested_by=who,
                                 reason=why, holds_slot=slot, lease_token=token,
                                 lease_scope=scope),
                id=remediation_workflow_id(node),
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                search_attributes=TypedSearchAttributes([
                    SearchAttributePair(GPU_NODE, node),
                    SearchAttributePair(REMEDIATION_STATE, NodeState.HEALTHY.value),
                    SearchAttributePair(REMEDIATION_ACTION, verdict.action.value),
                ]),
                static_summary=plain(f"{node}: {verdict.summary}", 200),
                static_details=_evidence(verdict, who, why, s.dry_run),
            )
        except WorkflowAlreadyStartedError:
            workflow.logger.warning("%s already runs: counted in the budget, not started again",
                                    remediation_workflow_id(node))
            if self.leases_mode:
                # Not ours (a direct start): its token is not this lease's, so it can take no
                # step; the lease holds the slot until it closes, then the node is admitted
                # again.
                st.leases[node].token = f"held-for-{token}"
                return False
            st.pending = [*st.pending, PendingStart(node=node, at=workflow.now(), slot=slot)]
            return False
        self.children[node] = handle
        st.pending = [*st.pending, PendingStart(node=node, at=workflow.now(), slot=slot)]
        st.started_total += 1
        if s.dry_run:
            st.planned[node] = verdict.action
        return True

    def _show(self, obs: FleetObservation, in_use: list[str]) -> None:
        st = self.state
        lines = [
            f"**budget** {len(in_use)}/{self.budget} in use · {len(self.waiting)} waiting · "
            f"{obs.managed_nodes} GPU nodes, {obs.readable_nodes} readable"
            + (" · **dry-run**" if self.settings.dry_run else ""),
        ]
        if st.paused:
            lines.append(f"**paused** ({plain(st.paused_by, 300)})")
        if self.over_limits:
            lines.append("**admitting nothing**: settings past the worker's limits: "
                         + plain("; ".join(self.over_limits), 1000))
        if st.breaker_open:
            lines.append(f"**circuit breaker open**: {st.breaker_reason}")
        for inc in sorted(st.incidents.values(), key=lambda i: i.key):
            if inc.closed_at is not None:
                continue
            held = "released: remediated one by one" if inc.released_by else \
                "cordoned, not drained"
            lines.append(f"**domain incident** {plain(inc.label, 317)}="
                         f"{plain(domain_name(inc.domain), 63)} since "
                         f"{inc.opened_at:%Y-%m-%d %H:%M:%S} UTC ({held}): "
                         + plain(", ".join(inc.nodes[:20]), 1000)
                         + f" — {plain(inc.reason, 300)}")
        over = [u for u in self.domain_uses if u.budget is not None and u.in_use >= u.budget]
        gpus = self.gpu_use
        if gpus is not None and (gpus.budget is not None or gpus.isolated or gpus.pools):
            lines.append(f"**GPUs** {gpus.out_of_service}/"
                         f"{'-' if gpus.budget is None else gpus.budget} out of service "
                         f"({gpus.isolated} isolated) · {gpus.gpus} GPUs"
                         + "".join(f" · pool {plain(p or '(none)', 63)} {used}/"
                                   f"{gpus.pool_budgets.get(p, '-')}"
                                   for p, used in sorted(gpus.pools.items())[:10]))
        over += [u for u in self.domain_uses if u not in over and u.gpu_budget is not None
                 and u.gpus_in_use >= u.gpu_budget]
        if over:
            lines.append("domains at their budget: " + ", ".join(
                f"{plain(u.label, 100)}={plain(domain_name(u.domain), 63)} "
                f"{u.in_use}/{'-' if u.budget is None else u.budget} nodes"
                + ("" if u.gpu_budget is None else f", {u.gpus_in_use}/{u.gpu_budget} GPUs")
                for u in over[:10]))
        if self.waiting:
            lines.append("waiting: " + ", ".join(self.waiting[:20]))
        if obs.errors:
            lines.append(f"{len(obs.errors)} exporter errors, first: "
                         f"{plain(obs.errors[0], 300)}")
        workflow.set_current_details("\n\n".join(lines))


def _node_state(value: str, default: NodeState = NodeState.HEALTHY) -> NodeState:
    """A RemediationState search attribute (written by the remediation itself) as a state."""
    try:
        return NodeState(value)
    except ValueError:
        return default


def _evidence(verdict: Verdict, who: str, why: str, dry_run: bool) -> str:
    # Rendered as Markdown by the Temporal UI: every value a node, its exporter or a client
    # wrote is escaped (workflows/ui_text.py), so none can become a heading or a link.

    rows = [f"| {plain(f.gpu, 16)} | {plain(f.uuid, 64)} | {plain(f.signal, 64)} | "
            f"{f.value:g} | {plain(f.rule, 120)} | {f.action.value} |"
            for f in verdict.findings[:50]]
    return "\n".join([
        f"### {plain(verdict.node, 253)}: {verdict.action.value}"
        + (" (dry-run)" if dry_run else ""),
        f"Requested by **{plain(who, 253)}**: {plain(why, 1024)}", "",
        "| GPU | UUID | signal | value | rule | action |", "|---|---|---|---|---|---|", *rows,
    ])


@workflow.defn(name="DetectorWorkflow", versioning_behavior=VersioningBehavior.PINNED)
class PinnedDetectorWorkflow(DetectorWorkflow):
    """The detector as a worker with Worker Deployment Versioning registers it: pinned to
    the version it started on, so a release never changes the code under a running loop,
    and moved to the deployment's current version at its next continue-as-new (every
    ``ticks_per_run`` ticks). An unversioned worker (the default) refuses a pinned class,
    hence a subclass the worker picks (worker/service/run.py ``detector_workflow``)."""

    pinned = True

    @workflow.run
    async def run(self, inp: DetectorInput) -> None:
        await super().run(inp)
