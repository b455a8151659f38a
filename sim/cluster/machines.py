"""The machines behind the simulated nodes: power, boot, and what an operator scripts.

A reboot here behaves as on a real GPU node (docs/simulators-cluster.md lists each
behaviour with its source): the reboot command either returns before the shutdown or is
killed by it (drawn from a seeded RNG), the shutdown kills every pod on the node, the node
is NotReady for a while, comes back with a new boot ID, and reports `nvidia.com/gpu`
allocatable 0 until the device plugin re-registers. Scripted faults (`gpu-remediate sim
node ...`): a reboot that never returns, a kubelet that stops (wedge), a node deleted and
registered again under the same name (replace), and recover.

This module holds the state and the timing; the kubelet acts on them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Literal

NodeCommand = Literal["hang", "replace", "wedge", "recover"]
COMMANDS: tuple[NodeCommand, ...] = ("hang", "replace", "wedge", "recover")


@dataclass(frozen=True)
class NodeTiming:
    """How long node events take, in seconds of wall clock (short for tests and demos)."""

    reboot_seconds: float = 3.0
    """Shutdown to kubelet back: the NotReady window."""
    shutdown_seconds: float = 1.0
    """Longest time between the reboot command and the shutdown (drawn in [0, this])."""
    device_plugin_seconds: float = 1.0
    """Ready to `nvidia.com/gpu` allocatable again: the device plugin re-registering."""
    status_grace_seconds: float = 4.0
    """A kubelet silent this long is marked Unknown (node-monitor-grace-period, 40 s real)."""
    reregister_seconds: float = 1.0
    """A replaced node's Node object is absent this long before the new machine registers."""
    operand_seconds: float = 1.0
    """A GPU Operator operand pod (device plugin, DCGM, dcgm-exporter, GFD): start to Ready."""
    plugin_health_seconds: float = 1.0
    """How often the device plugin's health check learns XIDs from the GPU simulator."""
    seed: int = 0
    """Seed of the draw between "reboot command returns first" and "pod killed"."""

    def __post_init__(self) -> None:
        for name in ("reboot_seconds", "shutdown_seconds", "device_plugin_seconds",
                     "status_grace_seconds", "reregister_seconds", "operand_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.plugin_health_seconds <= 0:
            raise ValueError(
                f"plugin_health_seconds must be positive, got {self.plugin_health_seconds}")


# The NVIDIA device plugin's default DP_DISABLE_HEALTHCHECKS skip list: XIDs that are the
# application's fault; any other XID marks the GPU unhealthy until the plugin restarts.
PLUGIN_SKIPPED_XIDS = frozenset({13, 31, 43, 45, 68, 109})


@dataclass
class Machine:
    """One node's machine. Times are wall-clock seconds; None means "not scheduled"."""

    powered: bool = True
    wedged: bool = False
    hang_next_reboot: bool = False
    shutdown_at: float | None = None
    boot_at: float | None = None
    plugin_at: float | None = None
    silent_since: float | None = None
    marked_unknown: bool = False
    register_at: float | None = None
    # A replacement machine registers only once the GPU simulator holds its GPUs as a new
    # machine's (driver loaded fresh, a new dcgm-exporter that remembers no XID): until
    # then the old machine's exporter could still be read under the new node's name.
    gpus_fresh: bool = True
    reboots: int = 0
    events: list[str] = field(default_factory=list)
    # The device plugin (when the cluster runs the GPU Operator's device-plugin DaemonSet):
    # the running instance as (pod uid, restart count), None while none runs; `steady`
    # only for machines present when the simulator starts, whose plugin is already
    # registered; the GPUs this instance holds unhealthy (critical XIDs seen).
    plugin_instance: tuple[str, int] | None = None
    plugin_registered: bool = False
    steady: bool = False
    plugin_unhealthy: set[int] = field(default_factory=set)
    plugin_managed: bool = False
    power_lost: bool = False
    # MIG (a node whose labels name a layout): whether its GPU and compute instances exist.
    # A GPU reset or a boot destroys them (MIG mode itself persists); only the MIG
    # manager's apply creates them again (sim/cluster/mig.py).
    mig_instances: bool = True

    @property
    def registered(self) -> bool:
        return self.register_at is None

    def follow_plugin(self, instance: tuple[str, int] | None, now: float,
                      register_after: float) -> None:
        """The device-plugin instance running Ready on the node now, as (pod uid, restart
        count), or None. A new instance (a new pod, or a container restart) starts with
        every GPU healthy and registers ``register_after`` seconds later; none running
        means no GPUs. A ``steady`` machine's plugin counts as registered until the first
        change."""
        if instance != self.plugin_instance and not (self.steady and instance is None):
            if self.plugin_instance is not None:
                self.events.append("device plugin stopped")
            self.plugin_unhealthy.clear()
            self.plugin_instance = instance
            self.plugin_registered = instance is not None and self.steady
            self.plugin_at = None
            if instance is not None and not self.steady:
                self.plugin_at = now + register_after
                self.events.append("device plugin started")
            self.steady = False
        if self.plugin_at is not None and now >= self.plugin_at:
            self.plugin_at = None
            self.plugin_registered = True
            self.events.append("device plugin registered")

    def plugin_saw(self, xids: dict[int, list[int]]) -> None:
        """The device plugin's health check: a GPU with an XID outside the plugin's skip list
        is unhealthy until the plugin restarts (nothing while no plugin runs)."""
        if self.plugin_instance is None:
            return
        for index, values in xids.items():
            critical = [x for x in values if x not in PLUGIN_SKIPPED_XIDS]
            if critical and index not in self.plugin_unhealthy:
                self.plugin_unhealthy.add(index)
                self.events.append(f"device plugin: GPU {index} unhealthy (XID {critical[0]})")

    def healthy_gpus(self, capacity: int) -> int:
        """What the registered plugin offers: the GPUs it does not hold unhealthy."""
        return max(0, capacity - len({i for i in self.plugin_unhealthy if 0 <= i < capacity}))

    @property
    def kubelet_running(self) -> bool:
        """The kubelet posts status and runs pods: powered, registered and not wedged."""
        return self.powered and not self.wedged and self.registered

    def describe(self) -> dict[str, Any]:
        if not self.registered:
            state = "replaced (registering)"
        elif not self.powered and self.power_lost:
            state = "down (power lost: never returns)"
        elif not self.powered:
            state = "down (hung: never returns)" if self.boot_at is None else "down (rebooting)"
        elif self.wedged:
            state = "wedged"
        elif self.shutdown_at is not None:
            state = "shutting down"
        elif self.plugin_at is not None:
            state = "up (device plugin registering)"
        elif self.plugin_managed and self.plugin_instance is None:
            state = "up (no device plugin)"
        else:
            state = "up"
        return {"state": state, "reboots": self.reboots,
                "hang_next_reboot": self.hang_next_reboot,
                "power_lost": self.power_lost, "events": self.events[-10:],
                "device_plugin_unhealthy_gpus": sorted(self.plugin_unhealthy)}


class Machines:
    def __init__(self, nodes: list[str], timing: NodeTiming) -> None:
        self.timing = timing
        self.rng = random.Random(timing.seed)
        self.by_node = {n: Machine(steady=True) for n in nodes}

    def get(self, node: str) -> Machine:
        try:
            return self.by_node[node]
        except KeyError:
            raise KeyError(f"no simulated machine behind node {node!r}") from None

    def plan_reboot(self, node: str, now: float) -> bool:
        """A reboot command ran on the node: schedule its shutdown.

        Returns True when the command returns before the shutdown (its pod succeeds),
        False when the shutdown kills it first. A second command before the shutdown
        changes nothing: the machine goes down once.
        """
        m = self.get(node)
        returns_first = self.rng.random() < 0.5
        delay = self.rng.uniform(0.0, self.timing.shutdown_seconds)
        if m.shutdown_at is None and m.powered:
            m.shutdown_at = now + delay
            m.events.append(f"reboot requested; shutdown in {delay:.2f}s, command "
                            + ("returns first" if returns_first else "killed by the shutdown"))
        return returns_first
