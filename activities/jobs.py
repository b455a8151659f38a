"""Jobs pinned to a node: validation (all its GPUs), GPU reset and reboot.

Job names are deterministic per workflow run and attempt, so a retried activity
adopts the Job it already created instead of starting a second one.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory, CancelledError

from activities import metrics
from activities.gpus import GPU_RESOURCE
from activities.job_templates import JobsSettings, JobTemplate, TemplateRefused
from activities.kube import REQUEST_TIMEOUT, raise_typed, status_message
from activities.node_keys import A_RUN, JOB_LABEL, NODE_LABEL, label_value
from policy.diag import DiagReport, DiagUnparseable, parse_dcgmi_json
from workflows import errors
from workflows.isolation import DRA_DRIVER, TAINT_KEY
from workflows.messages import NodeJobInput, NodeJobResult

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
LOG_LIMIT_BYTES = 4_000_000
"""The most of a validation pod's log read for its evidence (dcgmi diag -r 4 on 8 GPUs
writes tens of kilobytes)."""


def job_manifest(inp: NodeJobInput, template: JobTemplate, namespace: str,
                 run_id: str = "", host_engine: str = "") -> dict[str, Any]:
    """The Job: the worker's template for the step, pinned by nodeName (so cordon and taints
    do not stop it), tolerating everything, requesting all the node's GPUs for validation
    (exclusive access). Only the node, the name and the GPU come from the workflow."""
    labels = {JOB_LABEL: inp.kind, NODE_LABEL: label_value(inp.node),
              "app.kubernetes.io/managed-by": "gpu-remediate"}
    # The label selects (a node name may be too long for it); the annotation names.
    annotations = {NODE_LABEL: inp.node}
    if run_id:
        annotations[A_RUN] = run_id
    container: dict[str, Any] = {
        "name": inp.kind,
        "image": template.image,
        "command": list(template.command),
        "env": [*({"name": k, "value": v} for k, v in sorted(template.env.items())),
                {"name": "NODE_NAME", "value": inp.node}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if inp.gpu_index is not None:
        container["env"].append({"name": "GPU_INDEX", "value": inp.gpu_index})
    if inp.gpu_uuids:
        container["env"].append({"name": "GPU_UUIDS", "value": ",".join(inp.gpu_uuids)})
    if host_engine:
        container["env"] += [
            {"name": "DCGM_HOST_ENGINE", "value": host_engine},
            # The standalone engine listens on the node (hostPort 5555).
            {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]
    if inp.device_uuid:
        # One GPU through its own ResourceClaim (claim_manifest), no nvidia.com/gpu.
        container["resources"] = {"claims": [{"name": CLAIM_REF}]}
    elif inp.kind == "validate" and inp.gpus > 0:
        container["resources"] = {"limits": {GPU_RESOURCE: str(inp.gpus)}}
    pod_spec: dict[str, Any] = {
        "nodeName": inp.node,
        "restartPolicy": "Never",
        # A node Job talks to the GPUs, never to the API server.
        "automountServiceAccountToken": False,
        "tolerations": [{"operator": "Exists"}],
        "containers": [container],
    }
    if inp.device_uuid:
        # The scheduler allocates a claim; a pod bound by nodeName skips it and would wait
        # for an allocation that never comes. Pinned to the node by affinity instead.
        del pod_spec["nodeName"]
        pod_spec["affinity"] = {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In",
                                  "values": [inp.node]}]}]}}}
        pod_spec["resourceClaims"] = [{"name": CLAIM_REF, "resourceClaimName": inp.name}]
    if template.service_account:
        pod_spec["serviceAccountName"] = template.service_account
    if template.runtime_class_name:
        pod_spec["runtimeClassName"] = template.runtime_class_name
    if template.privileged:
        # Root inside: an image whose USER is not root (the worker's own) gets no
        # capabilities from `privileged` alone, and nsenter/chroot need them.
        container["securityContext"] = {"privileged": True, "runAsUser": 0}
        pod_spec["hostPID"] = True
        pod_spec["volumes"] = [{"name": "host", "hostPath": {"path": "/"}}]
        container["volumeMounts"] = [{"name": "host", "mountPath": "/host"}]
    elif template.run_as_user is not None:
        container["securityContext"] = {
            "runAsNonRoot": True, "runAsUser": template.run_as_user,
            "runAsGroup": template.run_as_user, "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": inp.name, "namespace": namespace, "labels": labels,
                     "annotations": annotations},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": int(template.deadline.total_seconds()),
            "ttlSecondsAfterFinished": 86400,
            "template": {"metadata": {"labels": labels, "annotations": annotations},
                         "spec": pod_spec},
        },
    }


GENERIC_CALLS: dict[str, set[tuple[str, str, str]]] = {
    # CustomObjectsApi method verb -> the RBAC permission: the pinned validation's claim,
    # in the job namespace (tests/deploy/test_rbac.py cannot read it off a generic path).
    "create": {("resource.k8s.io", "resourceclaims", "create")},
    "delete": {("resource.k8s.io", "resourceclaims", "delete")},
}
CLAIM_REF = "gpu"
CLAIM_VERSIONS = ("v1", "v1beta2")
"""ResourceClaim versions whose requests take ``exactly`` (v1 from Kubernetes 1.34)."""


def claim_manifest(inp: NodeJobInput, namespace: str, version: str) -> dict[str, Any]:
    """The ResourceClaim of a validation pinned to one GPU: exactly the device with the
    UUID, tolerating our own device taint only (the GPU is isolated by it), named and
    labelled as its Job."""
    labels = {JOB_LABEL: inp.kind, NODE_LABEL: label_value(inp.node),
              "app.kubernetes.io/managed-by": "gpu-remediate"}
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaim",
        "metadata": {"name": inp.name, "namespace": namespace, "labels": labels,
                     "annotations": {NODE_LABEL: inp.node}},
        "spec": {"devices": {"requests": [{"name": CLAIM_REF, "exactly": {
            "deviceClassName": DRA_DRIVER, "allocationMode": "ExactCount", "count": 1,
            "selectors": [{"cel": {"expression":
                f'device.attributes["{DRA_DRIVER}"].uuid == "{inp.device_uuid}"'}}],
            "tolerations": [{"key": TAINT_KEY, "operator": "Exists"}],
        }}]}},
    }


def _condition(job: Any, kind: str) -> Any | None:
    for cond in (job.status.conditions or []) if job.status else []:
        if cond.type == kind and cond.status == "True":
            return cond
    return None


# Since Kubernetes 1.31 the Job controller adds FailureTarget / SuccessCriteriaMet as soon
# as the outcome is decided, and Failed / Complete only once every pod has terminated. A
# pod on a node that lost power never terminates, so the interim condition is the verdict.
_ENDS = {"Complete": ("Complete", "SuccessCriteriaMet"), "Failed": ("Failed", "FailureTarget")}


def _ended(job: Any, outcome: str) -> Any | None:
    """The condition that decides the outcome (``Complete`` or ``Failed``), terminal or
    interim, or None."""
    for kind in _ENDS[outcome]:
        cond = _condition(job, kind)
        if cond is not None:
            return cond
    return None


PULL_FAILURES = frozenset({"ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"})
"""Container waiting reasons that mean the image will not come: the kubelet retried the
pull at least once (ErrImagePull alone is the first try, often a blip), the pull policy
forbids pulling, or the reference is malformed."""


def pull_failure(pods: list[Any]) -> str:
    """Why the Job's pod cannot start, from its containers' waiting state, or ""."""
    for pod in pods:
        statuses = [*((pod.status.init_container_statuses or []) if pod.status else []),
                    *((pod.status.container_statuses or []) if pod.status else [])]
        for cs in statuses:
            waiting = cs.state.waiting if cs.state else None
            if waiting is not None and waiting.reason in PULL_FAILURES:
                name = pod.metadata.name if pod.metadata else "?"
                detail = f": {waiting.message.strip()[:300]}" if waiting.message else ""
                return f"pod {name}: image {cs.image} not pulled ({waiting.reason}{detail})"
    return ""


_COMPUTE_APP = re.compile(
    r"^\s*((?:GPU|MIG)-[0-9A-Fa-f][0-9A-Fa-f-]{7,63}),\s*(\d{1,10}),\s*([^\n,]{1,200}?)\s*"
    r"(?:,[^\n]*)?$", re.MULTILINE)


def unschedulable(pods: list[Any]) -> str:
    """Why a pinned validation's pod is not scheduled (its claim cannot be allocated: no
    DRA driver, the device gone, or still held by the claim the isolation evicts), or "".
    Not a failure by itself: the scheduler retries until the Job's deadline."""
    for pod in pods:
        for cond in (pod.status.conditions or []) if pod.status else []:
            if cond.type == "PodScheduled" and cond.status == "False" and \
                    cond.reason == "Unschedulable":
                return f"its pod cannot be scheduled: {cond.message or cond.reason}"
    return ""


def reset_holders(text: str) -> list[str]:
    """Who holds the GPUs, from the rows of `nvidia-smi --query-compute-apps=gpu_uuid,pid,
    process_name --format=csv,noheader` that the reset prints when it is refused:
    "pid 4100 (/usr/bin/python3) on GPU-...". Node output: bounded, de-duplicated."""
    found: list[str] = []
    for m in _COMPUTE_APP.finditer(text[-20_000:]):
        entry = f"pid {m.group(2)} ({m.group(3)}) on {m.group(1)}"
        if entry not in found:
            found.append(entry)
    return found[:10]


DCGM_PORT = 5555
EXPORTER_APPS = frozenset({"nvidia-dcgm-exporter", "dcgm-exporter"})


def host_engine_choice(pods: list[dict[str, Any]]) -> tuple[str, str]:
    """Which DCGM host engine a validation on the node uses, from the pods on it: one serving
    DCGM's port on the node (hostPort 5555: the GPU Operator's standalone ``dcgm`` operand)
    and Ready is ("standalone", its name); else dcgm-exporter still there (it embeds an
    engine, Terminating or not) or a standalone engine starting or stopping is ("busy",
    their names): a Job's own engine would be a second one; else ("embedded", ""): the Job
    starts the only one."""
    standalone: list[str] = []
    starting: list[str] = []
    exporters: list[str] = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            continue
        name = f"{meta.get('namespace')}/{meta.get('name')}"
        containers = (pod.get("spec") or {}).get("containers") or []
        serves = any(port.get("hostPort") == DCGM_PORT
                     for c in containers for port in c.get("ports") or [])
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions") or [])
        if serves and ready and not meta.get("deletionTimestamp"):
            standalone.append(name)
        elif serves:
            starting.append(name)  # an engine starting or stopping: one all the same
        elif ((meta.get("labels") or {}).get("app") in EXPORTER_APPS
              or any("dcgm-exporter" in str(c.get("image", "")) for c in containers)):
            exporters.append(name)
    if standalone:
        return "standalone", standalone[0]
    if exporters or starting:
        return "busy", ", ".join(sorted(exporters + starting))
    return "embedded", ""


def node_not_ready(node: dict[str, Any]) -> str:
    """Why no node Job may be created on the node now ("" when it is Ready): a Job pod on a
    NotReady node cannot run, or would run once the node returns, long after the step
    gave up on it (a reboot Job would reboot a node back in service)."""
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            if cond.get("status") == "True":
                return ""
            return (f"Ready={cond.get('status')} ({cond.get('reason') or 'no reason'}"
                    + (f": {str(cond['message'])[:200]}" if cond.get("message") else "") + ")")
    return "no Ready condition"


class JobActivities:
    def __init__(self, api: client.ApiClient, jobs: JobsSettings | None = None) -> None:
        self.batch = client.BatchV1Api(api)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.unscheduled: dict[str, str] = {}
        """Pinned validations whose pod was last seen unscheduled, and why: the Job's
        deadline deletes the pod, and with it the reason."""
        self.jobs = jobs or JobsSettings()
        self.namespace = self.jobs.namespace

    def _template(self, inp: NodeJobInput) -> JobTemplate:
        try:
            return self.jobs.resolve(inp.kind, inp.template)
        except TemplateRefused as err:
            metrics.JOBS.labels(inp.kind, "refused").inc()
            log.warning("refused %s Job for %s: %s", inp.kind, inp.node, err)
            raise ApplicationError(str(err), type=errors.JOB_TEMPLATE_REFUSED,
                                   non_retryable=True) from err

    def _ensure(self, inp: NodeJobInput) -> None:
        run_id = activity.info().workflow_run_id or ""
        template = self._template(inp)
        self._node_ready(inp)
        engine = ""
        # Every validation Job learns the node's one host engine, whatever its output: an
        # exit-code template that runs dcgmi needs it as much. The worker waits for a busy
        # engine only for the template whose command it knows (dcgmi-json).
        if template.output == "dcgmi-json" or inp.kind == "validate":
            engine, who = host_engine_choice(self._pods_on_node(inp.node))
            if engine == "busy" and template.output == "dcgmi-json":
                raise ApplicationError(
                    f"{inp.kind} Job {inp.name} not created: dcgm-exporter's embedded DCGM "
                    f"host engine runs on {inp.node} ({who}); the Job's own would be a "
                    "second beside it: waiting for the exporter to be paused",
                    type=errors.HOST_ENGINE_BUSY, category=ApplicationErrorCategory.BENIGN)
            log.info("%s Job %s on %s: DCGM host engine %s%s", inp.kind, inp.name, inp.node,
                     engine, f" ({who})" if who else "")
        manifest = job_manifest(inp, template, self.namespace, run_id, engine)
        if inp.device_uuid:
            self._ensure_claim(inp)
        try:
            self.batch.create_namespaced_job(
                self.namespace, client.V1Job.model_validate(manifest),
                _request_timeout=REQUEST_TIMEOUT,
            )
        except ApiException as err:
            if err.status != 409:
                raise_typed(err, f"create job {self.namespace}/{inp.name}")
            self._adopt(inp, run_id)

    def _ensure_claim(self, inp: NodeJobInput) -> None:
        """The pinned validation's ResourceClaim (adopted when a retry finds it)."""
        for version in CLAIM_VERSIONS:
            try:
                self.custom.create_namespaced_custom_object(
                    "resource.k8s.io", version, self.namespace, "resourceclaims",
                    claim_manifest(inp, self.namespace, version),
                    _request_timeout=REQUEST_TIMEOUT)
                return
            except ApiException as err:
                if err.status == 409:
                    return
                if err.status == 404 and version != CLAIM_VERSIONS[-1]:
                    continue  # that version is not served: the next
                if err.status == 404:
                    raise ApplicationError(
                        f"{inp.kind} Job {inp.name} not created: the API server serves no "
                        "ResourceClaim (resource.k8s.io v1 or v1beta2)",
                        type=errors.JOB_NOT_STARTED, non_retryable=True) from err
                raise_typed(err, f"create ResourceClaim {self.namespace}/{inp.name}")

    def _delete_claim(self, inp: NodeJobInput) -> None:
        """The pinned validation's claim goes with its Job (its device returns to the pool)."""
        for version in CLAIM_VERSIONS:
            try:
                self.custom.delete_namespaced_custom_object(
                    "resource.k8s.io", version, self.namespace, "resourceclaims", inp.name,
                    _request_timeout=REQUEST_TIMEOUT)
                return
            except ApiException as err:
                if err.status == 404:
                    continue  # gone, or that version not served: the next says which
                log.warning("could not delete ResourceClaim %s/%s: %s %s",
                            self.namespace, inp.name, err.status, err.reason)
                return

    def _pods_on_node(self, node: str) -> list[dict[str, Any]]:
        try:
            resp = self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node}", _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            raise_typed(err, f"list pods on {node}")
        items: list[dict[str, Any]] = json.loads(resp.data).get("items") or []  # type: ignore[attr-defined]
        return items

    def _node_ready(self, inp: NodeJobInput) -> None:
        try:
            resp = self.core.read_node(inp.node, _preload_content=False,
                                       _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            if err.status == 404:
                raise ApplicationError(f"node {inp.node} is gone", type=errors.NODE_GONE,
                                       non_retryable=True) from err
            raise_typed(err, f"read node {inp.node}")
        why = node_not_ready(json.loads(resp.data))  # type: ignore[attr-defined]
        if why:
            raise ApplicationError(
                f"{inp.kind} Job {inp.name} not created: node {inp.node} is NotReady, {why}",
                type=errors.NODE_NOT_READY, category=ApplicationErrorCategory.BENIGN)

    def _adopt(self, inp: NodeJobInput, run_id: str) -> None:
        """A retry adopts the Job it created before, never another run's: that Job's result
        would say nothing about this fault (Jobs from before the run annotation existed
        are adopted as before)."""
        try:
            job = self.batch.read_namespaced_job_status(
                inp.name, self.namespace, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            raise_typed(err, f"read job {self.namespace}/{inp.name}")
        owner = ((job.metadata.annotations or {}) if job.metadata else {}).get(A_RUN)
        if owner and run_id and owner != run_id:
            raise ApplicationError(
                f"Job {self.namespace}/{inp.name} already exists and belongs to run {owner}, "
                f"not this one ({run_id}); delete it or release the node by hand",
                type=errors.JOB_CONFLICT, non_retryable=True)

    def _failure_message(self, inp: NodeJobInput, job: Any) -> str:
        cond = _ended(job, "Failed")
        parts = [f"{cond.reason}: {cond.message}" if cond else "failed"]
        try:
            pods = self.core.list_namespaced_pod(
                self.namespace, label_selector=f"job-name={inp.name}",
                _request_timeout=REQUEST_TIMEOUT,
            ).items
        except ApiException:
            pods = []
        if inp.device_uuid:
            seen = unschedulable(pods) or self.unscheduled.pop(inp.name, "")
            if seen:
                parts.append(seen)
        for pod in pods:
            # A pod the kubelet rejected (e.g. OutOfnvidia.com/gpu: something still holds
            # GPUs) never ran a container: the reason is only on the pod.
            if pod.status and pod.status.reason:
                name = pod.metadata.name if pod.metadata else "?"
                parts.append(f"pod {name}: {pod.status.reason}"
                             + (f": {pod.status.message}" if pod.status.message else ""))
            for cs in (pod.status.container_statuses or []) if pod.status else []:
                term = cs.state.terminated if cs.state else None
                if term and term.message:
                    parts.append(term.message.strip()[:500])
                    holders = reset_holders(term.message) if inp.kind == "gpu-reset" else []
                    if holders:
                        # Who must go before a reset can work, first: the reason to act on.
                        parts.insert(1, "GPU reset refused: held by " + ", ".join(holders))
        return "; ".join(parts)

    @activity.defn
    def run_node_job(self, inp: NodeJobInput) -> NodeJobResult:
        if inp.dry_run:
            return self._planned(inp)
        self._ensure(inp)
        try:
            return self._wait(inp)
        except CancelledError:
            details = activity.cancellation_details()
            # Only an abort stops the Job: a worker shutting down or a paused activity
            # comes back and adopts it by name.
            if details is not None and details.cancel_requested and \
                    not details.worker_shutdown:
                with activity.shield_thread_cancel_exception():
                    self._delete(inp)
            raise

    @activity.defn
    def poll_node_job(self, inp: NodeJobInput) -> NodeJobResult:
        """Create (or adopt) the Job, then look at it once: its result when it finished,
        else JobRunning, which the workflow's retry policy turns into the next look a
        poll interval later. Waiting this way holds no worker slot for the Job's minutes
        and writes no history events; an abort deletes the Job with delete_node_job."""
        if inp.dry_run:
            return self._planned(inp)
        if activity.info().attempt == 1:
            self._ensure(inp)
        try:
            job = self.batch.read_namespaced_job_status(
                inp.name, self.namespace, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            if err.status == 404:
                # Gone between looks (deleted by hand, or never created: an earlier
                # attempt failed before its create): create it again under its own name.
                self._ensure(inp)
                raise ApplicationError(f"{inp.kind} Job {inp.name} (re)created",
                                       type=errors.JOB_RUNNING,
                                       category=ApplicationErrorCategory.BENIGN) from err
            raise_typed(err, f"read job {self.namespace}/{inp.name}")
        done = self._result(inp, job)
        if done is not None:
            return done
        self._check_pull(inp)
        active = getattr(job.status, "active", None) or 0
        raise ApplicationError(f"{inp.kind} Job {inp.name} running ({active} pod(s) active)",
                               type=errors.JOB_RUNNING, category=ApplicationErrorCategory.BENIGN)

    def _planned(self, inp: NodeJobInput) -> NodeJobResult:
        t = self._template(inp)
        engine = ""
        if t.output == "dcgmi-json":
            mode, who = host_engine_choice(self._pods_on_node(inp.node))
            engine = {"standalone": f" (DCGM host engine: the node's standalone one, {who})",
                      "busy": f" (DCGM host engine: its own, once dcgm-exporter ({who}) is "
                              "paused)",
                      "embedded": " (DCGM host engine: its own, as root)"}[mode]
        return NodeJobResult(succeeded=True, job_name=inp.name,
                             message=(f"would run {inp.kind} Job {inp.name} on {inp.node}"
                                      f"{engine}: {t.image} {' '.join(t.command)}")[:500])

    @activity.defn
    def delete_node_job(self, inp: NodeJobInput) -> None:
        """Stop a node Job of an aborted remediation (no-op when it is gone)."""
        if not inp.dry_run:
            self._delete(inp)

    def _check_pull(self, inp: NodeJobInput) -> None:
        """A Job whose pod cannot pull its image never runs its step (for a reboot: the node
        was never asked to reboot). Said as such, and the Job deleted so that it cannot
        run late, should the image come after all."""
        try:
            pods: list[Any] = self.core.list_namespaced_pod(
                self.namespace, label_selector=f"job-name={inp.name}",
                _request_timeout=REQUEST_TIMEOUT).items
        except ApiException:
            return  # the next look tries again
        if inp.device_uuid:
            waiting = unschedulable(pods)
            if waiting:
                self.unscheduled[inp.name] = waiting
            else:
                self.unscheduled.pop(inp.name, None)
        why = pull_failure(pods)
        if not why:
            return
        metrics.JOBS.labels(inp.kind, "failed").inc()
        self._delete(inp, why)
        raise ApplicationError(f"{inp.kind} Job {inp.name} never started: {why}",
                               type=errors.JOB_NOT_STARTED, non_retryable=True)

    def _result(self, inp: NodeJobInput, job: Any) -> NodeJobResult | None:
        complete, failed = _ended(job, "Complete"), _ended(job, "Failed")
        if not complete and not failed:
            return None
        if inp.device_uuid:
            self._delete_claim(inp)
            if complete:
                self.unscheduled.pop(inp.name, None)
        reads_output = self._template(inp).output == "dcgmi-json"
        report, unreadable = self._diag_report(inp) if reads_output else (None, "")
        if complete and not reads_output:
            metrics.JOBS.labels(inp.kind, "succeeded").inc()
            return NodeJobResult(succeeded=True, job_name=inp.name,
                                 message=f"{inp.kind} job {inp.name} succeeded")
        if complete and report is not None and report.passed:
            metrics.JOBS.labels(inp.kind, "succeeded").inc()
            summary = report.summary()
            return NodeJobResult(succeeded=True, job_name=inp.name, evidence=summary,
                                 message=f"{inp.kind} job {inp.name} succeeded: {summary}")
        metrics.JOBS.labels(inp.kind, "failed").inc()
        if complete:
            # Exit 0 is not enough: the evidence must say every test passed.
            why = (f"dcgmi diag reports a failure: {report.summary()}" if report is not None
                   else f"its output is no evidence: {unreadable}")
            return NodeJobResult(succeeded=False, job_name=inp.name,
                                 evidence=report.summary() if report is not None else "",
                                 message=f"{inp.kind} job {inp.name} exited 0 but {why}")
        message = self._failure_message(inp, job)
        if report is not None:
            message = f"{report.summary()}; {message}"
        return NodeJobResult(succeeded=False, job_name=inp.name, message=message[:2000],
                             evidence=report.summary() if report is not None else "")

    def _diag_report(self, inp: NodeJobInput) -> tuple[DiagReport | None, str]:
        """The dcgmi diag report in the Job pod's log, or why there is none."""
        try:
            pods: list[Any] = self.core.list_namespaced_pod(
                self.namespace, label_selector=f"job-name={inp.name}",
                _request_timeout=REQUEST_TIMEOUT).items
        except ApiException as err:
            return None, f"could not list the Job's pods: {err.status} {err.reason}"
        if not pods:
            return None, "the Job has no pod left to read"
        pod = max(pods, key=lambda p: (p.metadata.creation_timestamp is not None,
                                       p.metadata.creation_timestamp))
        try:
            log_text = self.core.read_namespaced_pod_log(
                pod.metadata.name, self.namespace, container=inp.kind,
                limit_bytes=LOG_LIMIT_BYTES, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            return None, (f"could not read the log of pod {pod.metadata.name}: {err.status} "
                          f"{status_message(err) or err.reason}")
        try:
            return parse_dcgmi_json(str(log_text or ""), max_bytes=LOG_LIMIT_BYTES), ""
        except DiagUnparseable as err:
            return None, f"pod {pod.metadata.name}'s log: {err}"

    def _delete(self, inp: NodeJobInput, why: str = "") -> None:
        """Stop the Job and its pod (background deletion: the pod gets its grace period),
        so an aborted validation does not keep every GPU of a node back in service."""
        if inp.device_uuid:
            self._delete_claim(inp)
        try:
            self.batch.delete_namespaced_job(
                inp.name, self.namespace, propagation_policy="Background",
                _request_timeout=REQUEST_TIMEOUT)
            if not why:
                metrics.JOBS.labels(inp.kind, "aborted").inc()
            log.info("deleted %s Job %s/%s: %s", inp.kind, self.namespace, inp.name,
                     why or f"remediation of {inp.node} aborted")
        except ApiException as err:
            if err.status != 404:
                log.warning("could not delete Job %s/%s: %s %s",
                            self.namespace, inp.name, err.status, err.reason)

    def _wait(self, inp: NodeJobInput) -> NodeJobResult:
        while True:
            try:
                job = self.batch.read_namespaced_job_status(
                    inp.name, self.namespace, _request_timeout=REQUEST_TIMEOUT
                )
            except ApiException as err:
                raise_typed(err, f"read job {self.namespace}/{inp.name}")
            done = self._result(inp, job)
            if done is not None:
                return done
            self._check_pull(inp)
            status = job.status
            activity.heartbeat({"active": getattr(status, "active", None) or 0})
            time.sleep(POLL_SECONDS)
