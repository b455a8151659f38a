"""GPU Operator operands off and on around a GPU reset: messages and the pure plan.

A GPU reset needs the GPU idle, but on a GPU Operator node the device plugin, DCGM,
dcgm-exporter and GPU feature discovery run as DaemonSets and hold ``/dev/nvidia*``. The
operator turns each operand off and on per node through the node label
``nvidia.com/gpu.deploy.<operand>`` ("true" / "false"): every operand DaemonSet's pod
template selects ``nvidia.com/gpu.deploy.<operand>: "true"``.

No I/O imports: workflow code imports this module through the sandbox.
"""

from __future__ import annotations

from workflows.messages import _Message

DEFAULT_OPERANDS = ("device-plugin", "dcgm", "dcgm-exporter", "gpu-feature-discovery")
DEPLOY_LABEL_PREFIX = "nvidia.com/gpu.deploy."
ON = "true"
OFF = "false"


def deploy_label(operand: str) -> str:
    """The node label that turns ``operand`` on or off."""
    return DEPLOY_LABEL_PREFIX + operand


class OperandsInput(_Message):
    """Pause these operands on the node (``operands``: names such as "device-plugin")."""

    node: str
    operands: list[str]
    namespace: str = "gpu-operator"
    dry_run: bool = False


class OperandsPaused(_Message):
    """What a pause did, and the input of the restore.

    ``changed``: full label → its value before we changed it (only labels we set "false").
    ``left``: labels we left as found, with the value found (None: absent).
    ``dry_run``: a plan, nothing was written (the restore then writes nothing either).
    ``from_record``: the pause's answer never reached the workflow (an abort that lands in
    the same workflow task as the pause's completion loses the result): the restore also
    puts back what the node's pause record says the pause turned off.
    """

    node: str
    changed: dict[str, str]
    left: dict[str, str | None]
    message: str
    dry_run: bool = False
    from_record: bool = False


def pause_in_flight(node: str) -> OperandsPaused:
    """What the workflow holds while a pause runs: if its answer is lost, the restore goes
    by the node's pause record."""
    return OperandsPaused(node=node, changed={}, left={}, from_record=True,
                          message="a pause whose answer was lost (restored from the "
                                  "node's pause record)")


PAUSE_ANSWER_MAY_BE_LOST = "operands-pause-answer-may-be-lost"
"""The patch under which a remediation holds ``pause_in_flight`` while it pauses operands."""


class OperandsWaitInput(_Message):
    """One look at the operands selected by ``labels`` (full labels) on the node."""

    node: str
    labels: list[str]
    namespace: str = "gpu-operator"
    expected_gpus: int = 0


class OperandsState(_Message):
    """What a successful look saw: the operand pods (``ns/name``) and allocatable GPUs."""

    pods: list[str]
    allocatable_gpus: int
    message: str


def plan_pause(
    labels_now: dict[str, str], operands: list[str]
) -> tuple[dict[str, str], dict[str, str | None]]:
    """Which deploy labels to set "false" and which to leave as found.

    The labels are node-writable (a kubelet may change its own), so their values are
    untrusted text: only the exact value "true" is ours to turn off; "false", an absent
    label, "True", "yes" or anything else is left as found (and so never restored by us).
    Returns (label → value before, label → value found or None); an operand named twice
    counts once.
    """
    to_change: dict[str, str] = {}
    left: dict[str, str | None] = {}
    for operand in operands:
        label = deploy_label(operand)
        if label in to_change or label in left:
            continue
        value = labels_now.get(label)
        if value == ON:
            to_change[label] = value
        else:
            left[label] = value
    return to_change, left


DEVICE_PLUGIN = "device-plugin"


class DevicePluginInput(_Message):
    """Restart the device plugin on the node if fewer GPUs than expected are allocatable."""

    node: str
    uid: str = ""
    namespace: str = "gpu-operator"
    expected_gpus: int = 0


class DevicePluginRestart(_Message):
    """``evicted``: the device-plugin pods (``ns/name``) evicted, none when nothing was done
    (every GPU allocatable, or no device-plugin pod on the node)."""

    evicted: list[str]
    allocatable_gpus: int
    message: str
