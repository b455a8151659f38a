"""RuntimeClass (node.k8s.io/v1) as a real kube-apiserver serves it, and the RuntimeClass
admission that refuses a pod naming one the cluster lacks. The worker's start-up check
(activities/prerequisites.py) reads RuntimeClasses; a reset Job whose template names a
missing one never gets a pod.

Run against the simulator by default, or a real cluster (tests/sim/testkit.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.polling import wait_for
from tests.sim.testkit import Contract, real_cluster

sim_only = pytest.mark.skipif(bool(real_cluster()), reason="needs the simulator")


@pytest.fixture(scope="module")
def k(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Contract]:
    c = Contract.open(tmp_path_factory.mktemp("rc"), scenario="small", job_seconds=0.2)
    yield c
    c.close()


@pytest.fixture
def node_api(k: Contract) -> Any:
    return client.NodeV1Api(k.api)


def _status(err: client.ApiException) -> dict[str, Any]:
    return json.loads(err.body)


def _runtime_class(node_api: Any, handler: str = "runc") -> str:
    name = Contract.unique("rc")
    node_api.create_runtime_class({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                   "metadata": {"name": name}, "handler": handler})
    return name


def test_create_get_and_list(node_api: Any) -> None:
    name = _runtime_class(node_api)
    try:
        got = node_api.read_runtime_class(name)
        assert (got.metadata.name, got.handler) == (name, "runc")
        assert got.metadata.uid and got.metadata.resource_version
        assert name in {rc.metadata.name for rc in node_api.list_runtime_class().items}
    finally:
        node_api.delete_runtime_class(name)


def test_a_missing_one_is_404_with_a_status_body(node_api: Any) -> None:
    with pytest.raises(client.ApiException) as err:
        node_api.read_runtime_class("no-such-runtime")
    body = _status(err.value)
    assert err.value.status == 404
    assert (body["kind"], body["status"], body["reason"]) == ("Status", "Failure", "NotFound")
    assert body["message"] == 'runtimeclasses.node.k8s.io "no-such-runtime" not found'
    assert body["details"] == {"name": "no-such-runtime", "group": "node.k8s.io",
                               "kind": "runtimeclasses"}


def test_the_handler_must_be_a_dns_label_and_is_immutable(node_api: Any) -> None:
    with pytest.raises(client.ApiException) as err:
        node_api.create_runtime_class({"metadata": {"name": Contract.unique("rc")},
                                       "handler": "Not_A_Label"})
    body = _status(err.value)
    assert (err.value.status, body["reason"]) == (422, "Invalid")
    assert [c["field"] for c in body["details"]["causes"]] == ["handler"]
    name = _runtime_class(node_api)
    try:
        with pytest.raises(client.ApiException) as err:
            node_api.patch_runtime_class(name, {"handler": "other"})
        body = _status(err.value)
        assert (err.value.status, body["details"]["causes"][0]["field"]) == (422, "handler")
        assert "field is immutable" in body["message"]
    finally:
        node_api.delete_runtime_class(name)


def test_discovery_names_the_group_and_the_cluster_scoped_resource(k: Contract) -> None:
    groups = {g.name: g for g in client.ApisApi(k.api).get_api_versions().groups}
    assert "node.k8s.io" in groups
    assert groups["node.k8s.io"].preferred_version.group_version == "node.k8s.io/v1"
    resources = {res.name: res for res in client.NodeV1Api(k.api).get_api_resources().resources}
    assert not resources["runtimeclasses"].namespaced
    assert {"get", "list", "create"} <= set(resources["runtimeclasses"].verbs)


def test_a_pod_naming_a_missing_runtime_class_is_refused(k: Contract) -> None:
    ns = k.namespace()
    with pytest.raises(client.ApiException) as err:
        k.core.create_namespaced_pod(ns, {"metadata": {"name": "p"}, "spec": {
            "runtimeClassName": "no-such-runtime",
            "containers": [{"name": "c", "image": "registry.sim.local/x:1"}]}})
    body = _status(err.value)
    assert (err.value.status, body["reason"]) == (403, "Forbidden")
    assert body["message"] == ('pods "p" is forbidden: pod rejected: RuntimeClass '
                               '"no-such-runtime" not found')


def test_a_job_naming_a_missing_runtime_class_gets_no_pod_until_it_exists(
        k: Contract, node_api: Any) -> None:
    ns = k.namespace()
    wanted = Contract.unique("rc")
    k.batch.create_namespaced_job(ns, {"metadata": {"name": "reset"}, "spec": {
        "backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never", "runtimeClassName": wanted, "schedulerName": "none",
            "containers": [{"name": "c", "image": "registry.sim.local/x:1"}]}}}})
    time.sleep(1.5)
    assert k.core.list_namespaced_pod(ns, label_selector="job-name=reset").items == []
    node_api.create_runtime_class({"metadata": {"name": wanted}, "handler": "runc"})
    try:
        wait_for(lambda: k.core.list_namespaced_pod(
            ns, label_selector="job-name=reset").items, 20, "the Job's pod once it exists")
    finally:
        node_api.delete_runtime_class(wanted)


@sim_only
def test_the_simulated_gpu_operator_installs_runtime_class_nvidia(node_api: Any) -> None:
    assert node_api.read_runtime_class("nvidia").handler == "nvidia"
