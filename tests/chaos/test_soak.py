"""A seeded, randomized soak: faults of every class (permanent ones included), operator
releases, API faults, an admin cordon, an unreadable exporter and a worker SIGKILL,
with the invariant checker sampling throughout.

CI runs the short default. A long soak, its summary appended to a JSON file:

    GPU_REMEDIATE_SOAK_SECONDS=600 GPU_REMEDIATE_SOAK_NODES=200 GPU_REMEDIATE_SOAK_SEED=11 \\
        GPU_REMEDIATE_SOAK_REPORT=tools/bench/results/soak.json \\
        .venv/bin/pytest tests/chaos/test_soak.py -s
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
from collections.abc import Iterator

import httpx
import pytest
import yaml

from sim.gpu.client import GpuSimClient, GpuSimError
from tests.chaos.invariants import InvariantChecker
from tests.e2e.conftest import make_stack
from tests.e2e.kit import Cluster, update, view_state, wait_for, worker_log
from worker.cli.operator import OperatorError
from worker.stack import LocalStack

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]

SECONDS = float(os.environ.get("GPU_REMEDIATE_SOAK_SECONDS", "30"))
NODES = int(os.environ.get("GPU_REMEDIATE_SOAK_NODES", "10"))
SEED = int(os.environ.get("GPU_REMEDIATE_SOAK_SEED", "7"))
MAX_UNAVAILABLE = 3


@pytest.fixture(scope="module")
def soak_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    tmp = tmp_path_factory.mktemp("soak")
    scenario = tmp / "soak.yaml"
    scenario.write_text(yaml.safe_dump({
        "name": "soak", "pools": [{"name": "gpu-node", "nodes": NODES, "gpus": 8}],
        "workloads": [
            {"name": "trainer", "namespace": "team-a", "replicas": NODES // 2,
             "gpus_per_pod": 8, "labels": {"app": "trainer"},
             "pdb": {"max_unavailable": 2}, "readiness_delay_seconds": 1,
             "termination_grace_seconds": 1},
            {"name": "node-agent", "namespace": "kube-system", "kind": "DaemonSet",
             "labels": {"app": "node-agent"}}]}))
    stack = make_stack(tmp, str(scenario), **{
        "detector.max_unavailable": MAX_UNAVAILABLE, "detector.observe_timeout": "PT10S",
        "detector.breaker_max_flagged_percent": 100, "detector.breaker_max_flagged_nodes": 1000,
        "remediation.thermal.poll_interval": "PT1S", "remediation.thermal.hold": "PT2S",
        "remediation.thermal.escalate_after": "PT30S"})
    with stack:
        yield stack


def repair_by_hand(gpu: GpuSimClient, node: str) -> None:
    """What an operator does before releasing a quarantined node: the bad part replaced
    (the faults gone) and the machine power-cycled, which is what clears the volatile ECC
    counters (a release runs no reset or reboot, and the validation reads DCGM again)."""
    gpu.clear(node)
    gpu.reboot(node)


def _plan(stack: LocalStack, node: str) -> list[str]:
    try:
        return view_state(stack, node).plan[-6:]
    except Exception as err:  # what is known is printed either way
        return [f"(no view: {err})"]


FAULTS = [  # (weight, kind, value, clears_on)
    (4, "xid", 79, None), (4, "xid", 48, None), (2, "ecc-dbe", 1, "never"),
    (1, "row-remap-failure", None, None), (2, "gpu-temp", 92, None), (1, "xid", 13, None),
    (1, "xid", 31, None),  # twice on one GPU within a day escalates to a reset
]


def test_randomized_soak_keeps_every_invariant(soak_stack: LocalStack) -> None:
    rng = random.Random(SEED)
    k8s, gpu = Cluster(soak_stack), GpuSimClient(soak_stack.gpu_url)
    names = [f"gpu-node-{i:02d}" for i in range(1, NODES + 1)]
    admin, unreadable = names[-1], names[-2]
    k8s.cordon(admin)
    gpu.set_exporter_mode(unreadable, "garbled")
    time.sleep(2)  # the detector has seen the exporter broken before the fault
    gpu.inject_fault(unreadable, "0", "xid", 79)
    k8s.set_faults([
        {"verb": "patch", "resource": "nodes", "rate": 0.05, "status": 409},
        {"verb": "create", "resource": "pods/eviction", "rate": 0.05, "status": 429},
        {"verb": "create", "resource": "jobs", "rate": 0.05, "status": 500},
    ], seed=SEED)
    candidates = [n for n in names if n not in (admin, unreadable)]
    steps: list[str] = []
    killed = False
    checker = InvariantChecker(soak_stack, MAX_UNAVAILABLE, grace=45,
                               admin_cordoned={admin}, unreadable={unreadable}).start()
    started = time.monotonic()
    try:
        while time.monotonic() - started < SECONDS:
            elapsed = time.monotonic() - started
            if not killed and elapsed > SECONDS / 3:
                soak_stack.restart_worker()
                killed = True
                steps.append(f"{elapsed:.0f}s kill -9 worker")
                continue
            roll = rng.random()
            node = rng.choice(candidates)
            state = k8s.state(node)
            if roll < 0.6 and state == "healthy":
                _, kind, value, clears_on = rng.choices(
                    FAULTS, weights=[f[0] for f in FAULTS])[0]
                gpu_index = rng.randrange(8)
                gpu.inject_fault(node, gpu_index, kind, value, clears_on=clears_on)
                steps.append(f"{elapsed:.0f}s inject {kind} {value or ''} on {node}/{gpu_index}")
            elif roll < 0.8 and state == "quarantined":
                # At any time: a release validates the node while it stays labelled
                # quarantined, so it never takes a budget slot (the checker would see it).
                fixed = rng.random() < 0.7
                if fixed:
                    repair_by_hand(gpu, node)
                try:
                    update(soak_stack, node, "release", who="soak", reason="soak")
                    steps.append(f"{elapsed:.0f}s release {node} ({'fixed' if fixed else 'not'})")
                except OperatorError as err:
                    steps.append(f"{elapsed:.0f}s release {node} refused: {err}")
            elif roll < 0.9 and state == "cordoned":
                gpu.clear(node)
                steps.append(f"{elapsed:.0f}s cool {node}")
            time.sleep(rng.uniform(0.5, 2.0))

        # Wind down: no more API faults, every fault cleared, every quarantine released.
        k8s.clear_faults()
        for node in candidates:
            gpu.clear(node)

        refused: dict[str, str] = {}
        repaired: set[str] = set()

        def settled() -> bool:
            # Release every quarantined node on each pass (not only up to the first node
            # still out), and keep why a release was refused for the failure message.
            out = [n for n in candidates if k8s.state(n) != "healthy"]
            for node in out:
                if k8s.state(node) == "quarantined":
                    if node not in repaired:
                        repair_by_hand(gpu, node)
                        repaired.add(node)
                    try:
                        update(soak_stack, node, "release", who="soak", reason="wind down")
                    except OperatorError as err:
                        refused[node] = str(err)
            return not out

        try:
            # Faults cleared during the soak may still show on the XID gauge (it holds the
            # last XID): those are real events still queued under the budget, so the wind-down
            # lasts as long as that queue, which grows with the fleet.
            wait_for(soak_stack, "every node back in service", settled,
                     timeout=150 + 2 * NODES, every=2)
        except AssertionError as err:
            left = {n: k8s.state(n) for n in candidates if k8s.state(n) != "healthy"}
            why = {n: refused.get(n, "") for n in left}
            machines = httpx.get(f"{k8s.url}/sim/v1/nodes", timeout=10).json()["nodes"]
            seen = "".join(f"\n{n}: machine {machines.get(n)}; last outcome "
                           f"{(k8s.history(n) or [{}])[-1].get('outcome')!r}; remediation "
                           f"plan {_plan(soak_stack, n)}" for n in left)
            raise AssertionError(f"still out after the wind-down: {left}\n"
                                 f"last release refusals: {why}{seen}\nsteps:\n"
                                 + "\n".join(steps) + f"\n{err}") from None
    finally:
        checker.stop()
        with contextlib.suppress(Exception):
            k8s.clear_faults()
    print(f"\nsoak seed={SEED} nodes={NODES} seconds={SECONDS:.0f}: {len(steps)} steps, "
          f"{checker.samples} samples, max out {checker.max_out}, "
          f"{len(checker.violations)} violations")
    if report := os.environ.get("GPU_REMEDIATE_SOAK_REPORT"):
        _append_report(report, {
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seed": SEED,
            "nodes": NODES, "seconds": SECONDS, "max_unavailable": MAX_UNAVAILABLE,
            "steps": len(steps), "step_kinds": _kinds(steps), "samples": checker.samples,
            "max_out": checker.max_out, "violations": checker.violations})
    print("\n".join(steps))
    print("\n".join(checker.violations))
    assert not checker.violations, "\n".join(checker.violations) + worker_log(soak_stack)
    assert checker.samples > 20
    n = k8s.node(admin)
    assert n.spec.unschedulable, "the admin's cordon was undone"
    assert k8s.state(unreadable) == "healthy"
    for node in candidates:
        assert not k8s.node(node).spec.unschedulable, f"{node} left cordoned"
    with contextlib.suppress(GpuSimError):
        gpu.set_exporter_mode(unreadable, "up")


def _kinds(steps: list[str]) -> dict[str, int]:
    """"12s inject xid 79 on n/3" -> {"inject xid": 1, ...}"""
    out: dict[str, int] = {}
    for step in steps:
        words = step.split()[1:3]
        key = " ".join(w for w in words if not w.startswith("gpu-node")) or "?"
        out[key] = out.get(key, 0) + 1
    return out


def _append_report(path: str, entry: dict[str, object]) -> None:
    try:
        with open(path) as f:
            runs = json.load(f)
    except (OSError, ValueError):
        runs = []
    runs.append(entry)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(runs, f, indent=1)
