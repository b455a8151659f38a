"""Kubernetes Events on nodes, so `kubectl describe node` tells the story."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from activities.kube import REQUEST_TIMEOUT

log = logging.getLogger(__name__)

COMPONENT = "gpu-remediate"


def record_node_event(
    core: client.CoreV1Api,
    node: str,
    *,
    reason: str,
    message: str,
    event_type: str = "Normal",
) -> None:
    """Create a core/v1 Event on the node. An Event is best effort: losing one never
    fails a remediation, so API errors are logged, not raised."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{node}.", "namespace": "default"},
        # The kubelet records node Events with the node's name as uid, and
        # `kubectl describe node` searches for exactly that.
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
        "reason": reason,
        "message": message[:1024],
        "type": event_type,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        core.create_namespaced_event(
            "default", client.CoreV1Event.model_validate(body), _request_timeout=REQUEST_TIMEOUT
        )
    except ApiException as err:
        log.warning("could not record event %s on %s: %s", reason, node, err.status)
