"""Dynamic Resource Allocation (resource.k8s.io) as a cluster shows it to a client.

Four real parties are folded in here, each as unkind as the real one:

* the API server's validation and defaulting (sim/cluster/dra_schema.py);
* NVIDIA's DRA driver for GPUs (k8s-dra-driver-gpu): one ResourceSlice per GPU node,
  driver `gpu.nvidia.com`, pool = the node's name, devices `gpu-<minor>` with
  attributes `type`, `uuid`, `minor`, `index`, `productName`, `driverVersion`;
* kube-scheduler's DRA plugin: a claim gets devices of its class that no other claim
  holds and whose taints (the slice's own and every matching DeviceTaintRule's,
  effects NoSchedule and NoExecute) its request tolerates; else the pod stays Pending
  "cannot allocate all claims";
* kube-controller-manager: the resourceclaim controller drops `reservedFor` entries of
  pods that are gone or finished and deallocates a claim nobody reserves; the device
  taint eviction controller deletes pods whose allocated device carries a NoExecute
  taint they do not tolerate, and reports `EvictionInProgress` in each rule's status.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sim.cluster import clock, deletion
from sim.cluster import resources as r
from sim.cluster.dra_schema import SCHEDULING_EFFECTS
from sim.cluster.podutil import is_terminal, set_condition
from sim.cluster.store import Obj, Store
from sim.scenario import gpu_uuid

DRIVER = "gpu.nvidia.com"
DEVICE_CLASS = "gpu.nvidia.com"
GPU_RESOURCE = "nvidia.com/gpu"

# The one CEL shape the simulated scheduler evaluates: an attribute or the driver compared
# with a string. Anything else leaves the pod Pending with a message that says so.
_CEL_ATTR = re.compile(
    r'^\s*device\.attributes\[\s*["\']([^"\']+)["\']\s*\]\.(\w+)\s*==\s*["\']([^"\']*)["\']\s*$')
_CEL_DRIVER = re.compile(r'^\s*device\.driver\s*==\s*["\']([^"\']*)["\']\s*$')


# -- taints and allocation ----------------------------------------------------------------


def rule_selects(rule: Obj, driver: str, pool: str, device: str) -> bool:
    sel = (rule.get("spec") or {}).get("deviceSelector")
    if sel is None:
        return False  # without a selector, no devices are matched
    return all(sel.get(k) in (None, "", v)
               for k, v in (("driver", driver), ("pool", pool), ("device", device)))


def device_taints(slice_obj: Obj, device: Obj, rules: list[Obj]) -> list[dict[str, Any]]:
    spec = slice_obj.get("spec") or {}
    driver, pool = spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")
    out = [dict(t) for t in device.get("taints") or []]
    for rule in rules:
        if rule_selects(rule, driver, pool, device.get("name", "")):
            out.append(dict((rule.get("spec") or {}).get("taint") or {}))
    return out


def tolerated(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator", "Equal") == "Exists" and t.get("key") in (None, "", taint.get("key")):
            return True
        if (t.get("operator", "Equal") == "Equal" and t.get("key") == taint.get("key")
                and (t.get("value") or "") == (taint.get("value") or "")):
            return True
    return False


def _cel_ok(expr: str, driver: str, device: Obj) -> bool | None:
    """None: the simulator cannot evaluate this expression."""
    m = _CEL_DRIVER.match(expr)
    if m:
        return driver == m.group(1)
    m = _CEL_ATTR.match(expr)
    if m:
        if m.group(1) != driver:
            return False
        attr = (device.get("attributes") or {}).get(m.group(2)) or {}
        return str(attr.get("string", attr.get("version", attr.get("int", "")))) == m.group(3)
    return None


@dataclass
class Inventory:
    """The scheduler's view of DRA for one pass: devices by node, who holds what."""

    store: Store
    slices: dict[str, list[Obj]] = field(default_factory=dict)
    rules: list[Obj] = field(default_factory=list)
    held: set[tuple[str, str, str]] = field(default_factory=set)

    @classmethod
    def load(cls, store: Store) -> Inventory:
        inv = cls(store)
        for s in store.list(r.RESOURCESLICES):
            node = (s.get("spec") or {}).get("nodeName")
            if node:
                inv.slices.setdefault(node, []).append(s)
        inv.rules = store.list(r.DEVICETAINTRULES)
        for claim in store.list(r.RESOURCECLAIMS):
            inv.held |= allocated_devices(claim)
        return inv

    def free_devices(self, node: str, request: dict[str, Any],
                     taken: set[tuple[str, str, str]]) -> tuple[list[tuple[str, str, str]], str]:
        """Devices on `node` this request could get now, or why none."""
        exactly = request.get("exactly") or {}
        if exactly.get("deviceClassName") != DEVICE_CLASS:
            return [], f"device class {exactly.get('deviceClassName')} does not exist"
        tolerations = exactly.get("tolerations") or []
        out: list[tuple[str, str, str]] = []
        for s in self.slices.get(node, []):
            spec = s.get("spec") or {}
            driver, pool = spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")
            if driver != DRIVER:
                continue
            for d in spec.get("devices") or []:
                ref = (driver, pool, d.get("name", ""))
                if ref in self.held or ref in taken:
                    continue
                if any(t.get("effect") in SCHEDULING_EFFECTS and not tolerated(tolerations, t)
                       for t in device_taints(s, d, self.rules)):
                    continue
                verdicts = [_cel_ok(((sel or {}).get("cel") or {}).get("expression", ""),
                                    driver, d) for sel in exactly.get("selectors") or []]
                if None in verdicts:
                    return [], "a CEL selector the simulator cannot evaluate"
                if all(verdicts):
                    out.append(ref)
        return out, ""

    def allocate(self, pod: Obj, node: str) -> tuple[dict[str, Obj], str]:
        """Claims to write for `pod` on `node` (name -> claim with status set), or why not."""
        ns = pod["metadata"].get("namespace", "")
        out: dict[str, Obj] = {}
        taken: set[tuple[str, str, str]] = set()
        for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
            name = ref.get("resourceClaimName")
            if not name:
                return {}, f"pod claim {ref.get('name')}: only resourceClaimName is simulated"
            claim = self.store.find(r.RESOURCECLAIMS, ns, name)
            if claim is None:
                return {}, f'resourceclaim "{name}" not found'
            status = claim.setdefault("status", {})
            if status.get("allocation"):
                if allocation_node(claim) != node:
                    return {}, f"resourceclaim {name} is allocated on another node"
            else:
                results = []
                for req in (claim.get("spec") or {}).get("devices", {}).get("requests") or []:
                    exactly = req.get("exactly")
                    if not exactly:
                        return {}, "cannot allocate all claims (firstAvailable not simulated)"
                    free, why = self.free_devices(node, req, taken)
                    want = len(free) if exactly.get("allocationMode") == "All" else int(
                        exactly.get("count", 1))
                    if why or len(free) < want or want == 0:
                        return {}, "cannot allocate all claims"
                    for driver, pool, device in free[:want]:
                        taken.add((driver, pool, device))
                        results.append({"request": req["name"], "driver": driver,
                                        "pool": pool, "device": device})
                status["allocation"] = {
                    "devices": {"results": results},
                    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
                }
            reserved = status.setdefault("reservedFor", [])
            if not any(e.get("uid") == pod["metadata"].get("uid") for e in reserved):
                reserved.append({"resource": "pods", "name": pod["metadata"]["name"],
                                 "uid": pod["metadata"].get("uid", "")})
            out[name] = claim
        return out, ""

    def commit(self, claims: dict[str, Obj]) -> None:
        for claim in claims.values():
            self.held |= allocated_devices(claim)
            self.store.put_internal(r.RESOURCECLAIMS, claim)


def allocated_devices(claim: Obj) -> set[tuple[str, str, str]]:
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "results") or []
    return {(x.get("driver", ""), x.get("pool", ""), x.get("device", "")) for x in results}


def allocation_node(claim: Obj) -> str:
    terms = ((((claim.get("status") or {}).get("allocation") or {}).get("nodeSelector") or {})
             .get("nodeSelectorTerms") or [])
    for term in terms:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("values"):
                return str(f["values"][0])
    return ""


# -- the driver and the controllers --------------------------------------------------------


def slice_for(node: Obj) -> Obj | None:
    """The ResourceSlice NVIDIA's DRA driver publishes for a GPU node (None: no GPUs)."""
    status = node.get("status") or {}
    count = int((status.get("capacity") or {}).get(GPU_RESOURCE, "0") or 0)
    if count <= 0:
        return None
    name = node["metadata"]["name"]
    annotations = node["metadata"].get("annotations") or {}
    devices = []
    for i in range(count):
        devices.append({
            "name": f"gpu-{i}",
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": f"GPU-{gpu_uuid(name, i)}"},
                "minor": {"int": i},
                "index": {"int": i},
                "productName": {"string": annotations.get("nvidia.com/gpu.product", "")[:64]},
                "driverVersion": {"version": annotations.get("nvidia.com/gpu.driver", "0.0.0")},
            },
            "capacity": {"memory": {"value": "80Gi"}},
        })
    return {
        "metadata": {
            "name": f"{name}-{DRIVER}-{uuid.uuid4().hex[:5]}",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name,
                                 "uid": node["metadata"]["uid"], "controller": True}],
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": name,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


class DraControllers:
    """The DRA driver's slice publishing plus the claim and eviction controllers."""

    def __init__(self, store: Store, nodes: list[str]) -> None:
        self.store = store
        self.nodes = nodes
        self.evicted: Counter[str] = Counter()

    def reconcile(self, now: float) -> None:
        self._publish()
        self._release_claims()
        self._evict(now)

    def _publish(self) -> None:
        slices = {(s.get("spec") or {}).get("nodeName"): s
                  for s in self.store.list(r.RESOURCESLICES)
                  if (s.get("spec") or {}).get("driver") == DRIVER}
        for name in self.nodes:
            node = self.store.find(r.NODES, "", name)
            current = slices.get(name)
            owner = ((current or {}).get("metadata", {}).get("ownerReferences") or [{}])[0]
            stale = node is None or owner.get("uid") != node["metadata"]["uid"]
            if current is not None and stale:
                self.store.remove(r.RESOURCESLICES, "", current["metadata"]["name"])
                current = None
            if node is not None and current is None and (fresh := slice_for(node)) is not None:
                self.store.create(r.RESOURCESLICES, fresh)

    def _release_claims(self) -> None:
        pods = {p["metadata"].get("uid"): p for p in self.store.list(r.PODS)}
        for claim in self.store.list(r.RESOURCECLAIMS):
            status = claim.get("status") or {}
            reserved = status.get("reservedFor") or []
            kept = [e for e in reserved
                    if e.get("uid") in pods and not is_terminal(pods[e["uid"]])]
            if kept == reserved and (kept or not status.get("allocation")):
                continue
            status["reservedFor"] = kept
            if not kept:
                status.pop("allocation", None)
                status.pop("reservedFor", None)
            claim["status"] = status
            self.store.put_internal(r.RESOURCECLAIMS, claim)

    def _evict(self, now: float) -> None:
        rules = self.store.list(r.DEVICETAINTRULES)
        slices = {}
        for s in self.store.list(r.RESOURCESLICES):
            spec = s.get("spec") or {}
            for d in spec.get("devices") or []:
                slices[(spec.get("driver"), (spec.get("pool") or {}).get("name"),
                        d.get("name"))] = (s, d)
        claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c
                  for c in self.store.list(r.RESOURCECLAIMS)}
        pending: Counter[str] = Counter()
        would: Counter[str] = Counter()
        for pod in self.store.list(r.PODS):
            if is_terminal(pod):
                continue
            for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
                claim = claims.get((pod["metadata"]["namespace"], ref.get("resourceClaimName")))
                if claim is None:
                    continue
                requests = {q.get("name"): (q.get("exactly") or {}) for q in
                            ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []}
                results = ((((claim.get("status") or {}).get("allocation") or {})
                            .get("devices") or {}).get("results") or [])
                for res in results:
                    found = slices.get((res.get("driver"), res.get("pool"), res.get("device")))
                    if found is None:
                        continue
                    tols = requests.get(res.get("request"), {}).get("tolerations") or []
                    for rule in rules:
                        taint = (rule.get("spec") or {}).get("taint") or {}
                        if not rule_selects(rule, res["driver"], res["pool"], res["device"]):
                            continue
                        if tolerated(tols, {**taint, "effect": "NoExecute"}):
                            continue
                        uid = rule["metadata"]["uid"]
                        if taint.get("effect") == "NoExecute":
                            pending[uid] += 1
                            if not pod["metadata"].get("deletionTimestamp"):
                                deletion.delete_pod(self.store, pod, None)
                                self.evicted[uid] += 1
                        else:
                            would[uid] += 1
                    for t in found[1].get("taints") or []:
                        if (t.get("effect") == "NoExecute" and not tolerated(tols, t)
                                and not pod["metadata"].get("deletionTimestamp")):
                            deletion.delete_pod(self.store, pod, None)
        ts = clock.rfc3339(now)
        for rule in rules:
            uid, effect = rule["metadata"]["uid"], (rule["spec"].get("taint") or {}).get("effect")
            if effect == "NoExecute":
                message = (f"{pending[uid]} pods need to be evicted, {self.evicted[uid]} pods "
                           "evicted since the rule was created")
                status, reason = ("True", "PodsPendingEviction") if pending[uid] else (
                    "False", "Completed")
            else:
                message = (f"{would[uid]} pods would be evicted with effect NoExecute; effect "
                           f"{effect} evicts none")
                status, reason = "False", "NoEffect" if effect == "None" else "NotEvicting"
            cond = {"type": "EvictionInProgress", "status": status, "reason": reason,
                    "message": message,
                    "observedGeneration": rule["metadata"].get("generation", 1)}
            before = [dict(c) for c in (rule.get("status") or {}).get("conditions") or []]
            set_condition(rule, cond, ts)
            if rule["status"]["conditions"] != before:
                self.store.put_internal(r.DEVICETAINTRULES, rule)
