"""Events carry text a node or its exporter wrote; none of it can forge a line or a
terminal escape in `kubectl describe node`, whichever activity records the Event."""

from __future__ import annotations

from tests.activities.conftest import Cluster


def test_a_hostile_message_loses_its_control_characters(cluster: Cluster) -> None:
    from activities import events

    hostile = ("xid 79 on GPU-1\r\nNormal  Approved  gpu-remediate  approved by SRE"
               "\x1b]8;;http://x\x07runbook\x1b]8;;\x07\u202e")
    events.record_node_event(cluster.core, "gpu-node-01", reason="Probe\n", message=hostile)
    (event,) = cluster.core.list_namespaced_event(
        "default", field_selector="involvedObject.name=gpu-node-01").items
    assert event.reason == "Probe"
    assert not any(c in event.message for c in "\r\n\x1b\x07\u202e")
    assert event.message.startswith("xid 79 on GPU-1  Normal  Approved")
    assert "]8;;http://x" in event.message, "the text stays, only the controls go"


def test_a_long_message_is_cut_with_an_ellipsis(cluster: Cluster) -> None:
    from activities import events

    events.record_node_event(cluster.core, "gpu-node-01", reason="Probe", message="x" * 5000)
    (event,) = cluster.core.list_namespaced_event(
        "default", field_selector="involvedObject.name=gpu-node-01").items
    assert len(event.message) == 1024 and event.message.endswith("…")
