"""One simulated GPU: identity, counters, active faults and what DCGM would read from it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sim.gpu.faults import (
    GPU_MAX_OPERATING_C,
    GPU_SLOWDOWN_C,
    HW_SLOWDOWN,
    HW_SLOWDOWN_BITS,
    HW_THERMAL,
    SW_THERMAL,
    Fault,
)


@dataclass(frozen=True)
class PodRef:
    namespace: str
    pod: str
    container: str


@dataclass(slots=True)
class Sample:
    """One scrape's worth of field values for a GPU (None = series absent)."""

    sm_clock: int
    mem_clock: int
    memory_temp: int
    gpu_temp: int
    power: float
    energy_mj: int
    pcie_replay: int
    gpu_util: int
    mem_copy_util: int
    xid: int | None
    fb_free: int
    fb_used: int
    fb_reserved: int
    nvlink_bytes: int | None
    unc_remapped: int
    corr_remapped: int
    remap_failure: int
    gr_active: float
    tensor_active: float
    dram_active: float
    pcie_tx: int
    pcie_rx: int
    clock_events: int
    ecc_sbe_vol: int
    ecc_dbe_vol: int
    ecc_sbe_agg: int
    ecc_dbe_agg: int
    nvlink_crc_flit: int
    nvlink_crc_data: int
    nvlink_replay: int
    nvlink_recovery: int
    thermal_violation_ns: int
    remap_pending: int
    recovery_action: int
    zero: int = 0  # fields a bare-metal, non-vGPU board reports as 0 (ENC/DEC util, licence)


@dataclass
class Gpu:
    node: str
    index: int
    uuid: str
    pci_bus_id: str
    model: str
    driver: str
    seed: int
    fb_total_mib: int
    nvlink: bool
    faults: tuple[Fault, ...] = ()
    # The board serial (nvidia-smi -q "Serial Number"): 13 digits, fixed for the board's life.
    serial: str = ""
    # Exported as the DCGM_FI_DEV_SERIAL label: only when the counters file lists it as a
    # label field (the GPU Operator's stock file does not).
    serial_label: bool = False
    # What the exporter remembers: the last XID it saw since it started (issue #500).
    last_xid: int | None = None
    # (time, XID) of every XID the exporter saw within the count window, oldest first, for
    # DCGM_EXP_XID_ERRORS_COUNT. Swapped as a whole tuple like `faults`; only the recording
    # side prunes, so a render in a worker thread never races a concurrent injection.
    xid_events: tuple[tuple[float, int], ...] = ()
    pod: PodRef | None = None
    # nvidia-persistenced (which the GPU Operator's driver container runs) keeps every GPU
    # open with persistence mode on: a reset is refused until it is turned off.
    persistence_mode: bool = True
    ecc_sbe_vol: int = 0
    ecc_dbe_vol: int = 0
    ecc_sbe_agg: int = 0
    ecc_dbe_agg: int = 0
    unc_remapped: int = 0
    corr_remapped: int = 0
    nvlink_errors: int = 0
    pcie_replay: float = 0.0
    energy_mj: float = 0.0
    nvlink_bytes: float = 0.0
    thermal_violation_ns: float = 0.0
    mark: float = 0.0  # time the accumulating counters above were last folded
    # Rendered label sets, keyed by hostname label spelling; owned by exposition.py.
    label_cache: dict[str, tuple[str, str, str, str, str]] = field(default_factory=dict)

    @property
    def device(self) -> str:
        return f"nvidia{self.index}"

    @property
    def fallen_off(self) -> bool:
        return any(f.kind == "fallen-off-bus" for f in self.faults)

    def _value(self, kind: str) -> int | None:
        """Value of the newest active fault of a kind."""
        for f in reversed(self.faults):
            if f.kind == kind:
                return f.value
        return None

    def clock_events(self) -> int:
        bits = 0x4 if self.pod else 0x1  # busy GPUs sit at the power cap; idle ones report idle
        temp = self._value("gpu-temp")
        if temp is not None and temp >= GPU_MAX_OPERATING_C:
            bits |= SW_THERMAL
        if temp is not None and temp >= GPU_SLOWDOWN_C:
            bits |= HW_THERMAL | HW_SLOWDOWN
        for f in self.faults:
            if f.kind == "thermal-slowdown":
                bits |= f.value or 0
        return bits

    def _rates(self) -> tuple[float, float, float, float]:
        """Per-second growth of energy (mJ), NVLink bytes, PCIe replays, throttle ns."""
        slowed = bool(self.clock_events() & HW_SLOWDOWN_BITS)
        watts = (620.0 if self.pod else 70.0) * (0.6 if slowed else 1.0)
        link = 4.0e10 if self.pod else 1.0e6
        replays = sum((f.value or 0) for f in self.faults if f.kind == "pcie-replay") / 60.0
        return watts * 1000.0, link, replays, 1.0e9 if slowed else 0.0

    def fold(self, now: float) -> None:
        """Bank counter growth up to now; call before anything that changes the rates."""
        dt = max(0.0, now - self.mark)
        energy, link, replays, throttle = self._rates()
        self.energy_mj += energy * dt
        self.nvlink_bytes += link * dt
        self.pcie_replay += replays * dt
        self.thermal_violation_ns += throttle * dt
        self.mark = now

    def see_xid(self, xid: int, now: float, window_s: float | None) -> None:
        """The exporter sees an XID occur: it becomes the last XID and, when the count
        window is on, one more occurrence (a repeat of the same XID counts again).

        Occurrences older than the window are dropped here, so memory stays bounded by
        the XIDs of one window.
        """
        self.last_xid = xid
        if window_s is None:
            return
        cutoff = now - window_s
        self.xid_events = (*(e for e in self.xid_events if e[0] > cutoff), (now, xid))

    def xid_counts(self, now: float, window_s: float) -> dict[int, int]:
        """XID -> occurrences within (now - window, now], ordered by XID number. Read-only."""
        cutoff = now - window_s
        counts: dict[int, int] = {}
        for t, xid in self.xid_events:
            if cutoff < t <= now:
                counts[xid] = counts.get(xid, 0) + 1
        return dict(sorted(counts.items()))

    def apply(self, fault: Fault, window_s: float | None = None) -> None:
        """Effects of a fault occurring: counters bump, the exporter sees the XID."""
        n = fault.value or 0
        if fault.kind == "xid":
            self.see_xid(n, fault.since, window_s)
        elif fault.kind == "ecc-dbe":
            self.ecc_dbe_vol += n
            self.ecc_dbe_agg += n
        elif fault.kind == "ecc-sbe":
            self.ecc_sbe_vol += n
            self.ecc_sbe_agg += n
        elif fault.kind == "nvlink-errors":
            self.nvlink_errors += n
        elif fault.kind == "pcie-replay":
            self.pcie_replay += n

    def jitter(self, now: float, channel: int) -> float:
        """Deterministic noise in [-1, 1], stable within a 15 s window."""
        h = (self.seed ^ (int(now // 15) * 0x9E3779B1) ^ (channel * 0x85EBCA6B)) * 2654435761
        return ((h >> 7) & 0xFFFF) / 32767.5 - 1.0

    def sample(self, now: float, xid_zero: bool) -> Sample | None:
        if self.fallen_off:
            return None  # DCGM cannot read the GPU at all, so every series vanishes
        dt = max(0.0, now - self.mark)
        energy, link, replays, throttle = self._rates()
        busy = self.pod is not None
        events = self.clock_events()
        slowed = bool(events & HW_SLOWDOWN_BITS)
        j0, j1 = self.jitter(now, 0), self.jitter(now, 1)
        gpu_temp = self._value("gpu-temp")
        mem_temp = self._value("memory-temp")
        base_temp = 35 + self.seed % 10 + (10 if busy else 0) + round(j0)
        total = self.fb_total_mib
        reserved = total // 150
        used = int(total * 0.85) if busy else 0
        xid = self.last_xid if self.last_xid is not None else (0 if xid_zero else None)
        return Sample(
            sm_clock=(990 if slowed else 1980) if busy else 345,
            mem_clock=2619,
            memory_temp=mem_temp if mem_temp is not None else base_temp + 3,
            gpu_temp=gpu_temp if gpu_temp is not None else base_temp,
            power=round((energy / 1000.0) + j1 * (15.0 if busy else 2.0), 3),
            energy_mj=int(self.energy_mj + energy * dt),
            pcie_replay=int(self.pcie_replay + replays * dt),
            gpu_util=(95 + round(j0 * 4)) if busy else 0,
            mem_copy_util=(40 + round(j1 * 5)) if busy else 0,
            xid=xid,
            fb_free=total - reserved - used,
            fb_used=used,
            fb_reserved=reserved,
            nvlink_bytes=int(self.nvlink_bytes + link * dt) if self.nvlink else None,
            unc_remapped=self.unc_remapped,
            corr_remapped=self.corr_remapped,
            remap_failure=1 if self._value("row-remap-failure") is not None else 0,
            gr_active=round(0.92 + j0 * 0.05, 6) if busy else 0.0,
            tensor_active=round(0.45 + j1 * 0.1, 6) if busy else 0.0,
            dram_active=round(0.55 + j0 * 0.1, 6) if busy else 0.0,
            pcie_tx=int(2.0e8 + j0 * 2.0e7) if busy else 12000,
            pcie_rx=int(3.0e8 + j1 * 3.0e7) if busy else 9000,
            clock_events=events,
            ecc_sbe_vol=self.ecc_sbe_vol,
            ecc_dbe_vol=self.ecc_dbe_vol,
            ecc_sbe_agg=self.ecc_sbe_agg,
            ecc_dbe_agg=self.ecc_dbe_agg,
            nvlink_crc_flit=self.nvlink_errors * 4,
            nvlink_crc_data=self.nvlink_errors * 2,
            nvlink_replay=self.nvlink_errors,
            nvlink_recovery=self.nvlink_errors,
            thermal_violation_ns=int(self.thermal_violation_ns + throttle * dt),
            remap_pending=1 if self._value("row-remap-pending") is not None else 0,
            recovery_action=self._value("recovery-action") or 0,
        )


def fb_total_mib(model: str) -> int:
    m = re.search(r"(\d+)\s*GB", model)
    return int(m.group(1)) * 1019 if m else 81559


def has_nvlink(model: str) -> bool:
    # PCIe cards (and L4/L40-class parts) have no NVLink, so dcgm-exporter drops the family.
    return "PCIe" not in model and not re.search(r"\bL4|\bL40|\bA10\b|\bT4\b", model)
