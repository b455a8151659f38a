"""Has a rebooted node come back? One look per call; the workflow's retry policy waits.

A reboot Job's exit code proves nothing: the shutdown may kill its pod, or the command may
return 0 before the machine goes down. What proves a reboot is what the node shows
afterwards: a new ``status.nodeInfo.bootID`` (or, from a kubelet that reports none, a Ready
transition after the reboot was requested), Ready, the GPUs allocatable again once the
device plugin has re-registered, and its exporter answering. The same Node name with
another ``metadata.uid`` is another machine, not ours to confirm.

Each call reads the node once and raises ``NodeNotBack`` (retryable) naming what is still
missing; the workflow retries it on a fixed interval under ``schedule_to_close_timeout =
remediation.reboot_return_timeout``, so the wait holds no worker slot and needs no heartbeat.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from activities.fleet import FleetActivities
from activities.fleet_nodes import GpuNode
from activities.gpus import GPU_RESOURCE, pod_gpu_request, quantity
from activities.kube import REQUEST_TIMEOUT, raise_typed
from activities.mig import mig_layout_not_applied
from activities.node_keys import JOB_LABEL
from workflows import errors
from workflows.messages import (
    GpusFree,
    GpusFreeInput,
    OutOfServiceInput,
    ReturnInput,
    ReturnResult,
)
from workflows.transitions import NodeState

NODE_NOT_BACK = "NodeNotBack"
GPUS_NOT_FREE = "GpusNotFree"


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _ready(node: dict[str, Any]) -> dict[str, Any]:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return dict(c)
    return {}


def _quantity(value: Any) -> int:
    """An extended resource's count ('8'); anything else reads as 0, never as back."""
    return quantity(value)


def missing_for_return(node: dict[str, Any], inp: ReturnInput) -> tuple[list[str], ReturnResult]:
    """What the node still lacks to count as returned (empty: back), and what it shows.

    Pure: the Node as JSON in, so the rules are tested without a cluster.
    """
    status = node.get("status") or {}
    boot_id = str((status.get("nodeInfo") or {}).get("bootID") or "")
    ready = _ready(node)
    since = _parse_time(ready.get("lastTransitionTime"))
    gpus = _quantity((status.get("allocatable") or {}).get(GPU_RESOURCE))
    missing: list[str] = []
    is_ready = ready.get("status") == "True"
    if inp.old_boot_id and boot_id:
        confirmed_by = "boot-id"
        if boot_id == inp.old_boot_id:
            missing.append(f"boot ID unchanged ({boot_id}): no reboot seen yet")
    else:
        # No boot ID to compare (a kubelet that reports none): a Ready transition after the
        # request proves the kubelet went down and came back. lastTransitionTime has second
        # precision, so the request's own second counts.
        confirmed_by = "ready-transition"
        requested = inp.reboot_requested_at.replace(microsecond=0)
        if not is_ready or since is None or since < requested:
            missing.append(
                "no boot ID to compare (node reports "
                + (f"bootID {boot_id!r}" if boot_id else "none")
                + ", claim recorded " + (repr(inp.old_boot_id) if inp.old_boot_id else "none")
                + f") and no NotReady→Ready transition since {inp.reboot_requested_at.isoformat()}"
            )
    if not is_ready:
        why = ready.get("reason") or "no Ready condition"
        detail = f": {ready['message']}" if ready.get("message") else ""
        missing.append(f"not Ready (Ready={ready.get('status', 'missing')}, {why}{detail})")
    if gpus < inp.expected_gpus:
        missing.append(f"allocatable {GPU_RESOURCE} {gpus} of {inp.expected_gpus} expected")
    result = ReturnResult(
        boot_id=boot_id, allocatable_gpus=gpus,
        confirmed_by=confirmed_by,
        ready_since=since if is_ready else None, message="",
    )
    return missing, result


VALIDATOR_APP = "nvidia-operator-validator"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"


def gpu_stack_not_ready(labels: dict[str, str], pods: list[Any]) -> list[str]:
    """What the node's GPU stack still lacks before a validation pod may start: the GPU
    Operator's own validator pod on the node Ready (after a reboot it checks the driver,
    the toolkit and CUDA; a validation racing it finds a half-started stack); where no
    validator runs, GPU feature discovery's ``nvidia.com/gpu.present`` "true" when the node
    carries the label at all. Pure: node labels and V1Pods in."""
    validators = [p for p in pods
                  if ((p.metadata.labels or {}) if p.metadata else {}).get("app") == VALIDATOR_APP
                  and not (p.status and p.status.phase in ("Succeeded", "Failed"))]
    if validators:
        waiting = [f"{p.metadata.namespace}/{p.metadata.name}" for p in validators
                   if not any(c.type == "Ready" and c.status == "True"
                              for c in (p.status.conditions or []) if p.status)]
        return ([f"GPU Operator validator not Ready yet: {', '.join(waiting[:3])}"]
                if waiting else []) + mig_layout_not_applied(labels)
    missing = []
    present = labels.get(GPU_PRESENT_LABEL)
    if present is not None and present != "true":
        missing.append(f"node label {GPU_PRESENT_LABEL}={present[:40]!r} (GPU feature "
                       "discovery has not seen the GPUs yet)")
    return missing + mig_layout_not_applied(labels)


OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
OUT_OF_SERVICE_VALUE = "gpu-remediate"
"""Our taint's value: the one we take off again (someone else's is left alone)."""
MERGE_PATCH = "application/merge-patch+json"


def out_of_service_taints(node: dict[str, Any], on: bool) -> tuple[list[dict[str, Any]] | None,
                                                                   str]:
    """The node's taints with our out-of-service taint put on (only while the node is not
    Ready: a Ready node is no shutdown) or taken off, and what that does; None when
    nothing changes. Pure: the Node as JSON in."""
    taints = list((node.get("spec") or {}).get("taints") or [])
    ours = [t for t in taints if t.get("key") == OUT_OF_SERVICE
            and t.get("value") == OUT_OF_SERVICE_VALUE]
    if not on:
        if not ours:
            return None, f"no {OUT_OF_SERVICE} taint of ours"
        return [t for t in taints if t not in ours], f"{OUT_OF_SERVICE} taint taken off"
    if _ready(node).get("status") == "True":
        return None, f"Ready: no {OUT_OF_SERVICE} taint on a node that runs"
    if any(t.get("key") == OUT_OF_SERVICE for t in taints):
        return None, f"{OUT_OF_SERVICE} taint already on"
    return ([*taints, {"key": OUT_OF_SERVICE, "value": OUT_OF_SERVICE_VALUE,
                       "effect": "NoExecute"}],
            f"{OUT_OF_SERVICE}:NoExecute put on (non-graceful shutdown: its pods are "
            "force-deleted, their volumes detached)")


class NodeReturnActivities:
    """``check_node_returned``: the node side of confirming a reboot."""

    def __init__(self, api: client.ApiClient, fleet: FleetActivities) -> None:
        self.core = client.CoreV1Api(api)
        # The exporter is found and read the way the detector reads it (template,
        # discovered pod or Prometheus): "answers" means answers for the detector too.
        self.fleet = fleet

    def _read(self, name: str) -> dict[str, Any]:
        # Raw JSON: the typed client model refuses a nodeInfo whose fields it requires.
        try:
            resp = self.core.read_node(name, _preload_content=False,
                                       _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            if err.status == 404:
                raise ApplicationError(
                    f"node {name} is gone (deleted while it was rebooting)",
                    type=errors.NODE_GONE, non_retryable=True) from err
            raise_typed(err, f"read node {name}")
        data: dict[str, Any] = json.loads(resp.data)  # type: ignore[attr-defined]
        return data

    def _pods_on(self, node: str) -> list[Any]:
        try:
            pods: list[Any] = self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node}", _request_timeout=REQUEST_TIMEOUT).items
        except ApiException as err:
            raise_typed(err, f"list pods on {node}")
        return pods

    def _gpu_holders(self, pods: list[Any]) -> list[str]:
        """Pods on the node that hold GPUs through the device plugin (not our own node
        Jobs, not finished pods), named with their owner."""
        holders = []
        for pod in pods:
            labels = (pod.metadata.labels or {}) if pod.metadata else {}
            if JOB_LABEL in labels or (pod.status and pod.status.phase in ("Succeeded",
                                                                            "Failed")):
                continue
            want = pod_gpu_request(pod)
            if not want:
                continue
            owner = next((f"{r.kind} {pod.metadata.namespace}/{r.name}"
                          for r in pod.metadata.owner_references or [] if r.controller), "")
            holders.append(f"{pod.metadata.namespace}/{pod.metadata.name} ({want} GPU(s)"
                           + (f", {owner}" if owner else "") + ")")
        return holders

    @activity.defn
    async def check_gpus_free(self, inp: GpusFreeInput) -> GpusFree:
        """One look before validation: every expected GPU allocatable (the device plugin
        registered, no GPU marked unhealthy) and none held by another pod (a GPU-requesting
        DaemonSet is named, since it would make every validation fail). GpusNotFree says
        what is missing; the workflow polls by retry."""
        node = await asyncio.to_thread(self._read, inp.node)
        uid = str((node.get("metadata") or {}).get("uid") or "")
        if inp.uid and uid != inp.uid:
            raise ApplicationError(
                f"node {inp.node} was replaced: uid {inp.uid} at claim, now {uid}",
                type=errors.NODE_GONE, non_retryable=True)
        gpus = _quantity(((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE))
        missing = []
        if gpus < inp.expected_gpus:
            missing.append(f"allocatable {GPU_RESOURCE} {gpus} of {inp.expected_gpus} "
                           "expected (device plugin not registered, or a GPU it holds "
                           "unhealthy or gone)")
        pods = await asyncio.to_thread(self._pods_on, inp.node)
        labels = (node.get("metadata") or {}).get("labels") or {}
        missing += gpu_stack_not_ready(labels, pods)
        holders = self._gpu_holders(pods)
        if holders:
            missing.append("GPUs held by " + ", ".join(holders[:5])
                           + (f" and {len(holders) - 5} more" if len(holders) > 5 else "")
                           + ": validation needs every GPU of the node")
        if missing:
            raise ApplicationError(f"{inp.node}: not every GPU is free for validation: "
                                   + "; ".join(missing), *missing, type=GPUS_NOT_FREE,
                                   category=ApplicationErrorCategory.BENIGN)
        return GpusFree(allocatable_gpus=gpus,
                        message=f"{gpus} of {inp.expected_gpus} GPU(s) allocatable and free")

    def _mark_out_of_service(self, inp: OutOfServiceInput) -> str:
        for _ in range(5):
            node = self._read(inp.node)
            meta = node.get("metadata") or {}
            if inp.uid and str(meta.get("uid") or "") != inp.uid:
                raise ApplicationError(
                    f"node {inp.node} was replaced: uid {inp.uid} at claim, now "
                    f"{meta.get('uid')}", type=errors.NODE_GONE, non_retryable=True)
            taints, what = out_of_service_taints(node, inp.on)
            if taints is None:
                return f"{inp.node}: {what}"
            body = {"metadata": {"resourceVersion": meta.get("resourceVersion")},
                    "spec": {"taints": taints or None}}
            try:
                self.core.patch_node(inp.node, body, _content_type=MERGE_PATCH,
                                     _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
            except ApiException as err:
                if err.status == 409:
                    continue  # changed under us: read again
                raise_typed(err, f"patch node {inp.node}")
            return f"{inp.node}: {what}"
        raise ApplicationError(f"node {inp.node} kept changing under us", type=errors.CONFLICT)

    @activity.defn
    async def mark_out_of_service(self, inp: OutOfServiceInput) -> str:
        """remediation.drain.out_of_service_taint: put ``node.kubernetes.io/out-of-service``
        on a node still not Ready (never on a Ready one), or take ours off. Guarded by the
        node's resourceVersion; the answer says what it did."""
        return await asyncio.to_thread(self._mark_out_of_service, inp)

    @activity.defn
    async def check_node_returned(self, inp: ReturnInput) -> ReturnResult:
        """One check that the node is back from its reboot; NodeNotBack says what is not."""
        node = await asyncio.to_thread(self._read, inp.node)
        uid = str((node.get("metadata") or {}).get("uid") or "")
        if inp.uid and uid != inp.uid:
            raise ApplicationError(
                f"node {inp.node} was replaced: uid {inp.uid} at claim, now {uid} (a new "
                "machine under the same name, with none of our labels, taints or history)",
                type=errors.NODE_GONE, non_retryable=True)
        missing, result = missing_for_return(node, inp)
        if not missing and inp.check_exporter:
            readings, unread = await self.fleet.read_many(
                [inp.node], [GpuNode(inp.node, NodeState.HEALTHY, "", {}, {})])
            if inp.node not in readings:
                missing.append("exporter not answering: "
                               + unread.get(inp.node, "no readings for the node"))
        if missing:
            # "Not yet", polled by retry: benign, so each look logs no error and counts in
            # no failure metric (the workflow's schedule-to-close is the real limit).
            raise ApplicationError(f"{inp.node} not back from reboot: " + "; ".join(missing),
                                   *missing, type=NODE_NOT_BACK,
                                   category=ApplicationErrorCategory.BENIGN)
        if result.confirmed_by == "boot-id":
            how = f"boot ID {inp.old_boot_id} → {result.boot_id}"
        else:
            since = result.ready_since.isoformat() if result.ready_since else "?"
            how = f"no boot ID; NotReady→Ready at {since}"
        return result.model_copy(update={"message": (
            f"{inp.node} rebooted ({how}), Ready, {result.allocatable_gpus} GPU(s) allocatable"
            + (", exporter answering" if inp.check_exporter else ""))})
