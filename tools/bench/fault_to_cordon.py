"""Fault injection -> node cordoned, with the real stack, with and without the node watcher.

Run: ``.venv/bin/python -m tools.bench.fault_to_cordon [--injections 20] [--interval 5]
[--modes scrape,watcher]``

For each mode, starts the real local stack (Temporal dev server, GPU simulator, cluster
simulator and the worker as processes, ephemeral ports; ``worker.stack.LocalStack``) on a
scenario with one node per injection, with the detector ticking every ``--interval``
seconds. Then, one at a time, each on a different node:

1. waits a random 0..interval seconds (seeded, the same draws in both modes), so injections
   land at every phase of the detector's tick;
2. injects XID 79 (GPU fallen off the bus: reboot) on GPU 0 through the simulator's API;
3. polls the node every 50 ms until ``spec.unschedulable`` is true and the
   ``gpu-remediate.io/state`` label says something other than healthy: the latency;
4. releases it: reboots the simulated node (which clears the fault and restarts the
   exporter) and aborts the remediation, then waits until the node is labelled healthy
   and schedulable again, so each injection starts from a quiet fleet.

Modes:

- ``scrape``: the detector sees the fault at its next tick (the exporter's gauge).
- ``watcher``: the node-bound event path as deployed, but in one process: the GPU simulator
  writes each node's kernel log (``GPU_SIM_KERNEL_LOG_DIR``), a watcher per node
  (``worker.watch``) follows it and reports to the worker's HTTPS endpoint
  (``reports.enabled``, a throw-away self-signed certificate) with a ServiceAccount token
  the cluster simulator issued for a pod on that node; the worker reviews the token
  (TokenReview) and signals the detector. Also measured: injection -> report accepted
  (the detector signalled), whatever the detector does with it. A detector without the
  ``node_report`` handler records the signal as unknown (the bench says so): then the
  cordon still waits for the next tick.

Reports p50, p95 and max per mode, side by side. Targets: p95 <= interval + 3 s (scrape),
p95 <= 1 s (watcher).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import random
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.bench._common import (
    free_port,
    make_stack,
    median,
    percentile,
    save,
    table,
    wait_until,
    worker_log_problems,
    write_scenario,
)

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api, V1Node

WATCH_NAMESPACE = "gpu-remediate"
WATCH_ACCOUNT = "gpu-remediate-watch"
AUDIENCE = "gpu-remediate"


def _name(node: V1Node) -> str:
    assert node.metadata is not None and node.metadata.name is not None
    return node.metadata.name


def _labels(node: V1Node) -> dict[str, str] | None:
    assert node.metadata is not None
    return node.metadata.labels


def _unschedulable(node: V1Node) -> bool | None:
    assert node.spec is not None
    return node.spec.unschedulable


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (openssl), for the report endpoint."""
    cert, key = directory / "reports.crt", directory / "reports.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=gpu-remediate-reports", "-addext",
                    "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


class Watchers:
    """One ``worker.watch`` watcher per node in a thread of their own, each with a token
    for a pod on its node, and when each report was accepted."""

    def __init__(self, core: CoreV1Api, nodes: list[str], logs: Path, url: str,
                 ca: Path, tokens: Path) -> None:
        from worker.watch.reporter import Reporter, ReporterSettings
        from worker.watch.watcher import Watcher, WatchSettings

        self.accepted: dict[str, float] = {}
        self._loop = asyncio.new_event_loop()
        self._tasks: list[asyncio.Task[None]] = []
        bench = self

        class Timed(Reporter):
            async def send(self, report: dict[str, Any]) -> bool:
                ok = await super().send(report)
                if ok:
                    bench.accepted.setdefault(str(report["node"]), time.monotonic())
                return ok

        with_pods(core, nodes)
        tokens.mkdir(parents=True, exist_ok=True)
        self.watchers = []
        for node in nodes:
            token = tokens / node
            token.write_text(request_token(core, node))
            settings = ReporterSettings(url=url, token_file=token, ca_file=ca)
            self.watchers.append(Watcher(
                WatchSettings(node=node, reporter=settings, kernel_log=logs / f"{node}.log"),
                reporter=Timed(settings)))
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> Watchers:
        self._thread.start()

        async def start() -> None:
            self._tasks = [asyncio.create_task(w.run()) for w in self.watchers]

        asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            for t in self._tasks:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def with_pods(core: Any, nodes: list[str]) -> None:
    """The watcher's namespace and a pod on each node (what the DaemonSet would run)."""
    from kubernetes.client.exceptions import ApiException

    try:
        core.create_namespace({"metadata": {"name": WATCH_NAMESPACE}})
    except ApiException as err:
        if err.status != 409:
            raise
    for node in nodes:
        core.create_namespaced_pod(WATCH_NAMESPACE, {
            "metadata": {"name": f"watch-{node}", "labels": {"app": "gpu-remediate-watch"}},
            "spec": {"nodeName": node, "serviceAccountName": WATCH_ACCOUNT,
                     "containers": [{"name": "watch", "image": "gpu-remediate"}]}})


def request_token(core: Any, node: str) -> str:
    pod = core.read_namespaced_pod(f"watch-{node}", WATCH_NAMESPACE)
    assert pod.metadata is not None
    answer = core.create_namespaced_service_account_token(WATCH_ACCOUNT, WATCH_NAMESPACE, {
        "spec": {"audiences": [AUDIENCE], "expirationSeconds": 3600,
                 "boundObjectRef": {"kind": "Pod", "apiVersion": "v1",
                                    "name": pod.metadata.name, "uid": pod.metadata.uid}}})
    assert answer.status is not None
    return str(answer.status.token)


def run_mode(mode: str, args: argparse.Namespace, data: Path) -> dict[str, Any]:
    from kubernetes import client, config

    from activities.node_keys import STATE_LABEL
    from sim.gpu.client import GpuSimClient
    from worker.cli import operator
    from worker.config import TemporalSettings
    from worker.temporal_client import connect
    from workflows.messages import OperatorCommand

    data.mkdir(parents=True, exist_ok=True)
    scenario = write_scenario(data / "scenario.yaml", args.injections)
    overrides: dict[str, Any] = {
        "detector.interval": f"PT{args.interval:g}S",
        # One slot per node, so a node whose release lags never delays the next injection.
        "detector.max_unavailable": args.injections,
        "remediation.drain.retry_interval": "PT1S"}
    logs = data / "kmsg"
    report_port = free_port()
    cert = key = None
    if mode == "watcher":
        cert, key = self_signed(data)
        overrides.update({"reports.enabled": True, "reports.bind": "127.0.0.1",
                          "reports.port": report_port, "reports.tls_cert": str(cert),
                          "reports.tls_key": str(key), "reports.audience": AUDIENCE,
                          "reports.service_accounts": [
                              f"system:serviceaccount:{WATCH_NAMESPACE}:{WATCH_ACCOUNT}"]})
        # The GPU simulator the stack starts inherits it: it writes the kernel logs.
        os.environ["GPU_SIM_KERNEL_LOG_DIR"] = str(logs)
    else:
        os.environ.pop("GPU_SIM_KERNEL_LOG_DIR", None)
    stack = make_stack(data / "stack", scenario, overrides)
    rng = random.Random(args.seed)
    latencies: list[float] = []
    to_signal: list[float] = []
    stuck: list[str] = []
    rejected: list[str] = []
    t0 = time.monotonic()
    with stack:
        startup = time.monotonic() - t0
        core = client.CoreV1Api(config.new_client_from_config(config_file=str(stack.kubeconfig)))
        gpu = GpuSimClient(stack.gpu_url)
        nodes = sorted(_name(n) for n in core.list_node().items)[: args.injections]

        def cordoned(node: str) -> bool:
            n = core.read_node(node)
            state = (_labels(n) or {}).get(STATE_LABEL, "healthy")
            return bool(_unschedulable(n)) and state != "healthy"

        def released(node: str) -> bool:
            n = core.read_node(node)
            state = (_labels(n) or {}).get(STATE_LABEL, "healthy")
            return not _unschedulable(n) and state == "healthy"

        async def abort(node: str) -> None:
            temporal = await connect(TemporalSettings(address=stack.temporal_address))
            await operator.abort(temporal, node, OperatorCommand(operator="bench",
                                                                 reason="benchmark release"))

        async def detector_rejections() -> list[str]:
            temporal = await connect(TemporalSettings(address=stack.temporal_address))
            view = await operator.detector_view(temporal)
            return [f"{r.name}: {r.why}" for r in view.rejected_commands
                    if r.name == "node_report"]

        watchers = None
        if mode == "watcher":
            assert cert is not None
            watchers = Watchers(core, nodes, logs, f"https://127.0.0.1:{report_port}/v1/reports",
                                cert, data / "tokens").__enter__()
        try:
            for i, node in enumerate(nodes):
                time.sleep(rng.uniform(0, args.interval))
                start = time.monotonic()
                gpu.inject_fault(node, 0, "xid", 79)
                wait_until(functools.partial(cordoned, node), 120, f"{node} cordoned",
                           every=0.05)
                latencies.append(time.monotonic() - start)
                note = ""
                if watchers is not None and node in watchers.accepted:
                    to_signal.append(watchers.accepted[node] - start)
                    note = f" (report accepted, detector signalled at {to_signal[-1]:.2f}s)"
                print(f"{mode} {i + 1:2d}/{len(nodes)} {node}: {latencies[-1]:.2f}s{note}",
                      flush=True)
                gpu.reboot(node)
                try:
                    asyncio.run(abort(node))
                except Exception as err:  # the latency is measured; a failed release is noted
                    stuck.append(f"{node}: abort failed: {err}")
                    print(f"   {stuck[-1]}", flush=True)
                    continue
                try:
                    wait_until(functools.partial(released, node), 60, f"{node} released",
                               every=0.2)
                except TimeoutError:
                    n = core.read_node(node)
                    labels = _labels(n) or {}
                    stuck.append(f"{node}: unschedulable={_unschedulable(n)} "
                                 f"labels={labels.get(STATE_LABEL)}")
                    print(f"   not released within 60s: {stuck[-1]}", flush=True)
            if mode == "watcher":
                rejected = asyncio.run(detector_rejections())
        finally:
            if watchers is not None:
                watchers.__exit__()
        problems = worker_log_problems(stack.data_dir / "logs" / "worker.log")
    os.environ.pop("GPU_SIM_KERNEL_LOG_DIR", None)
    target = 1.0 if mode == "watcher" else args.interval + 3
    p95 = percentile(latencies, 95)
    return {"mode": mode, "latencies_s": latencies, "p50_s": percentile(latencies, 50),
            "p95_s": p95, "max_s": max(latencies, default=float("nan")),
            "median_s": median(latencies), "target_p95_s": target, "met": p95 <= target,
            "report_to_signal_s": to_signal,
            "signal_p50_s": percentile(to_signal, 50), "signal_p95_s": percentile(to_signal, 95),
            "detector_rejected_reports": rejected[:5], "worker_log": problems,
            "not_released": stuck, "stack_startup_s": startup, "data_dir": str(data)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--injections", type=int, default=20)
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--modes", default="scrape,watcher",
                   help="comma-separated: scrape (the detector's tick), watcher (node reports)")
    args = p.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(modes) - {"scrape", "watcher"}
    if unknown or not modes:
        p.error(f"--modes: unknown {sorted(unknown)}; use scrape and/or watcher")

    data = Path(tempfile.mkdtemp(prefix="bench-fault-to-cordon-"))
    runs = [run_mode(m, args, data / m) for m in modes]

    print()
    print(table(["mode", "injections", "interval s", "p50 s", "p95 s", "max s",
                 "inject->signal p50 s", "inject->signal p95 s", "target p95 s", "met"],
                [[r["mode"], len(r["latencies_s"]), args.interval, r["p50_s"], r["p95_s"],
                  r["max_s"],
                  r["signal_p50_s"] if r["mode"] == "watcher" else "-",
                  r["signal_p95_s"] if r["mode"] == "watcher" else "-",
                  r["target_p95_s"], "yes" if r["met"] else "NO"] for r in runs]))
    for r in runs:
        print(f"{r['mode']}: stack start-up {r['stack_startup_s']:.1f}s; worker log markers: "
              f"{r['worker_log']}; not released after abort: {len(r['not_released'])}")
        if r["detector_rejected_reports"]:
            print(f"{r['mode']}: the detector has no node_report handler (it rejected the "
                  f"reports as unknown: {r['detector_rejected_reports'][0]}); the cordon "
                  "waited for the next tick, and inject->signal is what the watcher path "
                  "delivers")
    save("fault_to_cordon", {"interval_s": args.interval, "injections": args.injections,
                             "modes": {r["mode"]: r for r in runs}})


if __name__ == "__main__":
    main()
