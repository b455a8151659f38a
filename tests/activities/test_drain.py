"""drain_node against the cluster simulator: Eviction API, PDBs, skips, force, dry-run."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.testing import ActivityEnvironment

from activities import drain as drain_module
from activities.drain import DrainActivities, clear_blocked
from activities.nodes import NodeActivities
from tests.activities.conftest import Cluster, Heartbeats, metric
from tests.polling import wait_for
from workflows.messages import DrainInput
from workflows.settings import DrainSettings

NODE = "gpu-node-01"  # runs team-a/trainer (8 GPUs, PDB min_available 1), DaemonSets, mirror pod
FAST = DrainSettings(retry_interval=timedelta(seconds=0.2))


def drain(node: str = NODE, *, report_after: float = 20, force: bool = False,
          dry_run: bool = False, gpu_pods_only: bool = False) -> DrainInput:
    return DrainInput(node=node, settings=FAST.model_copy(update={"gpu_pods_only": gpu_pods_only}),
                      force=force, report_after=timedelta(seconds=report_after), dry_run=dry_run)


@pytest.fixture
def acts(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[DrainActivities]:
    monkeypatch.setattr(drain_module, "POLL_SECONDS", 0.1)
    cluster.cordon(NODE)  # claim_node cordons first; replacements must land elsewhere
    yield DrainActivities(cluster.api)
    # Every test's simulator has the same node names; the blocked state is per process.
    clear_blocked(NODE)


def bare_pod(k: Cluster, ns: str, node: str, name: str, *, gpus: int = 0,
             labels: dict[str, str] | None = None, ready_after: float = 0) -> None:
    container: dict[str, Any] = {"name": "main", "image": "registry.sim.local/x"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    k.core.create_namespaced_pod(ns, {
        "metadata": {"name": name, "labels": labels or {},
                     "annotations": {"sim.gpu-remediate.io/readiness-delay-seconds":
                                     str(ready_after)}},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                 "containers": [container]}})


def namespace(k: Cluster, name: str) -> str:
    k.core.create_namespace({"metadata": {"name": name}})
    return name


def block_trainer(k: Cluster) -> str:
    """Make team-a/trainer's PDB refuse every eviction (both replicas must stay)."""
    pdbs = k.policy.list_namespaced_pod_disruption_budget("team-a").items
    assert len(pdbs) == 1
    name = pdbs[0].metadata.name
    k.policy.patch_namespaced_pod_disruption_budget(name, "team-a",
                                                    {"spec": {"minAvailable": 2}})
    wait_for(lambda: k.policy.read_namespaced_pod_disruption_budget(name, "team-a")
             .status.disruptions_allowed == 0)
    return name


def trainer_on(k: Cluster, node: str) -> str:
    pods = wait_for(lambda: [p for p in k.pods_on(node) if p.metadata.namespace == "team-a"])
    assert len(pods) == 1, [p.metadata.name for p in pods]
    return f"team-a/{pods[0].metadata.name}"


def test_drain_evicts_normal_pods_and_skips_daemonset_mirror_and_finished_pods(
        cluster: Cluster, acts: DrainActivities, env: ActivityEnvironment) -> None:
    ns = namespace(cluster, "team-c")
    trainer = trainer_on(cluster, NODE)
    cluster.batch.create_namespaced_job(ns, {
        "metadata": {"name": "done"},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "nodeName": NODE, "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "registry.sim.local/x"}]}}}})
    wait_for(lambda: any(p.status.phase == "Succeeded" for p in cluster.pods_on(NODE)))
    bare_pod(cluster, ns, NODE, "cpu-worker")
    result = env.run(acts.drain_node, drain())
    assert result.outcome == "drained"
    assert result.evicted == sorted([trainer, "team-c/cpu-worker"])
    reasons = {s.split(" (")[1].rstrip(")") for s in result.skipped}
    assert reasons == {"DaemonSet pod", "mirror pod", "finished"}
    assert any(s.startswith("kube-system/node-local-agent-gpu-node-01 (mirror")
               for s in result.skipped)
    left = {f"{p.metadata.namespace}/{p.metadata.name}" for p in cluster.pods_on(NODE)}
    assert trainer not in left and "team-c/cpu-worker" not in left
    # Under load the trainer's PDB may refuse a round (429) until its replacement is ready;
    # what matters is that only the two movable pods were ever asked to move, once each.
    evictions = cluster.writes("pods/eviction")
    assert {w["name"] for w in evictions} == {trainer.split("/")[1], "cpu-worker"}, \
        "only the two movable pods were asked to move"
    assert sorted(w["name"] for w in evictions if w["code"] in (200, 201)) == sorted(
        [trainer.split("/")[1], "cpu-worker"]), "each was evicted once"
    assert not [w for w in cluster.writes("pods") if w["verb"] == "delete"]


def test_drain_gpu_pods_only_leaves_cpu_pods(
        cluster: Cluster, acts: DrainActivities, env: ActivityEnvironment) -> None:
    ns = namespace(cluster, "team-c")
    bare_pod(cluster, ns, NODE, "cpu-worker")
    result = env.run(acts.drain_node, drain(gpu_pods_only=True))
    assert result.outcome == "drained" and result.evicted == [trainer_on_was(result)]
    assert "team-c/cpu-worker (uses no GPU)" in result.skipped
    assert any(p.metadata.name == "cpu-worker" and p.metadata.deletion_timestamp is None
               for p in cluster.pods_on(NODE))


def trainer_on_was(result: Any) -> str:
    return next(p for p in result.evicted if p.startswith("team-a/"))


def test_drain_blocked_by_a_pdb_reports_it_after_report_after(
        cluster: Cluster, acts: DrainActivities, env: ActivityEnvironment,
        heartbeats: Heartbeats) -> None:
    pdb = block_trainer(cluster)
    trainer = trainer_on(cluster, NODE)
    result = env.run(acts.drain_node, drain(report_after=1))
    assert result.outcome == "blocked"
    assert result.blocking_pdb == f"team-a/{pdb}"
    assert result.remaining == [trainer] and pdb in result.message
    assert heartbeats.seen and heartbeats.seen[-1]["pdb"] == f"team-a/{pdb}"
    events = cluster.events(NODE, "DrainBlocked")
    assert len(events) == 1 and pdb in events[0].message and events[0].type == "Warning"
    assert metric("gpu_remediate_drain_blocked", node=NODE, pdb=f"team-a/{pdb}") == 1


def test_drain_blocked_again_by_the_same_pdb_does_not_repeat_the_event(
        cluster: Cluster, acts: DrainActivities, env: ActivityEnvironment) -> None:
    """The workflow calls drain_node again after every 'blocked': one Event per
    blocking episode, not one per minute for the whole drain deadline."""
    block_trainer(cluster)
    for _ in range(3):
        assert env.run(acts.drain_node, drain(report_after=0.3)).outcome == "blocked"
    assert len(cluster.events(NODE, "DrainBlocked")) == 1


def test_drain_completes_once_the_replacement_is_ready(
        cluster: Cluster, acts: DrainActivities, env: ActivityEnvironment,
        heartbeats: Heartbeats) -> None:
    """Two replicas on the node, PDB min_available 1: the second eviction waits until the
    first one's replacement (elsewhere) is Ready."""
    ns = namespace(cluster, "web")
    cluster.cordon(NODE, False)
    others = ["gpu-node-02", "gpu-node-03", "gpu-node-04"]
    for n in others:
        cluster.cordon(n)
    labels = {"app": "web"}
    cluster.apps.create_namespaced_replica_set(ns, {
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels, "annotations": {
                "sim.gpu-remediate.io/readiness-delay-seconds": "1.5"}},
            "spec": {"terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "registry.sim.local/web"}]}}}})
    cluster.policy.create_namespaced_pod_disruption_budget(ns, {
        "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": labels}, "minAvailable": 1}})

    def web_pods() -> list[Any]:
        return list(cluster.core.list_namespaced_pod(ns).items)

    def ready(p: Any) -> bool:
        return any(c.type == "Ready" and c.status == "True"
                   for c in (p.status.conditions or []))

    wait_for(lambda: len(web_pods()) == 2 and all(
        p.spec.node_name == NODE and ready(p) for p in web_pods()))
    wait_for(lambda: cluster.policy.read_namespaced_pod_disruption_budget("web", ns)
             .status.disruptions_allowed == 1)
    for n in others:
        cluster.cordon(n, False)
    cluster.cordon(NODE)

    result = env.run(acts.drain_node, drain(report_after=30))
    assert result.outcome == "drained"
    assert len([p for p in result.evicted if p.startswith("web/")]) == 2
    assert any(h["pdb"] == "web/web" for h in heartbeats.seen), "the second eviction waited"
    moved = [p for p in web_pods() if p.metadata.deletion_timestamp is None]
    assert moved and all(p.spec.node_name != NODE for p in moved)
    assert any(ready(p) for p in moved)
    assert metric("gpu_remediate_drain_blocked", node=NODE, pdb="web/web") is None


def test_drain_force_deletes_what_eviction_cannot_move(
        cluster: Cluster, acts: DrainActivities, env: ActivityEnvironment) -> None:
    block_trainer(cluster)
    trainer = trainer_on(cluster, NODE)
    result = env.run(acts.drain_node, drain(force=True))
    assert result.outcome == "drained" and result.forced == [trainer]
    deletes = [w for w in cluster.writes("pods") if w["verb"] == "delete"]
    assert [f"{w['namespace']}/{w['name']}" for w in deletes] == [trainer]
    assert not cluster.writes("pods/eviction")


def test_drain_dry_run_plans_and_writes_nothing(
        cluster: Cluster, acts: DrainActivities, env: ActivityEnvironment) -> None:
    trainer = trainer_on(cluster, NODE)
    cluster.clear_writes()
    result = env.run(acts.drain_node, drain(dry_run=True))
    assert result.outcome == "planned" and result.remaining == [trainer]
    # DaemonSet pods (the GPU Operator's operands among them) and the mirror pod stay.
    assert sum("(mirror pod)" in p for p in result.skipped) == 1
    assert all(p.endswith(("(DaemonSet pod)", "(mirror pod)")) for p in result.skipped)
    assert any(p.startswith("gpu-operator/") for p in result.skipped)
    assert cluster.writes() == []


def test_drain_with_two_matching_pdbs_is_blocked_with_a_clear_name(
        cluster: Cluster, acts: DrainActivities, env: ActivityEnvironment) -> None:
    """The Eviction API answers 500 when several PDBs select a pod: that is a block an
    operator must fix, named as such, not a transient error to retry blindly."""
    cluster.policy.create_namespaced_pod_disruption_budget("team-a", {
        "metadata": {"name": "trainer-extra"},
        "spec": {"selector": {"matchLabels": {"app": "trainer"}}, "maxUnavailable": 1}})
    result = env.run(acts.drain_node, drain(report_after=0.5))
    assert result.outcome == "blocked"
    assert result.blocking_pdb == "team-a/(several budgets match)"
    assert "several budgets" in cluster.events(NODE, "DrainBlocked")[0].message


@pytest.mark.parametrize("status", [500, 503])
def test_drain_transient_eviction_error_fails_retryably_and_the_retry_drains(
        cluster: Cluster, acts: DrainActivities, env: ActivityEnvironment,
        status: int) -> None:
    """urllib3 does not retry a POST: the error reaches the activity, which fails with a
    retryable ApplicationError; Temporal's retry (the next call) finishes the drain."""
    trainer = trainer_on(cluster, NODE)
    cluster.faults({"verb": "create", "resource": "pods/eviction", "status": status,
                    "times": 1})
    with pytest.raises(ApplicationError) as err:
        env.run(acts.drain_node, drain())
    assert err.value.type == f"Http{status}" and not err.value.non_retryable
    assert "injected" in str(err.value) or str(status) in str(err.value)
    result = env.run(acts.drain_node, drain())
    assert result.outcome == "drained" and result.evicted == [trainer]


def test_drain_pod_list_survives_a_503_burst(
        cluster: Cluster, acts: DrainActivities, env: ActivityEnvironment) -> None:
    """GETs are idempotent: the drain retries a 503 + Retry-After itself (heartbeating; the
    client's own retries are off, they were unseen by any heartbeat)."""
    cluster.faults({"verb": "list", "resource": "pods", "status": 503, "times": 1,
                    "retry_after": 1})
    assert env.run(acts.drain_node, drain()).outcome == "drained"
    assert cluster.injected()["injected"] == 1


def test_drain_of_a_missing_node_says_the_node_is_gone(
        cluster: Cluster, acts: DrainActivities, env: ActivityEnvironment) -> None:
    with pytest.raises(ApplicationError) as err:
        env.run(acts.drain_node, drain("no-such-node"))
    assert err.value.type == "NodeGone" and err.value.non_retryable
    assert "no-such-node" in str(err.value)


def test_drain_reports_on_a_timer_without_any_pdb(
        cluster: Cluster, acts: DrainActivities, env: ActivityEnvironment) -> None:
    """A pod with a long grace period holds the drain up with no PDB involved: the
    workflow still hears of it after report_after, so its deadline can apply."""
    assert env.run(acts.drain_node, drain()).outcome == "drained"  # the PDB's pods go first
    ns = namespace(cluster, "team-slow")
    cluster.core.create_namespaced_pod(ns, {
        "metadata": {"name": "slow"},
        "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 3600,
                 "containers": [{"name": "main", "image": "registry.sim.local/x"}]}})
    wait_for(lambda: cluster.core.read_namespaced_pod("slow", ns).status.phase == "Running")
    result = env.run(acts.drain_node, drain(report_after=1))
    assert result.outcome == "blocked" and result.blocking_pdb == ""
    assert f"{ns}/slow" in result.remaining
    assert result.node_ready and result.terminating == []  # within its grace: not stuck
    assert "pods left" in result.message


def test_release_clears_the_blocked_gauge_of_a_drain_given_up(
        cluster: Cluster, acts: DrainActivities, env: ActivityEnvironment) -> None:
    pdb = f"team-a/{block_trainer(cluster)}"
    assert env.run(acts.drain_node, drain(report_after=0.3)).outcome == "blocked"
    assert metric("gpu_remediate_drain_blocked", node=NODE, pdb=pdb) == 1
    from tests.activities.test_nodes import release
    env.run(NodeActivities(cluster.api).release_node, release(outcome="released"))
    assert metric("gpu_remediate_drain_blocked", node=NODE, pdb=pdb) is None


def test_drain_stops_promptly_when_cancelled(
        cluster: Cluster, acts: DrainActivities, env: ActivityEnvironment) -> None:
    """An operator's abort cancels the activity: a blocked drain must not keep evicting."""
    block_trainer(cluster)
    first_beat = threading.Event()
    env.on_heartbeat = lambda *_: first_beat.set()
    outcome: list[BaseException | object] = []

    def run() -> None:
        try:
            outcome.append(env.run(acts.drain_node, drain(report_after=3600)))
        except BaseException as err:
            outcome.append(err)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    assert first_beat.wait(60)
    env.cancel()
    # Uncancelled, the blocked drain would run for report_after (an hour): ending at all,
    # within a deadline any loaded machine meets, is stopping promptly.
    worker.join(60)
    assert not worker.is_alive()
    assert isinstance(outcome[0], CancelledError)


@pytest.fixture
def wedgeable(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    from sim.cluster.machines import NodeTiming
    from tests.activities.conftest import _cluster
    monkeypatch.setattr(drain_module, "POLL_SECONDS", 0.1)
    yield from _cluster(tmp_path, node_timing=NodeTiming(status_grace_seconds=0.5))
    clear_blocked(NODE)


def test_drain_of_a_wedged_node_reports_pods_stuck_terminating_then_counts_them_gone(
        wedgeable: Cluster, env: ActivityEnvironment) -> None:
    """A stopped kubelet never confirms a deletion: the evicted pods stay Terminating.
    The drain says so on its timer; past not_ready_terminating_timeout on the NotReady
    node they count as gone and the drain ends."""
    import httpx
    k = wedgeable
    k.cordon(NODE)
    acts = DrainActivities(k.api)
    ns = namespace(k, "team-w")
    k.core.create_namespaced_pod(ns, {
        "metadata": {"name": "stuck"},
        "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "main", "image": "registry.sim.local/x"}]}})
    wait_for(lambda: k.core.read_namespaced_pod("stuck", ns).status.phase == "Running")
    assert httpx.post(f"{k.url}/sim/v1/nodes/{NODE}/wedge").status_code == 200
    wait_for(lambda: not DrainActivities(k.api)._node_ready(NODE), timeout=60)
    slow = DrainInput(node=NODE, settings=FAST.model_copy(
        update={"not_ready_terminating_timeout": timedelta(hours=1)}),
        report_after=timedelta(seconds=2))
    first = env.run(acts.drain_node, slow)
    assert first.outcome == "blocked" and not first.node_ready
    assert f"{ns}/stuck" in first.remaining
    assert any(t.startswith(f"{ns}/stuck ") for t in first.terminating), first.terminating
    assert "node not Ready" in first.message and "Terminating" in first.message
    assert k.core.read_namespaced_pod("stuck", ns).metadata.deletion_timestamp is not None
    quick = slow.model_copy(update={"settings": FAST.model_copy(
        update={"not_ready_terminating_timeout": timedelta(seconds=1)})})
    done = env.run(acts.drain_node, quick)
    assert done.outcome == "drained", done
    assert f"{ns}/stuck" in done.counted_gone and "counted" in done.message
    # Only the drain's view: the pod object is still there, Terminating, as on a real
    # cluster until the kubelet returns or the node is deleted.
    assert k.core.read_namespaced_pod("stuck", ns).metadata.deletion_timestamp is not None


def test_the_drain_heartbeats_after_every_eviction(
        cluster: Cluster, acts: DrainActivities, env: ActivityEnvironment,
        heartbeats: Heartbeats) -> None:
    """One heartbeat per eviction, not one per round: evictions add up, heartbeats don't."""
    ns = namespace(cluster, "team-c")
    for name in ("a", "b", "c"):
        bare_pod(cluster, ns, NODE, name)
    result = env.run(acts.drain_node, drain())
    assert result.outcome == "drained"
    steps = [h.get("step", "") for h in heartbeats.seen if isinstance(h, dict)]
    for name in ("a", "b", "c"):
        assert f"evicted team-c/{name}" in steps, steps


def test_a_drain_on_an_api_server_taking_most_of_the_heartbeat_timeout_per_call_never_misses_it(
        cluster: Cluster, acts: DrainActivities, env: ActivityEnvironment) -> None:
    """Issue 29: sequential evictions of 20 s each used to heartbeat once per round, past
    the 30 s heartbeat timeout, and the node was quarantined "step drain failed". Here every
    call takes 7 s against a 10 s heartbeat timeout (the same 2/3 as 20 s against the
    default 30 s, which the test below pins; the simulator's latency injection): no gap
    between heartbeats reaches the heartbeat timeout, and the drain completes."""
    ns = namespace(cluster, "team-c")
    for name in ("a", "b"):
        bare_pod(cluster, ns, NODE, name)
    trainer = trainer_on(cluster, NODE)
    beats: list[float] = []
    timeout, delay = timedelta(seconds=10), 7
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timeout)
    env.on_heartbeat = lambda *_: beats.append(time.monotonic())
    cluster.faults(*({"verb": verb, "resource": resource, "delay_seconds": delay,
                      "status": None}
                     for verb, resource in (("get", "nodes"), ("list", "pods"),
                                            ("create", "pods/eviction"))))
    started = time.monotonic()
    result = env.run(acts.drain_node, drain(report_after=600))
    ended = time.monotonic()
    assert result.outcome == "drained"
    assert sorted(result.evicted) == sorted([trainer, "team-c/a", "team-c/b"])
    marks = [started, *beats, ended]
    gaps = [b - a for a, b in itertools.pairwise(marks)]
    assert max(gaps) < timeout.total_seconds(), gaps
    assert ended - started > 5 * delay, "every call was slowed down"
    assert cluster.injected()["injected"] >= 7


def test_a_drain_call_always_fits_inside_the_heartbeat_timeout() -> None:
    margin = drain_module.HEARTBEAT_MARGIN_SECONDS
    for seconds in (5, 10, 27, 30, 60, 3600):
        call = drain_module.call_timeout_for(timedelta(seconds=seconds))
        assert call + margin <= seconds and call <= drain_module.MAX_CALL_SECONDS, seconds
    assert drain_module.call_timeout_for(timedelta(seconds=30)) > 20, \
        "a 20 s answer must fit the default"
    assert drain_module.min_heartbeat_timeout() == timedelta(seconds=5)
