"""What a repair path needs from the cluster, looked at once when the worker starts (and by
``gpu-remediate plan``): the GPU Operator operand DaemonSets a GPU reset pauses
(``remediation.gpu_operator.operands``, in ``remediation.gpu_operator.namespace``).

An operand with no DaemonSet that selects nodes by its deploy label
(``nvidia.com/gpu.deploy.<operand>``, as the GPU Operator's own do) is most often a name the
config got wrong, or an operator installed elsewhere: a reset would pause nothing by that
name, and whatever holds the GPUs instead makes the reset fail (it then escalates to a
reboot). So it is said, one line per operand, as a warning, never a refusal: refusing to
start would stop every remediation, reboots included, for a step that already fails safe,
and an operator installed after the worker is not an error.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

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

