"""The kubelets of the simulated nodes.

For every node the simulator registered from the scenario: heartbeat the
Ready condition and the node Lease, keep one static mirror pod, start bound
pods (Running, then Ready after the readiness delay), run Job pods' programs,
finish graceful deletions when the grace period is over, and reboot the node
on request. Nodes created through the API have no kubelet, as a Node object
without a machine behind it would not.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sim.cluster import clock, objects
from sim.cluster import resources as r
from sim.cluster.podutil import (
    allocatable_gpus,
    controller_ref,
    gpu_request,
    is_ready,
    is_terminal,
    phase,
    set_condition,
)
from sim.cluster.store import Obj, Store

HEARTBEAT_SECONDS = 10.0
LEASE_SECONDS = 40
MIRROR_PREFIX = "node-local-agent"
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."

Program = Callable[[Obj], Awaitable[tuple[int, str]]]


@dataclass
class _Running:
    ready_at: float
    task: asyncio.Task[None] | None = None


class Kubelet:
    def __init__(self, store: Store, nodes: list[str], program: Program) -> None:
        self.store = store
        self.nodes = set(nodes)
        self.node_index = {n: i for i, n in enumerate(nodes)}
        self.program = program
        self._running: dict[str, _Running] = {}
        self._rebooting: dict[str, float] = {}
        self._heartbeat: dict[str, float] = {}
        self._deleting: dict[str, float] = {}
        self._ip_seq = 10

    # -- node state -------------------------------------------------------------

    def is_rebooting(self, node: str) -> bool:
        return node in self._rebooting

    def start_reboot(self, node: str, seconds: float, keep_pod_uid: str) -> None:
        """Shut the node down now and bring it back after `seconds`."""
        now = clock.now()
        self._rebooting[node] = now + seconds
        self._set_ready(node, False, now)
        for pod in self.store.list(r.PODS):
            if (pod.get("spec") or {}).get("nodeName") != node or pod["metadata"][
                "uid"
            ] == keep_pod_uid:
                continue
            self._shutdown_pod(pod, now)

    def _shutdown_pod(self, pod: Obj, now: float) -> None:
        m = pod["metadata"]
        running = self._running.pop(m["uid"], None)
        if running and running.task:
            running.task.cancel()
        if m.get("deletionTimestamp"):
            self.store.remove(r.PODS, m["namespace"], m["name"])
            return
        if is_terminal(pod):
            return
        ts = clock.rfc3339(now)
        ref = controller_ref(pod) or {}
        if ref.get("kind") in ("DaemonSet", "Node"):
            # Node agents and static pods restart in place after the reboot.
            self._set_pod_ready(pod, False, now)
            self.store.put_internal(r.PODS, pod)
            return
        status = pod.setdefault("status", {})
        status.update({"phase": "Failed", "reason": "Terminated", "message": SHUTDOWN_MESSAGE})
        for cs in status.get("containerStatuses") or []:
            cs["ready"] = False
            cs["started"] = False
            cs["state"] = {
                "terminated": {
                    "exitCode": 137,
                    "reason": "Error",
                    "startedAt": ts,
                    "finishedAt": ts,
                }
            }
        self._set_pod_ready(pod, False, now)
        self.store.put_internal(r.PODS, pod)

    def _set_ready(self, node_name: str, ready: bool, now: float) -> None:
        node = self.store.find(r.NODES, "", node_name)
        if node is None:
            return
        ts = clock.rfc3339(now)
        cond = {
            "type": "Ready",
            "status": "True" if ready else "False",
            "reason": "KubeletReady" if ready else "KubeletNotReady",
            "message": "kubelet is posting ready status"
            if ready
            else "node is shutting down for a reboot (simulated)",
            "lastHeartbeatTime": ts,
        }
        set_condition(node, cond, ts)
        self.store.put_internal(r.NODES, node)
        self._heartbeat[node_name] = now

    def _heartbeat_node(self, name: str, now: float) -> None:
        if now - self._heartbeat.get(name, 0) < HEARTBEAT_SECONDS:
            return
        node = self.store.find(r.NODES, "", name)
        if node is None:
            return
        ts = clock.rfc3339(now)
        for c in (node.get("status") or {}).get("conditions") or []:
            c["lastHeartbeatTime"] = ts
            if c["type"] == "Ready" and c.get("status") != "True":
                # A live kubelet reports what it sees, whatever a client wrote.
                c.update(
                    {
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                        "lastTransitionTime": ts,
                    }
                )
        self.store.put_internal(r.NODES, node)
        self._renew_lease(name, now)
        self._heartbeat[name] = now

    def _renew_lease(self, name: str, now: float) -> None:
        lease = self.store.find(r.LEASES, "kube-node-lease", name)
        spec = {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": clock.micro(now),
        }
        if lease is None:
            node = self.store.find(r.NODES, "", name)
            refs = (
                [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}]
                if node
                else []
            )
            self.store.create(
                r.LEASES,
                {
                    "metadata": {
                        "name": name,
                        "namespace": "kube-node-lease",
                        "ownerReferences": refs,
                    },
                    "spec": spec,
                },
            )
        else:
            lease["spec"] = {**lease.get("spec", {}), **spec}
            self.store.put_internal(r.LEASES, lease)

    # -- reconcile ----------------------------------------------------------------

    def reconcile(self, now: float) -> None:
        for name, until in list(self._rebooting.items()):
            if now >= until:
                del self._rebooting[name]
                self._set_ready(name, True, now)
        for name in sorted(self.nodes):
            if name not in self._rebooting:
                self._heartbeat_node(name, now)
                self._ensure_mirror_pod(name)
        for pod in self.store.list(r.PODS):
            node = (pod.get("spec") or {}).get("nodeName")
            if node in self.nodes:
                self._sync_pod(pod, node, now)

    def _ensure_mirror_pod(self, node_name: str) -> None:
        name = f"{MIRROR_PREFIX}-{node_name}"
        if self.store.find(r.PODS, "kube-system", name) is not None:
            return
        node = self.store.find(r.NODES, "", node_name)
        if node is None:
            return
        pod = objects.pod_from_template(
            {
                "metadata": {
                    "labels": {"component": MIRROR_PREFIX, "tier": "node"},
                    "annotations": {
                        objects.MIRROR: objects.suffix(32),
                        "kubernetes.io/config.source": "file",
                        "kubernetes.io/config.hash": objects.suffix(32),
                        objects.READINESS_DELAY: "0",
                    },
                },
                "spec": {
                    "containers": [{"name": "agent", "image": "registry.sim.local/agent:1"}],
                    "nodeName": node_name,
                    "priorityClassName": "system-node-critical",
                    "tolerations": [{"operator": "Exists", "effect": "NoExecute"}],
                },
            },
            "kube-system",
            name,
            None,
            None,
        )
        pod["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": node_name,
                "uid": node["metadata"]["uid"],
                "controller": True,
            }
        ]
        self.store.create(r.PODS, pod)

    def _sync_pod(self, pod: Obj, node: str, now: float) -> None:
        m = pod["metadata"]
        uid = m["uid"]
        if m.get("deletionTimestamp"):
            # Like the kubelet, time the grace period from when the deletion was seen:
            # deletionTimestamp has only second precision.
            seen = self._deleting.setdefault(uid, now)
            if now >= seen + float(m.get("deletionGracePeriodSeconds") or 0):
                self._deleting.pop(uid, None)
                running = self._running.pop(uid, None)
                if running and running.task:
                    running.task.cancel()
                self.store.remove(r.PODS, m["namespace"], m["name"])
            return
        if is_terminal(pod) or node in self._rebooting:
            return
        running = self._running.get(uid)
        if phase(pod) == "Pending":
            if self._admit(pod, node, now):
                self._start(pod, node, now)
        elif running is None:
            self._restart(pod, now)
        elif not is_ready(pod) and now >= running.ready_at:
            self._set_pod_ready(pod, True, now)
            self.store.put_internal(r.PODS, pod)

    def _admit(self, pod: Obj, node: str, now: float) -> bool:
        """Kubelet admission: a pod bound by nodeName that does not fit is rejected."""
        want = gpu_request(pod)
        if not want:
            return True
        node_obj = self.store.find(r.NODES, "", node)
        capacity = allocatable_gpus(node_obj) if node_obj else 0
        used = sum(
            gpu_request(p)
            for p in self.store.list(r.PODS)
            if (p.get("spec") or {}).get("nodeName") == node
            and not is_terminal(p)
            and p["metadata"]["uid"] != pod["metadata"]["uid"]
            and phase(p) != "Pending"
        )
        if want <= capacity - used:
            return True
        status = pod.setdefault("status", {})
        status.update(
            {
                "phase": "Failed",
                "reason": "OutOfnvidia.com/gpu",
                "message": f"Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, "
                f"requested: {want}, used: {used}, capacity: {capacity}",
                "startTime": clock.rfc3339(now),
            }
        )
        self.store.put_internal(r.PODS, pod)
        return False

    def _restart(self, pod: Obj, now: float) -> None:
        """A Running pod this kubelet is not tracking: its containers restart (after a reboot)."""
        m = pod["metadata"]
        if is_ready(pod):
            self._running[m["uid"]] = _Running(ready_at=now)
            return
        delay = float((m.get("annotations") or {}).get(objects.READINESS_DELAY, "0") or 0)
        self._running[m["uid"]] = _Running(ready_at=now + delay)
        ts = clock.rfc3339(now)
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            cs["restartCount"] = cs.get("restartCount", 0) + 1
            cs["started"] = True
            cs["state"] = {"running": {"startedAt": ts}}
        self.store.put_internal(r.PODS, pod)

    def _start(self, pod: Obj, node: str, now: float) -> None:
        m = pod["metadata"]
        annotations = m.get("annotations") or {}
        restarts = sum(
            cs.get("restartCount", 0)
            for cs in (pod.get("status") or {}).get("containerStatuses") or []
        )
        self._ip_seq = self._ip_seq % 250 + 1
        pod_ip = annotations.get(objects.POD_IP) or (
            f"10.244.{self.node_index.get(node, 0)}.{self._ip_seq}"
        )
        node_obj = self.store.find(r.NODES, "", node)
        addrs = ((node_obj or {}).get("status") or {}).get("addresses") or []
        node_ip = next((a["address"] for a in addrs if a["type"] == "InternalIP"), "10.0.0.1")
        pod["status"] = objects.running_status(pod, node_ip, pod_ip, now)
        for cs in pod["status"]["containerStatuses"]:
            cs["restartCount"] = restarts
        delay = float(annotations.get(objects.READINESS_DELAY, "0") or 0)
        entry = _Running(ready_at=now + delay)
        self._running[m["uid"]] = entry
        ref = controller_ref(pod) or {}
        if ref.get("kind") == "Job" and annotations.get(objects.RUN_FOREVER) != "true":
            entry.ready_at = now
            entry.task = asyncio.get_running_loop().create_task(self._run_program(pod))
        if now >= entry.ready_at:
            self._set_pod_ready(pod, True, now)
        self.store.put_internal(r.PODS, pod)

    def _set_pod_ready(self, pod: Obj, ready: bool, now: float) -> None:
        ts = clock.rfc3339(now)
        value = "True" if ready else "False"
        for kind in ("Ready", "ContainersReady"):
            cond = {"type": kind, "status": value, "lastProbeTime": None}
            if not ready:
                cond.update(
                    {"reason": "ContainersNotReady", "message": "containers with unready status"}
                )
            set_condition(pod, cond, ts)
            if ready:
                for c in pod["status"]["conditions"]:
                    if c["type"] == kind:
                        c.pop("reason", None)
                        c.pop("message", None)
        for cs in pod["status"].get("containerStatuses") or []:
            cs["ready"] = ready

    async def _run_program(self, pod: Obj) -> None:
        code, message = await self.program(copy.deepcopy(pod))
        m = pod["metadata"]
        current = self.store.find(r.PODS, m["namespace"], m["name"])
        if current is None or current["metadata"]["uid"] != m["uid"] or is_terminal(current):
            return
        now = clock.now()
        ts = clock.rfc3339(now)
        status = current["status"]
        status["phase"] = "Succeeded" if code == 0 else "Failed"
        for cs in status.get("containerStatuses") or []:
            started = (cs.get("state") or {}).get("running", {}).get("startedAt", ts)
            terminated = {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": started,
                "finishedAt": ts,
            }
            if message:
                terminated["message"] = message
            cs.update({"ready": False, "started": False, "state": {"terminated": terminated}})
        self._set_pod_ready(current, False, now)
        for c in status["conditions"]:
            if c["type"] in ("Ready", "ContainersReady"):
                c["reason"] = "PodCompleted"
                c.pop("message", None)
        self._running.pop(m["uid"], None)
        self.store.put_internal(r.PODS, current)
