"""Contract tests for the Eviction API and PodDisruptionBudget status."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kubernetes import client

from tests.polling import wait_for
from tests.sim.testkit import Contract, real_cluster

sim_only = pytest.mark.skipif(bool(real_cluster()), reason="needs the simulator's controllers")


@pytest.fixture(scope="module")
def k(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Contract]:
    c = Contract.open(tmp_path_factory.mktemp("evict"), scenario="small")
    yield c
    c.close()


def _evict(k: Contract, ns: str, name: str, **options: object) -> object:
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=ns),
                             delete_options=client.V1DeleteOptions(**options) if options else None)
    return k.core.create_namespaced_pod_eviction(name, ns, body)


def test_eviction_without_pdb_deletes_pod_and_returns_201_status(k: Contract) -> None:
    ns, node = k.namespace(), k.node()
    pod = k.pod(ns, node)
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod.metadata.name, namespace=ns))
    resp = k.core.create_namespaced_pod_eviction(pod.metadata.name, ns, body,
                                                 _preload_content=False)
    assert resp.status == 201
    out = json.loads(resp.data)
    assert (out["kind"], out["status"]) == ("Status", "Success")
    gone = k.core.read_namespaced_pod(pod.metadata.name, ns)
    assert gone.metadata.deletion_timestamp is not None


def test_eviction_blocked_by_pdb_returns_429_with_cause(k: Contract) -> None:
    ns, node = k.namespace(), k.node()
    pods = [k.pod(ns, node, {"app": "x"}) for _ in range(2)]
    pdb = k.pdb(ns, {"app": "x"}, min_available=2)
    k.settled_pdb(ns, pdb, current_healthy=2, desired_healthy=2, disruptions_allowed=0)
    with pytest.raises(client.ApiException) as err:
        _evict(k, ns, pods[0].metadata.name)
    body = json.loads(err.value.body)
    assert (err.value.status, body["reason"]) == (429, "TooManyRequests")
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"]["causes"] == [{
        "reason": "DisruptionBudget",
        "message": f"The disruption budget {pdb} needs 2 healthy pods and has 2 currently",
    }]
    assert k.core.read_namespaced_pod(pods[0].metadata.name, ns).metadata.deletion_timestamp \
        is None


def test_eviction_allowed_decrements_pdb_and_records_disrupted_pod(k: Contract) -> None:
    ns, node = k.namespace(), k.node()
    pods = [k.pod(ns, node, {"app": "y"}) for _ in range(3)]
    pdb = k.pdb(ns, {"app": "y"}, min_available=2)
    k.settled_pdb(ns, pdb, disruptions_allowed=1)
    _evict(k, ns, pods[0].metadata.name)
    status = k.policy.read_namespaced_pod_disruption_budget(pdb, ns).status
    assert status.disruptions_allowed == 0
    with pytest.raises(client.ApiException) as err:
        _evict(k, ns, pods[1].metadata.name)
    assert err.value.status == 429


def test_eviction_with_two_pdbs_returns_500(k: Contract) -> None:
    ns, node = k.namespace(), k.node()
    pod = k.pod(ns, node, {"app": "z"})
    for _ in range(2):
        k.settled_pdb(ns, k.pdb(ns, {"app": "z"}, max_unavailable=1), expected_pods=0)
    with pytest.raises(client.ApiException) as err:
        _evict(k, ns, pod.metadata.name)
    body = json.loads(err.value.body)
    assert (err.value.status, body["reason"]) == (500, "InternalError")
    assert "more than one PodDisruptionBudget" in body["message"]


def test_eviction_of_missing_pod_returns_404(k: Contract) -> None:
    ns = k.namespace()
    with pytest.raises(client.ApiException) as err:
        _evict(k, ns, "ghost")
    assert err.value.status == 404
    assert json.loads(err.value.body)["message"] == 'pods "ghost" not found'


def test_eviction_of_pending_pod_ignores_pdb(k: Contract) -> None:
    ns = k.namespace()
    pod = k.pod(ns, None, {"app": "p"}, running=False)
    pdb = k.pdb(ns, {"app": "p"}, min_available=5)
    k.settled_pdb(ns, pdb, disruptions_allowed=0, desired_healthy=5)
    _evict(k, ns, pod.metadata.name)
    assert k.core.list_namespaced_pod(ns).items == []


def test_eviction_dry_run_changes_nothing(k: Contract) -> None:
    ns, node = k.namespace(), k.node()
    pod = k.pod(ns, node, {"app": "d"})
    k.pod(ns, node, {"app": "d"})
    pdb = k.pdb(ns, {"app": "d"}, min_available=1)
    k.settled_pdb(ns, pdb, disruptions_allowed=1)
    _evict(k, ns, pod.metadata.name, dry_run=["All"])
    assert k.core.read_namespaced_pod(pod.metadata.name, ns).metadata.deletion_timestamp is None
    assert k.policy.read_namespaced_pod_disruption_budget(pdb, ns).status.disruptions_allowed == 1


def test_pdb_does_not_count_unready_or_terminating_pods(k: Contract) -> None:
    ns, node = k.namespace(), k.node()
    k.pod(ns, node, {"app": "u"})
    k.pod(ns, node, {"app": "u"}, ready=False)
    leaving = k.pod(ns, node, {"app": "u"})
    k.core.delete_namespaced_pod(leaving.metadata.name, ns)
    pdb = k.pdb(ns, {"app": "u"}, min_available=1)
    k.settled_pdb(ns, pdb, current_healthy=1, expected_pods=3, disruptions_allowed=0)


def _replicaset(k: Contract, ns: str, app: str, replicas: int) -> None:
    k.apps.create_namespaced_replica_set(ns, {
        "metadata": {"name": app},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": app}},
                 "template": {"metadata": {"labels": {"app": app}},
                              "spec": {"containers": [{"name": "c", "image": "x"}],
                                       "terminationGracePeriodSeconds": 0}}}})
    wait_for(lambda: len([p for p in k.core.list_namespaced_pod(ns).items
                          if p.status.phase == "Running"]) == replicas)


@sim_only
def test_pdb_percent_min_available_rounds_up(k: Contract) -> None:
    ns = k.namespace()
    _replicaset(k, ns, "pct", 3)
    pdb = k.pdb(ns, {"app": "pct"}, min_available="50%")
    # ceil(3 * 50%) = 2 pods must stay healthy.
    k.settled_pdb(ns, pdb, expected_pods=3, desired_healthy=2, current_healthy=3,
                  disruptions_allowed=1)


@sim_only
def test_pdb_max_unavailable_uses_controller_scale(k: Contract) -> None:
    ns = k.namespace()
    _replicaset(k, ns, "mu", 4)
    pdb = k.pdb(ns, {"app": "mu"}, max_unavailable="30%")
    # ceil(4 * 30%) = 2 may be unavailable, so 2 must stay healthy.
    k.settled_pdb(ns, pdb, expected_pods=4, desired_healthy=2, disruptions_allowed=2)
