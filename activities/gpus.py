"""The GPU resource as Kubernetes shows it: one home for its name and how to read it.

Everything here reads what a node or a pod says about GPUs. A node writes its own labels
and status, so each value is untrusted text: anything that is not plain digits reads as
"unknown" (a count) or 0 (a quantity), never as "all there".
"""

from __future__ import annotations

from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
"""The device plugin's extended resource."""

GPU_COUNT_LABEL = "nvidia.com/gpu.count"
"""GPU feature discovery's count of the GPUs on the node's PCI bus."""


def declared_gpus(labels: dict[str, str]) -> int | None:
    """The node's declared GPU count, or None: ASCII digits only, at most 1024 (a label is
    node-writable input, never our record)."""
    value = labels.get(GPU_COUNT_LABEL, "")
    if not (0 < len(value) <= 4 and value.isascii() and value.isdigit()):
        return None
    count = int(value)
    return count if count <= 1024 else None


def quantity(value: Any) -> int:
    """An extended resource's count ('8'); anything else reads as 0."""
    text = str(value) if value is not None else ""
    if not (0 < len(text) <= 5 and text.isascii() and text.isdigit()):
        return 0
    return int(text)


def _container_gpus(container: Any) -> int:
    res = container.resources
    limits = getattr(res, "limits", None) or {}
    requests = getattr(res, "requests", None) or {}
    return max(quantity(limits.get(GPU_RESOURCE, "0")),
               quantity(requests.get(GPU_RESOURCE, "0")))


def pod_gpu_request(pod: Any) -> int:
    """GPUs a pod (a kubernetes client V1Pod) asks for, by the scheduler's rule: the larger
    of each init container's request and the sum over the app containers (a restartable
    init container, a sidecar, runs beside them and adds to both). A container's request
    is the larger of its limit and its request."""
    spec = pod.spec
    if spec is None:
        return 0
    apps = sum(_container_gpus(c) for c in spec.containers or [])
    sidecars = 0
    init_peak = 0
    for c in spec.init_containers or []:
        gpus = _container_gpus(c)
        if getattr(c, "restart_policy", None) == "Always":
            sidecars += gpus
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, sidecars + gpus)
    return max(apps + sidecars, init_peak)
