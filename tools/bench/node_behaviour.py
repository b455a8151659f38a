"""Fault x node behaviour -> outcome and time to outcome, on the laptop stack.

One stack (real dev server, worker, detector, both simulators), one node per row, rows one
after another, each from a quiet fleet:

- XID 79 on a node whose reboot is graceful (the reboot Job's pod exits or is killed, the
  node returns with a new boot ID);
- XID 79 on a node whose reboot hangs (`sim node hang`: it never returns);
- XID 79 on a node that loses power once its reboot is under way (`hang?hard=true`: no
  graceful shutdown, its pods keep their phase, the Job never ends);
- XID 48 on a node whose GPUs have persistence mode on (every simulated GPU does), beside
  the standalone DCGM host engine (the GPU Operator's `dcgm` operand);
- XID 48 on a node without the standalone host engine (validation pauses dcgm-exporter and
  runs its own engine);
- XID 48 on a MIG node (the reset destroys the MIG instances; the MIG manager re-applies
  the layout before validation).

Run: ``python -m tools.bench.node_behaviour``. Prints a table and appends the run to
tools/bench/results/node_behaviour.json. The times are the stack's short test settings
(1 s Jobs, 2 s reboots, `reboot_return_timeout` 15 s), not a real node's.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import yaml

from tools.bench._common import make_stack, save, table, wait_until

RETURN_TIMEOUT_S = 15
SCENARIO = {
    "name": "bench-node-behaviour",
    "description": "Nodes for the fault x node-behaviour matrix: standalone host engine, "
                   "embedded host engine, MIG.",
    "pools": [
        {"name": "standalone", "nodes": 4, "gpus": 8},
        {"name": "embedded", "nodes": 1, "gpus": 8,
         "labels": {"nvidia.com/gpu.deploy.dcgm": "false"}},
        {"name": "mig", "nodes": 1, "gpus": 8,
         "labels": {"nvidia.com/mig.config": "all-1g.10gb"}},
    ],
}


@dataclass(frozen=True)
class Row:
    behaviour: str
    node: str
    gpu: int
    xid: int
    expect: str  # healthy | quarantined
    before: str = ""  # a `sim node` command before the fault
    during_reboot: str = ""  # a `sim node` command once the reboot Job exists


ROWS = (
    Row("graceful reboot", "standalone-01", 1, 79, "healthy"),
    Row("reboot hangs (never returns)", "standalone-02", 1, 79, "quarantined", before="hang"),
    Row("power lost during the reboot", "standalone-03", 1, 79, "quarantined",
        during_reboot="hang?hard=true"),
    Row("persistence mode on, standalone host engine", "standalone-04", 3, 48, "healthy"),
    Row("persistence mode on, embedded host engine", "embedded-01", 3, 48, "healthy"),
    Row("MIG node (layout re-applied)", "mig-01", 3, 48, "healthy"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=240,
                        help="seconds each row may take before it counts as stuck")
    args = parser.parse_args()

    from kubernetes import client, config

    from sim.gpu.client import GpuSimClient

    with tempfile.TemporaryDirectory(prefix="bench-nodes-") as tmp:
        data = Path(tmp)
        scenario = data / "scenario.yaml"
        scenario.write_text(yaml.safe_dump(SCENARIO))
        stack = make_stack(data / "stack", scenario, {
            "detector.interval": "PT1S", "remediation.drain.retry_interval": "PT1S",
            "remediation.heartbeat_timeout": "PT5S", "detector.max_unavailable": 1,
            "detector.breaker_max_flagged_percent": 100, "detector.max_quarantined": "100%",
            "detector.breaker_max_quarantines": 0,
            "remediation.reboot_return_timeout": f"PT{RETURN_TIMEOUT_S}S",
            "remediation.gpus_free_timeout": "PT15S"})
        with stack:
            api = config.new_client_from_config(config_file=str(stack.kubeconfig))
            core: Any = client.CoreV1Api(api)
            batch: Any = client.BatchV1Api(api)
            gpu = GpuSimClient(stack.gpu_url)
            sim_url = f"http://127.0.0.1:{stack.ports.cluster}"

            def labels(node: str) -> dict[str, str]:
                return dict(core.read_node(node).metadata.labels or {})

            def state(node: str) -> str:
                return labels(node).get("gpu-remediate.io/state", "healthy")

            def jobs(node: str) -> list[str]:
                return sorted(j.metadata.labels["gpu-remediate.io/job"]
                              for j in batch.list_namespaced_job("gpu-remediate-jobs").items
                              if (j.metadata.labels or {}).get("gpu-remediate.io/node") == node)

            def reasons(node: str) -> list[str]:
                events = core.list_namespaced_event(
                    "default", field_selector=f"involvedObject.name={node}").items
                return [e.reason for e in events]

            def claimed(node: str) -> bool:
                return state(node) != "healthy"

            def rebooting(node: str) -> bool:
                return "reboot" in jobs(node)

            def finished(node: str) -> str | None:
                """Quarantined, or healthy again after the claim (the claim was seen)."""
                now = state(node)
                return now if now in ("quarantined", "healthy") else None

            def command(node: str, what: str) -> None:
                resp = httpx.post(f"{sim_url}/sim/v1/nodes/{node}/{what}", timeout=10)
                resp.raise_for_status()

            results: list[dict[str, Any]] = []
            for row in ROWS:
                if row.before:
                    command(row.node, row.before)
                start = time.monotonic()
                gpu.inject_fault(row.node, row.gpu, "xid", row.xid)
                node = row.node
                wait_until(partial(claimed, node), 60, f"{node} claimed")
                hit = 0.0
                if row.during_reboot:
                    wait_until(partial(rebooting, node), args.timeout, f"{node}'s reboot Job")
                    command(node, row.during_reboot)
                    hit = time.monotonic()
                try:
                    outcome = wait_until(partial(finished, node), args.timeout, f"{node} done")
                except TimeoutError:
                    outcome = f"stuck ({state(row.node)})"
                took = time.monotonic() - start
                history = json.loads(core.read_node(row.node).metadata.annotations.get(
                    "gpu-remediate.io/history", "[]") or "[]")
                entry = {
                    "behaviour": row.behaviour, "fault": f"XID {row.xid}", "node": row.node,
                    "outcome": outcome, "expected": row.expect, "seconds": round(took, 1),
                    "jobs": jobs(row.node),
                    "reason": (history[-1].get("outcome", "") if history else "")[:90],
                    "node_did_not_return": "NodeDidNotReturn" in reasons(row.node)}
                if row.during_reboot:
                    entry["after_power_loss_s"] = round(time.monotonic() - hit, 1)
                results.append(entry)
                print(f"{row.behaviour}: {outcome} in {took:.1f} s", flush=True)
                if row.before or row.during_reboot:
                    command(row.node, "recover")
                gpu.clear(row.node)
            api.close()

    print()
    print(table(["node behaviour", "fault", "outcome", "seconds", "Jobs", "why"],
                [[r["behaviour"], r["fault"], r["outcome"], r["seconds"],
                  ", ".join(r["jobs"]), r["reason"]] for r in results]))
    wrong = [r for r in results if r["outcome"] != r["expected"]]
    lost = next((r["after_power_loss_s"] for r in results if "after_power_loss_s" in r), "?")
    print(f"\nreboot_return_timeout {RETURN_TIMEOUT_S} s; power lost -> quarantined {lost} s "
          f"after the power went; {len(wrong)} rows not as expected")
    save("node_behaviour", {"rows": results, "return_timeout_s": RETURN_TIMEOUT_S})


if __name__ == "__main__":
    main()
