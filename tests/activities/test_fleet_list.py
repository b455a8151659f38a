"""The fleet observation's node list: parsed from the raw NodeList into slim nodes that
carry every field the observation reads, and shared by the shards that list at the same
time on one worker (never by a later call)."""

from __future__ import annotations

import threading
import time
from typing import Any

from kubernetes import client

from activities.exporter_settings import ExporterSettings
from activities.fleet import FleetActivities
from activities.fleet_nodes import _slim_nodes
from activities.node_keys import STATE_LABEL, TAINT_KEY
from tests.activities.conftest import Cluster


def _fields(n: client.V1Node) -> tuple[Any, ...]:
    spec, status = n.spec, n.status
    return (n.metadata.name, n.metadata.uid, n.metadata.labels or {}, n.metadata.annotations or {},
            n.metadata.resource_version, bool(spec.unschedulable),
            sorted((t.key, t.effect, t.value) for t in spec.taints or []),
            dict(status.capacity or {}))


def test_slim_nodes_carry_what_the_full_client_models_carry(cluster: Cluster) -> None:
    core = client.CoreV1Api(cluster.api)
    name = core.list_node().items[0].metadata.name
    # Every field the observation reads, set: a taint of ours, a cordon, our label, an
    # annotation with JSON in it.
    core.patch_node(name, {
        "metadata": {"labels": {STATE_LABEL: "draining"},
                     "annotations": {"gpu-remediate.io/acknowledged-xids": '{"0": 79}'}},
        "spec": {"unschedulable": True,
                 "taints": [{"key": TAINT_KEY, "effect": "NoSchedule", "value": "x"}]}})
    # One response read both ways: two lists could differ (a kubelet's status heartbeat
    # moves the resourceVersion in between).
    data = core.list_node(_preload_content=False).data
    full = core.api_client.deserialize(data.decode(), "V1NodeList",
                                       "application/json").items
    slim = _slim_nodes(data)
    assert [_fields(n) for n in slim] == [_fields(n) for n in full]
    assert any(n.spec.unschedulable and n.spec.taints for n in slim)


def test_an_empty_or_bare_node_list_parses() -> None:
    assert _slim_nodes(b'{"kind": "NodeList", "items": null}') == []
    [bare] = _slim_nodes(b'{"items": [{"metadata": {"name": "n"}}]}')
    assert bare.metadata.name == "n" and bare.spec.taints is None
    assert bare.status.capacity is None


def test_overlapping_lists_share_one_request_and_a_later_call_lists_again(
        cluster: Cluster) -> None:
    fleet = FleetActivities(cluster.api, ExporterSettings())
    real = fleet.core.list_node
    calls: list[float] = []
    shards = 4
    arrived = threading.Semaphore(0)

    class CountingLock:
        """The list's lock, counting the shards that asked for it: each has made its call
        (and taken its time) before it waits here."""

        def __init__(self, lock: Any) -> None:
            self.lock = lock

        def __enter__(self) -> None:
            arrived.release()
            self.lock.acquire()

        def __exit__(self, *exc: object) -> None:
            self.lock.release()

    def slow_list(*args: Any, **kwargs: Any) -> Any:
        calls.append(time.monotonic())
        # A big fleet's list: the first lasts until every other shard has asked for the
        # nodes (the test, not the machine's speed, makes them overlap).
        for _ in range(shards if len(calls) == 1 else 0):
            assert arrived.acquire(timeout=60), "the other shards never asked"
        return real(*args, **kwargs)

    fleet._list_lock = CountingLock(fleet._list_lock)  # type: ignore[assignment]
    fleet.core.list_node = slow_list  # type: ignore[method-assign]
    results: list[list[client.V1Node]] = []
    threads = [threading.Thread(target=lambda: results.append(fleet._list_nodes()))
               for _ in range(shards)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1, calls
    assert len(results) == 4 and all(r is results[0] for r in results)
    # A call after the list ended sees the fleet as it is now.
    core = client.CoreV1Api(cluster.api)
    name = results[0][0].metadata.name
    core.patch_node(name, {"metadata": {"labels": {"later": "yes"}}})
    again = {n.metadata.name: n for n in fleet._list_nodes()}
    assert len(calls) == 2
    assert again[name].metadata.labels["later"] == "yes"
