"""kubectl's server-side printing: `kubectl get nodes/pods/jobs/events` asks the API server for a
meta.k8s.io/v1 Table and prints its columns. The cluster simulator answers as a real API
server does (with GPU_REMEDIATE_REAL_CLUSTER set, these run against one)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sim.cluster.tables import age, wants_table
from tests.sim.testkit import Contract

KUBECTL_ACCEPT = ("application/json;as=Table;v=v1;g=meta.k8s.io,"
                  "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json")


@pytest.fixture
def k(tmp_path: Path) -> Iterator[Contract]:
    c = Contract.open(tmp_path, scenario="small")
    yield c
    c.close()


def get(k: Contract, path: str, accept: str = KUBECTL_ACCEPT) -> dict[str, Any]:
    method, url, headers, _body, _ = k.api.param_serialize(
        "GET", path, header_params={"Accept": accept}, auth_settings=["BearerToken"])
    response = k.api.call_api(method, url, header_params=headers)
    response.read()
    assert response.status == 200, response.data
    out: dict[str, Any] = json.loads(response.data)
    return out


def columns(table: dict[str, Any], wide: bool = False) -> list[str]:
    return [c["name"] for c in table["columnDefinitions"] if wide or c["priority"] == 0]


def row_of(table: dict[str, Any], name: str) -> list[Any]:
    rows = [r for r in table["rows"] if r["cells"][0] == name]
    assert len(rows) == 1, [r["cells"][0] for r in table["rows"]]
    assert rows[0]["object"]["kind"] == "PartialObjectMetadata"
    assert rows[0]["object"]["metadata"]["name"] == name
    cells: list[Any] = rows[0]["cells"]
    return cells


def test_kubectl_get_nodes_shows_status_roles_age_version(k: Contract) -> None:
    node = k.node()
    table = get(k, "/api/v1/nodes")
    assert table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
    assert columns(table) == ["Name", "Status", "Roles", "Age", "Version"]
    assert columns(table, wide=True)[5:] == ["Internal-IP", "External-IP", "OS-Image",
                                             "Kernel-Version", "Container-Runtime"]
    assert row_of(table, node)[1:3] == ["Ready", "<none>"]
    k.core.patch_node(node, {"spec": {"unschedulable": True}})
    assert row_of(get(k, f"/api/v1/nodes/{node}"), node)[1] == "Ready,SchedulingDisabled"


def test_kubectl_get_pods_shows_ready_status_restarts_age(k: Contract) -> None:
    ns = k.namespace()
    pod = k.pod(ns, k.node()).metadata.name
    table = get(k, f"/api/v1/namespaces/{ns}/pods")
    assert columns(table) == ["Name", "Ready", "Status", "Restarts", "Age"]
    assert columns(table, wide=True)[5:7] == ["IP", "Node"]
    assert row_of(table, pod)[1:4] == ["0/1", "Running", "0"]


def test_kubectl_get_events_shows_last_seen_type_reason_object_message(k: Contract) -> None:
    """The columns a real cluster shows (the Event printer's: NAME only with -o wide, last),
    for an Event as the worker writes one (core/v1, on a node)."""
    from kubernetes import client

    node = k.node()
    k.core.create_namespaced_event("default", client.CoreV1Event(
        metadata=client.V1ObjectMeta(name=f"{node}.remediation"),
        involved_object=client.V1ObjectReference(kind="Node", name=node),
        reason="RemediationStarted", message="  XID 79 on GPU 3: reboot  ", type="Warning",
        source=client.V1EventSource(component="gpu-remediate", host="worker-0"),
        first_timestamp=datetime.now(UTC), last_timestamp=datetime.now(UTC), count=2))
    table = get(k, "/api/v1/namespaces/default/events")
    assert columns(table) == ["Last Seen", "Type", "Reason", "Object", "Message"]
    assert columns(table, wide=True) == ["Last Seen", "Type", "Reason", "Object", "Subobject",
                                         "Source", "Message", "First Seen", "Count", "Name"]
    rows = [r["cells"] for r in table["rows"] if r["cells"][9] == f"{node}.remediation"]
    assert len(rows) == 1
    last, kind, reason, target, sub, source, message, first, count, _ = rows[0]
    assert (kind, reason, target, sub) == ("Warning", "RemediationStarted", f"node/{node}", "")
    assert (source, message, count) == ("gpu-remediate, worker-0", "XID 79 on GPU 3: reboot", 2)
    assert last.endswith("s") and first.endswith("s")
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"


def test_plain_json_is_still_plain_json(k: Contract) -> None:
    assert get(k, "/api/v1/nodes", accept="application/json")["kind"] == "NodeList"


def test_accept_header_and_ages_read_as_kubectl_does() -> None:
    assert wants_table(KUBECTL_ACCEPT)
    assert not wants_table("application/json")
    assert not wants_table("application/json;as=Table;v=v1beta1;g=meta.k8s.io")
    now = 1_000_000.0
    stamp = "1970-01-12T13:46:40Z"  # = now
    assert [age(stamp, now + s) for s in (5, 125, 900, 3 * 3600 + 60, 20 * 3600,
                                          3 * 86400, 30 * 86400)] == [
        "5s", "2m5s", "15m", "3h1m", "20h", "3d", "30d"]
