"""Kubernetes Events on nodes, so `kubectl describe node` tells the story."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity

from activities.kube import REQUEST_TIMEOUT
from workflows.messages import NodeEventInput
from workflows.ui_text import printable

log = logging.getLogger(__name__)

COMPONENT = "gpu-remediate"
EVENT_RETRY_PAUSES = (0.2, 0.5, 1.0, 0.0)

_namespace = "default"


def set_event_namespace(namespace: str) -> None:
    """Where the worker records node Events (``kubernetes.event_namespace``): set once at
    start, before any activity runs. A Node has no namespace; `kubectl describe node` finds
    its Events in any namespace, and a locked-down cluster may allow ``create events`` only
    in the controller's own."""
    global _namespace
    _namespace = namespace


def event_namespace() -> str:
    return _namespace


def record_node_event(
    core: client.CoreV1Api,
    node: str,
    *,
    reason: str,
    message: str,
    event_type: str = "Normal",
    before_each_try: Callable[[], None] | None = None,
) -> None:
    """Create a core/v1 Event on the node. An Event is best effort: losing one never
    fails a remediation, so API errors are logged, not raised. ``before_each_try``: called
    before every attempt (a drain heartbeats there, so retries never outlast its heartbeat
    timeout).

    The message often carries what a node or its exporter wrote (a GPU's label, a pod's
    name, an operator's reason): control characters are dropped here, for every caller,
    so none can forge a line or a terminal escape in `kubectl describe node` or a log
    pipeline. Markdown is not escaped: an Event is plain text, and a backslash in a UUID
    would mislead whoever copies it."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{node}.", "namespace": _namespace},
        # The kubelet records node Events with the node's name as uid, and
        # `kubectl describe node` searches for exactly that.
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
        "reason": printable(reason, 128).strip(),
        "message": printable(message, 1024),
        "type": event_type,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    event = client.CoreV1Event.model_validate(body)
    for attempt, pause in enumerate(EVENT_RETRY_PAUSES):
        if before_each_try is not None:
            before_each_try()
        try:
            core.create_namespaced_event(_namespace, event, _request_timeout=REQUEST_TIMEOUT)
            return
        except ApiException as err:
            # A transient answer gets a short retry; the story of a node should not
            # lose its last chapter to one 500.
            transient = err.status in (429, 500, 502, 503, 504)
            if not transient or attempt == len(EVENT_RETRY_PAUSES) - 1:
                log.warning("could not record event %s on %s: %s", reason, node, err.status)
                return
        time.sleep(pause)


class EventActivities:
    """Events a workflow records without changing the node (a rejected operator signal)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)

    @activity.defn
    def record_event(self, inp: NodeEventInput) -> None:
        record_node_event(self.core, inp.node, reason=inp.reason, message=inp.message,
                          event_type=inp.event_type)
