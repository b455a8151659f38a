"""The GPU Operator's operands by name: which ones exist, and which a reset may pause.

The operator turns each operand on and off per node through the node label
``nvidia.com/gpu.deploy.<operand>``; a reset pauses the ones that hold the GPUs
(workflows/operands.py, activities/operands.py). Pure data with its why.
"""

from __future__ import annotations

# The operands the GPU Operator turns on and off per node through a deploy label (its
# ClusterPolicy state labels), with what each one is. A name outside this table is a label
# no DaemonSet of the operator selects: pausing it would pause nothing, so the config that
# names one is refused at start rather than found out at the first reset.
GPU_OPERATOR_OPERANDS: dict[str, str] = {
    "driver": "the NVIDIA driver container",
    "container-toolkit": "the NVIDIA Container Toolkit (the nvidia RuntimeClass)",
    "device-plugin": "the device plugin (advertises nvidia.com/gpu)",
    "dcgm": "the standalone DCGM host engine",
    "dcgm-exporter": "dcgm-exporter (embeds a host engine when no standalone one runs)",
    "gpu-feature-discovery": "GPU feature discovery (node labels)",
    "mig-manager": "the MIG manager (applies nvidia.com/mig.config)",
    "node-status-exporter": "the node status exporter",
    "operator-validator": "the operator's validator",
    "nvsm": "NVIDIA System Management",
    "sandbox-device-plugin": "the device plugin for GPU passthrough to VMs",
    "sandbox-validator": "the validator for GPU passthrough to VMs",
    "vfio-manager": "the VFIO manager (GPU passthrough)",
    "vgpu-manager": "the vGPU host driver",
    "vgpu-device-manager": "the vGPU device manager",
    "kata-manager": "the Kata Containers manager",
    "cc-manager": "the confidential-computing mode manager",
}

# Operands a reset must never pause, with why: turning them off takes away what the reset
# itself runs on.
NEVER_PAUSED: dict[str, str] = {
    "driver": "the reset runs the driver's nvidia-smi; turning the driver off unloads it "
              "from every GPU of the node",
    "container-toolkit": "the reset pod runs under the nvidia RuntimeClass the toolkit "
                         "installs",
}


def operand_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a reset's operand, or None when it can."""
    if name in NEVER_PAUSED:
        return f"{name!r} is never paused around a reset: {NEVER_PAUSED[name]}"
    if name not in GPU_OPERATOR_OPERANDS:
        known = ", ".join(n for n in GPU_OPERATOR_OPERANDS if n not in NEVER_PAUSED)
        return (f"{name[:60]!r} is not a GPU Operator operand (no DaemonSet of the operator "
                f"selects nvidia.com/gpu.deploy.{name[:60]}); known: {known}")
    return None
