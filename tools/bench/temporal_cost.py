"""Temporal history cost: events per detector tick (1,000 vs 10,000 nodes) and per remediation.

Run: ``.venv/bin/python -m tools.bench.temporal_cost [--ticks 8] [--nodes 1000 10000]``

Three measurements against one real Temporal dev server:

1. **Detector tick, stubbed observation, at fleet scale.** A cluster simulator with 10,000
   nodes and a 10,000-node scrape per tick is too slow for a benchmark (see
   ``tools/bench/detector_tick.py``), so an in-process worker on its own task queue registers the
   real ``DetectorWorkflow`` with a stub ``observe_fleet`` activity returning a
   ``FleetObservation`` with ``managed_nodes = readable_nodes = N`` and the same three
   flagged verdicts for every N (budget ``max_unavailable: 0``, so they wait and no child
   starts; the breaker stays closed), and a no-op ``report_admission``. Events and history
   bytes per tick are measured between consecutive ``observe_fleet`` schedulings.
2. **Detector tick, real stack.** The detector of the real local stack (real observation,
   4 nodes) over the same number of ticks, with nothing flagged.
3. **One complete remediation, reboot path.** XID 79 injected on a node of the real stack
   carrying pods with a PDB; the remediation runs claim, drain, reboot Job, validation Job,
   release. Its history (events, bytes, events by type) is read after it completes.
   Target: <= 120 events.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.bench._common import (
    make_stack,
    median,
    save,
    table,
    worker_log_problems,
    write_scenario,
)
from workflows.messages import AdmissionReport, FleetObservation, ObserveInput

if TYPE_CHECKING:
    from temporalio.api.enums.v1 import EventType

TARGET_REMEDIATION_EVENTS = 120


def _verdicts() -> list[Any]:
    from policy.models import Action, Finding, Verdict

    return [Verdict(node=f"gpu-node-{i:05d}", action=Action.REBOOT, findings=[Finding(
        gpu="0", uuid=f"GPU-{i:08d}", signal="xid", value=79, rule="xid-79",
        action=Action.REBOOT)]) for i in (1, 2, 3)]


async def _history(client: Any, workflow_id: str, run_id: str | None = None) -> list[Any]:
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    return [e async for e in handle.fetch_history_events()]


def per_tick(events: list[Any]) -> tuple[list[int], list[int]]:
    """Events and bytes between consecutive observe_fleet schedulings."""
    from temporalio.api.enums.v1 import EventType

    marks = [i for i, e in enumerate(events)
             if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
             and e.activity_task_scheduled_event_attributes.activity_type.name == "observe_fleet"]
    counts = [b - a for a, b in itertools.pairwise(marks)]
    sizes = [sum(e.ByteSize() for e in events[a:b]) for a, b in itertools.pairwise(marks)]
    return counts, sizes


async def stub_ticks(address: str, nodes: int, ticks: int) -> dict[str, Any]:
    from temporalio import activity
    from temporalio.worker import Worker

    from activities.visibility import RunningRemediations, RunningRemediationsInput
    from worker.config import TemporalSettings
    from worker.temporal_client import connect
    from workflows.detector import DetectorWorkflow
    from workflows.messages import DetectorInput
    from workflows.remediation import RemediationWorkflow
    from workflows.settings import DetectorSettings

    @activity.defn(name="observe_fleet")
    async def observe_fleet(_: ObserveInput) -> FleetObservation:
        return FleetObservation(managed_nodes=nodes, readable_nodes=nodes, verdicts=_verdicts())

    @activity.defn(name="report_admission")
    async def report_admission(_: AdmissionReport) -> None:
        return None

    @activity.defn(name="list_running_remediations")
    async def list_running_remediations(_: RunningRemediationsInput) -> RunningRemediations:
        return RunningRemediations()

    client = await connect(TemporalSettings(address=address))
    queue = f"bench-stub-{uuid.uuid4().hex[:8]}"
    wid = f"bench-detector-{nodes}-{queue}"
    async with Worker(client, task_queue=queue, workflows=[DetectorWorkflow, RemediationWorkflow],
                      activities=[observe_fleet, report_admission,
                                  list_running_remediations]):
        settings = DetectorSettings(interval=timedelta(seconds=0.5), max_unavailable=0)
        handle = await client.start_workflow(DetectorWorkflow.run, DetectorInput(settings=settings),
                                             id=wid, task_queue=queue)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            # Decoded as DetectorView, the return type of the query method.
            view = await handle.query(DetectorWorkflow.view)
            if view.ticks_total >= ticks + 1:
                break
            await asyncio.sleep(0.3)
        await handle.terminate("benchmark done")
    events = await _history(client, wid)
    counts, sizes = per_tick(events)
    return {"nodes": nodes, "ticks": len(counts), "events_per_tick": counts,
            "bytes_per_tick": sizes, "waiting": len(view.waiting), "budget": view.budget,
            "observation_bytes": len(FleetObservation(
                managed_nodes=nodes, readable_nodes=nodes,
                verdicts=_verdicts()).model_dump_json())}


async def real_stack(stack: Any, ticks: int) -> dict[str, Any]:
    from sim.gpu.client import GpuSimClient
    from worker.config import TemporalSettings
    from worker.temporal_client import connect
    from workflows.ids import DETECTOR_WORKFLOW_ID, remediation_workflow_id
    from workflows.messages import RemediationResult

    client = await connect(TemporalSettings(address=stack.temporal_address))
    # Detector ticks with nothing flagged.
    start = len(await _history(client, DETECTOR_WORKFLOW_ID))
    await asyncio.sleep(ticks * 1.3 + 2)
    events = await _history(client, DETECTOR_WORKFLOW_ID)
    counts, sizes = per_tick(events[max(0, start - 1):])

    node = "bench-0001"
    GpuSimClient(stack.gpu_url).inject_fault(node, 0, "xid", 79)
    t0 = time.monotonic()
    wid = remediation_workflow_id(node)

    async def started() -> bool:
        try:
            await client.get_workflow_handle(wid).describe()
            return True
        except Exception:
            return False

    while not await started():
        await asyncio.sleep(0.2)
        if time.monotonic() - t0 > 60:
            raise SystemExit("remediation did not start")
    result = await asyncio.wait_for(
        client.get_workflow_handle(wid, result_type=RemediationResult).result(), 300)
    took = time.monotonic() - t0
    history = await _history(client, wid)
    by_type = collections.Counter(
        _event_name(e.event_type) for e in history)
    return {"detector_events_per_tick": counts, "detector_bytes_per_tick": sizes,
            "remediation": {"node": node, "outcome": result.outcome, "message": result.message,
                            "events": len(history),
                            "bytes": sum(e.ByteSize() for e in history),
                            "seconds": took, "by_type": dict(by_type.most_common())}}


def _event_name(value: EventType.ValueType) -> str:
    from temporalio.api.enums.v1 import EventType

    return EventType.Name(value).removeprefix("EVENT_TYPE_")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ticks", type=int, default=8)
    p.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000])
    args = p.parse_args()

    data = Path(tempfile.mkdtemp(prefix="bench-temporal-cost-"))
    scenario = write_scenario(data / "scenario.yaml", 4, pods_per_node=4)
    stack = make_stack(data / "stack", scenario, {
        "detector.interval": "PT1S", "remediation.drain.retry_interval": "PT1S"})
    with stack:
        stub = [asyncio.run(stub_ticks(stack.temporal_address, n, args.ticks))
                for n in args.nodes]
        real = asyncio.run(real_stack(stack, args.ticks))
        problems = worker_log_problems(stack.data_dir / "logs" / "worker.log")

    rows = [[f"stub observation, {s['nodes']} nodes", s["ticks"],
             median(s["events_per_tick"]), min(s["events_per_tick"]), max(s["events_per_tick"]),
             median(s["bytes_per_tick"]), s["observation_bytes"]] for s in stub]
    rows.append(["real stack, 4 nodes", len(real["detector_events_per_tick"]),
                 median(real["detector_events_per_tick"]), min(real["detector_events_per_tick"]),
                 max(real["detector_events_per_tick"]), median(real["detector_bytes_per_tick"]),
                 "-"])
    print(table(["detector", "ticks", "events/tick (median)", "min", "max", "bytes/tick",
                 "observation JSON bytes"], rows))
    equal = len({median(s["events_per_tick"]) for s in stub}) == 1
    print(f"events per tick equal across fleet sizes: {'yes' if equal else 'NO'}")
    rem = real["remediation"]
    print()
    print(f"one remediation (reboot path), {rem['node']}: outcome {rem['outcome']}, "
          f"{rem['events']} events, {rem['bytes'] / 1024:.0f} KiB history, {rem['seconds']:.1f}s "
          f"(target <= {TARGET_REMEDIATION_EVENTS} events: "
          f"{'met' if rem['events'] <= TARGET_REMEDIATION_EVENTS else 'NOT met'})")
    print(table(["event type", "count"], list(rem["by_type"].items())))
    print(f"worker log markers: {problems}")
    save("temporal_cost", {"stub": stub, "real": real, "equal_per_tick": equal,
                           "target_remediation_events": TARGET_REMEDIATION_EVENTS,
                           "worker_log": problems, "data_dir": str(data)})


if __name__ == "__main__":
    main()
