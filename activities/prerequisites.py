"""What a repair path needs from the cluster, looked at once when the worker starts (and by
``gpu-remediate plan``): the GPU Operator operand DaemonSets a GPU reset pauses
(``remediation.gpu_operator.operands``, in ``remediation.gpu_operator.namespace``).

Every configured name is a GPU Operator operand (the config refuses any other, and the
driver and the container toolkit, at start: policy/operands.py). A known operand with no
DaemonSet that selects nodes by its deploy label (``nvidia.com/gpu.deploy.<operand>``, as
the GPU Operator's own do) is an operand this cluster does not deploy (the standalone
``dcgm`` is optional) or an operator installed in another namespace: a reset would pause
nothing by that name, and whatever holds the GPUs instead makes the reset fail (it then
escalates to a reboot). So it is said, one line per operand, as a warning, never a
refusal: refusing to start would stop every remediation, reboots included, for a step that
already fails safe, and an operator installed after the worker is not an error.

The RuntimeClasses the Job templates name (``jobs.templates.<name>.runtime_class_name``;
the built-in gpu-reset names ``nvidia``, which the GPU Operator installs) are different: a
pod naming a RuntimeClass the cluster lacks is refused by the API server's admission, so
every Job of that template would wait out its deadline with no pod. That is a config that
cannot work, and the worker refuses to start on it, naming the field. Only a definite
answer counts: where the RuntimeClasses cannot be read (no grant, no API) it is said as a
warning naming what is missing, and the worker starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from activities.job_templates import JobsSettings
from activities.kube import REQUEST_TIMEOUT
from workflows.operands import DEPLOY_LABEL_PREFIX, deploy_label
from workflows.settings import GpuOperatorSettings


def selected_deploy_labels(daemonset: dict[str, Any]) -> set[str]:
    """The deploy labels a DaemonSet's pods require of a node: its nodeSelector, and the
    required node affinity's ``In``/``Exists`` terms."""
    spec = ((daemonset.get("spec") or {}).get("template") or {}).get("spec") or {}
    keys = set((spec.get("nodeSelector") or {}).keys())
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    for term in required.get("nodeSelectorTerms") or []:
        for expr in term.get("matchExpressions") or []:
            if expr.get("operator") in ("In", "Exists"):
                keys.add(str(expr.get("key", "")))
    return {k for k in keys if k.startswith(DEPLOY_LABEL_PREFIX)}


def operands_without_daemonset(operands: list[str],
                               daemonsets: list[dict[str, Any]]) -> list[str]:
    """The configured operands no DaemonSet selects nodes by (config order, once each)."""
    selected: set[str] = set()
    for ds in daemonsets:
        selected |= selected_deploy_labels(ds)
    return [o for o in dict.fromkeys(operands) if deploy_label(o) not in selected]


def missing_prerequisites(api: client.ApiClient, gpu_operator: GpuOperatorSettings) -> list[str]:
    """One line for each configured operand without its DaemonSet, or one line saying the
    DaemonSets could not be read; none when all are there (or no operand is configured)."""
    if not gpu_operator.operands:
        return []
    namespace = gpu_operator.namespace
    try:
        resp = client.AppsV1Api(api).list_namespaced_daemon_set(
            namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
        daemonsets: list[dict[str, Any]] = json.loads(resp.data).get("items") or []  # type: ignore[attr-defined]
    except ApiException as err:
        return [f"GPU Operator operands not checked: cannot list DaemonSets in namespace "
                f"{namespace} (HTTP {err.status} {err.reason}); a GPU reset pauses them "
                "(remediation.gpu_operator)"]
    except Exception as err:  # unreachable API: said, never a reason not to start
        return [f"GPU Operator operands not checked: cannot list DaemonSets in namespace "
                f"{namespace} ({type(err).__name__}: {str(err)[:200]})"]
    return [f"GPU Operator operand {o!r} missing: no DaemonSet in namespace {namespace} "
            f"selects nodes by {deploy_label(o)}; a GPU reset cannot pause it "
            "(remediation.gpu_operator.operands)"
            for o in operands_without_daemonset(gpu_operator.operands, daemonsets)]



RUNTIME_CLASS_GRANT = ("get on runtimeclasses.node.k8s.io, cluster-wide (the ClusterRole "
                       "gpu-remediate in deploy/base/rbac.yaml, or the Helm chart's)")


@dataclass(frozen=True)
class RuntimeClassCheck:
    """What the start-up look at the templates' RuntimeClasses found."""

    missing: list[str] = field(default_factory=list)
    """One line per RuntimeClass the cluster does not have, naming the config fields that
    name it: the worker refuses to start."""
    unchecked: list[str] = field(default_factory=list)
    """Why they could not be read (no grant, no node.k8s.io API, no API at all): said,
    never a reason not to start."""


def named_runtime_classes(jobs: JobsSettings) -> dict[str, list[str]]:
    """RuntimeClass name -> the config fields that name it (sorted by template)."""
    out: dict[str, list[str]] = {}
    for name, template in sorted(jobs.templates.items()):
        if template.runtime_class_name:
            out.setdefault(template.runtime_class_name, []).append(
                f"jobs.templates.{name}.runtime_class_name")
    return out


def _missing_object(err: ApiException, name: str) -> bool:
    """A 404 for the object itself (a Status naming it), not for a path the server does
    not serve (an API server without node.k8s.io answers 404 with no details)."""
    try:
        details = (json.loads(err.body or "{}") or {}).get("details") or {}
    except (ValueError, AttributeError):
        return False
    return details.get("kind") == "runtimeclasses" and details.get("name") == name


def check_runtime_classes(api: client.ApiClient, jobs: JobsSettings) -> RuntimeClassCheck:
    """Read each RuntimeClass the templates name (one GET each)."""
    wanted = named_runtime_classes(jobs)
    if not wanted:
        return RuntimeClassCheck()
    nodes = client.NodeV1Api(api)
    missing: list[str] = []
    for rc, fields in wanted.items():
        named = ", ".join(fields)
        try:
            nodes.read_runtime_class(rc, _preload_content=False,
                                     _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            if err.status == 404 and _missing_object(err, rc):
                missing.append(
                    f"{named}: RuntimeClass {rc!r} does not exist in the cluster, and the "
                    "API server refuses every pod that names it (the GPU Operator installs "
                    "'nvidia'). Install it, or set runtime_class_name: null where the "
                    "node's default runtime serves the Job (docs/install.md)")
                continue
            if err.status == 403:
                why = f"the worker may not read them (HTTP 403): grant {RUNTIME_CLASS_GRANT}"
            elif err.status == 404:
                why = "the API server does not serve node.k8s.io/v1 (HTTP 404)"
            else:
                why = f"HTTP {err.status} {err.reason}"
            return RuntimeClassCheck(missing, [
                f"RuntimeClasses not checked: {why}; {named} names {rc!r}"])
        except Exception as err:  # unreachable API: said, never a reason not to start
            return RuntimeClassCheck(missing, [
                f"RuntimeClasses not checked: {type(err).__name__}: {str(err)[:200]}; "
                f"{named} names {rc!r}"])
    return RuntimeClassCheck(missing)
