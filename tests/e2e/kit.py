"""Helpers shared by the end-to-end and chaos suites: read the cluster the way an SRE
would (labels, annotations, taints, Events, Jobs, the simulator's write log), talk to
Temporal the way the CLI does, and poll with deadlines that print the worker's log
tail when they run out."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import httpx
from kubernetes import client, config
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities.node_keys import A_HISTORY, STATE_LABEL, TAINT_KEY
from tests.polling import wait_for as poll
from worker.cli import operator
from worker.config import TemporalSettings
from worker.stack.local import LocalStack, _tail
from worker.temporal_client import connect
from workflows.ids import remediation_workflow_id
from workflows.messages import (
    DetectorView,
    OperatorAck,
    OperatorCommand,
    ReleaseInput,
    RemediationResult,
    RemediationView,
)

T = TypeVar("T")

OUT_OF_SERVICE = {"awaiting-approval", "draining", "repairing", "validating", "cordoned"}


def worker_log(stack: LocalStack, lines: int = 60) -> str:
    return _tail(stack.data_dir / "logs" / "worker.log", lines)


def wait_for(stack: LocalStack, what: str, check: Callable[[], T | None], *,
             timeout: float = 60.0, every: float = 0.25) -> T:
    """``tests/polling.wait_for`` against the stack: an API error while polling is transient
    (the worker or a server restarting is not the test), and a timeout shows the worker's
    log tail."""
    return poll(check, timeout, what, every=every, transient=(Exception,),
                context=lambda: f"--- worker log tail ({stack.data_dir}/logs/worker.log) ---\n"
                                + worker_log(stack))


class Cluster:
    """A thin view of the (simulated or real) cluster through the official client."""

    def __init__(self, stack: LocalStack) -> None:
        self.stack = stack
        api = config.new_client_from_config(config_file=str(stack.kubeconfig))
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.policy = client.PolicyV1Api(api)
        self.url = f"http://127.0.0.1:{stack.ports.cluster}"

    # nodes
    def node(self, name: str) -> Any:
        return self.core.read_node(name)

    def nodes(self) -> dict[str, Any]:
        return {n.metadata.name: n for n in self.core.list_node().items}

    def state(self, name: str) -> str:
        return str((self.node(name).metadata.labels or {}).get(STATE_LABEL, "healthy"))

    def annotations(self, name: str) -> dict[str, str]:
        return dict(self.node(name).metadata.annotations or {})

    def history(self, name: str) -> list[dict[str, Any]]:
        return list(json.loads(self.annotations(name).get(A_HISTORY) or "[]"))

    @staticmethod
    def has_our_taint(node: Any) -> bool:
        return any(t.key == TAINT_KEY for t in node.spec.taints or [])

    def cordon(self, name: str) -> None:
        self.core.patch_node(name, {"spec": {"unschedulable": True}})

    # events, pods, jobs
    def event_reasons(self, node: str) -> list[str]:
        events = self.core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={node}").items
        return [e.reason for e in sorted(events, key=lambda e: e.metadata.resource_version
                                         and int(e.metadata.resource_version))]

    def events(self, node: str, reason: str) -> list[Any]:
        return [e for e in self.core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={node}").items if e.reason == reason]

    def pods_on(self, node: str, *, include_system: bool = False) -> list[Any]:
        pods = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}").items
        out = []
        for p in pods:
            owners = p.metadata.owner_references or []
            if not include_system and (
                    any(o.kind in ("DaemonSet", "Node", "Job") for o in owners)
                    or p.metadata.namespace in ("kube-system", "gpu-operator",
                                                "gpu-remediate-jobs")):
                continue
            if p.status.phase in ("Succeeded", "Failed"):
                continue
            out.append(p)
        return out

    def jobs(self, node: str) -> list[Any]:
        return [j for j in self.batch.list_namespaced_job("gpu-remediate-jobs").items
                if (j.metadata.labels or {}).get("gpu-remediate.io/node") == node]

    def job_kinds(self, node: str) -> list[str]:
        return sorted(j.metadata.labels["gpu-remediate.io/job"] for j in self.jobs(node))

    # simulator control
    def writes(self) -> list[dict[str, Any]]:
        return list(httpx.get(f"{self.url}/sim/v1/writes", timeout=10).json()["writes"])

    def set_faults(self, rules: list[dict[str, Any]], seed: int = 1) -> dict[str, Any]:
        resp = httpx.put(f"{self.url}/sim/v1/faults", json={"rules": rules, "seed": seed},
                         timeout=10)
        resp.raise_for_status()
        return dict(resp.json())

    def clear_faults(self) -> dict[str, Any]:
        resp = httpx.delete(f"{self.url}/sim/v1/faults", timeout=10)
        resp.raise_for_status()
        return dict(resp.json())


# ---------------------------------------------------------------- Temporal


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def _client(stack: LocalStack) -> Client:
    # A stack whose server authenticates (tests/production/test_authorization.py) names
    # the settings its tests connect with.
    settings = getattr(stack, "client_temporal", None)
    return await connect(settings or TemporalSettings(address=stack.temporal_address))


def view_state(stack: LocalStack, node: str) -> RemediationView:
    async def go() -> RemediationView:
        return await operator.remediation_view(await _client(stack), node)
    return run(go())


def detector_view(stack: LocalStack) -> DetectorView:
    async def go() -> DetectorView:
        return await operator.detector_view(await _client(stack))
    return run(go())


def update(stack: LocalStack, node: str, verb: operator.RemediationVerb,
           who: str = "e2e", reason: str = "test") -> OperatorAck:
    async def go() -> OperatorAck:
        return await operator.remediation_update(
            await _client(stack), node, verb, OperatorCommand(operator=who, reason=reason))
    return run(go())


def detector_update(stack: LocalStack, verb: Any, who: str = "e2e",
                    reason: str = "test") -> OperatorAck:
    async def go() -> OperatorAck:
        return await operator.detector_update(await _client(stack), verb,
                                              OperatorCommand(operator=who, reason=reason))
    return run(go())


def abort(stack: LocalStack, node: str, who: str = "e2e", reason: str = "test") -> str:
    async def go() -> str:
        return await operator.abort(await _client(stack), node,
                                    OperatorCommand(operator=who, reason=reason))
    return run(go())


def workflow_status(stack: LocalStack, node: str) -> WorkflowExecutionStatus | None:
    """The status of the node's latest remediation run, None if it never had one."""
    async def go() -> WorkflowExecutionStatus | None:
        temporal = await _client(stack)
        try:
            desc = await temporal.get_workflow_handle(remediation_workflow_id(node)).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        return desc.status
    return run(go())


def workflow_runs(stack: LocalStack, node: str) -> int:
    """How many remediation runs the node has had (visibility, eventually consistent)."""
    async def go() -> int:
        temporal = await _client(stack)
        n = 0
        async for _ in temporal.list_workflows(
                f'WorkflowId="{remediation_workflow_id(node)}"'):
            n += 1
        return n
    return run(go())


def result(stack: LocalStack, node: str, timeout: float = 60) -> RemediationResult:
    async def go() -> RemediationResult:
        temporal = await _client(stack)
        handle = temporal.get_workflow_handle(remediation_workflow_id(node),
                                              result_type=RemediationResult)
        return await asyncio.wait_for(handle.result(), timeout)
    return run(go())


def release_input(stack: LocalStack, node: str) -> ReleaseInput:
    """What the node's latest remediation last asked the release activity to write (a
    quarantine and a later release are two calls): read from the workflow's history, so a
    detector tick that changed the node since cannot hide it."""
    async def go() -> ReleaseInput:
        temporal = await _client(stack)
        handle = temporal.get_workflow_handle(remediation_workflow_id(node))
        last = None
        async for event in handle.fetch_history_events():
            scheduled = event.activity_task_scheduled_event_attributes
            if event.HasField("activity_task_scheduled_event_attributes") and \
                    scheduled.activity_type.name == "release_node":
                last = scheduled.input.payloads
        assert last is not None, f"{node}: the remediation never released the node"
        [inp] = await temporal.data_converter.decode(last, [ReleaseInput])
        assert isinstance(inp, ReleaseInput)
        return inp
    return run(go())


def metrics_text(stack: LocalStack) -> str:
    return httpx.get(f"http://127.0.0.1:{stack.ports.metrics}/metrics", timeout=5).text


def settle_ticks(stack: LocalStack, ticks: int, timeout: float = 60) -> None:
    """Wait until the detector has observed the fleet ``ticks`` more times."""
    start = detector_view(stack).ticks_total
    wait_for(stack, f"{ticks} detector ticks",
             lambda: detector_view(stack).ticks_total >= start + ticks, timeout=timeout)
