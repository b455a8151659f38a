"""GPU Operator operands off and on around a GPU reset, through the node's deploy labels.

``nvidia-smi -r`` needs the GPU idle, but on a GPU Operator node the device plugin, DCGM,
dcgm-exporter and GPU feature discovery run as DaemonSets holding ``/dev/nvidia*``. The
operator turns each one off and on per node with the label ``nvidia.com/gpu.deploy.<operand>``
("true" / "false"), which every operand DaemonSet's pod template selects. So: set the labels
"false" (pause), wait for the pods to go (``check_operands_gone``), reset, put the labels back
(restore), wait for the operands and the GPUs (``check_operands_back``).

Only a label found at exactly "true" is ours to turn off, and only those are restored. What
the pause changed is also recorded on the node (annotation ``A_OPERANDS_PAUSED``, in the
same patch as the labels), so a pause retried after a write whose answer was lost still
reports the label it turned off as changed. Every write is one merge patch guarded by the
node's resourceVersion (409: re-read and recompute); a label someone else changed while it
was off is left as it is.

On a MIG node (``nvidia.com/mig.config`` names a layout) the MIG manager is paused too, as
the GPU Operator does it (``nvidia.com/gpu.deploy.mig-manager``, only when found "true",
restored exactly as found): a reset destroys the GPU and compute instances (MIG mode
persists), and NVIDIA's MIG manager applies the layout when its pod starts and otherwise
only when ``mig.config`` changes. Its restart after the reset is what re-applies the
layout. The restore writes ``nvidia.com/mig.config.state=pending`` in the same patch (the
layout is not applied, whatever the label said before the reset; the MIG manager writes
``success`` or ``failed`` when it is done), and the operands count as back only once it
says ``success``.

The checks make one look per call and raise a benign ``ApplicationError`` ("not yet"); the
workflow's retry policy polls them, so no activity waits in a loop or holds a worker slot.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from activities.events import record_node_event
from activities.gpus import GPU_RESOURCE
from activities.kube import REQUEST_TIMEOUT, raise_typed
from activities.mig import MIG_CONFIG_LABEL, MIG_STATE_LABEL, mig_layout_not_applied
from activities.node_keys import PREFIX, TAINT_KEY
from workflows import errors
from workflows.operands import (
    DEPLOY_LABEL_PREFIX,
    DEVICE_PLUGIN,
    OFF,
    ON,
    DevicePluginInput,
    DevicePluginRestart,
    OperandsInput,
    OperandsPaused,
    OperandsState,
    OperandsWaitInput,
    deploy_label,
    plan_pause,
)

log = logging.getLogger(__name__)

# Deploy label → its value before the pause, as JSON. Merged by each pause, emptied by
# the restore. Node-writable like every annotation: read strictly (see parse_record).
A_OPERANDS_PAUSED = f"{PREFIX}/operands-paused"

OPERANDS_RUNNING = "OperandsRunning"
OPERANDS_NOT_READY = "OperandsNotReady"

REASON_PAUSED = "GpuOperandsPaused"
REASON_RESTORED = "GpuOperandsRestored"
REASON_PLUGIN_RESTARTED = "DevicePluginRestarted"

MERGE_PATCH = "application/merge-patch+json"
CONFLICT_RETRIES = 5
RECORD_MAX_CHARS = 8192
LABEL_MAX_CHARS = 317  # a 253-character prefix, "/", a 63-character name

# Tolerations the DaemonSet controller adds to every DaemonSet pod.
_DS_TOLERATED = frozenset({
    "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable",
    "node.kubernetes.io/disk-pressure", "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/pid-pressure", "node.kubernetes.io/unschedulable",
    "node.kubernetes.io/network-unavailable",
})
_DIGITS = re.compile(r"[0-9]{1,9}")


# ------------------------------------------------------------------ pure helpers


def parse_record(text: str | None) -> dict[str, str]:
    """The pause record on the node: deploy label → "true". The node can write it, so
    anything else (other keys, other values, damaged JSON, oversize) is dropped, not
    raised: it only ever adds labels we turned off from "true" back to "true"."""
    if not text:
        return {}
    if len(text) > RECORD_MAX_CHARS:
        log.warning("ignoring %s: %d characters", A_OPERANDS_PAUSED, len(text))
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        log.warning("ignoring %s: not JSON", A_OPERANDS_PAUSED)
        return {}
    if not isinstance(data, dict):
        log.warning("ignoring %s: not an object", A_OPERANDS_PAUSED)
        return {}
    kept = {k: v for k, v in data.items()
            if isinstance(k, str) and k.startswith(DEPLOY_LABEL_PREFIX)
            and len(k) <= LABEL_MAX_CHARS and v == ON}
    if len(kept) != len(data):
        log.warning("ignoring %d entries of %s", len(data) - len(kept), A_OPERANDS_PAUSED)
    return kept


def dump_record(record: dict[str, str]) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def quantity(value: Any) -> int:
    """An extended resource count as plain digits ("8"); anything else reads as 0."""
    text = value if isinstance(value, str) else ""
    return int(text) if _DIGITS.fullmatch(text) else 0


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in (_meta(obj).get("labels") or {}).items()}


def _key(obj: dict[str, Any]) -> str:
    m = _meta(obj)
    return f"{m.get('namespace', '')}/{m.get('name', '')}"


def _node_selector(ds: dict[str, Any]) -> dict[str, str]:
    tspec = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
    return {str(k): str(v) for k, v in (tspec.get("nodeSelector") or {}).items()}


def selected_daemonsets(daemonsets: list[dict[str, Any]],
                        labels: list[str]) -> list[dict[str, Any]]:
    """The DaemonSets whose pod template's nodeSelector names one of ``labels``."""
    wanted = set(labels)
    return [ds for ds in daemonsets if wanted & set(_node_selector(ds))]


def _owner_uid(pod: dict[str, Any]) -> str:
    for ref in _meta(pod).get("ownerReferences") or []:
        if ref.get("kind") == "DaemonSet":
            return str(ref.get("uid") or "")
    return ""


def _terminating(obj: dict[str, Any]) -> bool:
    return bool(_meta(obj).get("deletionTimestamp"))


def _ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or _terminating(pod):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in status.get("conditions") or [])


def _pod_state(pod: dict[str, Any]) -> str:
    if _terminating(pod):
        return "terminating"
    phase = str((pod.get("status") or {}).get("phase") or "Pending")
    return f"{phase}, not Ready" if phase == "Running" else phase


def _tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    if taint.get("key") in _DS_TOLERATED:
        return True
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (
                taint.get("value") or ""):
            return True
    return False


def blocking_taints(ds: dict[str, Any], node: dict[str, Any]) -> list[str]:
    """The node's NoSchedule/NoExecute taints the DaemonSet's pods do not tolerate: the
    DaemonSet controller puts no new pod there while they stay (our remediation taint
    among them, unless the operand tolerates it)."""
    tspec = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
    tolerations = list(tspec.get("tolerations") or [])
    out = []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(
                tolerations, taint):
            value = f"={taint['value']}" if taint.get("value") else ""
            out.append(f"{taint.get('key')}{value}:{taint.get('effect')}")
    return out


MIG_MANAGER = "mig-manager"


def reset_operands(labels: dict[str, str], operands: list[str]) -> list[str]:
    """The operands a reset pauses on a node: the configured ones, and on a MIG node the
    MIG manager, whose restart re-applies the layout the reset destroys."""
    if mig_layout_not_applied({MIG_CONFIG_LABEL: labels.get(MIG_CONFIG_LABEL, "")}) and (
            MIG_MANAGER not in operands):
        return [*operands, MIG_MANAGER]
    return list(operands)


def _described(values: dict[str, str | None]) -> str:
    return ", ".join(f"{k}={v!r}" if v is not None else f"{k} (absent)"
                     for k, v in values.items())


# ------------------------------------------------------------------ activities


class OperandActivities:
    """Pause, restore and watch the GPU Operator's operands on one node."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)

    # Raw JSON everywhere: the typed client model refuses a nodeInfo whose fields it
    # requires, and the checks read only a few fields of pods and DaemonSets.
    def _read_node(self, name: str) -> dict[str, Any]:
        try:
            resp = self.core.read_node(name, _preload_content=False,
                                       _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            if err.status == 404:
                raise ApplicationError(f"node {name} is gone", type=errors.NODE_GONE,
                                       non_retryable=True) from err
            raise_typed(err, f"read node {name}")
        data: dict[str, Any] = json.loads(resp.data)  # type: ignore[attr-defined]
        return data

    def _daemonsets(self, namespace: str) -> list[dict[str, Any]]:
        try:
            resp = self.apps.list_namespaced_daemon_set(
                namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            raise_typed(err, f"list daemonsets in {namespace}")
        items: list[dict[str, Any]] = json.loads(resp.data).get("items") or []  # type: ignore[attr-defined]
        return items

    def _pods_on(self, namespace: str, node: str) -> list[dict[str, Any]]:
        try:
            resp = self.core.list_namespaced_pod(
                namespace, field_selector=f"spec.nodeName={node}", _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            raise_typed(err, f"list pods of {namespace} on {node}")
        items: list[dict[str, Any]] = json.loads(resp.data).get("items") or []  # type: ignore[attr-defined]
        return items

    def _patch_guarded(self, name: str,
                       build: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
        """Read, compute, patch with the resourceVersion read; a 409 starts over."""
        for _ in range(CONFLICT_RETRIES):
            node = self._read_node(name)
            body = build(node)
            if body is None:
                return
            body.setdefault("metadata", {})["resourceVersion"] = _meta(node).get(
                "resourceVersion")
            try:
                self.core.patch_node(name, body, _content_type=MERGE_PATCH,
                                     _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
                return
            except ApiException as err:
                if err.status == 409:
                    continue
                if err.status == 404:
                    raise ApplicationError(f"node {name} is gone", type=errors.NODE_GONE,
                                           non_retryable=True) from err
                raise_typed(err, f"patch node {name}")
        raise ApplicationError(f"node {name} kept changing under us", type=errors.CONFLICT)

    # -------------------------------------------------------------- pause

    def _pause(self, inp: OperandsInput) -> OperandsPaused:
        seen: dict[str, Any] = {}

        def build(node: dict[str, Any]) -> dict[str, Any] | None:
            labels = _labels(node)
            annotations = _meta(node).get("annotations") or {}
            recorded = parse_record(annotations.get(A_OPERANDS_PAUSED))
            operands = reset_operands(labels, inp.operands)
            to_change, found = plan_pause(labels, operands)
            changed: dict[str, str] = {}
            left: dict[str, str | None] = {}
            for label in dict.fromkeys(deploy_label(o) for o in operands):
                value = found.get(label)
                if label in to_change:
                    changed[label] = to_change[label]
                elif value == OFF and label in recorded:
                    # Ours from an earlier try whose answer was lost: still ours to restore.
                    changed[label] = recorded[label]
                else:
                    left[label] = value
            seen.update(changed=changed, left=left, written=bool(to_change))
            if not to_change:
                return None
            return {"metadata": {
                "labels": dict.fromkeys(to_change, OFF),
                # Earlier entries are kept while their label is still off; one someone
                # else has changed since is no longer ours.
                "annotations": {A_OPERANDS_PAUSED: dump_record({
                    **{k: v for k, v in recorded.items() if labels.get(k) == OFF},
                    **to_change})},
            }}

        if inp.dry_run:
            build(self._read_node(inp.node))
        else:
            self._patch_guarded(inp.node, build)
        changed, left = seen["changed"], seen["left"]
        prefix = "[dry-run] would turn off" if inp.dry_run else "turned off"
        message = (f"{prefix} {', '.join(changed) or 'no operand'} on {inp.node}"
                   + (f"; left as found: {_described(left)}" if left else ""))
        if not inp.dry_run:
            record_node_event(self.core, inp.node, reason=REASON_PAUSED,
                              message=f"GPU Operator operands paused for a GPU reset: {message}")
        return OperandsPaused(node=inp.node, changed=changed, left=left, message=message,
                              dry_run=inp.dry_run)

    @activity.defn
    async def pause_gpu_operands(self, inp: OperandsInput) -> OperandsPaused:
        """Set the operands' deploy labels found "true" to "false", recording what we did."""
        return await asyncio.to_thread(self._pause, inp)

    # -------------------------------------------------------------- restore

    def _restore(self, inp: OperandsPaused) -> None:
        if inp.dry_run or not (inp.changed or inp.from_record):
            return
        seen: dict[str, Any] = {}

        def build(node: dict[str, Any]) -> dict[str, Any] | None:
            labels = _labels(node)
            annotations = _meta(node).get("annotations") or {}
            changed = dict(inp.changed)
            if inp.from_record:
                # The pause's answer was lost: what it turned off is in its record.
                changed = {**parse_record(annotations.get(A_OPERANDS_PAUSED)), **changed}
            restore: dict[str, str] = {}
            already: list[str] = []
            others: dict[str, str | None] = {}
            for label, before in changed.items():
                now = labels.get(label)
                if now == before:
                    already.append(label)
                elif now == OFF:
                    restore[label] = before
                else:
                    # Someone else's value now (the operator's, an admin's): never ours
                    # to overwrite.
                    others[label] = now
            seen.update(restore=restore, already=already, others=others, lifted=False,
                        mig="")
            body: dict[str, Any] = {"metadata": {}}
            if restore:
                body["metadata"]["labels"] = dict(restore)
                if (restore.get(deploy_label(MIG_MANAGER)) == ON
                        and mig_layout_not_applied({MIG_CONFIG_LABEL:
                                                    labels.get(MIG_CONFIG_LABEL, "")})):
                    # The MIG manager starts again and applies the layout the reset
                    # destroyed; until it says so, the layout is not applied.
                    body["metadata"]["labels"][MIG_STATE_LABEL] = "pending"
                    seen["mig"] = labels.get(MIG_CONFIG_LABEL, "")
            # The operand DaemonSets tolerate the GPU taint, not ours: while our NoSchedule
            # taint is on, a restored operand could not start again. It is lifted (the node
            # stays cordoned, so no workload lands) and the next state write puts it back.
            taints = (node.get("spec") or {}).get("taints") or []
            if any(t.get("key") == TAINT_KEY for t in taints):
                body["spec"] = {"taints": [t for t in taints if t.get("key") != TAINT_KEY]
                                or None}
                seen["lifted"] = True
            if A_OPERANDS_PAUSED in annotations:
                rest = {k: v for k, v in parse_record(annotations[A_OPERANDS_PAUSED]).items()
                        if k not in changed}
                text = dump_record(rest) if rest else None
                if text != annotations[A_OPERANDS_PAUSED]:
                    body["metadata"]["annotations"] = {A_OPERANDS_PAUSED: text}
            return body if body["metadata"] or "spec" in body else None

        self._patch_guarded(inp.node, build)
        restore, already, others = seen["restore"], seen["already"], seen["others"]
        parts = []
        if seen.get("lifted"):
            parts.append(f"{TAINT_KEY} taint lifted until the next state write (still "
                         "cordoned) so the operands can start")
        if restore:
            parts.append("restored " + ", ".join(f"{k}={v}" for k, v in restore.items()))
        if seen.get("mig"):
            parts.append(f"the MIG manager re-applies MIG layout {seen['mig'][:63]!r} "
                         f"({MIG_STATE_LABEL}=pending until it reports success)")
        if already:
            parts.append("already as before the pause: " + ", ".join(already))
        if others:
            log.warning("%s: leaving operand labels changed by someone else since the "
                        "pause: %s", inp.node, _described(others))
            parts.append("left as changed by someone else since the pause: "
                         + _described(others))
        if not parts:
            parts.append("the pause's record names no operand turned off: nothing to restore")
        record_node_event(self.core, inp.node, reason=REASON_RESTORED,
                          message="GPU Operator operands after the GPU reset: "
                                  + "; ".join(parts),
                          event_type="Warning" if others else "Normal")

    @activity.defn
    async def restore_gpu_operands(self, inp: OperandsPaused) -> None:
        """Put back each label the pause changed, unless someone else changed it since."""
        await asyncio.to_thread(self._restore, inp)

    # -------------------------------------------------------------- checks

    def _selected(self, inp: OperandsWaitInput) -> list[dict[str, Any]]:
        """The DaemonSets of the operands waited for; an operand that none selects (a wrong
        operator namespace, a renamed label) fails the wait, naming where it looked: found
        nothing is not the same as gone, nor as back."""
        daemonsets = self._daemonsets(inp.namespace)
        missing = [label for label in inp.labels if not selected_daemonsets(daemonsets, [label])]
        if missing:
            raise ApplicationError(
                f"{inp.node}: no DaemonSet in namespace {inp.namespace} selects "
                + ", ".join(f"{label}=true" for label in missing)
                + " (remediation.gpu_operator.namespace / operands)",
                type=errors.OPERANDS_NOT_FOUND, non_retryable=True)
        return selected_daemonsets(daemonsets, inp.labels)

    def _gone(self, inp: OperandsWaitInput) -> OperandsState:
        node = self._read_node(inp.node)
        selected = self._selected(inp)
        uids = {str(_meta(ds).get("uid") or "") for ds in selected} - {""}
        # Present is present: a Terminating pod still holds the device.
        holding = [p for p in self._pods_on(inp.namespace, inp.node) if _owner_uid(p) in uids]
        gpus = quantity(((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE))
        if holding:
            named = [f"{_key(p)} ({_pod_state(p)})" for p in holding]
            raise ApplicationError(
                f"{inp.node}: {len(holding)} GPU operand pod(s) still on the node: "
                + ", ".join(named), *named, type=OPERANDS_RUNNING,
                category=ApplicationErrorCategory.BENIGN)
        message = (f"{inp.node}: no pod of {', '.join(_key(d) for d in selected)} "
                   "left on the node")
        return OperandsState(pods=[], allocatable_gpus=gpus, message=message)

    def _back(self, inp: OperandsWaitInput) -> OperandsState:
        node = self._read_node(inp.node)
        node_labels = _labels(node)
        pods = self._pods_on(inp.namespace, inp.node)
        ready: list[str] = []
        missing: list[str] = []
        expected = 0
        for ds in self._selected(inp):
            selector = _node_selector(ds)
            if any(node_labels.get(k) != v for k, v in selector.items()
                   if k not in inp.labels):
                continue  # not meant for this node whatever our labels say
            expected += 1
            uid = str(_meta(ds).get("uid") or "")
            mine = [p for p in pods if uid and _owner_uid(p) == uid]
            up = [_key(p) for p in mine if _ready(p)]
            if up:
                ready.extend(up)
                continue
            why = ([f"{_key(p)} {_pod_state(p)}" for p in mine] or ["no pod on the node"])
            why += [f"node label {k}={node_labels[k]!r}" if k in node_labels
                    else f"node label {k} absent"
                    for k in inp.labels if k in selector and node_labels.get(k) != selector[k]]
            why += [f"taint {t} not tolerated" for t in blocking_taints(ds, node)]
            missing.append(f"{_key(ds)} ({'; '.join(why)})")
        gpus = quantity(((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE))
        if missing:
            missing = ["operands not Ready: " + ", ".join(missing)]
        if deploy_label(MIG_MANAGER) in inp.labels:
            # The MIG manager restarted after the reset: back once it reports the layout
            # applied ("failed" is said as such, and fails the step at start_timeout).
            missing += mig_layout_not_applied(node_labels)
        if gpus < inp.expected_gpus:
            missing.append(f"allocatable {GPU_RESOURCE} {gpus} of {inp.expected_gpus} expected")
        if missing:
            raise ApplicationError(f"{inp.node}: " + "; ".join(missing), *missing,
                                   type=OPERANDS_NOT_READY,
                                   category=ApplicationErrorCategory.BENIGN)
        return OperandsState(pods=ready, allocatable_gpus=gpus, message=(
            f"{inp.node}: {expected} GPU operand(s) Ready ({len(ready)} pod(s)), "
            f"{gpus} GPU(s) allocatable"))

    @activity.defn
    async def check_operands_gone(self, inp: OperandsWaitInput) -> OperandsState:
        """One look: OperandsRunning while a pod of a selected DaemonSet is on the node."""
        return await asyncio.to_thread(self._gone, inp)

    @activity.defn
    async def check_operands_back(self, inp: OperandsWaitInput) -> OperandsState:
        """One look: OperandsNotReady until every expected operand has a Ready pod on the
        node and the GPUs are allocatable again."""
        return await asyncio.to_thread(self._back, inp)

    # -------------------------------------------------------------- device plugin

    def _restart_device_plugin(self, inp: DevicePluginInput) -> DevicePluginRestart:
        node = self._read_node(inp.node)
        uid = str(_meta(node).get("uid") or "")
        if inp.uid and uid != inp.uid:
            raise ApplicationError(f"node {inp.node} was replaced: uid {inp.uid} at claim, "
                                   f"now {uid}", type=errors.NODE_GONE, non_retryable=True)
        gpus = quantity(((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE))
        if gpus >= inp.expected_gpus:
            return DevicePluginRestart(evicted=[], allocatable_gpus=gpus, message=(
                f"{inp.node}: {gpus} of {inp.expected_gpus} GPU(s) allocatable, the device "
                "plugin is left alone"))
        selected = selected_daemonsets(self._daemonsets(inp.namespace),
                                       [deploy_label(DEVICE_PLUGIN)])
        uids = {str(_meta(ds).get("uid") or "") for ds in selected} - {""}
        pods = [p for p in self._pods_on(inp.namespace, inp.node)
                if _owner_uid(p) in uids and not _terminating(p)]
        if not pods:
            return DevicePluginRestart(evicted=[], allocatable_gpus=gpus, message=(
                f"{inp.node}: {gpus} of {inp.expected_gpus} GPU(s) allocatable and no "
                f"device-plugin pod of {inp.namespace} runs there to restart"))
        evicted = []
        for pod in pods:
            # The Eviction API, as a drain: the DaemonSet controller starts a new pod
            # (operands tolerate the cordon), and the uid precondition evicts only the
            # pod seen here, never its successor.
            meta = _meta(pod)
            body = client.V1Eviction.model_validate({
                "apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
                "deleteOptions": {"preconditions": {"uid": meta.get("uid")}}})
            try:
                self.core.create_namespaced_pod_eviction(
                    str(meta.get("name")), str(meta.get("namespace")), body,
                    _request_timeout=REQUEST_TIMEOUT)
            except ApiException as err:
                if err.status in (404, 409):
                    continue  # gone or replaced already: the restart happened
                raise_typed(err, f"evict device-plugin pod {_key(pod)}")
            evicted.append(_key(pod))
        message = (f"{inp.node}: {gpus} of {inp.expected_gpus} GPU(s) allocatable; restarted "
                   f"the device plugin ({', '.join(evicted) or 'already restarting'}): it "
                   "keeps a GPU that had a critical XID unhealthy until it restarts")
        record_node_event(self.core, inp.node, reason=REASON_PLUGIN_RESTARTED,
                          message=message)
        return DevicePluginRestart(evicted=evicted, allocatable_gpus=gpus, message=message)

    @activity.defn
    async def restart_device_plugin(self, inp: DevicePluginInput) -> DevicePluginRestart:
        """When fewer GPUs than expected are allocatable, evict the node's device-plugin
        pod once: the NVIDIA device plugin marks a GPU unhealthy on a critical XID and
        never marks it healthy again while it runs. Nothing when every GPU is allocatable
        or no device-plugin pod runs on the node."""
        return await asyncio.to_thread(self._restart_device_plugin, inp)
