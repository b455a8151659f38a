"""cordon_for_incident against the cluster simulator: cordoned with the annotation and a
Warning Event; a node someone else cordoned is left so and reported; only a cordon of ours
comes off; a node gone counts as uncordoned; one node's 500 never stops the others."""

from __future__ import annotations

from typing import Any

from temporalio.testing import ActivityEnvironment

from activities.incidents import IncidentActivities
from activities.node_keys import A_INCIDENT
from tests.activities.conftest import Cluster
from workflows.incidents import IncidentCordon

KEY = "nvidia.com/gpu.clique=d0"


def cordon(cluster: Cluster, env: ActivityEnvironment, **kw: Any) -> Any:
    acts = IncidentActivities(cluster.api)
    return env.run(acts.cordon_for_incident, IncidentCordon(key=KEY, reason="3 nodes", **kw))


def test_the_incident_cordons_without_draining_and_says_so_on_each_node(
        cluster: Cluster, env: ActivityEnvironment) -> None:
    cluster.core.patch_node("gpu-node-03", {"spec": {"unschedulable": True}})  # an admin's
    result = cordon(cluster, env, cordon=["gpu-node-01", "gpu-node-02", "gpu-node-03"])
    assert (result.cordoned, result.already) == (["gpu-node-01", "gpu-node-02"], ["gpu-node-03"])
    for name in ("gpu-node-01", "gpu-node-02"):
        node = cluster.core.read_node(name)
        assert node.spec.unschedulable and (node.metadata.annotations or {})[A_INCIDENT] == KEY
        assert not any(t.key.startswith("gpu-remediate") for t in node.spec.taints or [])
        [event] = cluster.events(name, "DomainIncident")
        assert event.type == "Warning" and KEY in event.message
    assert A_INCIDENT not in (cluster.core.read_node("gpu-node-03").metadata.annotations or {})
    assert "someone else" in cluster.events("gpu-node-03", "DomainIncident")[0].message
    # No pod was evicted: the nodes were not drained.
    assert not [w for w in cluster.writes() if w["resource"] in ("pods/eviction", "eviction")]

    result = cordon(cluster, env, uncordon=["gpu-node-01", "gpu-node-03", "gpu-node-99"])
    assert result.uncordoned == ["gpu-node-01", "gpu-node-03", "gpu-node-99"]
    assert not cluster.core.read_node("gpu-node-01").spec.unschedulable
    assert cluster.core.read_node("gpu-node-03").spec.unschedulable, "not ours: kept"
    assert cluster.core.read_node("gpu-node-02").spec.unschedulable


def test_one_nodes_api_error_never_stops_the_others(
        cluster: Cluster, env: ActivityEnvironment) -> None:
    cluster.faults({"verb": "patch", "resource": "nodes", "name": "gpu-node-01",
                    "status": 500, "times": 100})
    result = cordon(cluster, env, cordon=["gpu-node-01", "gpu-node-02"])
    assert result.cordoned == ["gpu-node-02"]
    assert result.errors and result.errors[0].startswith("gpu-node-01")
