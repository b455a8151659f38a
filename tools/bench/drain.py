"""Drain one node carrying 110 pods (several ReplicaSets with PDBs) with DrainActivities.drain_node.

Run: ``.venv/bin/python -m tools.bench.drain [--repeat 3] [--retry-interval 5]``

Per run, a fresh cluster simulator (in-process, ``ThreadedClusterSim``) with three nodes:
``bench-0001`` (the one drained) and two spares. With the spares cordoned, six ReplicaSets are
created through the API, so all their pods land on ``bench-0001``: 108 pods plus the node's
mirror pod and dcgm-exporter DaemonSet pod = 110 pods, the kubelet's default maximum. PDBs:
two ReplicaSets ``maxUnavailable: 50%``, two ``minAvailable: 12`` (of 18), one
``maxUnavailable: 25%``, one without a PDB. Then the spares are uncordoned, ``bench-0001``
cordoned (as the remediation's claim does), and ``drain_node`` runs in an activity context
until ``drained`` (replacements must become Ready elsewhere before a PDB allows the next
evictions, so several rounds are needed).

Reports the time, the number of rounds (list calls), and the API calls: every request the
kubernetes client sent (counted by wrapping its REST client, by method) and the simulator's
write log (mutating requests by verb/resource and HTTP status).
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from tools.bench._common import free_port, median, save, table, wait_until, write_scenario

REPLICAS = 18
PDBS: list[dict[str, Any] | None] = [
    {"maxUnavailable": "50%"}, {"maxUnavailable": "50%"}, {"minAvailable": 12},
    {"minAvailable": 12}, {"maxUnavailable": "25%"}, None,
]
NAMESPACE = "team-drain"


def setup(api: Any, node: str, spares: list[str]) -> None:
    from kubernetes import client

    # Any, as in tests/sim/testkit.py: the client takes the plain dict bodies below, which its
    # type hints (model objects only) do not allow.
    core: Any = client.CoreV1Api(api)
    apps: Any = client.AppsV1Api(api)
    policy: Any = client.PolicyV1Api(api)
    for s in spares:
        core.patch_node(s, {"spec": {"unschedulable": True}})
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    for i, pdb in enumerate(PDBS):
        name = f"app-{i}"
        labels = {"app": name}
        apps.create_namespaced_replica_set(NAMESPACE, {
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": REPLICAS, "selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels, "annotations": {
                    "sim.gpu-remediate.io/readiness-delay-seconds": "0.5"}},
                "spec": {"terminationGracePeriodSeconds": 1,
                         "containers": [{"name": "main", "image": "busybox"}]}}}})
        if pdb is not None:
            policy.create_namespaced_pod_disruption_budget(NAMESPACE, {
                "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": name},
                "spec": {"selector": {"matchLabels": labels}, **pdb}})

    def all_ready_on_node() -> bool:
        pods = core.list_namespaced_pod(NAMESPACE).items
        ready = [p for p in pods if p.spec.node_name == node and any(
            c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]
        pdbs = policy.list_namespaced_pod_disruption_budget(NAMESPACE).items
        settled = all((b.status.current_healthy or 0) == REPLICAS for b in pdbs)
        return len(ready) == REPLICAS * len(PDBS) and settled

    wait_until(all_ready_on_node, 120, f"{REPLICAS * len(PDBS)} pods Ready on {node}")
    for s in spares:
        core.patch_node(s, {"spec": {"unschedulable": False}})
    core.patch_node(node, {"spec": {"unschedulable": True}})


def one_run(retry_interval: float, tmp: Path) -> dict[str, Any]:
    import httpx
    from kubernetes import client, config
    from temporalio.testing import ActivityEnvironment

    from activities.drain import DrainActivities
    from sim.cluster import ThreadedClusterSim
    from workflows.messages import DrainInput
    from workflows.settings import DrainSettings

    scenario = write_scenario(tmp / "drain-scenario.yaml", 3)
    node, spares = "bench-0001", ["bench-0002", "bench-0003"]
    with ThreadedClusterSim(scenario=str(scenario), port=free_port(), job_seconds=1.0) as sim:
        api = config.new_client_from_config(config_file=str(sim.kubeconfig(tmp / "kubeconfig")))
        setup(api, node, spares)
        on_node = client.CoreV1Api(api).list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}").items
        httpx.delete(f"{sim.url}/sim/v1/writes", timeout=10)

        requests: collections.Counter[str] = collections.Counter()
        rest = api.rest_client
        original = rest.request

        def counting(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            path = url.split("?", 1)[0]
            kind = "eviction" if path.endswith("/eviction") else \
                "events" if "/events" in path else path.rsplit("/", 1)[-1]
            requests[f"{method} {kind}"] += 1
            return original(method, url, *args, **kwargs)

        rest.request = counting
        drain = DrainActivities(api)
        inp = DrainInput(node=node, settings=DrainSettings(
            retry_interval=timedelta(seconds=retry_interval)),
            report_after=timedelta(minutes=30))
        heartbeats: list[Any] = []
        env = ActivityEnvironment()
        env.on_heartbeat = lambda *details: heartbeats.append(details)
        t0 = time.perf_counter()
        result = env.run(drain.drain_node, inp)
        seconds = time.perf_counter() - t0
        rest.request = original
        writes = httpx.get(f"{sim.url}/sim/v1/writes", timeout=10).json()["writes"]
    by_write = collections.Counter(f"{w['verb']} {w['resource']} {w['code']}" for w in writes)
    return {"outcome": result.outcome, "evicted": len(result.evicted),
            "skipped": len(result.skipped), "pods_on_node": len(on_node), "seconds": seconds,
            "rounds": requests.get("GET pods", 0), "requests_total": sum(requests.values()),
            "requests": dict(requests), "writes_total": len(writes), "writes": dict(by_write),
            "heartbeats": len(heartbeats)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--retry-interval", type=float, default=5.0,
                   help="DrainSettings.retry_interval in seconds (product default 5)")
    args = p.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-drain-"))
    runs = []
    for i in range(args.repeat):
        r = one_run(args.retry_interval, tmp)
        runs.append(r)
        print(f"run {i + 1}: {r['outcome']}, {r['evicted']} evicted, {r['seconds']:.1f}s, "
              f"{r['rounds']} rounds, {r['requests_total']} requests, {r['writes_total']} writes",
              flush=True)
    rows = [[r["pods_on_node"], r["evicted"], r["skipped"], r["seconds"], r["rounds"],
             r["requests_total"], r["writes_total"]] for r in runs]
    rows.append(["median", "", "", median([r["seconds"] for r in runs]),
                 median([r["rounds"] for r in runs]), median([r["requests_total"] for r in runs]),
                 median([r["writes_total"] for r in runs])])
    print(table(["pods on node", "evicted", "skipped", "seconds", "rounds (lists)",
                 "API requests", "writes (log)"], rows))
    print("requests by kind (last run):", runs[-1]["requests"])
    print("writes by verb/resource/status (last run):", runs[-1]["writes"])
    save("drain", {"retry_interval_s": args.retry_interval, "runs": runs,
                   "median_seconds": median([r["seconds"] for r in runs]),
                   "median_requests": median([r["requests_total"] for r in runs])})


if __name__ == "__main__":
    main()
