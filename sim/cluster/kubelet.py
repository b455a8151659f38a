"""The kubelets of the simulated nodes.

For every node the simulator registered from the scenario: heartbeat the
Ready condition and the node Lease, keep one static mirror pod, start bound
pods (Running, then Ready after the readiness delay), run Job pods' programs,
finish graceful deletions when the grace period is over, and act out what the
node's machine does (sim/cluster/machines.py): reboots that kill every pod and
come back with a new boot ID and the GPUs allocatable only after the device
plugin re-registers, reboots that never return, a kubelet that stops, a machine
replaced under the same name. Nodes created through the API have no kubelet, as
a Node object without a machine behind it would not.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sim.cluster import clock, objects
from sim.cluster import resources as r
from sim.cluster.defaults import GPU
from sim.cluster.fleet import DEVICE_PLUGIN, OPERATOR_NAMESPACE
from sim.cluster.machines import Machine, Machines, NodeCommand, NodeTiming
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
SIGTERM_EXIT_SECONDS = 0.5
UNREACHABLE_REGISTRIES = frozenset({"unreachable.invalid"})
"""Registries no simulated node can reach (an offline cluster): a pod with an image from
one never starts (ImagePullBackOff)."""
LEASE_SECONDS = 40
MIRROR_PREFIX = "node-local-agent"
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."
UNKNOWN_MESSAGE = "Kubelet stopped posting node status."
# What a healthy kubelet reports for the conditions other than Ready.
HEALTHY_CONDITIONS = {
    "MemoryPressure": ("KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    "DiskPressure": ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    "PIDPressure": ("KubeletHasSufficientPID", "kubelet has sufficient PID available"),
}

Program = Callable[[Obj], Awaitable[tuple[int, str]]]


@dataclass
class _Running:
    ready_at: float
    task: asyncio.Task[None] | None = None


class Kubelet:
    def __init__(
        self, store: Store, nodes: list[str], program: Program, timing: NodeTiming | None = None
    ) -> None:
        self.store = store
        self.nodes = set(nodes)
        self.node_index = {n: i for i, n in enumerate(nodes)}
        self.program = program
        self.machines = Machines(nodes, timing or NodeTiming())
        # What each machine registers with: a replaced node comes back as this, under a
        # new UID, with none of the labels, annotations or taints written since.
        self._registration = {
            n: copy.deepcopy(obj) for n in nodes if (obj := store.find(r.NODES, "", n))
        }
        self._running: dict[str, _Running] = {}
        self._heartbeat: dict[str, float] = {}
        self._deleting: dict[str, float] = {}
        self._pull_failed: set[str] = set()
        self._ip_seq = 10
        # What each container wrote to stdout, by pod uid and container name (pods/log).
        self.logs: dict[str, dict[str, str]] = {}
        # Called for a replacement machine before it registers (the GPU simulator reboots
        # its GPUs: a new machine's driver and exporter); None without a GPU simulator.
        self.on_new_machine: Callable[[str], Awaitable[object]] | None = None
        self._background: set[asyncio.Task[None]] = set()

    # -- node state -------------------------------------------------------------

    @property
    def timing(self) -> NodeTiming:
        return self.machines.timing

    def is_running(self, node: str) -> bool:
        return self.machines.get(node).kubelet_running

    def request_reboot(self, node: str) -> bool:
        """A reboot command on the node; True when it returns before the shutdown."""
        return self.machines.plan_reboot(node, clock.now())

    def command(self, node: str, what: NodeCommand, *, hard: bool = False) -> dict[str, object]:
        """A scripted machine fault or its end (`gpu-remediate sim node ...`). ``hard``
        (hang only): the machine loses power now, with no graceful shutdown."""
        m = self.machines.get(node)
        now = clock.now()
        if hard and what != "hang":
            raise ValueError("hard applies to hang only")
        if what == "hang" and hard:
            self._power_loss(node, m, now)
        elif what == "hang":
            if not m.powered and m.registered:
                m.boot_at = None  # already down: this reboot never returns
            else:
                m.hang_next_reboot = True
            m.events.append("hang: the next reboot never returns")
        elif what == "wedge":
            if not m.wedged:
                m.wedged = True
                m.silent_since = m.silent_since or now
                m.events.append("wedged: the kubelet stopped")
        elif what == "replace":
            self._replace(node, m, now)
        elif what == "recover":
            self._recover(node, m, now)
        else:  # pragma: no cover - the HTTP layer checks the command
            raise ValueError(f"unknown node command {what!r}")
        return {"node": node, **m.describe()}

    def describe(self) -> dict[str, dict[str, object]]:
        return {n: self.machines.get(n).describe() for n in sorted(self.nodes)}

    def _recover(self, node: str, m: Machine, now: float) -> None:
        m.hang_next_reboot = False
        if not m.registered:
            m.register_at = now  # registers on this tick
        if m.wedged:
            m.wedged = False
            m.events.append("recovered: the kubelet runs again")
            if m.powered:
                self._kubelet_back(node, now)
        if m.registered and not m.powered and m.boot_at is None:
            m.boot_at = now
            m.events.append("recovered: the hung reboot completes")

    def _power_loss(self, node: str, m: Machine, now: float) -> None:
        """Power lost: no graceful node shutdown, so nothing on the node is told. The
        kubelet just stops posting: the node goes Unknown after the grace period, its
        pods keep their phase (Running stays Running, a deletion is never confirmed),
        and it does not come back until `recover`."""
        if not m.registered:
            return
        m.shutdown_at = None
        m.hang_next_reboot = False
        m.boot_at = None
        m.plugin_at = None
        m.plugin_registered = False
        m.power_lost = True
        if m.powered:
            m.powered = False
            m.reboots += 1
            m.silent_since = m.silent_since or now
            m.marked_unknown = False
        m.events.append("power lost: no graceful shutdown, never returns until recover")
        # The processes die with the machine; the API server is not told.
        for pod in self.store.list(r.PODS):
            if (pod.get("spec") or {}).get("nodeName") == node:
                running = self._running.pop(pod["metadata"]["uid"], None)
                if running and running.task:
                    running.task.cancel()
                self._deleting.pop(pod["metadata"]["uid"], None)

    def _shutdown(self, node: str, m: Machine, now: float) -> None:
        """Graceful node shutdown: every pod on the node is killed, the kubelet stops."""
        m.shutdown_at = None
        m.powered = False
        m.plugin_at = None
        m.plugin_registered = False
        m.reboots += 1
        m.silent_since = now
        m.marked_unknown = False
        if m.hang_next_reboot:
            m.hang_next_reboot = False
            m.boot_at = None
            m.events.append("shut down; this reboot never returns (hang)")
        else:
            m.boot_at = now + self.timing.reboot_seconds
            m.events.append("shut down for a reboot")
        self._set_ready(node, False, now, "node is shutting down for a reboot (simulated)")
        for pod in self.store.list(r.PODS):
            if (pod.get("spec") or {}).get("nodeName") == node:
                self._shutdown_pod(pod, now)

    def _boot(self, node: str, m: Machine, now: float) -> None:
        """The machine is up: a new boot ID, Ready, and no GPUs until the plugin registers."""
        m.powered = True
        m.boot_at = None
        m.power_lost = False
        m.mig_instances = False  # a MIG layout does not survive a boot
        m.events.append("booted")
        obj = self.store.find(r.NODES, "", node)
        if obj is None:
            return
        status = obj.setdefault("status", {})
        status.setdefault("nodeInfo", {})["bootID"] = str(uuid.uuid4())
        if GPU in (status.get("capacity") or {}):
            status.setdefault("allocatable", {})[GPU] = "0"
            if not m.plugin_managed:
                # No device-plugin DaemonSet: the plugin registers on its own after boot.
                m.plugin_at = now + self.timing.device_plugin_seconds
        self.store.put_internal(r.NODES, obj)
        self._kubelet_back(node, now)

    def _plugin_registered(self, node: str, m: Machine) -> None:
        m.plugin_at = None
        obj = self.store.find(r.NODES, "", node)
        if obj is None:
            return
        status = obj.setdefault("status", {})
        status.setdefault("allocatable", {})[GPU] = (status.get("capacity") or {}).get(GPU, "0")
        self.store.put_internal(r.NODES, obj)
        m.events.append("device plugin registered")

    def _kubelet_back(self, node: str, now: float) -> None:
        m = self.machines.get(node)
        m.silent_since = None
        m.marked_unknown = False
        self._heartbeat.pop(node, None)
        obj = self.store.find(r.NODES, "", node)
        if obj is None:
            return
        ts = clock.rfc3339(now)
        for kind, (reason, message) in HEALTHY_CONDITIONS.items():
            cond = {"type": kind, "status": "False", "reason": reason, "message": message,
                    "lastHeartbeatTime": ts}
            set_condition(obj, cond, ts)
        self.store.put_internal(r.NODES, obj)
        self._set_ready(node, True, now)

    def _mark_unknown(self, node: str, m: Machine, now: float) -> None:
        """The node lifecycle controller's view of a silent kubelet: every condition
        Unknown, and the node's pods no longer Ready."""
        m.marked_unknown = True
        obj = self.store.find(r.NODES, "", node)
        if obj is None:
            return
        ts = clock.rfc3339(now)
        for c in list((obj.get("status") or {}).get("conditions") or []):
            set_condition(obj, {"type": c["type"], "status": "Unknown",
                                "reason": "NodeStatusUnknown", "message": UNKNOWN_MESSAGE}, ts)
        self.store.put_internal(r.NODES, obj)
        for pod in self.store.list(r.PODS):
            if (pod.get("spec") or {}).get("nodeName") == node and is_ready(pod):
                self._set_pod_ready(pod, False, now)
                self.store.put_internal(r.PODS, pod)

    def _replace(self, node: str, m: Machine, now: float) -> None:
        """The machine is re-provisioned: its Node object, Lease and pods go; after
        reregister_seconds a new machine registers under the same name."""
        for pod in self.store.list(r.PODS):
            if (pod.get("spec") or {}).get("nodeName") == node:
                running = self._running.pop(pod["metadata"]["uid"], None)
                if running and running.task:
                    running.task.cancel()
                self._deleting.pop(pod["metadata"]["uid"], None)
                self.store.remove(r.PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
        for rt, ns in ((r.NODES, ""), (r.LEASES, "kube-node-lease")):
            if self.store.find(rt, ns, node) is not None:
                self.store.remove(rt, ns, node)
        self._heartbeat.pop(node, None)
        fresh = Machine(register_at=now + self.timing.reregister_seconds, reboots=m.reboots)
        fresh.events = [*m.events, "replaced: deleted, a new machine registers"]
        self.machines.by_node[node] = fresh
        if self.on_new_machine is not None:
            fresh.gpus_fresh = False
            task = asyncio.get_running_loop().create_task(
                self._fresh_gpus(self.on_new_machine, node, fresh))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    @staticmethod
    async def _fresh_gpus(tell: Callable[[str], Awaitable[object]], node: str,
                          m: Machine) -> None:
        """Tell the GPU simulator the machine is new; it registers after that, whatever
        the answer (an unreachable GPU simulator is reported by its own client)."""
        try:
            await tell(node)
        finally:
            m.gpus_fresh = True

    def _register(self, node: str, m: Machine, now: float) -> None:
        m.register_at = None
        template = self._registration.get(node)
        if template is None or self.store.find(r.NODES, "", node) is not None:
            return
        ts = clock.rfc3339(now)
        obj = copy.deepcopy(template)
        meta = obj["metadata"]
        for key in ("uid", "resourceVersion", "creationTimestamp", "generation"):
            meta.pop(key, None)
        obj.get("spec", {}).pop("taints", None)
        obj.get("spec", {}).pop("unschedulable", None)
        info = obj["status"].setdefault("nodeInfo", {})
        info.update({"bootID": str(uuid.uuid4()), "machineID": uuid.uuid4().hex,
                     "systemUUID": str(uuid.uuid4())})
        for c in obj["status"].get("conditions") or []:
            c.update({"lastHeartbeatTime": ts, "lastTransitionTime": ts})
        self.store.create(r.NODES, obj)
        m.events.append("registered as a new node")
        self._heartbeat.pop(node, None)

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

    def _set_ready(self, node_name: str, ready: bool, now: float, why: str = "") -> None:
        node = self.store.find(r.NODES, "", node_name)
        if node is None:
            return
        ts = clock.rfc3339(now)
        cond = {
            "type": "Ready",
            "status": "True" if ready else "False",
            "reason": "KubeletReady" if ready else "KubeletNotReady",
            "message": "kubelet is posting ready status" if ready else why,
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
        managed = self.store.find(r.DAEMONSETS, OPERATOR_NAMESPACE, DEVICE_PLUGIN) is not None
        for name in sorted(self.nodes):
            self.machines.get(name).plugin_managed = managed
            self._machine_events(name, now)
            if self.is_running(name):
                self._heartbeat_node(name, now)
                self._ensure_mirror_pod(name)
        plugins: dict[str, Obj] = {}
        starting: set[str] = set()
        for pod in self.store.list(r.PODS):
            node = (pod.get("spec") or {}).get("nodeName")
            if node in self.nodes and self.is_running(node):
                self._sync_pod(pod, node, now)
                if managed and _is_plugin(pod, starting=True):
                    starting.add(node)
                    if _is_plugin(pod):
                        plugins[node] = pod
        if managed:
            for name in sorted(self.nodes):
                m = self.machines.get(name)
                if m.steady and name not in starting:
                    m.steady = False  # the seeded plugin pod went before it ever ran
                if self.is_running(name):
                    self._device_plugin(name, m, plugins.get(name), now)
        if len(self.logs) > 500:
            live = {p["metadata"]["uid"] for p in self.store.list(r.PODS)}
            self.logs = {uid: v for uid, v in self.logs.items() if uid in live}

    # -- the device plugin ----------------------------------------------------------

    def _device_plugin(self, node: str, m: Machine, pod: Obj | None, now: float) -> None:
        """`nvidia.com/gpu` allocatable as the kubelet's device manager reports it: 0 while
        no device-plugin pod runs Ready on the node (a terminating one has been told to
        stop), `device_plugin_seconds` after one starts its GPUs register, less those
        this plugin instance holds unhealthy. A new instance (a new pod, or a container
        restart) starts with every GPU healthy."""
        m.follow_plugin(plugin_instance(pod), now, self.timing.device_plugin_seconds)
        if m.steady:
            return  # as seeded, until the first plugin pod runs
        obj = self.store.find(r.NODES, "", node)
        if obj is None:
            return
        status = obj.setdefault("status", {})
        capacity = (status.get("capacity") or {}).get(GPU)
        if capacity is None:
            return
        want = str(m.healthy_gpus(int(capacity))) if m.plugin_registered else "0"
        if (status.get("allocatable") or {}).get(GPU) != want:
            status.setdefault("allocatable", {})[GPU] = want
            self.store.put_internal(r.NODES, obj)

    def plugin_health(self, xids: dict[str, dict[int, list[int]]]) -> None:
        """The device plugins' health checks see the XIDs active on their GPUs: a GPU with
        any XID outside the skip list becomes unhealthy until its plugin restarts."""
        for node in sorted(self.nodes):
            if node in xids:
                self.machines.get(node).plugin_saw(xids[node])

    def plugin_running(self) -> bool:
        return any(self.machines.get(n).plugin_instance is not None for n in self.nodes)

    # -- what Job programs see of the node ----------------------------------------------

    def gpu_holders(self, node: str, exclude_uid: str = "") -> list[Obj]:
        """Pods running on the node that keep its GPUs open: they request nvidia.com/gpu or
        carry the holds-gpus annotation (terminating pods run until they are killed)."""
        return [
            p for p in self.store.list(r.PODS)
            if (p.get("spec") or {}).get("nodeName") == node
            and phase(p) == "Running"
            and p["metadata"]["uid"] != exclude_uid
            and (gpu_request(p) > 0
                 or (p["metadata"].get("annotations") or {}).get(objects.HOLDS_GPUS) == "true")
        ]

    def write_log(self, pod: Obj, text: str) -> None:
        """Append to the stdout of the pod's first container."""
        containers = (pod.get("spec") or {}).get("containers") or []
        if not containers or not text:
            return
        logs = self.logs.setdefault(pod["metadata"]["uid"], {})
        name = containers[0]["name"]
        logs[name] = logs.get(name, "") + text

    def _machine_events(self, name: str, now: float) -> None:
        m = self.machines.get(name)
        if m.register_at is not None and now >= m.register_at and m.gpus_fresh:
            self._register(name, m, now)
        if m.shutdown_at is not None and now >= m.shutdown_at:
            self._shutdown(name, m, now)
        if not m.powered and m.boot_at is not None and now >= m.boot_at:
            self._boot(name, m, now)
        if (m.plugin_at is not None and now >= m.plugin_at and m.kubelet_running
                and not m.plugin_managed):
            self._plugin_registered(name, m)
        if (m.silent_since is not None and not m.marked_unknown and m.registered
                and now - m.silent_since >= self.timing.status_grace_seconds):
            self._mark_unknown(name, m, now)

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
            grace = float(m.get("deletionGracePeriodSeconds") or 0)
            running = self._running.get(uid)
            if running is not None and running.task is not None:
                # A Job's one-shot tool does not trap SIGTERM: it ends at once.
                grace = min(grace, SIGTERM_EXIT_SECONDS)
            if now >= seen + grace:
                self._deleting.pop(uid, None)
                self._pull_failed.discard(uid)
                running = self._running.pop(uid, None)
                if running and running.task:
                    running.task.cancel()
                self.store.remove(r.PODS, m["namespace"], m["name"])
            return
        if is_terminal(pod):
            return
        running = self._running.get(uid)
        if phase(pod) == "Pending":
            if uid in self._pull_failed:
                return  # in image pull back-off: never starts
            if self._admit(pod, node, now) and self._pulled(pod, now):
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

    def _pulled(self, pod: Obj, now: float) -> bool:
        """The images are there. One from an unreachable registry (an offline node) is
        not: the pod stays Pending, its container waiting in ImagePullBackOff."""
        containers = (pod.get("spec") or {}).get("containers") or []
        bad = [c for c in containers
               if str(c.get("image", "")).split("/", 1)[0] in UNREACHABLE_REGISTRIES]
        if not bad:
            return True
        self._pull_failed.add(pod["metadata"]["uid"])
        status = pod.setdefault("status", {})
        status.update({"phase": "Pending", "startTime": clock.rfc3339(now), "containerStatuses": [
            {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False,
             "started": False, "restartCount": 0,
             "state": {"waiting": {"reason": "ImagePullBackOff", "message": (
                 f'Back-off pulling image "{c.get("image", "")}": dial tcp: lookup '
                 f'{str(c.get("image", "")).split("/", 1)[0]}: no such host')}}}
            if c in bad else
            {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False,
             "started": False, "restartCount": 0,
             "state": {"waiting": {"reason": "PodInitializing"}}}
            for c in containers]})
        self.store.put_internal(r.PODS, pod)
        return False

    def _restart(self, pod: Obj, now: float) -> None:
        """A Running pod this kubelet is not tracking: its containers restart (after a reboot),
        or, with restartPolicy Never (a Job's pod after a power loss), it ends Failed."""
        m = pod["metadata"]
        if (pod.get("spec") or {}).get("restartPolicy") == "Never":
            self._fail_lost(pod, now)
            return
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

    def _fail_lost(self, pod: Obj, now: float) -> None:
        ts = clock.rfc3339(now)
        status = pod.setdefault("status", {})
        status.update({"phase": "Failed", "reason": "Terminated",
                       "message": "The node lost power while the pod ran."})
        for cs in status.get("containerStatuses") or []:
            cs.update({"ready": False, "started": False, "state": {"terminated": {
                "exitCode": 137, "reason": "Error", "startedAt": ts, "finishedAt": ts}}})
        self._set_pod_ready(pod, False, now)
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
        node = pod["spec"]["nodeName"]
        # A container that ends under a stopped kubelet is reported when the kubelet runs
        # again (or never, if the machine goes away first).
        while node in self.nodes and not self.is_running(node):
            await asyncio.sleep(0.05)
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


def plugin_instance(pod: Obj | None) -> tuple[str, int] | None:
    """A device-plugin pod as an instance of the plugin: (pod uid, restart count)."""
    if pod is None:
        return None
    restarts = sum(int(cs.get("restartCount") or 0)
                   for cs in (pod.get("status") or {}).get("containerStatuses") or [])
    return str(pod["metadata"]["uid"]), restarts


def _is_plugin(pod: Obj, starting: bool = False) -> bool:
    """A device-plugin pod that runs Ready (or, `starting`, may yet) and has not been told
    to stop."""
    m = pod["metadata"]
    if (m.get("namespace") != OPERATOR_NAMESPACE or m.get("deletionTimestamp")
            or (m.get("labels") or {}).get("app") != DEVICE_PLUGIN):
        return False
    if starting:
        return not is_terminal(pod)
    return phase(pod) == "Running" and is_ready(pod)
