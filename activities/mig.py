"""MIG layouts on a node, as the NVIDIA MIG manager reports them in node labels.

The layout a node should have is named by ``nvidia.com/mig.config``; the MIG manager
(NVIDIA mig-parted's k8s-mig-manager, a GPU Operator operand) applies it when its pod
starts and when that label changes, and writes ``nvidia.com/mig.config.state``: pending,
rebooting, success or failed. Pure: labels in.
"""

from __future__ import annotations

MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"


def mig_layout_not_applied(labels: dict[str, str]) -> list[str]:
    """A MIG node whose configured layout the MIG manager has not reported applied: a
    validation would test the wrong devices. The MIG manager writes ``mig.config.state``
    (pending, rebooting, success, failed) for the layout named by ``mig.config``."""
    config = labels.get(MIG_CONFIG_LABEL)
    if not config or config == "all-disabled":
        return []
    state = labels.get(MIG_STATE_LABEL, "")
    if state == "success":
        return []
    return [f"MIG layout {config[:63]!r} not applied (node label {MIG_STATE_LABEL}="
            f"{state[:20]!r}; the MIG manager applies {MIG_CONFIG_LABEL})"]
