"""Contract tests for the Kubernetes API semantics the product relies on.

Run against the simulator by default, or against a real cluster when
GPU_REMEDIATE_CONTRACT_KUBECONFIG is set (see tests/sim/testkit.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config, watch

from tests.sim.testkit import Contract, real_cluster

sim_only = pytest.mark.skipif(bool(real_cluster()), reason="needs the simulator")


@pytest.fixture(scope="module")
def k(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Contract]:
    c = Contract.open(tmp_path_factory.mktemp("api"), scenario="small", job_seconds=0.2)
    yield c
    c.close()


def _status(err: client.ApiException) -> dict:
    return json.loads(err.body)


def test_kubeconfig_is_accepted_by_load_kube_config(k: Contract) -> None:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(k.kubeconfig), client_configuration=cfg)
    assert cfg.host.startswith("http")
    assert client.VersionApi(k.api).get_code().major == "1"


def test_get_missing_node_returns_404_status_worded_like_kube(k: Contract) -> None:
    with pytest.raises(client.ApiException) as err:
        k.core.read_node("no-such-node")
    body = _status(err.value)
    assert err.value.status == 404
    assert body["kind"] == "Status" and body["status"] == "Failure"
    assert body["reason"] == "NotFound"
    assert body["message"] == 'nodes "no-such-node" not found'
    assert body["details"] == {"name": "no-such-node", "kind": "nodes"}


def test_create_existing_job_returns_409_already_exists(k: Contract) -> None:
    ns = k.namespace()
    job = {"metadata": {"name": "twice"}, "spec": {"template": {"spec": {
        "restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}],
        "schedulerName": "none"}}}}
    k.batch.create_namespaced_job(ns, job)
    with pytest.raises(client.ApiException) as err:
        k.batch.create_namespaced_job(ns, job)
    body = _status(err.value)
    assert (err.value.status, body["reason"]) == (409, "AlreadyExists")
    assert body["message"] == 'jobs.batch "twice" already exists'
    assert body["details"]["group"] == "batch"


def test_create_without_name_returns_422_with_field_cause(k: Contract) -> None:
    with pytest.raises(client.ApiException) as err:
        k.core.create_node({"metadata": {}})
    body = _status(err.value)
    assert (err.value.status, body["reason"]) == (422, "Invalid")
    cause = body["details"]["causes"][0]
    assert cause["field"] == "metadata.name"
    assert cause["reason"] == "FieldValueRequired"


def test_invalid_taint_effect_returns_422(k: Contract) -> None:
    node = k.node()
    with pytest.raises(client.ApiException) as err:
        k.core.patch_node(node, {"spec": {"taints": [{"key": "a", "effect": "Sometimes"}]}})
    body = _status(err.value)
    assert err.value.status == 422
    assert body["details"]["causes"][0]["field"] == "spec.taints[0].effect"


def test_create_in_missing_namespace_returns_404(k: Contract) -> None:
    with pytest.raises(client.ApiException) as err:
        k.core.create_namespaced_pod("no-such-ns", {
            "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}})
    assert err.value.status == 404
    assert _status(err.value)["message"] == 'namespaces "no-such-ns" not found'


def test_patch_with_stale_resource_version_returns_409_conflict(k: Contract) -> None:
    node = k.node()
    stale = k.core.read_node(node).metadata.resource_version
    k.core.patch_node(node, {"metadata": {"labels": {"step": "one"}}})
    with pytest.raises(client.ApiException) as err:
        k.core.patch_node(node, {"metadata": {"resourceVersion": stale,
                                              "labels": {"step": "two"}}})
    body = _status(err.value)
    assert (err.value.status, body["reason"]) == (409, "Conflict")
    assert body["message"] == (
        f'Operation cannot be fulfilled on nodes "{node}": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    assert k.core.read_node(node).metadata.labels["step"] == "one"


def test_replace_with_stale_resource_version_returns_409_conflict(k: Contract) -> None:
    node = k.node()
    obj = k.core.read_node(node)
    k.core.patch_node(node, {"spec": {"unschedulable": True}})
    obj.metadata.labels = {"x": "y"}
    with pytest.raises(client.ApiException) as err:
        k.core.replace_node(node, obj)
    assert err.value.status == 409


def test_resource_version_changes_on_every_write(k: Contract) -> None:
    node = k.node()
    first = k.core.read_node(node).metadata.resource_version
    second = k.core.patch_node(node, {"metadata": {"labels": {"a": "b"}}}).metadata.resource_version
    assert int(second) > int(first)


def test_strategic_merge_patch_deletes_annotation_with_null(k: Contract) -> None:
    node = k.node()
    k.core.patch_node(node, {"metadata": {"annotations": {"keep": "1", "drop": "2"}}})
    out = k.core.patch_node(node, {"metadata": {"annotations": {"drop": None}}})
    assert out.metadata.annotations.get("keep") == "1"
    assert "drop" not in out.metadata.annotations


def test_strategic_merge_patch_replaces_taint_list(k: Contract) -> None:
    # NodeSpec.taints has no patch strategy, so a strategic patch replaces the list.
    node = k.node()
    k.core.patch_node(node, {"spec": {"taints": [{"key": "one", "effect": "NoSchedule"}]}})
    out = k.core.patch_node(node, {"spec": {"taints": [{"key": "two", "effect": "NoSchedule"}]}})
    assert [t.key for t in out.spec.taints] == ["two"]


def test_strategic_merge_patch_merges_node_conditions_by_type(k: Contract) -> None:
    node = k.node()
    out = k.core.patch_node_status(node, {"status": {"conditions": [
        {"type": "GpuHealthy", "status": "False", "reason": "Xid79"}]}})
    types = {c.type: c.status for c in out.status.conditions}
    assert types == {"Ready": "True", "GpuHealthy": "False"}


def test_merge_patch_replaces_lists_and_removes_keys(k: Contract) -> None:
    node = k.node()
    k.core.patch_node(node, {"metadata": {"labels": {"a": "1", "b": "2"}}})
    out = k.core.patch_node(node, {"metadata": {"labels": {"a": None}}},
                            _content_type="application/merge-patch+json")
    assert out.metadata.labels == {"b": "2"}


def test_json_patch_applies_operations(k: Contract) -> None:
    node = k.node()
    out = k.core.patch_node(node, [
        {"op": "add", "path": "/metadata/labels", "value": {}},
        {"op": "add", "path": "/metadata/labels/gpu-remediate.io~1x", "value": "y"},
        {"op": "add", "path": "/spec/unschedulable", "value": True},
    ])
    assert out.spec.unschedulable is True
    assert out.metadata.labels == {"gpu-remediate.io/x": "y"}


def test_json_patch_test_op_fails_with_422(k: Contract) -> None:
    node = k.node()
    with pytest.raises(client.ApiException) as err:
        k.core.patch_node(node, [
            {"op": "test", "path": "/spec/unschedulable", "value": True},
            {"op": "replace", "path": "/spec/unschedulable", "value": False},
        ])
    assert err.value.status == 422
    assert _status(err.value)["reason"] == "Invalid"


def test_apply_patch_is_rejected_with_415(k: Contract) -> None:
    if real_cluster():
        pytest.skip("a real API server implements server-side apply")
    node = k.node()
    with pytest.raises(client.ApiException) as err:
        k.core.patch_node(node, {"metadata": {"labels": {"a": "b"}}},
                          _content_type="application/apply-patch+yaml", field_manager="t")
    assert err.value.status == 415
    assert _status(err.value)["reason"] == "UnsupportedMediaType"


def test_status_subresource_only_changes_status(k: Contract) -> None:
    node = k.node()
    out = k.core.patch_node_status(node, {"spec": {"unschedulable": True},
                                          "status": {"phase": "Running"}})
    assert not out.spec.unschedulable
    out = k.core.patch_node(node, {"status": {"allocatable": {"nvidia.com/gpu": "1"}}})
    assert out.status.allocatable["nvidia.com/gpu"] == "8"


def test_label_selector_equality_and_inequality(k: Contract) -> None:
    ns = k.namespace()
    for tier in ("a", "b"):
        k.pod(ns, None, {"tier": tier}, running=False)
    assert len(k.core.list_namespaced_pod(ns, label_selector="tier=a").items) == 1
    assert len(k.core.list_namespaced_pod(ns, label_selector="tier==b").items) == 1
    assert len(k.core.list_namespaced_pod(ns, label_selector="tier!=a").items) == 1


def test_label_selector_in(k: Contract) -> None:
    ns = k.namespace()
    for tier in ("a", "b", "c"):
        k.pod(ns, None, {"tier": tier}, running=False)
    pods = k.core.list_namespaced_pod(ns, label_selector="tier in (a, c)").items
    assert sorted(p.metadata.labels["tier"] for p in pods) == ["a", "c"]


def test_label_selector_notin(k: Contract) -> None:
    ns = k.namespace()
    for tier in ("a", "b"):
        k.pod(ns, None, {"tier": tier}, running=False)
    k.pod(ns, None, {}, running=False)
    pods = k.core.list_namespaced_pod(ns, label_selector="tier notin (a)").items
    # notin also matches objects without the label at all.
    assert sorted((p.metadata.labels or {}).get("tier", "-") for p in pods) == ["-", "b"]


def test_label_selector_exists_and_does_not_exist(k: Contract) -> None:
    ns = k.namespace()
    k.pod(ns, None, {"gpu": "yes"}, running=False)
    k.pod(ns, None, {}, running=False)
    assert len(k.core.list_namespaced_pod(ns, label_selector="gpu").items) == 1
    assert len(k.core.list_namespaced_pod(ns, label_selector="!gpu").items) == 1


def test_field_selector_spec_node_name(k: Contract) -> None:
    ns, node = k.namespace(), k.node()
    k.pod(ns, node)
    k.pod(ns, None, running=False)
    pods = k.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    # DaemonSets that tolerate everything also land on the node; only ours are checked.
    assert {p.spec.node_name for p in pods} == {node}
    assert len([p for p in pods if p.metadata.namespace == ns]) == 1


def test_field_selector_status_phase_and_name(k: Contract) -> None:
    ns, node = k.namespace(), k.node()
    running = k.pod(ns, node)
    k.pod(ns, None, running=False)
    pods = k.core.list_namespaced_pod(ns, field_selector="status.phase=Running").items
    assert [p.metadata.name for p in pods] == [running.metadata.name]
    named = k.core.list_namespaced_pod(ns, field_selector=f"metadata.name!={running.metadata.name}")
    assert len(named.items) == 1


def test_field_selector_unsupported_field_returns_400(k: Contract) -> None:
    with pytest.raises(client.ApiException) as err:
        k.core.list_pod_for_all_namespaces(field_selector="spec.bogus=1")
    assert err.value.status == 400


def test_list_shape_matches_the_real_server(k: Contract) -> None:
    resp = k.core.list_node(_preload_content=False)
    data = json.loads(resp.data)
    assert data["kind"] == "NodeList" and data["apiVersion"] == "v1"
    assert data["metadata"]["resourceVersion"]
    # Items of a typed list carry no kind/apiVersion on the wire.
    assert "kind" not in data["items"][0]


def test_pagination_with_limit_and_continue(k: Contract) -> None:
    ns = k.namespace()
    for _ in range(5):
        k.pod(ns, None, running=False)
    first = k.core.list_namespaced_pod(ns, limit=2)
    assert len(first.items) == 2 and first.metadata._continue
    seen = [p.metadata.name for p in first.items]
    token = first.metadata._continue
    while token:
        page = k.core.list_namespaced_pod(ns, limit=2, _continue=token)
        seen += [p.metadata.name for p in page.items]
        token = page.metadata._continue
    assert len(set(seen)) == 5


def test_graceful_delete_sets_deletion_timestamp(k: Contract) -> None:
    ns, node = k.namespace(), k.node()
    pod = k.pod(ns, node)
    out = k.core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=30)
    assert out.metadata.deletion_timestamp is not None
    assert out.metadata.deletion_grace_period_seconds == 30
    # No kubelet runs on this node, so the pod stays visible as Terminating.
    again = k.core.read_namespaced_pod(pod.metadata.name, ns)
    assert again.metadata.deletion_timestamp is not None


def test_delete_with_grace_period_zero_removes_at_once(k: Contract) -> None:
    ns, node = k.namespace(), k.node()
    pod = k.pod(ns, node)
    k.core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)
    with pytest.raises(client.ApiException) as err:
        k.core.read_namespaced_pod(pod.metadata.name, ns)
    assert err.value.status == 404


def test_unbound_pod_is_deleted_at_once(k: Contract) -> None:
    ns = k.namespace()
    pod = k.pod(ns, None, running=False)
    k.core.delete_namespaced_pod(pod.metadata.name, ns)
    assert k.core.list_namespaced_pod(ns).items == []


def test_delete_with_stale_precondition_returns_409(k: Contract) -> None:
    node = k.node()
    with pytest.raises(client.ApiException) as err:
        k.core.delete_node(node, body=client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid="not-the-uid")))
    assert err.value.status == 409


def test_dry_run_create_stores_nothing(k: Contract) -> None:
    ns = k.namespace()
    k.core.create_namespaced_pod(ns, {"metadata": {"name": "dry"}, "spec": {
        "containers": [{"name": "c", "image": "x"}]}}, dry_run="All")
    assert k.core.list_namespaced_pod(ns).items == []


def test_core_events_create_list_and_patch(k: Contract) -> None:
    ns = k.namespace()
    k.core.create_namespaced_event(ns, {
        "metadata": {"name": "ev1"}, "reason": "Cordoned", "message": "m", "type": "Normal",
        "involvedObject": {"kind": "Node", "name": "n1"}, "count": 1})
    k.core.patch_namespaced_event("ev1", ns, {"count": 2})
    events = k.core.list_namespaced_event(ns, field_selector="reason=Cordoned").items
    assert [e.count for e in events] == [2]


def test_events_k8s_io_create_and_list(k: Contract) -> None:
    ns = k.namespace()
    k.events.create_namespaced_event(ns, {
        "metadata": {"name": "ev2"}, "eventTime": "2025-01-01T00:00:00.000000Z",
        "reason": "Remediating", "note": "draining", "type": "Normal", "action": "Drain",
        "reportingController": "gpu-remediate.io/controller", "reportingInstance": "w-1",
        "regarding": {"kind": "Node", "name": "n1"}})
    assert [e.reason for e in k.events.list_namespaced_event(ns).items] == ["Remediating"]


def test_lease_create_replace_and_conflict(k: Contract) -> None:
    ns = k.namespace()
    lease = k.coordination.create_namespaced_lease(ns, {
        "metadata": {"name": "leader"}, "spec": {"holderIdentity": "a",
                                                 "leaseDurationSeconds": 15}})
    lease.spec.holder_identity = "b"
    k.coordination.replace_namespaced_lease("leader", ns, lease)
    lease.spec.holder_identity = "c"
    with pytest.raises(client.ApiException) as err:
        k.coordination.replace_namespaced_lease("leader", ns, lease)
    assert err.value.status == 409
    assert k.coordination.read_namespaced_lease("leader", ns).spec.holder_identity == "b"


def test_watch_streams_modified_events(k: Contract) -> None:
    node = k.node()
    rv = k.core.read_node(node).metadata.resource_version
    k.core.patch_node(node, {"metadata": {"labels": {"watched": "yes"}}})
    w = watch.Watch()
    seen: list[tuple[str, str | None]] = []
    # Other writers (a real kubelet's status heartbeat, the node lifecycle controller) may
    # modify the node between the read and the patch, so the watch can deliver their
    # MODIFIED events first; the contract is that our change arrives, in order, as MODIFIED.
    for event in w.stream(k.core.list_node, field_selector=f"metadata.name={node}",
                          resource_version=rv, timeout_seconds=5):
        labels = event["object"].metadata.labels or {}
        seen.append((event["type"], labels.get("watched")))
        if labels.get("watched") == "yes":
            w.stop()
    assert ("MODIFIED", "yes") in seen, seen
    assert all(kind == "MODIFIED" for kind, _ in seen), seen


def test_discovery_documents(k: Contract) -> None:
    groups = client.ApisApi(k.api).get_api_versions()
    names = {g.name for g in groups.groups}
    assert {"batch", "policy", "coordination.k8s.io", "events.k8s.io"} <= names
    resources = k.core.get_api_resources()
    assert "pods/eviction" in {res.name for res in resources.resources}


@sim_only
def test_unknown_path_returns_404_status(k: Contract, tmp_path: Path) -> None:
    import httpx

    resp = httpx.get(f"{k.sim_url()}/api/v1/widgets")
    assert resp.status_code == 404
    assert resp.json()["message"] == "the server could not find the requested resource"
