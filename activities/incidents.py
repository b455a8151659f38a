"""Domain incidents on the nodes: the detector's cordon of an incident's flagged nodes, the
``DomainIncident`` Warning Event on each, and the uncordon when the incident ends.

Cordoned, not drained: no new work lands on a node of a domain whose shared part failed,
and nothing running is evicted. A node already cordoned by someone else is left as it is
and reported (``already``), so it is never uncordoned by us; a node we cordoned carries the
``gpu-remediate.io/domain-incident`` annotation, and we uncordon only a node that our record
and that annotation both say we cordoned (a node that deletes the annotation stays
cordoned: it can only keep itself out of work). One guarded patch per node, with the
resourceVersion it was computed from.
"""

from __future__ import annotations

import logging
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity

from activities import metrics
from activities.events import record_node_event
from activities.kube import REQUEST_TIMEOUT, meta_dict
from activities.node_keys import A_INCIDENT
from activities.nodes import CONFLICT_RETRIES, MERGE_PATCH
from workflows.incidents import IncidentCordon, IncidentCordonResult

log = logging.getLogger(__name__)

DOMAIN_INCIDENT = "DomainIncident"
DOMAIN_INCIDENT_ENDED = "DomainIncidentEnded"


class IncidentActivities:
    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)

    def _patch(self, name: str, build: Any) -> str:
        """Apply ``build(node)`` (None: nothing to do) with the node's resourceVersion;
        returns what happened ("", or build's answer)."""
        for _ in range(CONFLICT_RETRIES):
            node = self.core.read_node(name, _request_timeout=REQUEST_TIMEOUT)
            outcome, body = build(node)
            if body is None:
                return str(outcome)
            assert node.metadata is not None
            body.setdefault("metadata", {})["resourceVersion"] = node.metadata.resource_version
            try:
                self.core.patch_node(name, body, _content_type=MERGE_PATCH,
                                     _request_timeout=REQUEST_TIMEOUT)
                return str(outcome)
            except ApiException as err:
                if err.status == 409:
                    continue
                raise
        raise RuntimeError(f"node {name} kept changing under us")

    @activity.defn
    def cordon_for_incident(self, inp: IncidentCordon) -> IncidentCordonResult:
        """Cordon ``inp.cordon`` (a Warning Event ``DomainIncident`` on each) and uncordon
        ``inp.uncordon``. Per node, best effort: a node that cannot be reached is named in
        ``errors`` and tried again when the detector next asks."""
        out = IncidentCordonResult()

        def cordon(node: Any) -> tuple[str, dict[str, Any] | None]:
            if meta_dict(node, "annotations").get(A_INCIDENT):
                return "cordoned", None  # ours already (a retry)
            if node.spec is not None and node.spec.unschedulable:
                return "already", None
            return "cordoned", {"metadata": {"annotations": {A_INCIDENT: inp.key[:300]}},
                                "spec": {"unschedulable": True}}

        def uncordon(node: Any) -> tuple[str, dict[str, Any] | None]:
            if not meta_dict(node, "annotations").get(A_INCIDENT):
                return "kept", None  # not marked as ours: whoever cordoned it uncordons
            return "uncordoned", {"metadata": {"annotations": {A_INCIDENT: None}},
                                  "spec": {"unschedulable": None}}

        for name in inp.cordon:
            try:
                outcome = self._patch(name, cordon)
            except Exception as err:  # one node's trouble never stops the others
                out.errors.append(f"{name}: {err}"[:300])
                continue
            (out.cordoned if outcome == "cordoned" else out.already).append(name)
            record_node_event(
                self.core, name, reason=DOMAIN_INCIDENT, event_type="Warning",
                message=(f"domain incident {inp.key}: "
                         + ("cordoned (no new work), not drained" if outcome == "cordoned"
                            else "already cordoned by someone else, left so")
                         + f"; held until it is resolved or released. {inp.reason}")[:1000])
            metrics.NODE_EVENTS.labels(DOMAIN_INCIDENT).inc()
        for name in inp.uncordon:
            try:
                outcome = self._patch(name, uncordon)
            except ApiException as err:
                if err.status == 404:  # gone: nothing left to uncordon
                    out.uncordoned.append(name)
                    continue
                out.errors.append(f"{name}: {err.status} {err.reason}"[:300])
                continue
            except Exception as err:
                out.errors.append(f"{name}: {err}"[:300])
                continue
            out.uncordoned.append(name)
            record_node_event(
                self.core, name, reason=DOMAIN_INCIDENT_ENDED,
                message=(f"domain incident {inp.key} no longer holds this node: "
                         + ("uncordoned" if outcome == "uncordoned"
                            else "its cordon was not ours, left as it is")
                         + f". {inp.reason}")[:1000])
        if out.errors:
            log.warning("domain incident %s: %s", inp.key, "; ".join(out.errors[:5]))
        return out
