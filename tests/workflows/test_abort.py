"""Abort is exact: from every step, whatever its activity is doing, a cancel ends the
remediation as aborted and gives the node back.

The fakes here are as unkind as the real activities: a drain, Job or thermal watch
*blocks and heartbeats* until it is cancelled (or completes anyway, as an activity that
shields its last write does), a claim or state write runs to its end without looking at
cancellation (they do not heartbeat), and a failing call sits in retry backoff when the
cancel arrives. Real dev server (``local_env``): cancellation is delivered through real
heartbeats.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
import typing
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.worker import Worker

from policy.models import Action
from tests.workflows.fakes import FakeCluster, until, xid_verdict
from workflows.messages import (
    DrainResult,
    NodeHealth,
    RemediationInput,
    RemediationView,
    ThermalWatchResult,
)
from workflows.remediation import RemediationWorkflow
from workflows.settings import ApprovalSettings, DrainSettings, RemediationSettings, ThermalSettings
from workflows.transitions import NodeState

Mode = Literal["cancelled", "completes", "retrying", "gate"]

# Heartbeats are throttled to 0.8 x heartbeat_timeout: a short timeout delivers cancels fast.
SETTINGS = RemediationSettings(
    heartbeat_timeout=timedelta(seconds=2),
    drain=DrainSettings(retry_interval=timedelta(milliseconds=200)),
    thermal=ThermalSettings(poll_interval=timedelta(milliseconds=200),
                            hold=timedelta(seconds=1)),
)
SUPERVISED = SETTINGS.model_copy(update={"approval": ApprovalSettings(
    required_for=[Action.REBOOT], timeout=timedelta(hours=1))})


@dataclass
class Hold:
    """How one activity behaves the first time it is called (later calls are normal)."""

    activity: str
    mode: Mode
    kind: str | None = None  # for run_node_job: which Job
    entered: threading.Event = field(default_factory=threading.Event)
    gate: threading.Event = field(default_factory=threading.Event)
    outcome: list[str] = field(default_factory=list)

    def matches(self, name: str, inp: Any) -> bool:
        return name == self.activity and self.kind in (None, getattr(inp, "kind", ""))


@dataclass
class Unkind:
    cluster: FakeCluster
    hold: Hold
    started: list[str] = field(default_factory=list)
    used: bool = False

    def enter(self, name: str, inp: Any) -> None:
        self.started.append(name + (f":{inp.kind}" if name == "poll_node_job" else ""))
        if self.used or not self.hold.matches(name, inp):
            return
        h = self.hold
        if h.mode == "retrying":
            if h.gate.is_set():
                self.used = True  # the apiserver is back
                return
            h.entered.set()
            # Every attempt fails until the cancel; the workflow waits in retry backoff.
            raise ApplicationError("apiserver unavailable", type="Transient")
        self.used = True
        h.entered.set()
        if h.mode == "gate":
            # Runs to its end whatever happens (no heartbeat, so no cancel reaches it).
            h.gate.wait(30)
            h.outcome.append("completed")
            return
        end = time.monotonic() + 30
        if h.mode == "cancelled":
            try:
                while time.monotonic() < end:
                    activity.heartbeat("holding")
                    time.sleep(0.05)
            except CancelledError:
                h.outcome.append("cancelled")
                raise
            return
        # "completes": sees the cancel, finishes its work anyway and returns normally.
        with activity.shield_thread_cancel_exception():
            while not activity.is_cancelled() and time.monotonic() < end:
                activity.heartbeat("holding")
                time.sleep(0.05)
        h.outcome.append("completed despite cancel")

    def activities(self) -> list[Callable[..., Any]]:
        out = []
        for fn in self.cluster.activities():
            defn = activity._Definition.must_from_callable(fn)
            out.append(self._wrap(defn.name or fn.__name__, fn))
        return out

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        hints = typing.get_type_hints(fn)
        if inspect.iscoroutinefunction(fn):
            async def acall(inp: Any) -> Any:
                self.enter(name, inp)
                return await fn(inp)
            acall.__annotations__ = hints
            acall.__name__ = name
            return activity.defn(name=name)(acall)

        def call(inp: Any) -> Any:
            self.enter(name, inp)
            return fn(inp)
        call.__annotations__ = hints
        call.__name__ = name
        return activity.defn(name=name)(call)


@asynccontextmanager
async def unkind_worker(client: Client, unkind: Unkind) -> AsyncIterator[str]:
    queue = f"tq-{uuid.uuid4()}"
    with ThreadPoolExecutor(16) as pool:
        async with Worker(client, task_queue=queue, workflows=[RemediationWorkflow],
                          activities=unkind.activities(), activity_executor=pool):
            try:
                yield queue
            finally:
                unkind.hold.gate.set()


async def view(handle: Any) -> RemediationView:
    result: RemediationView = await handle.query(RemediationWorkflow.view_state)
    return result


# (step reached, activity held, mode) -> an abort there ends as aborted.
MATRIX: list[tuple[str, Hold, str]] = [
    ("claim, completes anyway", Hold("claim_node", "gate"), "reboot"),
    ("claim, retrying", Hold("claim_node", "retrying"), "reboot"),
    ("first state write, completes anyway", Hold("set_node_state", "gate"), "reboot"),
    ("drain, in flight", Hold("drain_node", "cancelled"), "reboot"),
    ("drain, completes anyway", Hold("drain_node", "completes"), "reboot"),
    ("drain, retrying", Hold("drain_node", "retrying"), "reboot"),
    # A look at a Job is short and does not heartbeat: in flight, it runs to its end.
    ("reboot Job, a look in flight", Hold("poll_node_job", "gate", "reboot"), "reboot"),
    ("reboot Job, between looks", Hold("poll_node_job", "retrying", "reboot"), "reboot"),
    ("waiting for the rebooted node", Hold("check_node_returned", "retrying"), "reboot"),
    ("validation Job, a look in flight", Hold("poll_node_job", "gate", "validate"), "reboot"),
    ("validation Job, between looks", Hold("poll_node_job", "retrying", "validate"), "reboot"),
    ("GPU reset Job, a look in flight", Hold("poll_node_job", "gate", "gpu-reset"), "reset"),
    ("GPU reset Job, between looks", Hold("poll_node_job", "retrying", "gpu-reset"), "reset"),
    ("thermal watch, between looks", Hold("check_thermal", "retrying"), "thermal"),
    ("thermal watch, a look completes anyway", Hold("check_thermal", "gate"), "thermal"),
    ("final release, retrying", Hold("release_node", "retrying"), "reboot"),
    # The quarantine's write does not look for a cancel, and the run then hands over to
    # the hold run: the abort must be carried, not left behind with this run.
    ("quarantine write, completes anyway", Hold("release_node", "gate"), "quarantine"),
]


@pytest.mark.parametrize(("label", "hold", "action"), MATRIX, ids=[m[0] for m in MATRIX])
async def test_abort_in_every_step_and_activity_state_releases_the_node(
        local_env, label: str, hold: Hold, action: str) -> None:
    cluster = FakeCluster(thermal_results=[ThermalWatchResult(outcome="hot", message="92C")])
    node = f"abort-{uuid.uuid4().hex[:8]}"
    unkind = Unkind(cluster, hold)
    verdict = xid_verdict(node, 79, Action(action))
    async with unkind_worker(local_env.client, unkind) as queue:
        handle = await local_env.client.start_workflow(
            RemediationWorkflow.run,
            RemediationInput(node=node, verdict=verdict, settings=SETTINGS),
            id=f"remediation-{node}", task_queue=queue)
        assert await asyncio.to_thread(hold.entered.wait, 20), f"{label}: never reached"
        if hold.mode in ("cancelled", "completes"):
            await asyncio.sleep(0.3)  # let the first heartbeat land
        jobs_before = [s for s in unkind.started if s.startswith("poll_node_job")]
        await handle.cancel(reason="by alice: wrong node")
        if hold.mode in ("gate", "retrying"):
            await asyncio.sleep(0.5)
            hold.gate.set()
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), 30)
        assert isinstance(failed.value.cause, CancelledError), failed.value.cause
        assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED
    n = cluster.node(node)
    assert n.state == NodeState.HEALTHY, f"{label}: {n.states_seen}"
    assert not n.tainted and not n.cordoned, label
    if hold.activity == "claim_node" and hold.mode == "retrying":
        assert n.history == [] and "claim" not in " ".join(cluster.mutations), \
            "a claim that never landed leaves nothing to undo"
        return
    assert n.history and \
        n.history[-1].outcome == "aborted: aborted by alice (unverified): wrong node", \
        [h.outcome for h in n.history]
    jobs_after = [s for s in unkind.started if s.startswith("poll_node_job")]
    assert jobs_after == jobs_before, f"{label}: a Job started after the abort"
    deleted = [c[1].kind for c in cluster.calls if c[0] == "delete_node_job"]
    if hold.activity == "poll_node_job":
        assert deleted == [hold.kind], f"{label}: the Job of the aborted step is deleted"
    else:
        assert deleted == [], label
    if hold.mode == "cancelled":
        assert hold.outcome == ["cancelled"], "the activity in flight saw the cancel"


@pytest.mark.parametrize("where", ["approval", "quarantine"])
async def test_abort_while_waiting_for_approval_or_in_quarantine(local_env, where: str) -> None:
    cluster = FakeCluster()
    node = f"abort-{where}-{uuid.uuid4().hex[:6]}"
    unkind = Unkind(cluster, Hold("none", "gate"))
    action = Action.QUARANTINE if where == "quarantine" else Action.REBOOT
    want = NodeState.AWAITING_APPROVAL if where == "approval" else NodeState.QUARANTINED
    async with unkind_worker(local_env.client, unkind) as queue:
        handle = await local_env.client.start_workflow(
            RemediationWorkflow.run,
            RemediationInput(node=node, verdict=xid_verdict(node, 79, action),
                             settings=SUPERVISED if where == "approval" else SETTINGS),
            id=f"remediation-{node}", task_queue=queue)

        async def there() -> bool:
            return (await view(handle)).state == want and cluster.node(node).state == want
        await until(there, 20, f"{node} {want.value}")
        # The quarantine hold runs in a run of its own: the cancel reaches the latest run.
        await handle.cancel(reason="freeing it for maintenance")
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), 20)
    n = cluster.nodes[node]
    assert n.state == NodeState.HEALTHY and not n.tainted and not n.cordoned, where
    # A cancel from the UI carries no operator: the reason is kept as typed.
    assert n.history[-1].outcome == ("aborted: aborted by a cancel request: freeing it "
                                     "for maintenance"), where


async def test_abort_keeps_an_admins_cordon(local_env) -> None:
    cluster = FakeCluster(drain_results=[DrainResult(outcome="blocked", remaining=["a/b"],
                                                     blocking_pdb="a/pdb")])
    node = f"abort-admin-{uuid.uuid4().hex[:6]}"
    cluster.node(node).cordoned = True
    unkind = Unkind(cluster, Hold("drain_node", "cancelled"))
    async with unkind_worker(local_env.client, unkind) as queue:
        handle = await local_env.client.start_workflow(
            RemediationWorkflow.run,
            RemediationInput(node=node, verdict=xid_verdict(node), settings=SETTINGS),
            id=f"remediation-{node}", task_queue=queue)
        assert await asyncio.to_thread(unkind.hold.entered.wait, 20)
        await asyncio.sleep(0.3)
        await handle.cancel(reason="by bob: not now")
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), 20)
    n = cluster.nodes[node]
    assert n.state == NodeState.HEALTHY and not n.tainted
    assert n.cordoned, "an admin's cordon outlives our abort"


@pytest.mark.parametrize("read", ["shows", "unreadable", "failing"])
async def test_abort_acknowledges_the_xids_shown_so_the_detector_does_not_restart_it(
        local_env, read: str) -> None:
    """An XID keeps showing until another comes: an abort that acknowledged nothing would
    see the detector start the same remediation on its next tick. The XID 79 that started
    it is acknowledged; the node shows XID 48 by the abort, and that is acknowledged in
    its place. A node that cannot be read is given back all the same, with XID 79."""
    node = f"abort-ack-{read}-{uuid.uuid4().hex[:6]}"
    shows = NodeHealth(readable=True, thermal_recovered=True,
                       verdict=xid_verdict(node, 48, Action.RESET))
    health = {"shows": [shows],
              "unreadable": [NodeHealth(readable=False, thermal_recovered=False,
                                        message="exporter timed out")],
              "failing": []}[read]
    cluster = FakeCluster(health=health, drain_results=[
        DrainResult(outcome="blocked", remaining=["a/b"], blocking_pdb="a/pdb")])
    hold = Hold("read_node_health", "retrying") if read == "failing" else Hold("none", "gate")
    unkind = Unkind(cluster, hold)
    async with unkind_worker(local_env.client, unkind) as queue:
        handle = await local_env.client.start_workflow(
            RemediationWorkflow.run,
            RemediationInput(node=node, verdict=xid_verdict(node, 79), settings=SETTINGS),
            id=f"remediation-{node}", task_queue=queue)

        async def draining() -> bool:
            return (await view(handle)).blocking_pdb == "a/pdb"
        await until(draining, 20, f"{node} blocked by its PDB")
        await handle.cancel(reason="by alice: wrong node")
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), 30)
    n = cluster.nodes[node]
    assert n.state == NodeState.HEALTHY and not n.tainted and not n.cordoned, read
    assert n.history[-1].outcome == "aborted: aborted by alice (unverified): wrong node"
    assert n.acked == {f"GPU-{node}-0": 48 if read == "shows" else 79}, read
    if read == "failing":
        reads = [c for c in unkind.started if c == "read_node_health"]
        assert reads == ["read_node_health"] * 3, "a few tries, then the node goes back"
