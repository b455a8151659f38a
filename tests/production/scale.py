"""A large fleet observed by several workers on the production topology: a measurement that
prints figures (not a test). docs/performance.md ("A 50,000-node fleet") quotes its output
and the model built on it.

    GPU_REMEDIATE_PRODUCTION=cached .venv/bin/python -m tests.production.scale \\
        --nodes 20000 --workers 2 --ticks 6

Starts PostgreSQL, the Temporal server (tests/production/build.sh), the GPU simulator and
the cluster simulator with ``--nodes`` 8-GPU nodes (no pods), ``--workers`` worker
processes and the detector (interval ``--interval``, shard size ``--shard-size``). After
one warm-up tick it measures ``--ticks`` ticks from the detector's history and the processes:

- per tick: wall time from the first observation scheduled to the last one completed, and
  which worker process ran each shard (its identity);
- history events and bytes per tick, and the PostgreSQL databases' growth per tick;
- CPU seconds per tick of each worker process, the simulators and the Temporal server and
  PostgreSQL (from /proc), and each worker's peak RSS.

The results are appended to tools/bench/results/production_scale.json (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client, config
from temporalio.api.enums.v1 import EventType

from tests.e2e.kit import detector_view, run
from tests.production.topology import REPO, ProductionStack, Replica, built_server
from worker.config import TemporalSettings
from worker.stack import Ports
from worker.temporal_client import connect
from workflows.ids import DETECTOR_WORKFLOW_ID

RESULTS = REPO / "tools" / "bench" / "results" / "production_scale.json"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its reaped children."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / CLK_TCK


def tree_cpu(pid: int) -> float:
    """CPU of a process and its live descendants (the PostgreSQL backends)."""
    total = cpu_seconds(pid)
    for task in Path("/proc").iterdir():
        if not task.name.isdigit():
            continue
        try:
            ppid = int((task / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            total += tree_cpu(int(task.name))
    return total


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def postgres_pid(stack: ProductionStack) -> int:
    assert stack.pg is not None
    return int((stack.pg.data / "postmaster.pid").read_text().split()[0])


def processes(stack: ProductionStack) -> dict[str, int]:
    procs = {p.name: p.proc.pid for p in stack.parts}
    if getattr(stack, "controlplane", None) is not None and stack.controlplane.proc:
        procs["kube-apiserver"] = stack.controlplane.proc.pid
    procs["postgresql"] = postgres_pid(stack)
    return procs


def db_bytes(stack: ProductionStack) -> int:
    assert stack.pg is not None
    return int(stack.pg.psql("SELECT sum(pg_database_size(datname)) FROM pg_database "
                             "WHERE datname LIKE 'temporal%'"))


async def detector_ticks(stack: ProductionStack) -> list[dict[str, Any]]:
    """Per tick of the detector's current run: observation wall time, shard identities,
    events and bytes of history."""
    client = await connect(TemporalSettings(address=stack.temporal_address))
    handle = client.get_workflow_handle(DETECTOR_WORKFLOW_ID)
    ticks: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    scheduled: dict[int, tuple[datetime, str]] = {}
    started_by: dict[int, str] = {}
    async for e in handle.fetch_history_events():
        t = e.event_time.ToDatetime()
        size = e.ByteSize()
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED and \
                e.activity_task_scheduled_event_attributes.activity_type.name == "observe_fleet":
            if current is None or current.get("closed"):
                current = {"first": t, "last": t, "shards": [], "events": 0, "bytes": 0}
                ticks.append(current)
            scheduled[e.event_id] = (t, "")
        if current is not None:
            current["events"] += 1
            current["bytes"] += size
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started_by[e.activity_task_started_event_attributes.scheduled_event_id] = \
                e.activity_task_started_event_attributes.identity
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            sid = e.activity_task_completed_event_attributes.scheduled_event_id
            if sid in scheduled and current is not None:
                current["last"] = t
                current["shards"].append(started_by.get(sid, "?"))
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED and current is not None:
            current["closed"] = True
    return [{"wall_s": (tk["last"] - tk["first"]).total_seconds(), "shards": tk["shards"],
             "events": tk["events"], "bytes": tk["bytes"]} for tk in ticks if tk.get("closed")]


@dataclass
class ScaleStack(ProductionStack):
    """The production topology with a fleet of ``fleet`` 8-GPU nodes: the GPU simulator in
    fleet mode, and Node objects created through the cluster simulator's API. Nodes
    created through the API have no simulated kubelet (no heartbeats, no operand pods),
    which is what lets one Python process hold 20,000 of them; the detector only lists
    them and scrapes their exporters."""

    fleet: int = 0
    controlplane_binary: Path | None = None
    controlplane: Any = None

    def start_cluster(self) -> None:
        """With ``controlplane_binary``: the real kube-apiserver (tests/controlplane) holds
        the Node objects instead of the cluster simulator."""
        if self.controlplane_binary is None:
            super().start_cluster()
            return
        from tests.controlplane.controlplane import ControlPlane

        cp_dir = self.data_dir / "controlplane"
        cp_dir.mkdir(parents=True, exist_ok=True)
        self.controlplane = ControlPlane(self.controlplane_binary, cp_dir).start()
        self.kubeconfig.write_text(self.controlplane.kubeconfig.read_text())
        # What the GPU Operator installs: the worker refuses to start without the
        # RuntimeClass its reset template names (activities/prerequisites.py).
        with config.new_client_from_config(config_file=str(self.kubeconfig)) as api:
            client.NodeV1Api(api).create_runtime_class(
                {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                 "metadata": {"name": "nvidia"}, "handler": "nvidia"})

    def stop(self) -> None:
        super().stop()
        if self.controlplane is not None:
            self.controlplane.stop()

    def start_gpu_simulator(self) -> None:
        gpu = self._spawn("gpu-simulator", self._cli(
            "sim", "gpu", "serve", "--port", str(self.ports.gpu), "--nodes", str(self.fleet),
            "--gpus", "8"))
        self._wait(gpu, lambda: httpx.get(f"{self.gpu_url}/healthz", timeout=1).status_code
                   == 200, timeout=300)

    def start_simulators(self) -> None:
        super().start_simulators()
        api = config.new_client_from_config(config_file=str(self.kubeconfig))
        core = client.CoreV1Api(api)

        def create(i: int) -> None:
            core.create_node(client.V1Node(
                metadata=client.V1ObjectMeta(name=f"gpu-node-{i:05d}", labels={
                    "kubernetes.io/hostname": f"gpu-node-{i:05d}",
                    "nvidia.com/gpu.present": "true"}),
                status=client.V1NodeStatus(
                    capacity={"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti"},
                    allocatable={"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti"},
                    conditions=[client.V1NodeCondition(type="Ready", status="True")])))

        started = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(create, range(1, self.fleet + 1)))
        api.close()
        print(f"{self.fleet} Node objects created in {time.monotonic() - started:.0f}s",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=20000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ticks", type=int, default=6)
    ap.add_argument("--interval", default="PT30S")
    ap.add_argument("--shard-size", type=int, default=5000)
    ap.add_argument("--api", choices=["controlplane", "sim"], default="controlplane",
                    help="what serves the Kubernetes API: the real kube-apiserver of "
                         "tests/controlplane (built and cached) or the cluster simulator")
    args = ap.parse_args()

    server = built_server()
    if server is None:
        raise SystemExit("build the Temporal server first: tests/production/build.sh")
    data = Path(tempfile.mkdtemp(prefix="gpu-remediate-scale-"))
    scenario = data / "scenario.yaml"
    scenario.write_text(json.dumps({
        "name": "scale", "description": "no machines; the GPU nodes come through the API",
        "pools": [], "workloads": []}))
    binary = None
    if args.api == "controlplane":
        from tests.controlplane.controlplane import cached_binary

        binary = cached_binary()
        if binary is None:
            raise SystemExit("build the control plane first: tests/controlplane/build.sh")
    stack = ScaleStack(
        data_dir=data, scenario=str(scenario), ports=Ports.ephemeral(), headless=True,
        replicas=args.workers, server=server, fleet=args.nodes, controlplane_binary=binary,
        overrides={"detector.interval": args.interval,
                   "detector.observe_shard_size": args.shard_size,
                   "detector.observe_timeout": "PT5M",
                   "detector.breaker_max_flagged_percent": 100})
    t0 = time.monotonic()
    with stack:
        startup = time.monotonic() - t0
        print(f"stack up in {startup:.0f}s ({args.nodes} nodes, {args.workers} workers)",
              flush=True)
        # Warm-up: the first tick learns the fleet's size (one shard), the second shards it.
        deadline = time.monotonic() + 900
        while detector_view(stack).ticks_total < 2 and time.monotonic() < deadline:
            time.sleep(2)
        procs = processes(stack)
        cpu0 = {n: tree_cpu(p) for n, p in procs.items()}
        db0, ticks0 = db_bytes(stack), detector_view(stack).ticks_total
        t_start = time.monotonic()
        while detector_view(stack).ticks_total < ticks0 + args.ticks:
            if time.monotonic() - t_start > 60 * 60:
                raise SystemExit("ticks did not come in an hour")
            time.sleep(2)
        elapsed = time.monotonic() - t_start
        cpu1 = {n: tree_cpu(p) for n, p in procs.items()}
        db1, ticks1 = db_bytes(stack), detector_view(stack).ticks_total
        history = run(detector_ticks(stack))[-args.ticks:]
        workers: dict[str, Replica] = dict(stack.workers)
        ident = {f"{r.pid}@": r.name for r in workers.values()}
        rss = {r.name: round(peak_rss_mib(r.pid)) for r in workers.values()}
        last = detector_view(stack)
    n = ticks1 - ticks0
    per_tick_cpu = {name: round((cpu1[name] - cpu0[name]) / n, 2) for name in cpu0}
    shard_split: dict[str, int] = {}
    for tick in history:
        for who in tick["shards"]:
            name = next((v for k, v in ident.items() if who.startswith(k)), who)
            shard_split[name] = shard_split.get(name, 0) + 1
    walls = [t["wall_s"] for t in history]
    result = {
        "nodes": args.nodes, "api": args.api, "workers": args.workers,
        "shard_size": args.shard_size,
        "interval": args.interval, "ticks": n, "seconds": round(elapsed),
        "startup_s": round(startup),
        "observation_wall_s": {"median": round(statistics.median(walls), 2),
                               "max": round(max(walls), 2)} if walls else None,
        "shards_per_tick": len(history[-1]["shards"]) if history else 0,
        "shards_by_worker": shard_split,
        "history_events_per_tick": statistics.median(t["events"] for t in history)
        if history else None,
        "history_bytes_per_tick": statistics.median(t["bytes"] for t in history)
        if history else None,
        "postgres_growth_bytes_per_tick": round((db1 - db0) / n),
        "postgres_bytes": db1,
        "cpu_s_per_tick": per_tick_cpu,
        "worker_peak_rss_mib": rss,
        "last_errors": last.last_errors,
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version(),
                    "load": os.getloadavg()},
    }
    print(json.dumps(result, indent=2))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as out:
        out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
