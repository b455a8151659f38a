"""The kubelets of simulated GPU nodes, for a real control plane (tests/controlplane).

A real kube-apiserver, controller-manager and scheduler have no kubelets here: this
process plays them, through the API only, with the official ``kubernetes`` client.

* ``seed``: what a cluster admin would have applied: the scenario's namespaces,
  workloads (ReplicaSet, StatefulSet, DaemonSet, Job, bare Pods), PDBs and the GPU
  Operator's operand DaemonSets (device plugin, DCGM, dcgm-exporter, GPU feature
  discovery, each selecting its ``nvidia.com/gpu.deploy.<operand>: "true"`` node label),
  shaped as the cluster simulator shapes them (``sim/cluster/fleet.py``), so the same
  scenario means the same objects. The real DaemonSet controller starts and stops their
  pods as the deploy labels change.
* ``NodeAgent``: registers the scenario's nodes (``nvidia.com/gpu`` capacity), keeps
  them Ready (status heartbeats and a Lease in ``kube-node-lease``), keeps a static
  mirror pod per node, starts bound pods (Running, then Ready after the pod's
  ``sim.gpu-remediate.io/readiness-delay-seconds``), rejects pods that do not fit
  (``OutOfnvidia.com/gpu``), finishes graceful deletions once the grace period is over
  (terminal phase, then a delete with grace 0 and a UID precondition, as the kubelet
  does), and runs remediation Job pods against the GPU simulator's HTTP API
  (docs/simulators-gpu.md): ``validate`` reads ``/api/v1/nodes/{node}/health``,
  ``gpu-reset`` posts ``.../reset``, ``reboot`` posts ``.../reboot`` and then reboots
  the node's machine the way the cluster simulator does (sim/cluster/machines.py,
  docs/simulators-cluster.md "Nodes behave like real GPU nodes"):

  - the reboot command either returns before the shutdown (the pod exits 0) or is
    killed by it (the pod ends Failed, ``Terminated``): drawn per reboot from an RNG
    seeded by ``--reboot-seed``, the node name and the node's reboot count, so a
    scenario draws the same on every run whatever order its nodes reboot in; the
    shutdown follows the command within ``shutdown_seconds``;
  - the shutdown kills every pod on the node, the reboot Job's own included;
    DaemonSet and static (mirror) pods restart in place after the boot (restart count
    + 1), the others end Failed with the graceful-node-shutdown message;
  - the node is NotReady (no heartbeats, no Lease renewals, nothing starts, no
    deletion is confirmed) for ``reboot_seconds``;
  - it comes back with a new ``status.nodeInfo.bootID`` (same name and UID), Ready
    (``lastTransitionTime`` moves), and ``allocatable["nvidia.com/gpu"] = "0"`` until
    the device plugin re-registers ``device_plugin_seconds`` later; a GPU pod bound
    meanwhile is rejected ``OutOfnvidia.com/gpu`` (admission counts allocatable).

  And the GPU Operator's node side, as the cluster simulator models it:

  - allocatable ``nvidia.com/gpu`` follows the device-plugin pod: 0 while none runs Ready
    on the node, the GPUs ``device_plugin_seconds`` after one starts, less those it holds
    unhealthy: its health check (every ``plugin_health_seconds``, against the GPU
    simulator) marks a GPU with a critical XID unhealthy until the plugin restarts;
  - ``nvidia-smi -r`` (the ``gpu-reset`` program) fails while a pod holds the GPUs
    (requests ``nvidia.com/gpu`` or is an operand that keeps ``/dev/nvidia*`` open);
  - a validation container running ``dcgmi`` needs a host engine: started in the same
    command (``nv-hostengine ... && dcgmi diag``) or reached with ``--host``
    (sim/cluster/dcgmi.py), else it fails as dcgmi does.

  And the simulator's scripted machine faults, in-process (``NodeAgent.command``): hang,
  wedge, replace, recover.

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
import random
import re
import signal
import ssl
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from kubernetes import client, config

from sim.cluster import dcgmi, fleet, objects
from sim.cluster.gpulink import GpuLink, Outcome
from sim.cluster.kubelet import plugin_instance
from sim.cluster.machines import Machine, NodeCommand, NodeTiming
from sim.scenario import Pool, Scenario, load_scenario

log = logging.getLogger("node-agent")

HEARTBEAT_SECONDS = 10.0
LEASE_SECONDS = 40
MIRROR_PREFIX = "node-local-agent"
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."
GPU = "nvidia.com/gpu"

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


def seed(api: client.ApiClient, scenario: Scenario, operand_seconds: float = 0.5) -> None:
    """Create the scenario's namespaces, workloads, PDBs and the GPU Operator's operand
    DaemonSets, as `kubectl apply` (and the operator) would."""
    core, apps, batch, policy = (client.CoreV1Api(api), client.AppsV1Api(api),
                                 client.BatchV1Api(api), client.PolicyV1Api(api))
    namespaces = list(fleet.BASE_NAMESPACES) + [w.namespace for w in scenario.workloads]
    for ns in dict.fromkeys(namespaces):
        _create(core.create_namespace, {"metadata": {"name": ns}})
    # The GPU Operator installs RuntimeClass nvidia; without it the API server's RuntimeClass
    # admission refuses every pod that names it (the default GPU reset template does), and
    # the worker refuses to start (activities/prerequisites.py).
    _create(client.NodeV1Api(api).create_runtime_class,
            {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
             "metadata": {"name": "nvidia"}, "handler": "nvidia"})
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
    for op in fleet.OPERANDS:
        _create(apps.create_namespaced_daemon_set, fleet.OPERATOR_NAMESPACE,
                fleet._operand_daemonset(op, operand_seconds))


# ------------------------------------------------------------------- the kubelet API


def serve_logs(agent: NodeAgent, cert: Path, key: Path, port: int = 0) -> ThreadingHTTPServer:
    """The kubelet's ``GET /containerLogs/{namespace}/{pod}/{container}`` over HTTPS on the
    loopback, which the API server calls for ``pods/log`` (it does not verify a kubelet's
    certificate unless told a CA): the containers' output as written by the Job programs.
    ``limitBytes`` and ``tailLines`` as the kubelet reads them. Returns the server, serving
    on a daemon thread; its port is ``server.server_address[1]``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            parts = [unquote(p) for p in url.path.strip("/").split("/")]
            if len(parts) != 4 or parts[0] != "containerLogs":
                self._send(404, f"no such kubelet path {url.path}\n")
                return
            with agent._lock:
                text = agent.logs.get((parts[1], parts[2], parts[3]))
            if text is None:
                self._send(404, f'container "{parts[3]}" in pod "{parts[2]}" has no log\n')
                return
            query = parse_qs(url.query)
            if "tailLines" in query:
                lines = text.splitlines(keepends=True)
                keep = int(query["tailLines"][0])
                text = "".join(lines[-keep:]) if keep > 0 else ""
            body = text.encode()
            if "limitBytes" in query:
                body = body[:int(query["limitBytes"][0])]
            self._send(200, body)

        def _send(self, code: int, body: str | bytes) -> None:
            data = body.encode() if isinstance(body, str) else body
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("kubelet API: " + format, *args)

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True, name="kubelet-api").start()
    return server


# ------------------------------------------------------------------------ the kubelets


def reboot_draw(timing: NodeTiming, node: str, reboots: int) -> tuple[bool, float]:
    """A reboot command's fate: (returns before the shutdown, seconds to the shutdown).

    One draw per reboot from the seed, the node and how often it rebooted before, so the
    outcome does not depend on which node's Job gets there first (the cluster simulator
    draws from one RNG in the order its single event loop runs them)."""
    rng = random.Random(f"{timing.seed}:{node}:{reboots}")
    return rng.random() < 0.5, rng.uniform(0.0, timing.shutdown_seconds)


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
    timing: NodeTiming = field(default_factory=NodeTiming)
    """The cluster simulator's machine timings and reboot seed (its status_grace_seconds
    and reregister_seconds are unused: the real node-lifecycle controller marks silent
    nodes Unknown, and nodes are not replaced here)."""
    interval: float = 0.2
    kubelet_port: int = 0
    """The port of the kubelet API (``/containerLogs``) this process serves; 0: none."""
    _running: dict[str, _Running] = field(default_factory=dict)
    _deleting: dict[str, float] = field(default_factory=dict)
    _killed: set[str] = field(default_factory=set)
    _lost: set[str] = field(default_factory=set)
    """Pods whose processes died with their machine's power (reported once it runs)."""
    _heartbeat: dict[str, float] = field(default_factory=dict)
    _ip_seq: int = 10
    _lock: threading.RLock = field(default_factory=threading.RLock)
    logs: dict[tuple[str, str, str], str] = field(default_factory=dict)
    """What each container wrote (namespace, pod, container), as a kubelet keeps it."""
    _log_uid: dict[tuple[str, str, str], str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.core: Any = client.CoreV1Api(self.api)
        self.coordination: Any = client.CoordinationV1Api(self.api)
        self.apps: Any = client.AppsV1Api(self.api)
        self.names = {n for n, _, _ in self.nodes}
        self.index = {n: i for n, _, i in self.nodes}
        self.pool = {n: p for n, p, _ in self.nodes}
        self.gpus = {n: int(p.gpus) for n, p, _ in self.nodes}
        # As registered: the device plugin counts as registered until its first pod runs.
        self.machines = {n: Machine(steady=True) for n in self.names}
        self._allocatable: dict[str, str] = {}
        self._health_at = 0.0
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="job-pod")

    # -- nodes --------------------------------------------------------------------------

    def register(self) -> None:
        for name, pool, index in self.nodes:
            self._register(name, pool, index)

    def _register(self, name: str, pool: Pool, index: int) -> None:
        obj = fleet.node_object(name, pool, index)
        status = obj.pop("status")
        obj["spec"].pop("podCIDRs", None)
        if self.kubelet_port:
            # Where the API server reaches this kubelet for pods/log: every node's kubelet
            # is this process, on the loopback (the API server prefers ExternalIP here).
            status["addresses"] = [*status["addresses"],
                                   {"type": "ExternalIP", "address": "127.0.0.1"}]
            status["daemonEndpoints"] = {"kubeletEndpoint": {"Port": self.kubelet_port}}
        _create(self.core.create_node, obj)
        self.core.patch_node_status(name, {"status": status})
        self._renew_lease(name)
        self._heartbeat[name] = time.time()
        self._allocatable.pop(name, None)
        self._ensure_mirror_pod(name)

    # -- scripted machine faults (`gpu-remediate sim node ...` in the cluster simulator) --

    def command(self, node: str, what: NodeCommand, *, hard: bool = False) -> None:
        """hang: the next reboot never returns (``hard``: the machine loses power now, with
        no graceful shutdown); wedge: the kubelet stops (no status, no Lease, nothing
        starts, no deletion confirmed: pods stay Terminating); replace: the Node, its Lease
        and pods are deleted and a new machine registers under the same name (a new UID)
        ``reregister_seconds`` later; recover: ends hang and wedge, and completes a hung
        reboot or boots a machine that lost power."""
        if hard and what != "hang":
            raise ValueError("hard applies to hang only")
        with self._lock:
            m = self.machines[node]
            now = time.time()
            if what == "hang" and hard:
                self._power_loss(node, m)
            elif what == "hang":
                if not m.powered and m.registered:
                    m.boot_at = None  # already down: this reboot never returns
                else:
                    m.hang_next_reboot = True
                m.events.append("hang: the next reboot never returns")
            elif what == "wedge":
                m.wedged = True
                m.events.append("wedged: the kubelet stopped")
            elif what == "replace":
                self._replace(node, m, now)
            elif what == "recover":
                m.hang_next_reboot = False
                if not m.registered:
                    m.register_at = now
                if m.wedged:
                    m.wedged = False
                    m.events.append("recovered: the kubelet runs again")
                    self._heartbeat.pop(node, None)  # status at once
                if m.registered and not m.powered and m.boot_at is None:
                    m.boot_at = now
                    m.events.append("recovered: the hung reboot completes")
            else:
                raise ValueError(f"unknown node command {what!r}")
            log.info("%s: %s", node, m.events[-1])

    def _power_loss(self, node: str, m: Machine) -> None:
        """Power lost (sim/cluster/kubelet.py): no graceful node shutdown, so nothing on the
        node is told and the API server hears nothing: the kubelet just stops posting (the
        node-lifecycle controller marks it Unknown after its grace period), its pods keep
        their phase (Running stays Running, no deletion is confirmed), and the machine does
        not come back until ``recover``. A Job's pod that ran then ends Failed once the
        kubelet runs again (restartPolicy Never: its container is not restarted)."""
        if not m.registered:
            return
        m.shutdown_at = None
        m.hang_next_reboot = False
        m.boot_at = None
        m.plugin_at = None
        m.plugin_instance, m.plugin_registered, m.steady = None, False, False
        m.plugin_unhealthy.clear()
        m.power_lost = True
        if m.powered:
            m.powered = False
            m.reboots += 1
        m.events.append("power lost: no graceful shutdown, never returns until recover")
        # The processes die with the machine; the API server is not told.
        for pod in self._pods():
            if pod["spec"].get("nodeName") == node:
                uid = pod["metadata"]["uid"]
                if self._running.pop(uid, None) is not None:
                    self._lost.add(uid)
                self._deleting.pop(uid, None)

    def _replace(self, node: str, m: Machine, now: float) -> None:
        for pod in self._pods():
            if pod["spec"].get("nodeName") == node:
                self._running.pop(pod["metadata"]["uid"], None)
                self._deleting.pop(pod["metadata"]["uid"], None)
                self._delete_now(pod)
        with contextlib.suppress(client.ApiException):
            self.coordination.delete_namespaced_lease(node, "kube-node-lease")
        with contextlib.suppress(client.ApiException):
            self.core.delete_node(node)
        self._heartbeat.pop(node, None)
        fresh = Machine(register_at=now + self.timing.reregister_seconds, reboots=m.reboots,
                        steady=True)
        fresh.events = [*m.events, "replaced: deleted, a new machine registers"]
        self.machines[node] = fresh

    def _set_ready(self, name: str, ready: bool, message: str) -> None:
        now = rfc3339()
        node = _json(self.core.read_node(name, _preload_content=False))
        conds = (node.get("status") or {}).get("conditions") or []
        old: Obj = next((c for c in conds if c["type"] == "Ready"), {})
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
            if not self.is_up(name) or now - self._heartbeat.get(name, 0) < HEARTBEAT_SECONDS:
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

    # -- the machines: reboot ---------------------------------------------------------------

    def is_up(self, node: str) -> bool:
        """The kubelet runs: powered, registered and not wedged. It posts status and runs
        pods; otherwise nothing starts, nothing is reported, no deletion is confirmed."""
        return self.machines[node].kubelet_running

    def allocatable_gpus(self, node: str) -> int:
        """What this kubelet reports allocatable: 0 until the device plugin registers, then
        the GPUs it does not hold unhealthy."""
        m = self.machines[node]
        if not m.powered or not (m.plugin_registered or m.steady):
            return 0
        return m.healthy_gpus(self.gpus[node])

    def request_reboot(self, node: str) -> bool:
        """A reboot command ran on the node: schedule its shutdown (once, however many
        commands come before it). True when the command returns before the shutdown."""
        with self._lock:
            m = self.machines[node]
            returns_first, delay = reboot_draw(self.timing, node, m.reboots)
            if m.shutdown_at is None and m.powered:
                m.shutdown_at = time.time() + delay
                m.events.append(f"reboot requested; shutdown in {delay:.2f}s, command "
                                + ("returns first" if returns_first else "killed by the shutdown"))
                log.info("%s: %s", node, m.events[-1])
            return returns_first

    def _machine_events(self, name: str, now: float) -> None:
        m = self.machines[name]
        if m.register_at is not None and now >= m.register_at:
            self._register(name, self.pool[name], self.index[name])
            m.register_at = None  # after the writes: a refused one is tried again
            m.events.append("registered as a new node")
        if m.shutdown_at is not None and now >= m.shutdown_at:
            self._shutdown(name, m, now)
        if not m.powered and m.boot_at is not None and now >= m.boot_at:
            self._boot(name, m, now)

    # -- the device plugin ----------------------------------------------------------------

    def _device_plugin(self, node: str, pod: Obj | None, now: float) -> None:
        """Follow the node's device-plugin pod (the sim/cluster/kubelet.py rules): a new
        instance (a new pod, or a container restart) starts with every GPU healthy and
        registers ``device_plugin_seconds`` later; none running means no GPUs."""
        m = self.machines[node]
        if pod is not None:
            m.plugin_managed = True  # a device-plugin DaemonSet serves this node
        if not m.plugin_managed and pod is None:
            # No device-plugin DaemonSet at boot: the plugin registers on its own.
            if m.plugin_at is not None and now >= m.plugin_at:
                m.plugin_at, m.steady = None, True
                m.events.append("device plugin registered")
            if self.gpus[node]:
                self._write_allocatable(node)
            return
        was = m.plugin_registered
        m.follow_plugin(plugin_instance(pod), now, self.timing.device_plugin_seconds)
        if m.plugin_registered and not was:
            log.info("%s: device plugin registered", node)
        if self.gpus[node]:
            self._write_allocatable(node)

    def _plugin_daemonset(self) -> bool:
        try:
            self.apps.read_namespaced_daemon_set(fleet.DEVICE_PLUGIN, fleet.OPERATOR_NAMESPACE,
                                                 _preload_content=False)
        except client.ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    def _write_allocatable(self, node: str) -> None:
        want = str(self.allocatable_gpus(node))
        if self._allocatable.get(node, str(self.gpus[node])) != want:
            self.core.patch_node_status(node, {"status": {"allocatable": {GPU: want}}})
            self._allocatable[node] = want  # after the write: a refused patch is retried

    def _plugin_health(self, now: float) -> None:
        """The device plugins' health checks: one request to the GPU simulator for the
        whole fleet, only while some plugin runs."""
        if not self.gpu_url or now - self._health_at < self.timing.plugin_health_seconds:
            return
        self._health_at = now
        if not any(m.plugin_instance is not None for m in self.machines.values()):
            return
        xids = asyncio.run(_fleet_xids(self.gpu_url))
        if xids:
            self.plugin_saw(xids)

    def plugin_saw(self, xids: dict[str, dict[int, list[int]]]) -> None:
        """What the nodes' device plugins see of the XIDs (sim/cluster/machines.py rules)."""
        for node in sorted(self.names & set(xids)):
            self.machines[node].plugin_saw(xids[node])

    def _shutdown(self, node: str, m: Machine, now: float) -> None:
        """Graceful node shutdown: every pod on the node is killed, the kubelet stops."""
        m.shutdown_at = None
        m.powered = False
        m.plugin_at = None
        m.plugin_instance, m.plugin_registered, m.steady = None, False, False
        m.plugin_unhealthy.clear()
        m.reboots += 1
        if m.hang_next_reboot:
            m.hang_next_reboot = False
            m.boot_at = None
            m.events.append("shut down; this reboot never returns (hang)")
        else:
            m.boot_at = now + self.timing.reboot_seconds
            m.events.append("shut down for a reboot")
        log.info("%s: shut down for a reboot (back in %.1fs)", node, self.timing.reboot_seconds)
        self._set_ready(node, False, "node is shutting down for a reboot (simulated)")
        for pod in self._pods():
            if pod["spec"].get("nodeName") == node:
                self._shutdown_pod(pod)

    def _boot(self, node: str, m: Machine, now: float) -> None:
        """Up again: a new boot ID, Ready, and no GPUs until the device plugin registers."""
        managed = bool(self.gpus[node]) and self._plugin_daemonset()
        status: Obj = {"nodeInfo": {"bootID": str(uuid.uuid4())}}
        if self.gpus[node]:
            status["allocatable"] = {GPU: "0"}
        self.core.patch_node_status(node, {"status": status})
        # After the write: a refused patch is tried again on the next pass. The GPUs come
        # back when the device-plugin pod runs again (it restarts in place).
        if self.gpus[node]:
            self._allocatable[node] = "0"
            m.plugin_managed = managed
            if not managed:
                m.plugin_at = now + self.timing.device_plugin_seconds
        m.powered = True
        m.boot_at = None
        m.power_lost = False
        m.events.append(f"booted (bootID {status['nodeInfo']['bootID']})")
        log.info("%s: %s", node, m.events[-1])
        self._set_ready(node, True, "kubelet is posting ready status")
        self._renew_lease(node)
        self._heartbeat[node] = now

    def _shutdown_pod(self, pod: Obj) -> None:
        m = pod["metadata"]
        self._running.pop(m["uid"], None)
        self._killed.add(m["uid"])
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
            for name in sorted(self.names):
                self._machine_events(name, now)
            self._heartbeats(now)
            pods = self._pods()
            plugins = {p["spec"]["nodeName"]: p for p in pods if _is_plugin(p)}
            for name in sorted(self.names):
                if self.is_up(name):
                    self._device_plugin(name, plugins.get(name), now)
            self._plugin_health(now)
            for pod in pods:
                if not self.is_up(pod["spec"]["nodeName"]):
                    # A machine that is down starts nothing, reports nothing and confirms
                    # no deletion: its pods stay as the API server last heard of them.
                    continue
                try:
                    self._sync(pod, pods, now)
                except client.ApiException as err:
                    log.warning("pod %s/%s: %s %s", pod["metadata"]["namespace"],
                                pod["metadata"]["name"], err.status, err.reason)

    def _sync(self, pod: Obj, pods: list[Obj], now: float) -> None:
        m = pod["metadata"]
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
        if _terminal(pod):
            return
        running = self._running.get(uid)
        phase = (pod.get("status") or {}).get("phase", "Pending")
        annotations = m.get("annotations") or {}
        delay = float(annotations.get(objects.READINESS_DELAY, "0") or 0)
        if phase == "Pending":
            if self._admit(pod, pods):
                self._start(pod, now, delay)
        elif running is None and uid in self._lost:
            # Its process died with the machine's power: with restartPolicy Never nothing
            # restarts it, otherwise its containers restart in place.
            self._lost.discard(uid)
            if (pod.get("spec") or {}).get("restartPolicy") == "Never":
                self._fail_lost(pod)
            else:
                self._restart(pod, now, delay)
        elif running is None:
            # A Running pod this kubelet does not track: a DaemonSet or static pod after a
            # reboot (or any pod after this process restarted). Unready ones restart.
            self._restart(pod, now, delay)
        elif not _ready(pod) and now >= running.ready_at and not running.program:
            self._patch_status(pod, {"conditions": self._ready_conditions(True)})

    def _fail_lost(self, pod: Obj) -> None:
        ts = rfc3339()
        statuses = [{**cs, "ready": False, "started": False, "state": {"terminated": {
            "exitCode": 137, "reason": "Error", "startedAt": ts, "finishedAt": ts}}}
            for cs in (pod.get("status") or {}).get("containerStatuses") or []]
        self._patch_status(pod, {"phase": "Failed", "reason": "Terminated",
                                 "message": "The node lost power while the pod ran.",
                                 "containerStatuses": statuses,
                                 "conditions": self._ready_conditions(False)})

    def _restart(self, pod: Obj, now: float, delay: float) -> None:
        uid = pod["metadata"]["uid"]
        if _ready(pod):
            self._running[uid] = _Running(ready_at=now)
            return
        self._running[uid] = _Running(ready_at=now + delay)
        ts = rfc3339(now)
        statuses = [{**cs, "restartCount": int(cs.get("restartCount") or 0) + 1,
                     "started": True, "ready": False, "state": {"running": {"startedAt": ts}}}
                    for cs in (pod.get("status") or {}).get("containerStatuses") or []]
        if statuses:
            self._patch_status(pod, {"containerStatuses": statuses})

    def _admit(self, pod: Obj, pods: list[Obj]) -> bool:
        want = _gpu_request(pod)
        if not want:
            return True
        node = pod["spec"]["nodeName"]
        # Allocatable, not capacity: 0 after a boot until the device plugin registers.
        capacity = self.allocatable_gpus(node)
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
        pod = self._with_field_env(pod)
        if kind == "validate":
            command = dcgmi.command_line(pod)
            if dcgmi.runs_dcgmi(command):
                return self._dcgmi(pod, node, command)
            if dcgmi.runs_dcgmi(dcgmi.command_line(pod, resolve=False)):
                # A dcgmi script whose branch for this environment runs no dcgmi (no host
                # engine chosen): it proves nothing, and ends as its shell would.
                out = "no DCGM host engine chosen: the diagnostic did not run\n"
                self.write_log(pod, out)
                return 3, out.strip()
        if kind == "gpu-reset":
            return asyncio.run(self._reset(pod, node))
        if self.gpu_url and kind in ("validate", "reboot"):
            # The same calls, retries and messages as the cluster simulator's Job programs.
            outcome = asyncio.run(_gpu_call(self.gpu_url, kind, node, _gpu_index(pod)))
            if not outcome.ok:
                return 1, "; ".join(outcome.problems) or "GPU unhealthy"
        # Without a GPU simulator validation passes; a reboot still reboots the machine
        # (as the cluster simulator does).
        if kind == "reboot" and not self.request_reboot(node):
            # The shutdown kills this container (the kubelet marks the pod Failed). Should
            # that not happen, end as a killed process would.
            uid = pod["metadata"]["uid"]
            deadline = time.monotonic() + self.timing.shutdown_seconds + 30.0
            while uid not in self._killed and time.monotonic() < deadline:
                time.sleep(0.05)
            return 137, "killed by the node shutdown"
        return 0, ""  # a reboot: `systemctl reboot` returned before the shutdown began

    def _with_field_env(self, pod: Obj) -> Obj:
        """The pod as its container sees its environment: ``status.hostIP`` and
        ``spec.nodeName`` field references resolved, as the kubelet does (the worker sets
        ``NODE_IP`` from ``status.hostIP`` for the standalone host engine)."""
        node = pod["spec"]["nodeName"]
        fields = {"status.hostIP": fleet.node_ip(self.index[node]), "spec.nodeName": node}
        containers = []
        for c in (pod.get("spec") or {}).get("containers") or []:
            env = []
            for e in c.get("env") or []:
                path = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
                env.append({"name": e.get("name"), "value": fields[path]}
                           if path in fields else e)
            containers.append({**c, "env": env})
        return {**pod, "spec": {**pod["spec"], "containers": containers}}

    async def _reset(self, pod: Obj, node: str) -> tuple[int, str]:
        """The reset container, as the cluster simulator's (sim/cluster/jobs.py): refused
        while another pod holds a GPU, and by the GPU simulator while a target GPU has
        persistence mode on; ``-pm 0`` in the command turns it off for the targets only
        (by ``GPU_UUIDS``, else ``GPU_INDEX``, else every GPU), ``-pm 1`` back on where it
        was on."""
        index = _gpu_index(pod)
        uuids = _env(pod, "GPU_UUIDS")
        command = dcgmi.command_line(pod)
        holders = self._gpu_holders(node, pod["metadata"]["uid"])
        link = GpuLink(self.gpu_url)
        try:
            gpus = await link.gpus(node)
            if holders:
                message = dcgmi.reset_in_use(index, self.gpus[node], holders, gpus or [])
                self.write_log(pod, message + "\n")
                return dcgmi.SMI_IN_USE_EXIT, message
            named = [u.strip() for u in (uuids or "").replace(" ", ",").split(",") if u.strip()]
            targets: list[str | None] = list(named) or [index]
            was_on: list[str] = []
            if gpus is not None:
                by_uuid = {str(g.get("uuid")): g for g in gpus}
                by_index = {str(g.get("index")): g for g in gpus}
                if named:
                    wanted = named
                elif index is not None:
                    wanted = [str(by_index[index]["uuid"])] if index in by_index else [index]
                else:
                    wanted = list(by_uuid)
                unknown = [u for u in wanted if u not in by_uuid]
                if unknown:
                    message = f"No devices were found matching {', '.join(unknown)}"
                    self.write_log(pod, message + "\n")
                    return dcgmi.SMI_NOT_FOUND_EXIT, message
                if dcgmi.turns_persistence_off(command):
                    for u in wanted:
                        if by_uuid[u].get("persistence_mode"):
                            await link.persistence(node, u, False)
                            was_on.append(u)
                targets = list(wanted) if (named or index is not None) else [None]
            problems: list[str] = []
            cleared: list[dict[str, object]] = []
            for target in targets:
                outcome = await link.reset(node, target)
                problems += outcome.problems
                cleared += outcome.cleared
            if dcgmi.restores_persistence(command):
                for u in was_on:
                    await link.persistence(node, u, True)
        finally:
            await link.aclose()
        if problems:
            message = "; ".join(problems)
            self.write_log(pod, message + "\n")
            return 1, message
        # The device plugin on the node saw the XIDs this reset cleared.
        xids: dict[int, list[int]] = {}
        for c in cleared:
            gpu, value = c.get("gpu"), c.get("value")
            if c.get("kind") == "xid" and isinstance(gpu, int) and isinstance(value, int):
                xids.setdefault(gpu, []).append(value)
        if xids:
            with self._lock:
                self.plugin_saw({node: xids})
        done = "all GPUs" if targets == [None] else ", ".join(str(t) for t in targets)
        self.write_log(pod, f"GPU {done} on {node} reset.\nAll done.\n")
        return 0, ""

    def _gpu_holders(self, node: str, exclude_uid: str) -> list[Obj]:
        """Pods running on the node that keep its GPUs open: they request nvidia.com/gpu
        or are operands holding /dev/nvidia* (terminating ones run until killed)."""
        return [p for p in self._pods()
                if p["spec"].get("nodeName") == node and p["metadata"]["uid"] != exclude_uid
                and (p.get("status") or {}).get("phase") == "Running"
                and (_gpu_request(p) > 0 or (p["metadata"].get("annotations") or {}).get(
                    objects.HOLDS_GPUS) == "true")]

    def _engines(self, node: str, pods: list[Obj]) -> list[str]:
        """The host engine already running for the node's GPUs: the standalone nvidia-dcgm
        operand (starting, running or stopping), else the one dcgm-exporter embeds (until
        its pod is gone, Terminating or not); none when neither runs."""
        on_node = [p for p in pods if p["spec"].get("nodeName") == node and not _terminal(p)]
        if any((p["metadata"].get("labels") or {}).get("app") == "nvidia-dcgm"
               for p in on_node):
            return ["the standalone nvidia-dcgm operand"]
        return [f"{p['metadata']['namespace']}/{p['metadata']['name']} (embedded)"
                for p in on_node
                if (p["metadata"].get("labels") or {}).get("app") == "nvidia-dcgm-exporter"]

    @staticmethod
    def _node_host_engine(node: str, pods: list[Obj]) -> bool:
        """The GPU Operator's nvidia-dcgm pod (the standalone nv-hostengine) runs Ready on
        the node: `dcgmi --host` reaches it."""
        return any(p["spec"].get("nodeName") == node and _ready(p)
                   and (p["metadata"].get("labels") or {}).get("app") == "nvidia-dcgm"
                   and not p["metadata"].get("deletionTimestamp") for p in pods)

    def _dcgmi(self, pod: Obj, node: str, command: str) -> tuple[int, str]:
        """A validation container running dcgmi: a client of nv-hostengine, one host engine
        per node (sim/cluster/jobs.py): its own beside the node's running one fails, and
        ``--host`` reaches the standalone nvidia-dcgm operand only."""
        engine = dcgmi.host_engine(command)
        pods = self._pods()
        running = self._engines(node, pods)
        if engine.embedded and running:
            code, out = dcgmi.second_engine(running)
        elif (not engine.embedded and engine.host is not None
                and not self._node_host_engine(node, pods)):
            code, out = dcgmi.unreachable_host(_expand(engine.host, pod))
        else:
            health = None
            if (engine.embedded or engine.host is not None) and dcgmi.runs_diag(command) \
                    and self.gpu_url:
                health = asyncio.run(_gpu_call(self.gpu_url, "validate", node, None))
            env = {str(e.get("name")): str(e.get("value", "")) for c in
                   ((pod.get("spec") or {}).get("containers") or [])[:1]
                   for e in c.get("env") or [] if "value" in e}
            code, out = dcgmi.run(command, engine, self.gpus[node], dcgmi.DEFAULT_DRIVER,
                                  health, dcgmi.gpu_list(command, env))
        self.write_log(pod, out)
        return code, dcgmi.termination_message(pod, code, out) or (
            out.strip().splitlines()[-1][:200] if code and out.strip() else "")

    def write_log(self, pod: Obj, text: str) -> None:
        """Append to the stdout of the pod's first container, served at the kubelet's
        ``/containerLogs`` (``pods/log`` through the API server)."""
        containers = (pod.get("spec") or {}).get("containers") or []
        if not containers or not text:
            return
        m = pod["metadata"]
        key = (m["namespace"], m["name"], str(containers[0]["name"]))
        with self._lock:
            if self._log_uid.get(key) != m["uid"]:
                self._log_uid[key] = m["uid"]
                self.logs[key] = ""
            self.logs[key] += text

    def _run_program(self, pod: Obj) -> None:
        try:
            code, message = self._program(pod)
        except Exception as err:  # a crashed program is a failed container
            log.exception("job pod program failed")
            code, message = 1, str(err)
        m = pod["metadata"]
        # A container that ends while the machine is down is reported when the kubelet
        # runs again (if the shutdown has not already ended it).
        while not self.is_up(pod["spec"]["nodeName"]):
            time.sleep(0.05)
        with self._lock:
            if m["uid"] in self._lost:
                return  # it died with the machine's power: _sync reports it
            try:
                current = _json(self.core.read_namespaced_pod(m["name"], m["namespace"],
                                                              _preload_content=False))
            except client.ApiException:
                return
            self._killed.discard(m["uid"])
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


async def _fleet_xids(url: str) -> dict[str, dict[int, list[int]]] | None:
    link = GpuLink(url)
    try:
        return await link.fleet_xids()
    finally:
        await link.aclose()


def _is_plugin(pod: Obj) -> bool:
    """A device-plugin pod running Ready and not told to stop."""
    m = pod["metadata"]
    return (m.get("namespace") == fleet.OPERATOR_NAMESPACE and not m.get("deletionTimestamp")
            and (m.get("labels") or {}).get("app") == fleet.DEVICE_PLUGIN
            and (pod.get("status") or {}).get("phase") == "Running" and _ready(pod))


def _expand(text: str, pod: Obj) -> str:
    """``$VAR`` and ``${VAR}`` from the pod's container environment, as its shell expands
    them (``--host "$NODE_IP"``)."""
    return re.sub(r"\$\{?(\w+)\}?", lambda m: _env(pod, m.group(1)) or "", text)


def _env(pod: Obj, name: str) -> str | None:
    for c in pod["spec"].get("containers") or []:
        for env in c.get("env") or []:
            if env.get("name") == name and env.get("value") not in (None, ""):
                return str(env["value"])
    return None


def _gpu_index(pod: Obj) -> str | None:
    value = _env(pod, "GPU_INDEX")
    if value is not None:
        return value
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
    parser.add_argument("--reboot-seconds", type=float, default=3.0,
                        help="a reboot's NotReady window")
    parser.add_argument("--shutdown-seconds", type=float, default=1.0,
                        help="longest time from the reboot command to the shutdown")
    parser.add_argument("--device-plugin-seconds", type=float, default=1.0,
                        help="Ready after a boot to nvidia.com/gpu allocatable again")
    parser.add_argument("--reboot-seed", type=int, default=0,
                        help="seed of the draw 'reboot command returns first' / 'pod killed'")
    parser.add_argument("--ready-timeout", type=float, default=120.0)
    parser.add_argument("--kubelet-cert", type=Path,
                        help="serve the kubelet API (pod logs) over HTTPS with this "
                             "certificate (and --kubelet-key), on the loopback")
    parser.add_argument("--kubelet-key", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    scenario = load_scenario(args.scenario)
    api = config.new_client_from_config(config_file=args.kubeconfig)
    agent = NodeAgent(api, scenario_nodes(scenario), gpu_url=args.gpu_sim_url,
                      job_seconds=args.job_seconds,
                      timing=NodeTiming(reboot_seconds=args.reboot_seconds,
                                        shutdown_seconds=args.shutdown_seconds,
                                        device_plugin_seconds=args.device_plugin_seconds,
                                        seed=args.reboot_seed))
    if args.kubelet_cert is not None:
        # Bind before registering: the nodes name the port.
        server = serve_logs(agent, args.kubelet_cert, args.kubelet_key or args.kubelet_cert)
        agent.kubelet_port = int(server.server_address[1])
        log.info("kubelet API on 127.0.0.1:%d", agent.kubelet_port)
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

