"""Many remediations at once on one worker, against the simulators.

Run: ``.venv/bin/python -m tools.bench.throughput [--nodes 200] [--interval 2]``

Starts the real local stack on a scenario with ``--nodes`` nodes, each carrying one GPU pod of
a ReplicaSet (no PDB: with every node cordoned a PDB could never be satisfied), with budget
``max_unavailable = nodes`` and the circuit breaker opened wide. It injects XID 79 (reboot)
on GPU 0 of every node at once, so the detector admits all of them on its next tick, and
each remediation runs claim, drain, reboot Job, validation Job, release on the one worker.

Reports: time from injection to all remediations started and to all settled (the workflow
closed, or it holds its node quarantined, where it waits for an operator), their outcomes,
the activity schedule-to-start wait (slot saturation), the worker's peak RSS (``VmHWM`` of
/proc/<pid>/status) and CPU time, and task timeouts: ``WORKFLOW_TASK_TIMED_OUT`` /
``ACTIVITY_TASK_TIMED_OUT`` events in every history, and TMPRL1101 (deadlock) / TMPRL1104
markers in the worker log.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.bench._common import (
    make_stack,
    percentile,
    proc_cpu_seconds,
    proc_status_kib,
    save,
    table,
    worker_log_problems,
    write_scenario,
)

if TYPE_CHECKING:
    from kubernetes.client import V1Node


def _states(nodes: Iterable[V1Node], label: str) -> dict[str, str]:
    """Each node's ``label`` value ("" where it has none), by node name."""
    states: dict[str, str] = {}
    for n in nodes:
        assert n.metadata is not None and n.metadata.name is not None
        states[n.metadata.name] = (n.metadata.labels or {}).get(label, "")
    return states


async def run(stack: Any, nodes: list[str], timeout: float) -> dict[str, Any]:
    from temporalio.api.enums.v1 import EventType
    from temporalio.client import WorkflowExecutionStatus

    from sim.gpu.client import GpuSimClient
    from worker.config import TemporalSettings
    from worker.temporal_client import connect
    from workflows.ids import remediation_workflow_id
    from workflows.messages import RemediationResult

    client = await connect(TemporalSettings(address=stack.temporal_address))
    gpu = GpuSimClient(stack.gpu_url)
    worker = next(p for p in stack.parts if p.name == "worker")
    cpu0 = proc_cpu_seconds(worker.proc.pid)
    t0 = time.monotonic()
    await asyncio.gather(*(asyncio.to_thread(gpu.inject_fault, n, 0, "xid", 79) for n in nodes))
    injected = time.monotonic() - t0

    async def status(node: str) -> Any:
        try:
            return (await client.get_workflow_handle(remediation_workflow_id(node)).describe()
                    ).status
        except Exception:
            return None

    from kubernetes import client as k8s
    from kubernetes import config

    from activities.node_keys import A_HISTORY, STATE_LABEL

    core = k8s.CoreV1Api(config.new_client_from_config(config_file=str(stack.kubeconfig)))
    all_started = None
    samples: list[tuple[float, int, int]] = []
    while True:
        statuses = await asyncio.gather(*(status(n) for n in nodes))
        labels = _states((await asyncio.to_thread(core.list_node)).items, STATE_LABEL)
        now = time.monotonic() - t0
        started = sum(1 for s in statuses if s is not None)
        # Settled: the workflow closed, or it holds the node quarantined (it then waits
        # for an operator and never closes by itself).
        done = sum(1 for n, s in zip(nodes, statuses, strict=True)
                   if s is not None and (s != WorkflowExecutionStatus.RUNNING
                                         or labels.get(n) == "quarantined"))
        samples.append((now, started, done))
        if all_started is None and started == len(nodes):
            all_started = now
        if done == len(nodes):
            break
        if now > timeout:
            break
        await asyncio.sleep(1.0)
    finished = time.monotonic() - t0
    worker_cpu = proc_cpu_seconds(worker.proc.pid) - cpu0
    hwm_kib = proc_status_kib(worker.proc.pid, "VmHWM")

    outcomes: collections.Counter[str] = collections.Counter()
    timeouts: collections.Counter[str] = collections.Counter()
    events_total = 0
    queue_wait: list[float] = []
    listed = core.list_node().items
    labels = _states(listed, STATE_LABEL)
    # Why each quarantine happened: the last history entry the release wrote on the node,
    # with numbers and node names blanked so that alike reasons count together.
    why: collections.Counter[str] = collections.Counter()
    for item in listed:
        meta = item.metadata
        assert meta is not None and meta.name is not None
        if labels.get(meta.name) != "quarantined":
            continue
        try:
            last = json.loads((meta.annotations or {}).get(A_HISTORY, "[]"))[-1]
            why[re.sub(r"bench-\d+|[0-9a-f]{8,}|\d+", "#", str(last.get("outcome")))[:160]] += 1
        except (ValueError, IndexError, AttributeError):
            why["(no readable history)"] += 1
    for n in nodes:
        handle = client.get_workflow_handle(remediation_workflow_id(n),
                                            result_type=RemediationResult)
        if labels.get(n) == "quarantined":
            outcomes["quarantined (waiting for an operator)"] += 1
        else:
            try:
                outcome = (await asyncio.wait_for(handle.result(), 5)).outcome
                outcomes[str(getattr(outcome, "value", outcome))] += 1
            except Exception as err:  # still running or failed
                outcomes[f"not finished ({type(err).__name__})"] += 1
        scheduled: dict[int, float] = {}
        async for e in handle.fetch_history_events():
            events_total += 1
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                scheduled[e.event_id] = e.event_time.ToMicroseconds() / 1e6
            elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                sid = e.activity_task_started_event_attributes.scheduled_event_id
                queue_wait.append(e.event_time.ToMicroseconds() / 1e6 - scheduled[sid])
            if e.event_type in (EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
                                EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT,
                                EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED):
                timeouts[EventType.Name(e.event_type).removeprefix("EVENT_TYPE_")] += 1
    return {"nodes": len(nodes), "inject_s": injected, "all_started_s": all_started,
            "all_settled_s": finished if sum(outcomes.values()) == len(nodes)
            and not any(k.startswith("not finished") for k in outcomes) else None,
            "elapsed_s": finished, "outcomes": dict(outcomes), "history_problems": dict(timeouts),
            "quarantine_reasons": dict(why.most_common(5)),
            "events_total": events_total,
            "activity_queue_wait_s": {"median": percentile(queue_wait, 50),
                                      "p95": percentile(queue_wait, 95),
                                      "max": max(queue_wait, default=0.0)},
            "worker_vmhwm_mib": hwm_kib / 1024,
            "worker_cpu_s": worker_cpu, "progress": samples}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=200)
    p.add_argument("--interval", type=float, default=2.0)
    p.add_argument("--timeout", type=float, default=900)
    args = p.parse_args()

    data = Path(tempfile.mkdtemp(prefix="bench-throughput-"))
    scenario = write_scenario(data / "scenario.yaml", args.nodes, pods_per_node=1, pdb=False)
    stack = make_stack(data / "stack", scenario, {
        "detector.interval": f"PT{args.interval:g}S",
        "detector.max_unavailable": args.nodes,
        "detector.breaker_max_flagged_percent": 100,
        "detector.breaker_max_flagged_nodes": args.nodes * 10,
        "remediation.drain.retry_interval": "PT1S"}, job_seconds=1.0, reboot_seconds=2.0)
    t0 = time.monotonic()
    with stack:
        startup = time.monotonic() - t0
        nodes = [f"bench-{i:04d}" for i in range(1, args.nodes + 1)]
        r = asyncio.run(run(stack, nodes, args.timeout))
        problems = worker_log_problems(stack.data_dir / "logs" / "worker.log")
    r["worker_log"] = problems
    r["stack_startup_s"] = startup
    print(table(["remediations", "all started s", "all settled s", "outcomes",
                 "WFT/activity timeouts (history)", "TMPRL1101", "TMPRL1104", "worker VmHWM MiB",
                 "worker CPU s"],
                [[r["nodes"], r["all_started_s"], r["all_settled_s"], r["outcomes"],
                  sum(r["history_problems"].values()), problems["TMPRL1101"],
                  problems["TMPRL1104"], r["worker_vmhwm_mib"], r["worker_cpu_s"]]]))
    print(f"activity schedule-to-start wait: {r['activity_queue_wait_s']}")
    if r.get("quarantine_reasons"):
        print(f"quarantine reasons: {r['quarantine_reasons']}")
    print(f"stack start-up {startup:.1f}s; history events in all remediations: "
          f"{r['events_total']} ({r['events_total'] / args.nodes:.0f} each); "
          f"worker log: {problems}")
    save("throughput", {**r, "interval_s": args.interval, "data_dir": str(data)})


if __name__ == "__main__":
    main()
