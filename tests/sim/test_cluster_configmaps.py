"""Contract tests for ConfigMaps, as the node records (activities/record.py) use them:
create, get, list by label, replace guarded by resourceVersion, the 1 MiB limit.

Run against the simulator by default, or a real cluster (tests/sim/testkit.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.sim.testkit import Contract


@pytest.fixture(scope="module")
def k(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Contract]:
    c = Contract.open(tmp_path_factory.mktemp("cm"), scenario="small", job_seconds=0.2)
    yield c
    c.close()


def _cm(name: str, data: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "data": data}


def _status(err: client.ApiException) -> dict[str, Any]:
    return dict(json.loads(err.body))


def test_create_get_and_list_by_label(k: Contract) -> None:
    ns = k.namespace()
    k.core.create_namespaced_config_map(ns, _cm("a", {"x": "1"}, {"app": "mine"}))
    k.core.create_namespaced_config_map(ns, _cm("b", {"x": "2"}, {"app": "other"}))
    got = k.core.read_namespaced_config_map("a", ns)
    assert got.data == {"x": "1"} and got.metadata.namespace == ns
    assert got.metadata.resource_version and got.metadata.uid
    listed = k.core.list_namespaced_config_map(ns, label_selector="app=mine").items
    assert [c.metadata.name for c in listed] == ["a"]


def test_missing_configmap_is_404_worded_like_kube(k: Contract) -> None:
    ns = k.namespace()
    with pytest.raises(client.ApiException) as err:
        k.core.read_namespaced_config_map("nope", ns)
    assert err.value.status == 404
    assert _status(err.value)["message"] == 'configmaps "nope" not found'


def test_create_twice_is_409_already_exists(k: Contract) -> None:
    ns = k.namespace()
    k.core.create_namespaced_config_map(ns, _cm("twice", {}))
    with pytest.raises(client.ApiException) as err:
        k.core.create_namespaced_config_map(ns, _cm("twice", {}))
    assert (err.value.status, _status(err.value)["reason"]) == (409, "AlreadyExists")


def test_replace_with_a_stale_resource_version_conflicts(k: Contract) -> None:
    ns = k.namespace()
    first = k.core.create_namespaced_config_map(ns, _cm("rv", {"v": "1"}))
    stale = first.metadata.resource_version
    body = _cm("rv", {"v": "2"})
    body["metadata"]["resourceVersion"] = stale
    second = k.core.replace_namespaced_config_map("rv", ns, body)
    assert second.data == {"v": "2"}
    assert second.metadata.resource_version != stale
    body["data"] = {"v": "3"}
    with pytest.raises(client.ApiException) as err:
        k.core.replace_namespaced_config_map("rv", ns, body)  # still the stale version
    assert (err.value.status, _status(err.value)["reason"]) == (409, "Conflict")
    assert k.core.read_namespaced_config_map("rv", ns).data == {"v": "2"}


def test_data_up_to_one_mebibyte_is_accepted_and_more_is_refused(k: Contract) -> None:
    ns = k.namespace()
    key = "record.json"
    fits = "x" * (1024 * 1024 - len(key))
    k.core.create_namespaced_config_map(ns, _cm("fits", {key: fits}))
    assert len(k.core.read_namespaced_config_map("fits", ns).data[key]) == len(fits)
    with pytest.raises(client.ApiException) as err:
        k.core.create_namespaced_config_map(ns, _cm("too-big", {key: fits + "x"}))
    assert err.value.status == 422
    assert "must have at most 1048576 bytes" in _status(err.value)["message"]


def test_a_key_that_is_not_a_config_key_is_invalid(k: Contract) -> None:
    ns = k.namespace()
    with pytest.raises(client.ApiException) as err:
        k.core.create_namespaced_config_map(ns, _cm("bad-key", {"a/b": "1"}))
    assert err.value.status == 422
    body = _status(err.value)
    assert body["details"]["causes"][0]["field"] == "data[a/b]"
