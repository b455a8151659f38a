"""Fault injection -> node cordoned, with the real stack.

Run: ``.venv/bin/python -m tools.bench.fault_to_cordon [--injections 20] [--interval 5]``

Starts the real local stack (Temporal dev server, GPU simulator, cluster simulator and the
worker as processes, ephemeral ports; ``worker.stack.LocalStack``) on a scenario with one
node per injection, with the detector ticking every ``--interval`` seconds. Then, one at a
time, each on a different node:

1. waits a random 0..interval seconds (seeded), so injections land at every phase of the
   detector's tick;
2. injects XID 79 (GPU fallen off the bus: reboot) on GPU 0 through the simulator's API;
3. polls the node every 50 ms until ``spec.unschedulable`` is true and the
   ``gpu-remediate.io/state`` label says something other than healthy: the latency;
4. releases it: reboots the simulated node (which clears the fault and restarts the
   exporter) and aborts the remediation, then waits until the node is labelled healthy
   and schedulable again, so each injection starts from a quiet fleet.

Reports p50, p95 and max. Target: p95 <= interval + 3 s.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tools.bench._common import (
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
    from kubernetes.client import V1Node


def _name(node: V1Node) -> str:
    assert node.metadata is not None and node.metadata.name is not None
    return node.metadata.name


def _labels(node: V1Node) -> dict[str, str] | None:
    assert node.metadata is not None
    return node.metadata.labels


def _unschedulable(node: V1Node) -> bool | None:
    assert node.spec is not None
    return node.spec.unschedulable


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--injections", type=int, default=20)
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()

    from kubernetes import client, config

    from activities.node_keys import STATE_LABEL
    from sim.gpu.client import GpuSimClient
    from worker.cli import operator
    from worker.config import TemporalSettings
    from worker.temporal_client import connect
    from workflows.messages import OperatorCommand

    data = Path(tempfile.mkdtemp(prefix="bench-fault-to-cordon-"))
    scenario = write_scenario(data / "scenario.yaml", args.injections)
    stack = make_stack(data / "stack", scenario, {
        "detector.interval": f"PT{args.interval:g}S",
        # One slot per node, so a node whose release lags never delays the next injection.
        "detector.max_unavailable": args.injections,
        "remediation.drain.retry_interval": "PT1S"})
    rng = random.Random(args.seed)
    latencies: list[float] = []
    stuck: list[str] = []
    t0 = time.monotonic()
    with stack:
        startup = time.monotonic() - t0
        core = client.CoreV1Api(config.new_client_from_config(config_file=str(stack.kubeconfig)))
        gpu = GpuSimClient(stack.gpu_url)
        nodes = sorted(_name(n) for n in core.list_node().items)

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

        for i, node in enumerate(nodes[: args.injections]):
            time.sleep(rng.uniform(0, args.interval))
            start = time.monotonic()
            gpu.inject_fault(node, 0, "xid", 79)
            wait_until(functools.partial(cordoned, node), 120, f"{node} cordoned", every=0.05)
            latencies.append(time.monotonic() - start)
            print(f"{i + 1:2d}/{args.injections} {node}: {latencies[-1]:.2f}s", flush=True)
            gpu.reboot(node)
            try:
                asyncio.run(abort(node))
            except Exception as err:  # the latency is measured; a failed release is reported
                stuck.append(f"{node}: abort failed: {err}")
                print(f"   {stuck[-1]}", flush=True)
                continue
            try:
                wait_until(functools.partial(released, node), 60, f"{node} released",
                           every=0.2)
            except TimeoutError:
                n = core.read_node(node)
                labels = _labels(n)
                assert labels is not None  # read unguarded before too: no labels still fails
                stuck.append(f"{node}: unschedulable={_unschedulable(n)} "
                             f"labels={labels.get(STATE_LABEL)}")
                print(f"   not released within 60s: {stuck[-1]}", flush=True)
        problems = worker_log_problems(stack.data_dir / "logs" / "worker.log")

    p50, p95 = percentile(latencies, 50), percentile(latencies, 95)
    target = args.interval + 3
    print()
    print(table(["injections", "interval s", "p50 s", "p95 s", "max s", "mean s", "target p95 s",
                 "met"], [[len(latencies), args.interval, p50, p95, max(latencies),
                           sum(latencies) / len(latencies), target,
                           "yes" if p95 <= target else "NO"]]))
    print(f"stack start-up {startup:.1f}s; worker log markers: {problems}; "
          f"not released after abort: {len(stuck)}")
    save("fault_to_cordon", {"interval_s": args.interval, "latencies_s": latencies,
                             "p50_s": p50, "p95_s": p95, "max_s": max(latencies),
                             "median_s": median(latencies), "target_p95_s": target,
                             "met": p95 <= target, "worker_log": problems, "not_released": stuck,
                             "stack_startup_s": startup, "data_dir": str(data)})


if __name__ == "__main__":
    main()
