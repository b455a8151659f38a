"""The kubelets of simulated GPU nodes, for a real control plane (tests/controlplane).

A real kube-apiserver, controller-manager and scheduler have no kubelets here: this
process plays them, through the API only, with the official ``kubernetes`` client.

* ``seed``: what a cluster admin would have applied: the scenario's namespaces,
  workloads (ReplicaSet, StatefulSet, DaemonSet, Job, bare Pods), PDBs and the
  dcgm-exporter DaemonSet, shaped as the cluster simulator shapes them
  (``sim/cluster/fleet.py``), so the same scenario means the same objects.
* ``NodeAgent``: registers the scenario's nodes (``nvidia.com/gpu`` capacity), keeps
  them Ready (status heartbeats and a Lease in ``kube-node-lease``), keeps a static
  mirror pod per node, starts bound pods (Running, then Ready after the pod's
  ``sim.gpu-remediate.io/readiness-delay-seconds``), rejects pods that do not fit
  (``OutOfnvidia.com/gpu``), finishes graceful deletions once the grace period is over
  (terminal phase, then a delete with grace 0 and a UID precondition, as the kubelet
  does), and runs remediation Job pods against the GPU simulator's HTTP API
  (docs/simulators-gpu.md): ``validate`` reads ``/api/v1/nodes/{node}/health``,
  ``gpu-reset`` posts ``.../reset``, ``reboot`` posts ``.../reboot`` and takes the node
  NotReady for ``reboot_seconds`` (its other non-DaemonSet pods end Failed, as with a
  graceful node shutdown).

Run as a process: ``python -m tests.controlplane.node_agent --kubeconfig K --scenario S
--gpu-sim-url URL [--seed]``; it prints ``READY`` once every node is Ready and every
seeded workload pod on them is Running.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, config

from sim.cluster import fleet, objects
from sim.cluster.gpulink import GpuLink, Outcome
from sim.scenario import Pool, Scenario, load_scenario

log = logging.getLogger("node-agent")

HEARTBEAT_SECONDS = 10.0
LEASE_SECONDS = 40
MIRROR_PREFIX = "node-local-agent"
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."

Obj = dict[str, Any]


def rfc3339(t: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if t is None else t))


def micro(t: float | None = None) -> str:
    t = time.time() if t is None else t
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


def _create(fn: Callable[..., Any], *args: Any) -> Any:
    """Create, tolerating AlreadyExists (seeding and registering are idempotent)."""
    try:
        return fn(*args)
    except client.ApiException as err:
        if err.status == 409:
            return None
        raise


def _json(resp: Any) -> Any:
    return json.loads(resp.data)


def _owner_kind(pod: Obj) -> str | None:
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("kind"))
    return None


def _terminal(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _ready(pod: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _gpu_request(pod: Obj) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        value = (res.get("limits") or {}).get("nvidia.com/gpu") or \
            (res.get("requests") or {}).get("nvidia.com/gpu")
        total += int(value or 0)
    return total


# ------------------------------------------------------------------------- seeding


def seed(api: client.ApiClient, scenario: Scenario) -> None:
    """Create the scenario's namespaces, workloads and PDBs, as `kubectl apply` would."""
    core, apps, batch, policy = (client.CoreV1Api(api), client.AppsV1Api(api),
                                 client.BatchV1Api(api), client.PolicyV1Api(api))
    namespaces = list(fleet.BASE_NAMESPACES) + [w.namespace for w in scenario.workloads]
    for ns in dict.fromkeys(namespaces):
        _create(core.create_namespace, {"metadata": {"name": ns}})
    pools = {p.name: p for p in scenario.pools}
    for w in scenario.workloads:
        template = fleet._template(w, pools, job=w.kind == "Job")
        labels = template["metadata"]["labels"]
        meta = {"name": w.name, "namespace": w.namespace, "labels": dict(w.labels)}
        selector = {"matchLabels": labels}
        if w.kind == "ReplicaSet":
            body: Obj = {"metadata": meta, "spec": {"replicas": w.replicas, "selector": selector,
                                                    "template": template}}
            _create(apps.create_namespaced_replica_set, w.namespace, body)
        elif w.kind == "StatefulSet":
            body = {"metadata": meta, "spec": {
                "replicas": w.replicas, "selector": selector, "template": template,
                "serviceName": w.name, "podManagementPolicy": "Parallel"}}
            _create(apps.create_namespaced_stateful_set, w.namespace, body)
        elif w.kind == "DaemonSet":
            body = {"metadata": meta, "spec": {"selector": selector, "template": template}}
            _create(apps.create_namespaced_daemon_set, w.namespace, body)
        elif w.kind == "Job":
            body = {"metadata": meta, "spec": {"parallelism": w.replicas,
                                               "completions": w.replicas, "template": template}}
            _create(batch.create_namespaced_job, w.namespace, body)
        else:
            for i in range(w.replicas):
                name = w.name if w.replicas == 1 else f"{w.name}-{i}"
                pod = {"metadata": {"name": name, **{k: v for k, v in template["metadata"].items()
                                                     if k in ("labels", "annotations")}},
                       "spec": template["spec"]}
                _create(core.create_namespaced_pod, w.namespace, pod)
        if w.pdb is not None:
            pdb = fleet._pdb(w, labels)
            _create(policy.create_namespaced_pod_disruption_budget, w.namespace, pdb)
    ds = fleet._dcgm_daemonset()
    _create(apps.create_namespaced_daemon_set, fleet.DCGM_NAMESPACE, ds)


# ------------------------------------------------------------------------ the kubelets


@dataclass
class _Running:
    ready_at: float
    program: bool = False


@dataclass
class NodeAgent:
    """Kubelets for `nodes` (name, pool, index), all driven from one polling loop."""

    api: client.ApiClient
    nodes: list[tuple[str, Pool, int]]
    gpu_url: str | None = None
    job_seconds: float = 2.0
    reboot_seconds: float = 3.0
    interval: float = 0.2
    _running: dict[str, _Running] = field(default_factory=dict)
    _deleting: dict[str, float] = field(default_factory=dict)
    _rebooting: dict[str, float] = field(default_factory=dict)
    _heartbeat: dict[str, float] = field(default_factory=dict)
    _ip_seq: int = 10
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def __post_init__(self) -> None:
        self.core: Any = client.CoreV1Api(self.api)
        self.coordination: Any = client.CoordinationV1Api(self.api)
        self.names = {n for n, _, _ in self.nodes}
        self.index = {n: i for n, _, i in self.nodes}
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="job-pod")

    # -- nodes --------------------------------------------------------------------------

    def register(self) -> None:
        for name, pool, index in self.nodes:
            obj = fleet.node_object(name, pool, index)
            status = obj.pop("status")
            obj["spec"].pop("podCIDRs", None)
            _create(self.core.create_node, obj)
            self.core.patch_node_status(name, {"status": status})
            self._renew_lease(name)
            self._heartbeat[name] = time.time()
            self._ensure_mirror_pod(name)

    def _set_ready(self, name: str, ready: bool, message: str) -> None:
        now = rfc3339()
        node = _json(self.core.read_node(name, _preload_content=False))
        conds = (node.get("status") or {}).get("conditions") or []
        old = next((c for c in conds if c["type"] == "Ready"), {})
        value = "True" if ready else "False"
        cond = {"type": "Ready", "status": value,
                "reason": "KubeletReady" if ready else "KubeletNotReady",
                "message": message, "lastHeartbeatTime": now,
                "lastTransitionTime": now if old.get("status") != value
                else old.get("lastTransitionTime", now)}
        others = [{**c, "lastHeartbeatTime": now} for c in conds if c["type"] != "Ready"]
        self.core.patch_node_status(name, {"status": {"conditions": [*others, cond]}})

    def _renew_lease(self, name: str) -> None:
        spec = {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": micro()}
        try:
            self.coordination.patch_namespaced_lease(name, "kube-node-lease", {"spec": spec})
        except client.ApiException as err:
            if err.status != 404:
                raise
            node = _json(self.core.read_node(name, _preload_content=False))
            refs = [{"apiVersion": "v1", "kind": "Node", "name": name,
                     "uid": node["metadata"]["uid"]}]
            _create(self.coordination.create_namespaced_lease, "kube-node-lease",
                    {"metadata": {"name": name, "ownerReferences": refs}, "spec": spec})

    def _heartbeats(self, now: float) -> None:
        for name in sorted(self.names):
            if name in self._rebooting or now - self._heartbeat.get(name, 0) < HEARTBEAT_SECONDS:
                continue
            self._set_ready(name, True, "kubelet is posting ready status")
            self._renew_lease(name)
            self._heartbeat[name] = now

    def _ensure_mirror_pod(self, name: str) -> None:
        node = _json(self.core.read_node(name, _preload_content=False))
        pod = {
            "metadata": {
                "name": f"{MIRROR_PREFIX}-{name}",
                "labels": {"component": MIRROR_PREFIX, "tier": "node"},
                "annotations": {objects.MIRROR: objects.suffix(32),
                                "kubernetes.io/config.source": "file",
                                "kubernetes.io/config.hash": objects.suffix(32),
                                objects.READINESS_DELAY: "0"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name,
                                     "uid": node["metadata"]["uid"], "controller": True}],
            },
            "spec": {"nodeName": name, "priorityClassName": "system-node-critical",
                     "containers": [{"name": "agent", "image": "registry.sim.local/agent:1"}],
                     "tolerations": [{"operator": "Exists", "effect": "NoExecute"}]},
        }
        try:
            self.core.create_namespaced_pod("kube-system", pod)
        except client.ApiException as err:
            if err.status != 409:
                log.warning("mirror pod for %s refused: %s %s", name, err.status, err.body)

    # -- reboot ---------------------------------------------------------------------------

    def is_rebooting(self, node: str) -> bool:
        return node in self._rebooting

    def start_reboot(self, node: str, seconds: float, keep_uid: str) -> None:
        with self._lock:
            self._rebooting[node] = time.time() + seconds
            self._set_ready(node, False, "node is shutting down for a reboot (simulated)")
            for pod in self._pods():
                if pod["spec"].get("nodeName") != node or pod["metadata"]["uid"] == keep_uid:
                    continue
                self._shutdown_pod(pod)

    def _shutdown_pod(self, pod: Obj) -> None:
        m = pod["metadata"]
        self._running.pop(m["uid"], None)
        if m.get("deletionTimestamp"):
            self._delete_now(pod)
            return
        if _terminal(pod):
            return
        if _owner_kind(pod) in ("DaemonSet", "Node"):
            # Node agents and static pods restart in place after the reboot.
            self._patch_status(pod, {"conditions": self._ready_conditions(False)})
            return
        ts = rfc3339()
        statuses = [{**cs, "ready": False, "started": False, "state": {"terminated": {
            "exitCode": 137, "reason": "Error", "startedAt": ts, "finishedAt": ts}}}
            for cs in pod["status"].get("containerStatuses") or []]
        self._patch_status(pod, {"phase": "Failed", "reason": "Terminated",
                                 "message": SHUTDOWN_MESSAGE, "containerStatuses": statuses,
                                 "conditions": self._ready_conditions(False)})

    # -- pods -----------------------------------------------------------------------------

    def _pods(self) -> list[Obj]:
        items = _json(self.core.list_pod_for_all_namespaces(_preload_content=False))["items"]
        return [p for p in items if (p.get("spec") or {}).get("nodeName") in self.names]

    def _patch_status(self, pod: Obj, status: Obj) -> None:
        m = pod["metadata"]
        try:
            self.core.patch_namespaced_pod_status(m["name"], m["namespace"], {"status": status})
        except client.ApiException as err:
            if err.status != 404:
                raise

    @staticmethod
    def _ready_conditions(ready: bool, reason: str = "ContainersNotReady") -> list[Obj]:
        ts = rfc3339()
        conds = []
        for kind in ("Ready", "ContainersReady"):
            c: Obj = {"type": kind, "status": "True" if ready else "False",
                      "lastTransitionTime": ts, "lastProbeTime": None}
            if not ready:
                c.update({"reason": reason})
                if reason == "ContainersNotReady":
                    c["message"] = "containers with unready status"
            conds.append(c)
        return conds

    def _delete_now(self, pod: Obj) -> None:
        m = pod["metadata"]
        with contextlib.suppress(client.ApiException):
            self.core.delete_namespaced_pod(
                m["name"], m["namespace"], grace_period_seconds=0,
                body=client.V1DeleteOptions(grace_period_seconds=0,
                                            preconditions=client.V1Preconditions(uid=m["uid"])))

    def reconcile(self) -> None:
        with self._lock:
            now = time.time()
            for name, until in list(self._rebooting.items()):
                if now >= until:
                    del self._rebooting[name]
                    self._set_ready(name, True, "kubelet is posting ready status")
                    self._renew_lease(name)
                    self._heartbeat[name] = now
            self._heartbeats(now)
            pods = self._pods()
            for pod in pods:
                try:
                    self._sync(pod, pods, now)
                except client.ApiException as err:
                    log.warning("pod %s/%s: %s %s", pod["metadata"]["namespace"],
                                pod["metadata"]["name"], err.status, err.reason)

    def _sync(self, pod: Obj, pods: list[Obj], now: float) -> None:
        m, node = pod["metadata"], pod["spec"]["nodeName"]
        uid = m["uid"]
        if m.get("deletionTimestamp"):
            # Like the kubelet, time the grace period from when the deletion was seen.
            seen = self._deleting.setdefault(uid, now)
            if now >= seen + float(m.get("deletionGracePeriodSeconds") or 0):
                self._deleting.pop(uid, None)
                self._running.pop(uid, None)
                if not _terminal(pod):
                    ts = rfc3339()
                    statuses = [{**cs, "ready": False, "started": False, "state": {"terminated": {
                        "exitCode": 143, "reason": "Error", "startedAt": ts, "finishedAt": ts}}}
                        for cs in (pod.get("status") or {}).get("containerStatuses") or []]
                    self._patch_status(pod, {"phase": "Failed", "containerStatuses": statuses,
                                             "conditions": self._ready_conditions(False)})
                self._delete_now(pod)
            return
        if _terminal(pod) or node in self._rebooting:
            return
        running = self._running.get(uid)
        phase = (pod.get("status") or {}).get("phase", "Pending")
        annotations = m.get("annotations") or {}
        delay = float(annotations.get(objects.READINESS_DELAY, "0") or 0)
        if phase == "Pending":
            if self._admit(pod, pods):
                self._start(pod, now, delay)
        elif running is None:
            # A Running pod this kubelet does not track: its containers (re)started.
            self._running[uid] = _Running(ready_at=now if _ready(pod) else now + delay)
        elif not _ready(pod) and now >= running.ready_at and not running.program:
            self._patch_status(pod, {"conditions": self._ready_conditions(True)})

    def _admit(self, pod: Obj, pods: list[Obj]) -> bool:
        want = _gpu_request(pod)
        if not want:
            return True
        node = pod["spec"]["nodeName"]
        capacity = next(int(p.gpus) for n, p, _ in self.nodes if n == node)
        used = sum(_gpu_request(p) for p in pods
                   if p["spec"].get("nodeName") == node and not _terminal(p)
                   and p["metadata"]["uid"] != pod["metadata"]["uid"]
                   and (p.get("status") or {}).get("phase", "Pending") != "Pending")
        if want <= capacity - used:
            return True
        self._patch_status(pod, {
            "phase": "Failed", "reason": "OutOfnvidia.com/gpu", "startTime": rfc3339(),
            "message": f"Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, "
                       f"requested: {want}, used: {used}, capacity: {capacity}"})
        return False

    def _start(self, pod: Obj, now: float, delay: float) -> None:
        m = pod["metadata"]
        annotations = m.get("annotations") or {}
        node = pod["spec"]["nodeName"]
        self._ip_seq = self._ip_seq % 250 + 1
        pod_ip = annotations.get(objects.POD_IP) or f"10.244.{self.index[node]}.{self._ip_seq}"
        status = objects.running_status(pod, fleet.node_ip(self.index[node]), pod_ip, now)
        program = _owner_kind(pod) == "Job" and annotations.get(objects.RUN_FOREVER) != "true"
        entry = _Running(ready_at=now if program else now + delay, program=program)
        self._running[m["uid"]] = entry
        if now >= entry.ready_at:
            status["conditions"] = [c for c in status["conditions"]
                                    if c["type"] not in ("Ready", "ContainersReady")]
            status["conditions"] += self._ready_conditions(True)
            for cs in status["containerStatuses"]:
                cs["ready"] = True
        self._patch_status(pod, status)
        if program:
            self._pool.submit(self._run_program, pod)

    # -- Job pods' programs ---------------------------------------------------------------

    def _program(self, pod: Obj) -> tuple[int, str]:
        labels = pod["metadata"].get("labels") or {}
        node = pod["spec"]["nodeName"]
        kind = labels.get(objects.JOB_LABEL, "")
        time.sleep(self.job_seconds)
        if not self.gpu_url:
            # Without a GPU simulator validation passes and a reset is a no-op; a reboot
            # still takes the node down (as the cluster simulator does).
            if kind == "reboot":
                self.start_reboot(node, self.reboot_seconds, pod["metadata"]["uid"])
                while self.is_rebooting(node):
                    time.sleep(0.05)
            return 0, ""
        if kind in ("validate", "gpu-reset", "reboot"):
            # The same calls, retries and messages as the cluster simulator's Job programs.
            outcome = asyncio.run(_gpu_call(self.gpu_url, kind, node, _gpu_index(pod)))
            if not outcome.ok:
                return 1, "; ".join(outcome.problems) or "GPU unhealthy"
            if kind == "reboot":
                self.start_reboot(node, self.reboot_seconds, pod["metadata"]["uid"])
                while self.is_rebooting(node):
                    time.sleep(0.05)
        return 0, ""

    def _run_program(self, pod: Obj) -> None:
        try:
            code, message = self._program(pod)
        except Exception as err:  # a crashed program is a failed container
            log.exception("job pod program failed")
            code, message = 1, str(err)
        m = pod["metadata"]
        with self._lock:
            try:
                current = _json(self.core.read_namespaced_pod(m["name"], m["namespace"],
                                                              _preload_content=False))
            except client.ApiException:
                return
            if current["metadata"]["uid"] != m["uid"] or _terminal(current):
                return
            ts = rfc3339()
            statuses = []
            for cs in (current.get("status") or {}).get("containerStatuses") or []:
                started = ((cs.get("state") or {}).get("running") or {}).get("startedAt", ts)
                terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                              "startedAt": started, "finishedAt": ts}
                if message:
                    terminated["message"] = message
                statuses.append({**cs, "ready": False, "started": False,
                                 "state": {"terminated": terminated}})
            self._patch_status(current, {
                "phase": "Succeeded" if code == 0 else "Failed",
                "containerStatuses": statuses,
                "conditions": self._ready_conditions(False, reason="PodCompleted")})
            self._running.pop(m["uid"], None)

    # -- loop -----------------------------------------------------------------------------

    def all_ready(self, namespaces: set[str]) -> bool:
        for name in self.names:
            node = _json(self.core.read_node(name, _preload_content=False))
            conds = (node.get("status") or {}).get("conditions") or []
            if not any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
                return False
        pods = [p for p in _json(self.core.list_pod_for_all_namespaces(
            _preload_content=False))["items"] if p["metadata"]["namespace"] in namespaces]
        # Every pod of the seeded namespaces is bound to one of these nodes and Ready.
        return bool(pods) and all(_ready(p) and p["spec"].get("nodeName") in self.names
                                  for p in pods)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.reconcile()
            except Exception:  # a kubelet keeps going through API errors
                log.exception("reconcile failed")
            stop.wait(self.interval)
        self._pool.shutdown(wait=False, cancel_futures=True)


async def _gpu_call(url: str, kind: str, node: str, gpu: str | None) -> Outcome:
    link = GpuLink(url)
    try:
        if kind == "validate":
            return await link.health(node)
        if kind == "gpu-reset":
            return await link.reset(node, gpu)
        return await link.reboot(node)
    finally:
        await link.aclose()


def _gpu_index(pod: Obj) -> str | None:
    for c in pod["spec"].get("containers") or []:
        for env in c.get("env") or []:
            if env.get("name") == "GPU_INDEX" and env.get("value") not in (None, ""):
                return str(env["value"])
    label = (pod["metadata"].get("labels") or {}).get(objects.GPU_LABEL)
    return str(label) if label else None


def scenario_nodes(scenario: Scenario) -> list[tuple[str, Pool, int]]:
    return [(name, pool, i) for i, (name, pool) in enumerate(scenario.nodes())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--scenario", default="small")
    parser.add_argument("--gpu-sim-url")
    parser.add_argument("--seed", action="store_true", help="also create the scenario's objects")
    parser.add_argument("--job-seconds", type=float, default=2.0)
    parser.add_argument("--reboot-seconds", type=float, default=3.0)
    parser.add_argument("--ready-timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    scenario = load_scenario(args.scenario)
    api = config.new_client_from_config(config_file=args.kubeconfig)
    agent = NodeAgent(api, scenario_nodes(scenario), gpu_url=args.gpu_sim_url,
                      job_seconds=args.job_seconds, reboot_seconds=args.reboot_seconds)
    agent.register()
    log.info("registered %d nodes", len(agent.names))
    if args.seed:
        seed(api, scenario)
        log.info("seeded scenario %s", scenario.name)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    loop = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    loop.start()
    namespaces = {w.namespace for w in scenario.workloads} | {fleet.DCGM_NAMESPACE}
    deadline = time.monotonic() + args.ready_timeout
    while not stop.is_set():
        with contextlib.suppress(client.ApiException):
            if agent.all_ready(namespaces):
                break
        if time.monotonic() > deadline:
            log.error("pods not Running/Ready after %.0fs", args.ready_timeout)
            return 1
        time.sleep(0.5)
    print("READY", flush=True)
    log.info("READY")
    loop.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())

