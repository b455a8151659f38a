"""DRA in the cluster simulator: ResourceSlice, ResourceClaim and DeviceTaintRule as a
Kubernetes 1.37 API server serves them, NVIDIA's DRA driver's slices, and a scheduler and
eviction controller that honour device taints.

The API-shape tests run against a real cluster too (GPU_REMEDIATE_CONTRACT_KUBECONFIG at a
release serving DeviceTaintRule); the ones that need the simulated driver are sim-only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from sim.scenario import gpu_uuid
from tests.polling import wait_for
from tests.sim.testkit import Contract, real_cluster

sim_only = pytest.mark.skipif(bool(real_cluster()), reason="needs the simulator")
GROUP = "resource.k8s.io"
NODE = "gpu-node-01"


@pytest.fixture(scope="module")
def k(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Contract]:
    c = Contract.open(tmp_path_factory.mktemp("dra"), scenario="small", job_seconds=0.2,
                      kubernetes_version="1.37")
    served = {g.name for g in client.ApisApi(c.api).get_api_versions().groups}
    if real_cluster() and GROUP not in served:
        c.close()
        pytest.skip("the cluster serves no resource.k8s.io (DeviceTaintRule needs 1.36+)")
    yield c
    c.close()


@pytest.fixture()
def co(k: Contract) -> Any:
    return client.CustomObjectsApi(k.api)


def _rule(name: str, device: str, effect: str = "NoSchedule", **selector: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": NODE, "device": device,
                               **selector},
            "taint": {"key": "gpu-remediate.io/isolated", "value": "xid-48", "effect": effect},
        },
    }


def _claim(name: str, count: int, tolerate: bool = False) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com", "count": count}
    if tolerate:
        exactly["tolerations"] = [{"key": "gpu-remediate.io/isolated", "operator": "Exists"}]
    return {"metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}}


def _claim_pod(name: str, claim: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "registry.sim.local/cuda:latest",
                            "resources": {"claims": [{"name": "gpus"}]}}],
            "resourceClaims": [{"name": "gpus", "resourceClaimName": claim}],
            "tolerations": [{"operator": "Exists"}],
        },
    }


def _delete_rule(co: Any, name: str) -> None:
    try:
        co.delete_cluster_custom_object(GROUP, "v1", "devicetaintrules", name)
    except client.ApiException as err:
        if err.status != 404:
            raise


def test_discovery_serves_devicetaintrule_as_v1_and_v1beta2(k: Contract) -> None:
    groups = {g.name: g for g in client.ApisApi(k.api).get_api_versions().groups}
    dra = groups[GROUP]
    assert dra.preferred_version.version == "v1"
    assert {v.version for v in dra.versions} >= {"v1", "v1beta2"}
    co = client.CustomObjectsApi(k.api)
    for version in ("v1", "v1beta2"):
        names = {x.name for x in co.get_api_resources(GROUP, version).resources}
        assert {"devicetaintrules", "devicetaintrules/status"} <= names, version
    assert "resourceslices" in {x.name for x in co.get_api_resources(GROUP, "v1").resources}


@sim_only
def test_a_133_server_has_no_devicetaintrule(tmp_path_factory: pytest.TempPathFactory) -> None:
    old = Contract.open(tmp_path_factory.mktemp("dra133"), scenario="small", job_seconds=0.2)
    try:
        assert client.VersionApi(old.api).get_code().minor == "33"
        assert GROUP not in {g.name for g in client.ApisApi(old.api).get_api_versions().groups}
        with pytest.raises(client.ApiException) as err:
            client.CustomObjectsApi(old.api).list_cluster_custom_object(
                GROUP, "v1", "devicetaintrules")
        assert err.value.status == 404
    finally:
        old.close()


@sim_only
def test_the_nvidia_driver_publishes_one_slice_per_gpu_node(k: Contract, co: Any) -> None:
    slices = co.list_cluster_custom_object(
        GROUP, "v1", "resourceslices",
        field_selector=f"spec.nodeName={NODE},spec.driver=gpu.nvidia.com")["items"]
    assert len(slices) == 1
    spec = slices[0]["spec"]
    assert spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == [f"gpu-{i}" for i in range(8)]
    # The same UUID the GPU simulator's exporter shows for that GPU.
    assert spec["devices"][3]["attributes"]["uuid"] == {"string": f"GPU-{gpu_uuid(NODE, 3)}"}
    owner = slices[0]["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Node", NODE)


def test_devicetaintrule_validation_names_the_field(k: Contract, co: Any) -> None:
    bad = _rule("dra-bad-effect", "gpu-1")
    bad["spec"]["taint"]["effect"] = "PreferNoSchedule"
    with pytest.raises(client.ApiException) as err:
        co.create_cluster_custom_object(GROUP, "v1", "devicetaintrules", bad)
    body = json.loads(err.value.body)
    assert err.value.status == 422 and body["reason"] == "Invalid"
    assert [c["field"] for c in body["details"]["causes"]] == ["spec.taint.effect"]
    nokey = _rule("dra-no-key", "gpu-1")
    del nokey["spec"]["taint"]["key"]
    with pytest.raises(client.ApiException) as err:
        co.create_cluster_custom_object(GROUP, "v1", "devicetaintrules", nokey)
    assert err.value.status == 422
    assert "spec.taint.key" in {c["field"] for c in json.loads(err.value.body)["details"]["causes"]}


def test_one_rule_is_served_in_both_versions(k: Contract, co: Any) -> None:
    body = _rule("dra-both", "gpu-2", effect="None")
    body["apiVersion"] = f"{GROUP}/v1beta2"
    created = co.create_cluster_custom_object(GROUP, "v1beta2", "devicetaintrules", body)
    try:
        assert created["apiVersion"] == f"{GROUP}/v1beta2"
        assert created["spec"]["taint"]["timeAdded"]  # set by the server
        assert created["metadata"]["generation"] == 1
        as_v1 = co.get_cluster_custom_object(GROUP, "v1", "devicetaintrules", "dra-both")
        assert as_v1["apiVersion"] == f"{GROUP}/v1"
        assert as_v1["spec"] == created["spec"]
        # A patch (the eviction controller writes status meanwhile, so a stale replace
        # would conflict).
        updated = co.patch_cluster_custom_object(GROUP, "v1", "devicetaintrules", "dra-both",
                                                 {"spec": {"taint": {"effect": "NoSchedule"}}})
        assert updated["metadata"]["generation"] == 2
        # The effect changed and the client kept the old time: the server renews it.
        assert updated["spec"]["taint"]["timeAdded"] >= created["spec"]["taint"]["timeAdded"]
    finally:
        _delete_rule(co, "dra-both")


def test_unknown_selector_fields_are_dropped_silently(k: Contract, co: Any) -> None:
    body = _rule("dra-alpha-fields", "gpu-1", deviceClassName="gpu.nvidia.com")
    created = co.create_cluster_custom_object(GROUP, "v1", "devicetaintrules", body)
    try:
        assert "deviceClassName" not in created["spec"]["deviceSelector"]
    finally:
        _delete_rule(co, "dra-alpha-fields")


def _wait_scheduled(k: Contract, ns: str, name: str) -> dict[str, Any]:
    def scheduled() -> dict[str, Any] | None:
        pod = k.api.sanitize_for_serialization(k.core.read_namespaced_pod(name, ns))
        conds = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}
        return pod if "PodScheduled" in conds else None
    return wait_for(scheduled, timeout=10, what=f"{name} considered by the scheduler")


@sim_only
def test_scheduler_keeps_claims_off_a_tainted_gpu(k: Contract, co: Any) -> None:
    ns = k.namespace()
    co.create_cluster_custom_object(GROUP, "v1", "devicetaintrules", _rule("dra-sched", "gpu-4"))
    try:
        # Eight GPUs with one tainted: a claim for eight cannot be met, one for seven can.
        co.create_namespaced_custom_object(GROUP, "v1", ns, "resourceclaims", _claim("all8", 8))
        k.core.create_namespaced_pod(ns, _claim_pod("wants8", "all8"))
        pod = _wait_scheduled(k, ns, "wants8")
        cond = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
        assert cond["status"] == "False" and "cannot allocate all claims" in cond["message"]
        k.core.delete_namespaced_pod("wants8", ns, grace_period_seconds=0)
        co.create_namespaced_custom_object(GROUP, "v1", ns, "resourceclaims", _claim("only7", 7))
        k.core.create_namespaced_pod(ns, _claim_pod("wants7", "only7"))
        pod = _wait_scheduled(k, ns, "wants7")
        assert pod["spec"].get("nodeName") == NODE
        claim = co.get_namespaced_custom_object(GROUP, "v1", ns, "resourceclaims", "only7")
        devices = {x["device"] for x in claim["status"]["allocation"]["devices"]["results"]}
        assert len(devices) == 7 and "gpu-4" not in devices
        assert claim["status"]["reservedFor"][0]["name"] == "wants7"
        # Once the pod is gone the claim is released: a tolerating claim then gets gpu-4.
        k.core.delete_namespaced_pod("wants7", ns, grace_period_seconds=0)
        wait_for(lambda: not co.get_namespaced_custom_object(
            GROUP, "v1", ns, "resourceclaims", "only7").get("status", {}).get("allocation"),
            timeout=10, what="claim deallocated")
        co.create_namespaced_custom_object(GROUP, "v1", ns, "resourceclaims",
                                           _claim("tolerant", 8, tolerate=True))
        k.core.create_namespaced_pod(ns, _claim_pod("tolerates", "tolerant"))
        assert _wait_scheduled(k, ns, "tolerates")["spec"].get("nodeName") == NODE
        k.core.delete_namespaced_pod("tolerates", ns, grace_period_seconds=0)
        wait_for(lambda: not co.get_namespaced_custom_object(
            GROUP, "v1", ns, "resourceclaims", "tolerant").get("status", {}).get("allocation"),
            timeout=10, what="claim deallocated")
    finally:
        _delete_rule(co, "dra-sched")


@sim_only
def test_noexecute_evicts_the_pod_holding_the_gpu_and_reports_it(k: Contract, co: Any) -> None:
    ns = k.namespace()
    co.create_namespaced_custom_object(GROUP, "v1", ns, "resourceclaims", _claim("one", 1))
    k.core.create_namespaced_pod(ns, _claim_pod("holder", "one"))
    assert _wait_scheduled(k, ns, "holder")["spec"].get("nodeName") == NODE
    claim = co.get_namespaced_custom_object(GROUP, "v1", ns, "resourceclaims", "one")
    device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
    co.create_cluster_custom_object(GROUP, "v1", "devicetaintrules",
                                    _rule("dra-evict", device, effect="NoExecute"))
    try:
        def gone() -> bool:
            try:
                k.core.read_namespaced_pod("holder", ns)
            except client.ApiException as err:
                return err.status == 404
            return False
        wait_for(gone, timeout=10, what="pod on the NoExecute-tainted GPU evicted")
        rule = wait_for(lambda: (r := co.get_cluster_custom_object(
            GROUP, "v1", "devicetaintrules", "dra-evict")).get("status") and r,
            timeout=10, what="rule status")
        cond = rule["status"]["conditions"][0]
        assert cond["type"] == "EvictionInProgress"
        assert cond["observedGeneration"] == 1
        assert "1 pods evicted" in cond["message"]
    finally:
        _delete_rule(co, "dra-evict")
