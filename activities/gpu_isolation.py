"""DeviceTaintRules for one GPU (KEP-5055), over the official client's generic calls.

The python client has no typed models for resource.k8s.io's DeviceTaintRule in every
version, so these are ``CustomObjectsApi`` calls over real HTTP: the same paths the typed
APIs use. Discovery first: a server that serves no DeviceTaintRule (before 1.36 without
feature gates), RBAC that forbids it, or a node whose DRA driver publishes no device with
the GPU's UUID is an answer (``why_not``), never an error: the remediation falls back to
the whole-node path and says why in a Warning Event.

A ResourceSlice is written by the node's own DRA kubelet plugin, so it is input from that
node: only a slice of driver ``gpu.nvidia.com`` whose ``nodeName`` and pool are the node,
with exactly one device named ``gpu-<minor>`` carrying the UUID, is believed, and the rule
selects that pool, so whatever a node publishes it can only have its own GPUs tainted.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity

from activities.kube import REQUEST_TIMEOUT, raise_typed, status_message
from activities.record import GpuQuarantineNote, NodeRecord, RecordStore, now_utc
from workflows.isolation import (
    DEVICE_NAME,
    DRA_DRIVER,
    TAINT_KEY,
    GpuTaintInput,
    IsolateGpuInput,
    IsolateGpuResult,
    rule_name,
)

GROUP = "resource.k8s.io"
RULES = "devicetaintrules"
SLICES = "resourceslices"
RULE_VERSIONS = ("v1", "v1beta2", "v1alpha3")
"""DeviceTaintRule: v1alpha3 behind feature gates in 1.33-1.35, v1beta2 in 1.36, v1 from
1.37. Their selector's driver/pool/device and taint fields agree, which is all we send."""
SLICE_VERSIONS = ("v1", "v1beta2", "v1beta1")
GENERIC_CALLS: dict[str, set[tuple[str, str, str]]] = {
    # CustomObjectsApi method verb -> the RBAC permissions those calls need (the create
    # path also reads an existing rule of the same name).
    "create": {(GROUP, RULES, "create"), (GROUP, RULES, "get")},
    "patch": {(GROUP, RULES, "patch")},
    "delete": {(GROUP, RULES, "delete")},
    "list": {(GROUP, SLICES, "list"), (GROUP, RULES, "list")},
}
"""What tests/deploy/test_rbac.py cannot read off a generic call's path."""
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "gpu-remediate"
NODE_ANNOTATION = "gpu-remediate.io/node"
UUID_ANNOTATION = "gpu-remediate.io/gpu-uuid"
OWNER_ANNOTATION = "gpu-remediate.io/workflow-id"
REASON_ANNOTATION = "gpu-remediate.io/reason"
_LABEL_VALUE_MAX = 63
log = logging.getLogger(__name__)


def _label_value(text: str) -> str:
    kept = "".join(c if c.isalnum() or c in "-_." else "-" for c in text)[:_LABEL_VALUE_MAX]
    return kept.strip("-_.")


class GpuIsolationActivities:
    def __init__(self, api: client.ApiClient, record_namespace: str | None = None) -> None:
        self.apis = client.ApisApi(api)
        self.custom = client.CustomObjectsApi(api)
        self.records = RecordStore(client.CoreV1Api(api), record_namespace)

    # -- the node's record ------------------------------------------------------------

    def _note(self, node: str, uuid: str, held: GpuQuarantineNote | None,
              rule: str = "") -> None:
        """Write (``held``) or clear (the entries of ``rule``, or of ``uuid``) the GPU's
        quarantine in the node's record. Best effort: the rule itself is what holds the
        GPU, and a record that cannot be written (unreadable, no namespace) must not undo
        an isolation or keep a rule from going; it is logged."""
        def change(rec: NodeRecord | None) -> NodeRecord | None:
            if held is not None:
                base = rec or NodeRecord(node=node)
                return base.model_copy(update={
                    "gpu_quarantines": {**base.gpu_quarantines, uuid: held}})
            if rec is None:
                return None
            kept = {k: q for k, q in rec.gpu_quarantines.items()
                    if k != uuid and (not rule or q.rule != rule)}
            if kept == rec.gpu_quarantines:
                return None
            return rec.model_copy(update={"gpu_quarantines": kept})
        try:
            self.records.update(node, change, now_utc())
        except Exception as err:  # best effort, said why
            log.warning("the record of %s could not note GPU %s: %s", node, uuid or rule, err)

    # -- discovery --------------------------------------------------------------------

    def _served(self, plural: str, versions: tuple[str, ...]) -> str | None:
        """The first of ``versions`` in which the server serves ``plural``, or None."""
        try:
            groups = self.apis.get_api_versions(_request_timeout=REQUEST_TIMEOUT).groups or []
        except ApiException as err:
            raise_typed(err, "discover API groups")
        group = next((g for g in groups if g.name == GROUP), None)
        offered = {v.version for v in (group.versions or [])} if group else set()
        for version in versions:
            if version not in offered:
                continue
            try:
                found = self.custom.get_api_resources(GROUP, version,
                                                      _request_timeout=REQUEST_TIMEOUT)
            except ApiException as err:
                if err.status == 404:
                    continue
                raise_typed(err, f"discover {GROUP}/{version}")
            if any(r.name == plural for r in found.resources or []):
                return version
        return None

    def _device(self, node: str, uuid: str) -> tuple[str, str]:
        """(device name, '') or ('', why not)."""
        version = self._served(SLICES, SLICE_VERSIONS)
        if version is None:
            return "", f"the API server serves no ResourceSlice ({GROUP}): no DRA driver"
        try:
            listed = cast(dict[str, Any], self.custom.list_cluster_custom_object(
                GROUP, version, SLICES,
                field_selector=f"spec.nodeName={node},spec.driver={DRA_DRIVER}",
                _request_timeout=REQUEST_TIMEOUT))
        except ApiException as err:
            if err.status in (401, 403):
                return "", f"not allowed to list ResourceSlices: {status_message(err)}"
            raise_typed(err, f"list ResourceSlices of {node}")
        found: list[str] = []
        for s in listed.get("items") or []:
            spec = s.get("spec") or {}
            if (spec.get("driver") != DRA_DRIVER or spec.get("nodeName") != node
                    or (spec.get("pool") or {}).get("name") != node):
                continue  # not this node's own pool: never believed for it
            for d in spec.get("devices") or []:
                name = d.get("name") if isinstance(d, dict) else None
                attr = ((d.get("attributes") or {}).get("uuid") or {}) if name else {}
                if (isinstance(name, str) and DEVICE_NAME.fullmatch(name)
                        and attr.get("string") == uuid):
                    found.append(name)
        if len(found) != 1:
            return "", (f"{node}'s {DRA_DRIVER} ResourceSlices show "
                        + ("no device" if not found else f"{len(found)} devices")
                        + f" with UUID {uuid}")
        return found[0], ""

    # -- the rule ---------------------------------------------------------------------

    def _body(self, inp: IsolateGpuInput, name: str, device: str, version: str) -> dict[str, Any]:
        labels = {MANAGED_BY: MANAGER}
        return {
            "apiVersion": f"{GROUP}/{version}",
            "kind": "DeviceTaintRule",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {NODE_ANNOTATION: inp.node, UUID_ANNOTATION: inp.uuid,
                                OWNER_ANNOTATION: inp.workflow_id,
                                REASON_ANNOTATION: inp.reason[:1000]},
            },
            "spec": {
                "deviceSelector": {"driver": DRA_DRIVER, "pool": inp.node, "device": device},
                # NoSchedule first: new claims stay off the GPU; eviction is a second,
                # separate decision (workflows/isolation.py POLICY).
                "taint": {"key": TAINT_KEY, "value": _label_value(inp.value),
                          "effect": "NoSchedule"},
            },
        }

    @activity.defn
    def isolate_gpu(self, inp: IsolateGpuInput) -> IsolateGpuResult:
        """Create the DeviceTaintRule for the GPU with ``inp.uuid`` on ``inp.node``."""
        version = self._served(RULES, RULE_VERSIONS)
        if version is None:
            return IsolateGpuResult(isolated=False, why_not=(
                f"the API server serves no DeviceTaintRule ({GROUP} v1, v1beta2 or v1alpha3: "
                "Kubernetes 1.36+, or 1.33-1.35 with the DRADeviceTaints and "
                "DRADeviceTaintRules feature gates)"))
        device, why = self._device(inp.node, inp.uuid)
        if not device:
            return IsolateGpuResult(isolated=False, api_version=version, why_not=why)
        name = rule_name(inp.node, device)
        if inp.dry_run:
            return IsolateGpuResult(isolated=True, rule=name, device=device,
                                    api_version=version)
        try:
            self.custom.create_cluster_custom_object(
                GROUP, version, RULES, self._body(inp, name, device, version),
                _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            if err.status == 409:
                return self._adopt(inp, name, device, version)
            if err.status in (401, 403):
                return IsolateGpuResult(isolated=False, api_version=version, device=device,
                                        why_not=f"not allowed to create DeviceTaintRules: "
                                                f"{status_message(err)}")
            if err.status in (404, 400, 422):
                return IsolateGpuResult(isolated=False, api_version=version, device=device,
                                        why_not=f"DeviceTaintRule {name} refused: "
                                                f"{err.status} {status_message(err)}")
            raise_typed(err, f"create DeviceTaintRule {name}")
        activity.logger.info("isolated %s %s (%s) with DeviceTaintRule %s", inp.node, device,
                             inp.uuid, name)
        self._note_held(inp, name, device)
        return IsolateGpuResult(isolated=True, rule=name, device=device, api_version=version)

    def _note_held(self, inp: IsolateGpuInput, name: str, device: str) -> None:
        self._note(inp.node, inp.uuid, GpuQuarantineNote(
            rule=name, device=device, since=now_utc(), workflow_id=inp.workflow_id,
            reason=inp.reason))

    def _adopt(self, inp: IsolateGpuInput, name: str, device: str,
               version: str) -> IsolateGpuResult:
        """The rule exists: ours (a retry, or the GPU's earlier quarantine) is kept; anyone
        else's name clash is a reason to fall back."""
        try:
            obj = cast(dict[str, Any], self.custom.get_cluster_custom_object(
                GROUP, version, RULES, name, _request_timeout=REQUEST_TIMEOUT))
        except ApiException as err:
            raise_typed(err, f"read DeviceTaintRule {name}")
        meta = obj.get("metadata") or {}
        sel = (obj.get("spec") or {}).get("deviceSelector") or {}
        ours = ((meta.get("labels") or {}).get(MANAGED_BY) == MANAGER
                and sel == {"driver": DRA_DRIVER, "pool": inp.node, "device": device})
        if not ours:
            return IsolateGpuResult(isolated=False, api_version=version, device=device,
                                    why_not=f"DeviceTaintRule {name} exists and is not ours")
        self._note_held(inp, name, device)
        return IsolateGpuResult(isolated=True, rule=name, device=device, api_version=version)

    def remove_rules_of(self, node: str, owner: str) -> tuple[list[str], str]:
        """Delete the DeviceTaintRules a remediation that is gone left for ``node``: ours by
        label, ``owner``'s by annotation, selecting that node's own pool (a rule of any
        other node, owner or manager is never touched). The names removed, and what stood
        in the way ('' if nothing)."""
        version = self._served(RULES, RULE_VERSIONS)
        if version is None:
            return [], ""
        try:
            listed = cast(dict[str, Any], self.custom.list_cluster_custom_object(
                GROUP, version, RULES, label_selector=f"{MANAGED_BY}={MANAGER}",
                _request_timeout=REQUEST_TIMEOUT))
        except ApiException as err:
            if err.status in (401, 403):
                return [], f"not allowed to list DeviceTaintRules: {status_message(err)}"
            raise_typed(err, "list DeviceTaintRules")
        removed: list[str] = []
        for rule in listed.get("items") or []:
            meta = rule.get("metadata") or {}
            ann = meta.get("annotations") or {}
            sel = (rule.get("spec") or {}).get("deviceSelector") or {}
            name = meta.get("name")
            if not name or (meta.get("labels") or {}).get(MANAGED_BY) != MANAGER or \
                    ann.get(NODE_ANNOTATION) != node or ann.get(OWNER_ANNOTATION) != owner or \
                    sel.get("driver") != DRA_DRIVER or sel.get("pool") != node:
                continue
            try:
                self.custom.delete_cluster_custom_object(GROUP, version, RULES, name,
                                                         _request_timeout=REQUEST_TIMEOUT)
            except ApiException as err:
                if err.status != 404:
                    raise_typed(err, f"delete DeviceTaintRule {name}")
            removed.append(name)
            self._note(node, "", None, rule=name)
        return removed, ""

    def forget_quarantines(self, node: str, owner: str) -> list[str]:
        """Clear the node's record notes of the GPUs ``owner`` (a remediation that is gone)
        held, once its rules are removed: any note left names a rule that was already
        gone (deleted by hand), which would otherwise keep the node an orphan for good.
        The rules those notes named. Raises what the record store raises."""
        forgotten: list[str] = []

        def change(rec: NodeRecord | None) -> NodeRecord | None:
            if rec is None:
                return None
            kept = {k: q for k, q in rec.gpu_quarantines.items() if q.workflow_id != owner}
            forgotten[:] = sorted(q.rule for q in rec.gpu_quarantines.values()
                                  if q.workflow_id == owner)
            if kept == rec.gpu_quarantines:
                return None
            return rec.model_copy(update={"gpu_quarantines": kept})
        self.records.update(node, change, now_utc())
        return forgotten

    @activity.defn
    def set_gpu_taint(self, inp: GpuTaintInput) -> str:
        """Change the rule's effect (NoSchedule -> NoExecute), or remove it (effect None).
        Returns what was done, for the workflow's details."""
        if inp.dry_run:
            return f"would {'remove' if inp.effect is None else 'set ' + inp.effect} {inp.rule}"
        version = inp.api_version.rpartition("/")[2] or "v1"
        try:
            if inp.effect is None:
                self.custom.delete_cluster_custom_object(GROUP, version, RULES, inp.rule,
                                                         _request_timeout=REQUEST_TIMEOUT)
                self._note(inp.node, "", None, rule=inp.rule)
                return f"removed DeviceTaintRule {inp.rule}"
            # A merge patch keeps timeAdded; the server renews it for the new effect.
            self.custom.patch_cluster_custom_object(
                GROUP, version, RULES, inp.rule, {"spec": {"taint": {"effect": inp.effect}}},
                _request_timeout=REQUEST_TIMEOUT)
            return f"DeviceTaintRule {inp.rule}: effect {inp.effect}"
        except ApiException as err:
            if err.status == 404 and inp.effect is None:
                self._note(inp.node, "", None, rule=inp.rule)
                return f"DeviceTaintRule {inp.rule} was already gone"
            raise_typed(err, f"{'delete' if inp.effect is None else 'patch'} DeviceTaintRule "
                             f"{inp.rule}")

