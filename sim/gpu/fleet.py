"""State of a simulated GPU fleet: nodes, GPUs, healthy baselines, faults and repairs.

Threading: every mutation runs on the server's event loop, while big renders may read
from a worker thread. Faults are immutable and each GPU's fault list is swapped as a
whole tuple, so a reader sees either the old or the new list, never a half-edited one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, get_args

from sim.gpu.device import Gpu, PodRef, Sample, fb_total_mib, has_nvlink
from sim.gpu.faults import Fault, failing_problem, validate
from sim.scenario import Scenario, gpu_uuid

__all__ = ["Fleet", "Gpu", "Node", "NodeSpec", "PodRef", "Sample", "UnknownGpu", "UnknownNode"]

ExporterMode = Literal["up", "down", "slow", "empty", "garbled"]
EXPORTER_MODES: tuple[str, ...] = get_args(ExporterMode)
HostnameLabel = Literal["Hostname", "hostname"]
XidSeries = Literal["absent-until-error", "zero"]

# PCI bus numbers of the eight GPUs on an HGX H100 baseboard, in index order.
_HGX_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
_MAX_DELAY_S = 600.0


class UnknownNode(LookupError):
    def __init__(self, name: str, fleet_size: int) -> None:
        super().__init__(f"unknown node {name!r}; the simulated fleet has {fleet_size} nodes")


class UnknownGpu(LookupError):
    def __init__(self, node: str, gpu: object, count: int) -> None:
        super().__init__(f"node {node!r} has no GPU {gpu!r}; valid GPU indices are 0-{count - 1}")


@dataclass
class ExporterState:
    mode: str = "up"
    delay_seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {"mode": self.mode, "delay_seconds": self.delay_seconds}


@dataclass
class Node:
    name: str
    pool: str
    model: str
    driver: str
    gpus: list[Gpu]
    exporter: ExporterState = field(default_factory=ExporterState)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    pool: str = "gpu-node"
    gpus: int = 8
    model: str = "NVIDIA H100 80GB HBM3"
    driver: str = "570.124.06"


@dataclass(frozen=True)
class RepairResult:
    ok: bool
    reason: str = ""
    cleared: tuple[tuple[int, Fault], ...] = ()  # (gpu index, fault)


@dataclass(frozen=True)
class HealthReport:
    node: str
    healthy: bool
    problems: list[str]


def _unreachable(g: Gpu) -> bool:
    """Off the bus (or XID 79 not marked reset-clearable): in-band reset cannot reach it."""
    return g.fallen_off or any(
        f.kind == "xid" and f.value == 79 and f.clears_on != "reset" for f in g.faults
    )


def _bus_id(index: int) -> str:
    bus = _HGX_BUSES[index] if index < len(_HGX_BUSES) else f"{0xE0 + index:02X}"
    return f"00000000:{bus}:00.0"


class Fleet:
    """A fleet of simulated GPU nodes plus the exporter quirks to mimic."""

    kernel_log: Callable[[Gpu, int, float], None] | None = None
    """Called with each injected XID (sim/gpu/kmsg.py writes the driver's line)."""

    def __init__(
        self,
        nodes: Iterable[NodeSpec],
        *,
        hostname_label: HostnameLabel = "Hostname",
        xid_series: XidSeries = "absent-until-error",
        extra_fields: bool = True,
        xid_count_window_ms: int | None = None,
        serial_label: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if hostname_label not in ("Hostname", "hostname"):
            raise ValueError(f"hostname_label must be Hostname or hostname, got {hostname_label!r}")
        if xid_series not in ("absent-until-error", "zero"):
            raise ValueError(f"xid_series must be absent-until-error or zero, got {xid_series!r}")
        if xid_count_window_ms is not None and (
            isinstance(xid_count_window_ms, bool)
            or not isinstance(xid_count_window_ms, int)
            or xid_count_window_ms <= 0
        ):
            raise ValueError(
                "xid_count_window_ms must be a positive whole number of milliseconds "
                f"(dcgm-exporter's --xid-count-window-size, default 300000), "
                f"got {xid_count_window_ms!r}"
            )
        self.hostname_label: str = hostname_label
        self.xid_series: str = xid_series
        self.extra_fields = extra_fields
        # None: DCGM_EXP_XID_ERRORS_COUNT is not exported (the stock exporter's default).
        self.xid_count_window_ms: int | None = xid_count_window_ms
        # True: every series carries DCGM_FI_DEV_SERIAL (a counters file that lists it as a
        # label field, as deploy/dcgm-exporter/gpu-remediate-counters.csv does).
        self.serial_label = bool(serial_label)
        self.clock = clock
        self._next_fault_id = 1
        now = clock()
        self.nodes: dict[str, Node] = {}
        for spec in nodes:
            if spec.name in self.nodes:
                raise ValueError(f"node {spec.name!r} appears twice in the fleet")
            gpus = [self._new_gpu(spec, i, now) for i in range(spec.gpus)]
            for g in gpus:
                g.serial_label = self.serial_label
            self.nodes[spec.name] = Node(spec.name, spec.pool, spec.model, spec.driver, gpus)

    @staticmethod
    def _new_gpu(spec: NodeSpec, index: int, now: float) -> Gpu:
        u = gpu_uuid(spec.name, index)
        seed = u.int & 0xFFFFFFFF
        return Gpu(
            node=spec.name,
            index=index,
            uuid=f"GPU-{u}",
            pci_bus_id=_bus_id(index),
            model=spec.model,
            driver=spec.driver,
            seed=seed,
            fb_total_mib=fb_total_mib(spec.model),
            nvlink=has_nvlink(spec.model),
            serial=f"{u.int % 10**13:013d}",
            energy_mj=float(seed % 900_000_000),  # energy since the driver loaded before we did
            nvlink_bytes=float(seed % 10_000_000),
            mark=now,
        )

    @classmethod
    def from_scenario(cls, scenario: Scenario, **switches: object) -> Fleet:
        specs = [
            NodeSpec(name, pool.name, pool.gpus, pool.model, pool.driver)
            for name, pool in scenario.nodes()
        ]
        return cls(specs, **switches)  # type: ignore[arg-type]

    @classmethod
    def synthetic(cls, nodes: int, gpus: int = 8, **switches: object) -> Fleet:
        """A fleet without a scenario: nodes gpu-node-00001, gpu-node-00002, ..."""
        specs = [NodeSpec(f"gpu-node-{i:05d}", gpus=gpus) for i in range(1, nodes + 1)]
        return cls(specs, **switches)  # type: ignore[arg-type]

    # -- lookup ----------------------------------------------------------------------
    def node(self, name: str) -> Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise UnknownNode(name, len(self.nodes)) from None

    def gpu(self, node: str, index: int | str) -> Gpu:
        """A GPU by index, or by UUID ("GPU-...") as nvidia-smi -i takes it."""
        n = self.node(node)
        if isinstance(index, str) and index.startswith("GPU-"):
            for g in n.gpus:
                if g.uuid == index:
                    return g
            raise UnknownGpu(node, index, len(n.gpus))
        try:
            i = int(index)
        except (TypeError, ValueError):
            raise UnknownGpu(node, index, len(n.gpus)) from None
        if not 0 <= i < len(n.gpus):
            raise UnknownGpu(node, index, len(n.gpus))
        return n.gpus[i]

    def _targets(self, node: str, gpu: int | str | None) -> list[Gpu]:
        return list(self.node(node).gpus) if gpu is None else [self.gpu(node, gpu)]

    # -- faults ----------------------------------------------------------------------
    def inject(
        self,
        node: str,
        gpu: int | str,
        kind: object,
        value: object = None,
        clears_on: object = None,
    ) -> Fault:
        """Add a fault; raises FaultError (bad request) or UnknownNode/UnknownGpu."""
        g = self.gpu(node, gpu)
        k, val, clears = validate(kind, value, clears_on)
        now = self.clock()
        fault = Fault(self._next_fault_id, k, val, clears, now)
        self._next_fault_id += 1
        g.fold(now)
        g.faults = (*g.faults, fault)
        g.apply(fault, self.xid_window_s)
        if k == "xid" and val is not None and self.kernel_log is not None:
            self.kernel_log(g, val, now)
        return fault

    def clear(self, node: str, gpu: int | str | None = None) -> list[tuple[int, Fault]]:
        """Remove faults as if the cause went away by itself (cooling fixed, test over).

        Counters and the exporter's remembered XID stay as they are, like on real
        hardware: only an exporter restart forgets a stale XID.
        """
        now = self.clock()
        removed: list[tuple[int, Fault]] = []
        for g in self._targets(node, gpu):
            g.fold(now)
            removed += [(g.index, f) for f in g.faults]
            g.faults = ()
        return removed

    # -- repairs ---------------------------------------------------------------------
    def set_persistence(self, node: str, gpu: int | str | None, enabled: object) -> list[Gpu]:
        """`nvidia-smi [-i ID] -pm 0|1`: persistence mode of one GPU or every GPU."""
        if not isinstance(enabled, bool):
            raise ValueError(f"enabled must be true or false, got {enabled!r}")
        targets = self._targets(node, gpu)
        for g in targets:
            g.persistence_mode = enabled
        return targets

    def reset(self, node: str, gpu: int | str | None = None) -> RepairResult:
        """`nvidia-smi -r`: clears reset-class faults on one GPU or all GPUs of the node.
        Refused while persistence mode is on for a target (nvidia-persistenced holds it)."""
        targets = self._targets(node, gpu)
        held = [g for g in targets if g.persistence_mode]
        if held:
            return RepairResult(False, "; ".join(
                f"Unable to reset GPU {g.pci_bus_id} ({g.uuid}) because it's being used by "
                "some other process: persistence mode is Enabled (nvidia-persistenced holds "
                "it); turn it off first (nvidia-smi -i UUID -pm 0)" for g in held))
        for g in targets:
            if _unreachable(g):
                return RepairResult(
                    False,
                    f"GPU {g.index} ({g.uuid}) has fallen off the bus; a GPU reset cannot "
                    "reach it, reboot the node",
                )
        cleared = self._repair(targets, frozenset({"reset"}))
        # Resetting a GPU means stopping everything that holds it open, dcgm-exporter
        # included; the restarted exporter forgets XIDs on every GPU of the node.
        self._restart_exporter(self.node(node))
        return RepairResult(True, cleared=tuple(cleared))

    def reboot(self, node: str) -> RepairResult:
        """Node reboot: clears reset- and reboot-class faults and all volatile state."""
        n = self.node(node)
        now = self.clock()
        for g in n.gpus:
            g.fold(now)
            g.pcie_replay = 0.0
            g.energy_mj = 0.0
            g.thermal_violation_ns = 0.0
            g.pod = None  # pods die with the node; the cluster re-assigns them
            g.persistence_mode = True  # nvidia-persistenced starts again with the driver
            g.label_cache.clear()
        cleared = self._repair(n.gpus, frozenset({"reset", "reboot"}))
        self._restart_exporter(n)
        return RepairResult(True, cleared=tuple(cleared))

    def _repair(self, gpus: list[Gpu], clears: frozenset[str]) -> list[tuple[int, Fault]]:
        now = self.clock()
        cleared: list[tuple[int, Fault]] = []
        for g in gpus:
            g.fold(now)
            keep = tuple(f for f in g.faults if f.clears_on not in clears)
            for f in g.faults:
                if f.clears_on in clears:
                    cleared.append((g.index, f))
                    if f.kind == "row-remap-pending":
                        g.unc_remapped += f.value or 1  # the pending remap takes effect now
            g.faults = keep
            g.ecc_sbe_vol = g.ecc_dbe_vol = g.nvlink_errors = 0
            # A fault that survives the repair shows up again straight away.
            for f in keep:
                if f.kind != "xid":
                    g.apply(f)
        return cleared

    @property
    def xid_window_s(self) -> float | None:
        """The XID count window in the clock's unit (seconds); None when the family is off."""
        ms = self.xid_count_window_ms
        return None if ms is None else ms / 1000.0

    def _restart_exporter(self, node: Node) -> None:
        """A fresh exporter (and its embedded DCGM) has no XID history: it knows only the
        XIDs of faults still active, which it sees fire once more now."""
        now = self.clock()
        window = self.xid_window_s
        for g in node.gpus:
            g.last_xid = None
            g.xid_events = ()
            for f in g.faults:
                if f.kind == "xid" and f.value is not None:
                    g.see_xid(f.value, now, window)

    def health(self, node: str) -> HealthReport:
        """What `dcgmi diag -r 2` would conclude for the node."""
        problems = [
            f"GPU {g.index} ({g.uuid}): {p}"
            for g in self.node(node).gpus
            for f in g.faults
            if (p := failing_problem(f)) is not None
        ]
        return HealthReport(node, not problems, problems)

    # -- exporter and pods -----------------------------------------------------------
    def set_exporter(self, node: str, mode: object, delay_seconds: object = None) -> ExporterState:
        n = self.node(node)
        if mode not in EXPORTER_MODES:
            raise ValueError(
                f"exporter mode must be one of {', '.join(EXPORTER_MODES)}, got {mode!r}"
            )
        delay = 0.0
        if delay_seconds is not None:
            if isinstance(delay_seconds, bool) or not isinstance(delay_seconds, int | float):
                raise ValueError(f"delay_seconds must be a number, got {delay_seconds!r}")
            delay = float(delay_seconds)
        if mode == "slow" and delay_seconds is None:
            delay = 5.0
        if not 0 <= delay <= _MAX_DELAY_S:
            raise ValueError(f"delay_seconds must be between 0 and {_MAX_DELAY_S:.0f}, got {delay}")
        if n.exporter.mode == "down" and mode != "down":
            self._restart_exporter(n)  # coming back from down is a fresh exporter process
        n.exporter = ExporterState(str(mode), delay)
        return n.exporter

    def assign(self, node: str, gpu: int | str, namespace: str, pod: str, container: str) -> None:
        g = self.gpu(node, gpu)
        g.fold(self.clock())
        g.pod = PodRef(namespace, pod, container)
        g.label_cache.clear()

    def unassign(self, node: str, gpu: int | str) -> None:
        g = self.gpu(node, gpu)
        g.fold(self.clock())
        g.pod = None
        g.label_cache.clear()

    def node_json(self, node: str) -> dict[str, object]:
        n = self.node(node)
        report = self.health(node)
        return {
            "name": n.name,
            "pool": n.pool,
            "model": n.model,
            "driver": n.driver,
            "exporter": n.exporter.to_json(),
            "healthy": report.healthy,
            "gpus": [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "serial": g.serial,
                    "pci_bus_id": g.pci_bus_id,
                    "device": g.device,
                    "persistence_mode": g.persistence_mode,
                    "last_xid": g.last_xid,
                    "pod": None if g.pod is None else vars(g.pod),
                    "faults": [f.to_json() for f in g.faults],
                }
                for g in n.gpus
            ],
        }

    def switches(self) -> dict[str, object]:
        return {
            "hostname_label": self.hostname_label,
            "xid_series": self.xid_series,
            "extra_fields": self.extra_fields,
            "xid_count_window_ms": self.xid_count_window_ms,
            "serial_label": self.serial_label,
        }
