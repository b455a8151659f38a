"""Other controllers that may be acting on a node: policy as data, each with its why.

A node one of them is draining, upgrading or rebooting is not admitted (two controllers
draining one node fight over its pods, and our reboot would cut theirs short); while it is
out of service because of them, it counts against the budget like a node of ours, since
the fleet loses its capacity all the same. The marks are read from the Node: labels,
annotations and taints these controllers write. A kubelet can write the first two on its own
Node (and cordon it), so only a taint makes the hold count against the budget: one
compromised node must not hold a slot by claiming a driver upgrade.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Neighbour:
    who: str
    where: Literal["label", "annotation", "taint"]
    key: str
    idle: frozenset[str]
    """Values that mean "not acting" (a label or annotation); any other value is busy."""
    why: str


NEIGHBOURS: tuple[Neighbour, ...] = (
    Neighbour(
        "GPU Operator driver upgrade", "label", "nvidia.com/gpu-driver-upgrade-state",
        frozenset({"", "upgrade-done"}),
        "the GPU Operator's upgrade controller moves the node through cordon, drain, driver "
        "restart and validation by this label; upgrade-failed waits for an admin"),
    Neighbour(
        "kured", "annotation", "weave.works/kured-reboot-in-progress", frozenset({""}),
        "kured holds its reboot lock for the node and drains it for an OS reboot (written "
        "with kured's --annotate-nodes)"),
    Neighbour(
        "Node Maintenance Operator", "taint", "medik8s.io/drain", frozenset(),
        "a NodeMaintenance (Medik8s) is draining the node for maintenance"),
    Neighbour(
        "out-of-service", "taint", "node.kubernetes.io/out-of-service", frozenset(),
        "the node is marked out of service (Self Node Remediation or an admin): its "
        "workloads are being deleted"),
)


@dataclass(frozen=True)
class Hold:
    by: str
    detail: str
    unforgeable: bool = False
    """Read from a taint, which a kubelet cannot set on its own Node (NodeRestriction); a
    label or annotation may be the node's own word."""


def neighbour_hold(labels: dict[str, str], annotations: dict[str, str],
                   taints: set[str]) -> Hold | None:
    """Who else is acting on the node, by the first mark found, or None."""
    for n in NEIGHBOURS:
        if n.where == "taint":
            if n.key in taints:
                return Hold(n.who, f"taint {n.key}", unforgeable=True)
            continue
        source = labels if n.where == "label" else annotations
        value = source.get(n.key)
        if value is not None and value not in n.idle:
            return Hold(n.who, f"{n.key}={value[:63]}")
    return None
