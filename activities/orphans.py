"""Orphans: nodes labelled in remediation whose remediation workflow is not running, and
nodes whose record holds a GPU quarantine (per-GPU isolation) with none running.

They keep their budget slot (fail closed); the first time one is seen it is marked with an
annotation and a Warning Event, and ``release_orphan`` releases it once an operator asks
and it still is one. ``OrphanActivities`` is a part of ``FleetActivities``
(activities/fleet.py), which sets up the state it reads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities import annotations as node_annotations
from activities import metrics
from activities.events import record_node_event
from activities.fleet_nodes import GpuNode, _our_workflow, _state, _tainted
from activities.gpu_isolation import GpuIsolationActivities
from activities.kube import REQUEST_TIMEOUT, meta_dict, raise_typed
from activities.node_keys import (
    A_ACTION,
    A_ORPHAN,
    A_PRECORDONED,
    A_REASON,
    A_SINCE,
    NODE_LABEL,
    STATE_LABEL,
    label_value,
)
from activities.nodes import NodeActivities
from activities.operands import A_OPERANDS_PAUSED, OperandActivities, parse_record
from activities.record import GpuQuarantineNote, NodeRecord, RecordStore, RecordUnreadable
from workflows import errors as error_types
from workflows.ids import remediation_workflow_id
from workflows.messages import HistoryEntry, OrphanRelease, ReleaseInput
from workflows.operands import OperandsPaused
from workflows.transitions import NodeState, Outcome

log = logging.getLogger(__name__)


class OrphanActivities:
    """FleetActivities' orphans: found in each observation, released on request."""

    core: client.CoreV1Api
    nodes: NodeActivities
    jobs_namespace: str
    records: RecordStore

    async def find_orphans(self, labelled: list[GpuNode], *, count: bool = True,
                           held_gpus: Mapping[str, NodeRecord] | None = None) -> list[str]:
        """Labelled nodes whose remediation is not running (terminated, failed, gone), and
        nodes whose record (``held_gpus``) holds a GPU quarantine with none running.

        They keep their slot (fail closed); the first time one is seen it gets an
        annotation and a Warning Event so an operator can release it.
        """
        try:
            activity.client()
        except RuntimeError:
            return []  # not running in a worker (offline tools)
        orphans = []
        for node in labelled:
            if not await self._gone(node.name):
                continue
            orphans.append(node.name)
            if not node.orphan_marked:
                await asyncio.to_thread(self._mark_orphan, node.name,
                                        remediation_workflow_id(node.name))
        # A per-GPU remediation never labels its node: a GPU it held, with the remediation
        # gone (terminated, failed), is known only from the controller's record, and its
        # DeviceTaintRule would keep the GPU out for good with nobody to release it.
        for name, record in sorted((held_gpus or {}).items()):
            if name in orphans or not record.gpu_quarantines or not await self._gone(name):
                continue
            orphans.append(name)
            unsaid = {u: q for u, q in record.gpu_quarantines.items() if q.orphaned is None}
            if unsaid:
                await asyncio.to_thread(self._announce_gpu_orphan, name, unsaid)
        if count:  # a node-only observation's few nodes are not the fleet's count
            metrics.ORPHANS.set(len(orphans))
        return sorted(orphans)

    def _announce_gpu_orphan(self, node: str, held: dict[str, GpuQuarantineNote]) -> None:
        """Once per held GPU (the record notes when it was said, where the node cannot
        write): a Warning Event naming the rules and what releases them."""
        gpus = "; ".join(f"GPU {uuid} (device {q.device or '?'}) held by DeviceTaintRule "
                         f"{q.rule} since {q.since:%Y-%m-%d %H:%M}Z"
                         for uuid, q in sorted(held.items()))
        record_node_event(
            self.core, node, reason="GpuQuarantineOrphaned", event_type="Warning",
            message=(f"{gpus}, but workflow {remediation_workflow_id(node)} is not running: "
                     "nothing will release them. `gpu-remediate release-orphan "
                     f"{node} -r REASON` removes the rules")[:1000])
        now = datetime.now(UTC)

        def said(rec: NodeRecord | None) -> NodeRecord | None:
            if rec is None:
                return None
            notes = {u: q.model_copy(update={"orphaned": now})
                     if u in held and q.rule == held[u].rule and q.orphaned is None else q
                     for u, q in rec.gpu_quarantines.items()}
            return None if notes == rec.gpu_quarantines else \
                rec.model_copy(update={"gpu_quarantines": notes})
        try:
            self.records.update(node, said, now)
        except Exception as err:  # said again next tick: an Event too many, nothing lost
            log.warning("the record of %s could not note its orphaned GPUs: %s", node, err)

    async def _gone(self, node: str) -> bool:
        """The node's remediation is not running (terminated, failed, never started).
        False where that cannot be told: never call a node an orphan on no data."""
        try:
            client = activity.client()
        except RuntimeError:
            return False  # not running in a worker (offline tools)
        # The one ID a remediation of this node runs under, never the ID the node's
        # annotation names (a node can write it: naming the detector, which always runs,
        # would hold a budget slot forever).
        try:
            desc = await client.get_workflow_handle(remediation_workflow_id(node)).describe()
        except RPCError as err:
            return err.status == RPCStatusCode.NOT_FOUND
        return not (desc.status == WorkflowExecutionStatus.RUNNING
                    and desc.workflow_type == "RemediationWorkflow")

    async def _remove_gpu_rules(self, node: str) -> tuple[list[str], str]:
        """The DeviceTaintRules a per-GPU remediation of ``node`` that is gone left (it
        isolated a GPU and never touched the node), removed: what was done, in words, and
        what kept them from being looked for ('' if nothing)."""
        if not await self._gone(node):
            return [], ""
        owner = remediation_workflow_id(node)
        rules = GpuIsolationActivities(self.core.api_client, self.records.ns)
        removed, blocked = await asyncio.to_thread(rules.remove_rules_of, node, owner)
        done = [f"DeviceTaintRule {name} removed" for name in removed]
        if blocked:
            return done, blocked
        # A note whose rule someone deleted by hand would keep the node an orphan for good.
        try:
            stale = await asyncio.to_thread(rules.forget_quarantines, node, owner)
        except RecordUnreadable as err:
            raise ApplicationError(f"{node}: {err}; its GPU quarantine notes stay",
                                   non_retryable=True) from err
        except ApiException as err:
            raise_typed(err, f"clear the GPU quarantine notes of {node}")
        return done + [f"the record's note of DeviceTaintRule {name} cleared (the rule was "
                       "already gone)" for name in stale if name not in removed], ""

    @activity.defn
    async def release_orphan(self, req: OrphanRelease) -> None:
        """Release a node whose remediation workflow is gone, after checking it still is."""
        try:
            n = await asyncio.to_thread(self.core.read_node, req.node,
                                        _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            raise_typed(err, f"read node {req.node}")
        labels, ann = meta_dict(n, "labels"), meta_dict(n, "annotations")
        node = GpuNode(req.node, _state(labels.get(STATE_LABEL), _tainted(n))[0],
                       _our_workflow(req.node, ann), {}, labels)
        # A per-GPU remediation leaves its DeviceTaintRule, not a label: removed first.
        rules, blocked = await self._remove_gpu_rules(req.node)
        if node.state == NodeState.HEALTHY or req.node not in await self.find_orphans([node]):
            if blocked:
                # Releasing the lease now could leave a GPU isolated with nobody holding it.
                raise ApplicationError(f"{req.node}: {blocked}; its remediation's "
                                       "DeviceTaintRule may remain, nothing released",
                                       non_retryable=True)
            if rules:
                # The node itself was never touched: nothing else to give back.
                why = (f"orphan released by {req.operator}"
                       + (f": {req.reason}" if req.reason else "") + f" ({'; '.join(rules)})")
                await asyncio.to_thread(record_node_event, self.core, req.node,
                                        reason="OrphanReleased", message=why)
                return
            raise ApplicationError(f"{req.node} is not an orphan any more",
                                   type=error_types.NOT_ORPHAN, non_retryable=True)
        # What the dead remediation left besides its markers: GPU Operator operands it
        # turned off for a reset, and its node Jobs (a validation holding every GPU).
        cleaned = rules + await asyncio.to_thread(self._clean_up, req.node, ann)
        if blocked:
            cleaned.append(f"its DeviceTaintRules could not be looked for ({blocked})")
        now = datetime.now(UTC)
        # Node-written: a naive or absurd time must not keep the release from finishing.
        started = node_annotations.parse_timestamp(A_SINCE, ann.get(A_SINCE), now=now).value or now
        why = f"orphan released by {req.operator}" + (f": {req.reason}" if req.reason else "")
        if cleaned:
            why += f" ({'; '.join(cleaned)})"
        await asyncio.to_thread(self.nodes.release_node, ReleaseInput(
            node=req.node, outcome=Outcome.RELEASED, uncordon=ann.get(A_PRECORDONED) != "true",
            history=HistoryEntry(started=started, finished=now, action=ann.get(A_ACTION, "?"),
                                 reason=ann.get(A_REASON, ""), outcome=f"{Outcome.RELEASED}: {why}",
                                 workflow_id=node.workflow_id, by=req.operator),
            event_reason="OrphanReleased", event_message=why))

    def _clean_up(self, node: str, ann: dict[str, str]) -> list[str]:
        """Restore the operand deploy labels the pause recorded (only those still "false":
        a value someone set since is theirs) and delete this node's Jobs of ours. What was
        done, in words, for the Event and the history."""
        done: list[str] = []
        recorded = parse_record(ann.get(A_OPERANDS_PAUSED))
        if recorded:
            OperandActivities(self.core.api_client)._restore(OperandsPaused(
                node=node, changed=recorded, left={}, message="orphan release"))
            done.append("GPU Operator operands restored: " + ", ".join(sorted(recorded)))
        if self.jobs_namespace:
            batch = client.BatchV1Api(self.core.api_client)
            try:
                jobs = batch.list_namespaced_job(
                    self.jobs_namespace, label_selector=f"{NODE_LABEL}={label_value(node)}",
                    _request_timeout=REQUEST_TIMEOUT).items
            except ApiException as err:
                raise_typed(err, f"list Jobs of {node}")
            for job in jobs:
                name = job.metadata.name if job.metadata else None
                if not name:
                    continue
                try:
                    batch.delete_namespaced_job(name, self.jobs_namespace,
                                                propagation_policy="Background",
                                                _request_timeout=REQUEST_TIMEOUT)
                except ApiException as err:
                    if err.status != 404:
                        raise_typed(err, f"delete Job {name}")
                done.append(f"Job {name} deleted")
        return done

    def _mark_orphan(self, node: str, workflow_id: str) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        try:
            self.core.patch_node(node, {"metadata": {"annotations": {A_ORPHAN: now}}},
                                 _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            log.warning("could not mark %s orphaned: %s", node, err.status)
            return
        record_node_event(self.core, node, reason="RemediationOrphaned", event_type="Warning",
                          message=f"labelled in remediation but workflow {workflow_id} is not "
                                  "running; it keeps its budget slot until released "
                                  f"(gpu-remediate release-orphan {node})")
