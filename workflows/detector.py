"""DetectorWorkflow: the singleton that observes the fleet and admits remediations.

Each tick: one activity observes the whole fleet (list nodes, scrape, evaluate);
then, in workflow code, admission under the budget and the circuit breaker, and
remediation children started with ParentClosePolicy.ABANDON so they outlive
every continue-as-new of this workflow. The detector is the only admitter, and
it counts slots from the nodes' state labels each tick, so a crash anywhere
never lets more nodes out of service than the budget.
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError, ApplicationError, WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    from policy.models import SEVERITY, Action, Finding, Verdict
    from workflows.models import (
        OUT_OF_SERVICE_STATES,
        AdmissionReport,
        DetectorInput,
        DetectorView,
        FleetObservation,
        ManualRemediation,
        NodeState,
        ObserveInput,
        OperatorAck,
        OperatorCommand,
        PendingStart,
        RemediationInput,
        remediation_workflow_id,
    )
    from workflows.search_attributes import GPU_NODE, REMEDIATION_ACTION, REMEDIATION_STATE

# A start not yet visible as a node label holds its slot this long at most.
PENDING_GRACE = timedelta(minutes=5)
NODE_ACTIONS = (Action.THERMAL, Action.RESET, Action.REBOOT, Action.QUARANTINE)


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
        # Nodes in remediation (label state, or "starting" for a pending start), for the
        # remediate validator.
        self.busy: dict[str, str] = {}
        # Children started by this run; a closed one no longer needs its pending slot.
        self.children: dict[str, workflow.ChildWorkflowHandle] = {}

    # ------------------------------------------------------------ operator messages

    @workflow.query(description="Budget, in-flight and waiting nodes, breaker and pause state.")
    def view(self) -> DetectorView:
        return DetectorView(
            paused=self.state.paused, breaker_open=self.state.breaker_open,
            breaker_reason=self.state.breaker_reason, budget=self.budget,
            in_flight=self.in_flight, waiting=self.waiting,
            last_tick=self.last_tick,
            last_errors=self.last_errors, ticks_total=self.state.ticks_total,
            started_total=self.state.started_total,
        )

    @workflow.update(description="Stop admitting new remediations; running ones continue.")
    async def pause(self, cmd: OperatorCommand) -> OperatorAck:
        self.state.paused, self.state.paused_by = True, f"{cmd.operator}: {cmd.reason}"
        return self._ack(f"paused by {cmd.operator}")

    @pause.validator
    def _check_pause(self, cmd: OperatorCommand) -> None:
        if self.state.paused:
            raise ApplicationError(f"already paused ({self.state.paused_by})", type="Rejected")

    @workflow.update(description="Resume admissions and close a tripped circuit breaker.")
    async def resume(self, cmd: OperatorCommand) -> OperatorAck:
        was = "breaker closed" if self.state.breaker_open else "resumed"
        self.state.paused = False
        self.state.paused_by = ""
        self.state.breaker_open = False
        self.state.breaker_reason = ""
        self.wake = True
        return self._ack(f"{was} by {cmd.operator}")

    @resume.validator
    def _check_resume(self, cmd: OperatorCommand) -> None:
        if not self.state.paused and not self.state.breaker_open:
            raise ApplicationError("not paused and the breaker is closed: nothing to resume",
                                   type="Rejected")

    @workflow.update(description="Remediate a node now, through the same budget.")
    async def remediate(self, req: ManualRemediation) -> OperatorAck:
        self.state.manual = [*self.state.manual, req]
        self.wake = True
        return self._ack(f"{req.node} queued for {req.action.value} by {req.operator}")

    @remediate.validator
    def _check_remediate(self, req: ManualRemediation) -> None:
        if req.action not in NODE_ACTIONS:
            raise ApplicationError(
                f"action {req.action.value} is not a node action; use one of "
                f"{', '.join(a.value for a in NODE_ACTIONS)}", type="Rejected")
        if any(m.node == req.node for m in self.state.manual):
            raise ApplicationError(f"{req.node} is already queued", type="Rejected")
        if req.node in self.in_flight or req.node in self.busy:
            state = self.busy.get(req.node, "in flight")
            raise ApplicationError(f"{req.node} is already in remediation ({state})",
                                   type="Rejected")

    def _ack(self, message: str) -> OperatorAck:
        return OperatorAck(state=NodeState.HEALTHY, message=message)

    # ------------------------------------------------------------ the loop

    @workflow.run
    async def run(self, inp: DetectorInput) -> None:
        ticks = 0
        while True:
            # An update that arrives during this tick wakes the next one at once.
            self.wake = False
            # Children known closed before the observation: their labels in it are the truth.
            closed = self._closed_children()
            obs = await self._observe()
            if obs is not None:
                await self._admit(obs, closed)
            ticks += 1
            self.state.ticks_total += 1
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(lambda: self.wake, timeout=self.settings.interval,
                                              timeout_summary="next fleet observation")
            if ticks >= self.settings.ticks_per_run or \
                    workflow.info().is_continue_as_new_suggested():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(DetectorInput(settings=self.settings, state=self.state))

    async def _observe(self) -> FleetObservation | None:
        try:
            return await workflow.execute_activity(
                "observe_fleet", ObserveInput(policy=self.settings.policy),
                result_type=FleetObservation,
                start_to_close_timeout=self.settings.observe_timeout,
                retry_policy=RetryPolicy(maximum_attempts=2),
                summary="scrape and evaluate the fleet",
            )
        except ActivityError as err:
            # No data, no action: a failed observation admits nothing this tick.
            self.last_errors = [f"observation failed: {err.cause or err}"]
            workflow.set_current_details(f"**observation failed**: {err.cause or err}")
            return None

    def _closed_children(self) -> set[str]:
        closed = {n for n, h in self.children.items() if h.done()}
        for n in sorted(closed):
            handle = self.children.pop(n)
            if not handle.cancelled():
                handle.exception()  # retrieved: a failed child is not an error of ours
        return closed

    async def _admit(self, obs: FleetObservation, closed: set[str] | None = None) -> None:
        s, st = self.settings, self.state
        now = workflow.now()
        closed = closed or set()
        self.last_tick = now
        self.last_errors = obs.errors[:10]
        labelled = {n.node: n for n in obs.remediating}
        # A pending start holds its slot until its label shows, its child is known to
        # have closed before this observation, or the grace period passes.
        st.pending = [p for p in st.pending if p.node not in labelled
                      and p.node not in closed and now - p.at < PENDING_GRACE]
        holding = set(OUT_OF_SERVICE_STATES)
        if s.cordoned_counts_against_budget:
            holding.add(NodeState.CORDONED)
        in_use = sorted({n for n, st_ in labelled.items() if st_.state in holding}
                        | {p.node for p in st.pending})
        busy = set(labelled) | {p.node for p in st.pending}
        self.busy = {**{p.node: "starting" for p in st.pending},
                     **{n: ns.state.value for n, ns in labelled.items()}}
        self.budget = s.budget_for(obs.managed_nodes)
        self.in_flight = in_use

        flagged = {v.node: v for v in obs.verdicts}
        if s.dry_run:
            # Forget a plan only when the node is no longer flagged for that action, not
            # merely while its (dry-run) child is still pending.
            st.planned = {n: a for n, a in st.planned.items()
                          if n in flagged and flagged[n].action == a}
        verdicts = {n: v for n, v in flagged.items() if n not in busy and n not in st.planned}
        # The breaker counts newly flagged nodes: the ones an operator already saw (and
        # resumed for) or that wait for a slot do not trip it again.
        self._check_breaker(obs, sum(1 for n in verdicts if n not in st.first_seen))
        for n in verdicts:
            st.first_seen.setdefault(n, now)
        st.first_seen = {n: t for n, t in st.first_seen.items() if n in verdicts}

        queue: list[tuple[Verdict, str, str]] = []
        manual = [m for m in st.manual if m.node not in busy]
        st.manual = manual
        for m in manual:
            queue.append((_manual_verdict(m), m.operator, m.reason))
        manual_nodes = {m.node for m in manual}
        for v in sorted(verdicts.values(),
                        key=lambda v: (-SEVERITY[v.action], st.first_seen[v.node], v.node)):
            if v.node not in manual_nodes:
                queue.append((v, "detector", v.summary))

        free = self.budget - len(in_use)
        waiting: list[str] = []
        blocked = st.paused or st.breaker_open
        for verdict, who, why in queue:
            if blocked or free <= 0:
                waiting.append(f"{verdict.node} ({verdict.action.value}: "
                               + ("paused" if st.paused else "breaker open" if st.breaker_open
                                  else "budget full") + ")")
                continue
            if await self._start(verdict, who, why):
                free -= 1
                in_use.append(verdict.node)
        st.manual = [m for m in st.manual if m.node not in in_use]
        self.waiting = waiting
        self._show(obs, in_use)
        report = AdmissionReport(budget=self.budget, in_use=len(in_use), waiting=len(waiting),
                                 breaker_open=st.breaker_open, paused=st.paused,
                                 breaker_reason=st.breaker_reason)
        if report != self.last_report:
            try:
                await workflow.execute_activity(
                    "report_admission", report, start_to_close_timeout=timedelta(seconds=30),
                    retry_policy=RetryPolicy(maximum_attempts=3),
                    summary="publish budget figures")
            except ActivityError as err:
                # Metrics are not worth the detector: log, and publish again next tick.
                workflow.logger.warning("report_admission failed: %s", err.cause or err)
                self.last_errors = [*self.last_errors, f"report failed: {err.cause or err}"]
            else:
                self.last_report = report

    def _check_breaker(self, obs: FleetObservation, flagged: int) -> None:
        s, st = self.settings, self.state
        if st.breaker_open or flagged < s.breaker_min_flagged_nodes:
            return
        # Unreadable exporters count toward neither side.
        base = max(obs.readable_nodes, 1)
        pct = 100.0 * flagged / base
        if flagged > s.breaker_max_flagged_nodes or pct > s.breaker_max_flagged_percent:
            st.breaker_open = True
            st.breaker_reason = (f"{flagged} of {obs.readable_nodes} readable nodes newly flagged "
                                 f"in one tick ({pct:.0f}% > {s.breaker_max_flagged_percent:.0f}% "
                                 f"or > {s.breaker_max_flagged_nodes}); resume after checking "
                                 "the fleet")

    async def _start(self, verdict: Verdict, who: str, why: str) -> bool:
        s, st = self.settings, self.state
        node = verdict.node
        try:
            handle = await workflow.start_child_workflow(
                "RemediationWorkflow",
                RemediationInput(node=node, verdict=verdict, settings=s.remediation,
                                 policy=s.policy, dry_run=s.dry_run, requested_by=who,
                                 reason=why),
                id=remediation_workflow_id(node),
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                search_attributes=TypedSearchAttributes([
                    SearchAttributePair(GPU_NODE, node),
                    SearchAttributePair(REMEDIATION_STATE, NodeState.HEALTHY.value),
                    SearchAttributePair(REMEDIATION_ACTION, verdict.action.value),
                ]),
                static_summary=f"{node}: {verdict.summary}"[:200],
                static_details=_evidence(verdict, who, why, s.dry_run),
            )
        except WorkflowAlreadyStartedError:
            return False
        self.children[node] = handle
        st.pending = [*st.pending, PendingStart(node=node, at=workflow.now())]
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
            lines.append(f"**paused** ({st.paused_by})")
        if st.breaker_open:
            lines.append(f"**circuit breaker open**: {st.breaker_reason}")
        if self.waiting:
            lines.append("waiting: " + ", ".join(self.waiting[:20]))
        if obs.errors:
            lines.append(f"{len(obs.errors)} exporter errors, first: {obs.errors[0]}")
        workflow.set_current_details("\n\n".join(lines))


def _manual_verdict(m: ManualRemediation) -> Verdict:
    return Verdict(node=m.node, action=m.action, findings=[Finding(
        gpu="all", signal="operator", value=0, rule=f"manual-{m.action.value}", action=m.action)])


def _evidence(verdict: Verdict, who: str, why: str, dry_run: bool) -> str:
    rows = [f"| {f.gpu} | `{f.uuid}` | {f.signal} | {f.value:g} | {f.rule} | {f.action.value} |"
            for f in verdict.findings[:50]]
    return "\n".join([
        f"### {verdict.node}: {verdict.action.value}" + (" (dry-run)" if dry_run else ""),
        f"Requested by **{who}**: {why}", "",
        "| GPU | UUID | signal | value | rule | action |", "|---|---|---|---|---|---|", *rows,
    ])
