"""Render simulated GPUs as dcgm-exporter's Prometheus text, byte for byte in its shape.

Shape rules (docs/simulators-gpu.md, "Exposition format"): `# HELP`/`# TYPE` once per
family, families in the counters-CSV order, a family with no samples prints nothing, labels
in the exporter's fixed order (gpu, UUID, pci_bus_id, device, modelName, Hostname,
DCGM_FI_DRIVER_VERSION, then attributes key-sorted), no spaces after commas, integers `%d`,
doubles `%f`, no timestamps, counters without `_total`.

The opt-in `DCGM_EXP_XID_ERRORS_COUNT` family (fleet switch `xid_count_window_ms`) comes
last, as from the exporter's separate XID collector: one series per (GPU, XID) seen in the
window with labels identity, DCGM_FI_DRIVER_VERSION, window_size_in_ms, xid, then the pod
attributes; a GPU with no XID in the window gets one series without `xid`, value 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from sim.gpu.faults import xid_message
from sim.gpu.fleet import Fleet, Gpu, Node, Sample

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class Family:
    name: str
    type: str
    help: str
    attr: str  # Sample attribute holding the value
    is_float: bool = False
    extra: bool = False  # not in the stock default-counters.csv

    @property
    def header(self) -> str:
        return f"# HELP {self.name} {self.help}\n# TYPE {self.name} {self.type}\n"


def _f(
    name: str, typ: str, help_: str, attr: str, *, is_float: bool = False, extra: bool = False
) -> Family:
    return Family(f"DCGM_FI_{name}", typ, help_, attr, is_float, extra)


_XID = "DCGM_FI_DEV_XID_ERRORS"

XID_COUNT = Family(
    "DCGM_EXP_XID_ERRORS_COUNT",
    "gauge",
    "Count of XID Errors within user-specified time window (see xid-count-window-size param).",
    "",  # not a Sample field: counted from the GPU's XID occurrences
)

# The 25 series of the stock default-counters.csv (dcgm-exporter 4.x) in file order, with
# the opt-in health fields slotted where their commented-out CSV lines sit.
FAMILIES: tuple[Family, ...] = (
    _f("DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", "sm_clock"),
    _f("DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", "mem_clock"),
    _f(
        "DEV_CLOCKS_EVENT_REASONS",
        "gauge",
        "Current clock event reasons (bitmask).",
        "clock_events",
        extra=True,
    ),
    _f("DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", "memory_temp"),
    _f("DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", "gpu_temp"),
    _f("DEV_POWER_USAGE", "gauge", "Power draw (in W).", "power", is_float=True),
    _f(
        "DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        "energy_mj",
    ),
    _f("DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", "pcie_replay"),
    _f("DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", "gpu_util"),
    _f("DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", "mem_copy_util"),
    _f("DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", "zero"),
    _f("DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", "zero"),
    _f("DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", "xid"),
    _f(
        "DEV_THERMAL_VIOLATION",
        "counter",
        "Throttling duration due to thermal constraints (in ns).",
        "thermal_violation_ns",
        extra=True,
    ),
    _f("DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", "fb_free"),
    _f("DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", "fb_used"),
    _f("DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", "fb_reserved"),
    _f(
        "DEV_ECC_SBE_VOL_TOTAL",
        "counter",
        "Total number of single-bit volatile ECC errors.",
        "ecc_sbe_vol",
        extra=True,
    ),
    _f(
        "DEV_ECC_DBE_VOL_TOTAL",
        "counter",
        "Total number of double-bit volatile ECC errors.",
        "ecc_dbe_vol",
        extra=True,
    ),
    _f(
        "DEV_ECC_SBE_AGG_TOTAL",
        "counter",
        "Total number of single-bit persistent ECC errors.",
        "ecc_sbe_agg",
        extra=True,
    ),
    _f(
        "DEV_ECC_DBE_AGG_TOTAL",
        "counter",
        "Total number of double-bit persistent ECC errors.",
        "ecc_dbe_agg",
        extra=True,
    ),
    _f(
        "DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink flow-control CRC errors.",
        "nvlink_crc_flit",
        extra=True,
    ),
    _f(
        "DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink data CRC errors.",
        "nvlink_crc_data",
        extra=True,
    ),
    _f(
        "DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink retries.",
        "nvlink_replay",
        extra=True,
    ),
    _f(
        "DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink recovery errors.",
        "nvlink_recovery",
        extra=True,
    ),
    _f(
        "DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes",
        "nvlink_bytes",
    ),
    _f("DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status", "zero"),
    _f(
        "DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        "unc_remapped",
    ),
    _f(
        "DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
        "corr_remapped",
    ),
    _f("DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", "remap_failure"),
    _f(
        "DEV_ROW_REMAP_PENDING",
        "gauge",
        "Whether remapping of rows is pending",
        "remap_pending",
        extra=True,
    ),
    _f(
        "DEV_GET_GPU_RECOVERY_ACTION",
        "gauge",
        "GPU recovery action required by the driver (NVML enum).",
        "recovery_action",
        extra=True,
    ),
    _f(
        "PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
        "gr_active",
        is_float=True,
    ),
    _f(
        "PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        "tensor_active",
        is_float=True,
    ),
    _f(
        "PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        "dram_active",
        is_float=True,
    ),
    _f(
        "PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second.",
        "pcie_tx",
    ),
    _f(
        "PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second.",
        "pcie_rx",
    ),
)
DEFAULT_FAMILIES: tuple[Family, ...] = tuple(f for f in FAMILIES if not f.extra)

STOCK_COUNTER_POOLS: frozenset[str] = frozenset({"gpu-operator"})
"""Node pools whose exporter serves exactly the stock counter set, as the GPU Operator's
dcgm-exporter does with /etc/dcgm-exporter/dcp-metrics-included.csv (the same 25 families
as default-counters.csv: no ECC, remap-pending, clock-event, recovery-action or NVLink error
fields, and no DCGM_EXP_XID_ERRORS_COUNT), whatever the fleet's switches say. The
gpu-operator scenario (sim/scenarios/gpu-operator.yaml) is one such pool."""


def stock_counters(node: Node) -> bool:
    """True when ``node``'s exporter runs with the stock counter file."""
    return node.pool in STOCK_COUNTER_POOLS


def _float(v: float) -> str:
    return f"{v:f}"  # Go's %f: always six decimals


@dataclass(frozen=True)
class _Columns:
    """Pulls and formats all of a sample's values with one C-level attrgetter call."""

    families: tuple[Family, ...]
    getter: Callable[[Sample], tuple[int | float | None, ...]]
    formats: tuple[Callable[[Any], str], ...]


def _columns(fams: tuple[Family, ...]) -> _Columns:
    return _Columns(
        fams,
        attrgetter(*(f.attr for f in fams)),
        tuple(_float if f.is_float else str for f in fams),
    )


_ALL = _columns(FAMILIES)
_DEFAULT = _columns(DEFAULT_FAMILIES)


def families_for(fleet: Fleet) -> tuple[Family, ...]:
    return FAMILIES if fleet.extra_fields else DEFAULT_FAMILIES


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


_Labels = tuple[str, str, str, str, str]


def _labels(gpu: Gpu, host_key: str) -> _Labels:
    """(plain label set, XID head, XID tail, identity prefix, pod attributes).

    err_code/err_msg go between XID head and tail. The XID count family puts its own
    labels between the identity prefix (which ends with the driver version) and the pod
    attributes, because the exporter prints sorted collector labels before attributes.

    Cached per GPU: the identity part never changes and the pod part changes only on
    assign/unassign, which empties the cache.
    """
    cached = gpu.label_cache.get(host_key)
    if cached is not None:
        return cached
    prefix = (
        f'{{gpu="{gpu.index}",UUID="{gpu.uuid}",pci_bus_id="{gpu.pci_bus_id}",'
        f'device="{gpu.device}",modelName="{_esc(gpu.model)}",{host_key}="{_esc(gpu.node)}",'
        f'DCGM_FI_DRIVER_VERSION="{_esc(gpu.driver)}"'
        + (f',DCGM_FI_DEV_SERIAL="{_esc(gpu.serial)}"' if gpu.serial_label else "")
    )
    pod = gpu.pod
    result: _Labels
    if pod is None:
        result = (prefix + "}", prefix, "}", prefix, "")
    else:
        # Attributes sort as container < err_code < err_msg < namespace < pod.
        container = f',container="{_esc(pod.container)}"'
        ns_pod = f',namespace="{_esc(pod.namespace)}",pod="{_esc(pod.pod)}"'
        result = (
            prefix + container + ns_pod + "}",
            prefix + container,
            ns_pod + "}",
            prefix,
            container + ns_pod,
        )
    gpu.label_cache[host_key] = result
    return result


_Row = tuple[_Labels, tuple[str | None, ...]]


def _row(gpu: Gpu, cols: _Columns, host_key: str, now: float, xid_zero: bool,
         stock: bool = False) -> _Row | None:
    """One GPU's label sets and formatted values (None = series absent); ``stock``: only the
    stock counter set's families have series."""
    sample = gpu.sample(now, xid_zero)
    if sample is None:
        return None
    # Tuples of strings are not tracked by the cyclic GC, which keeps a 80k-GPU render
    # from spending its time in garbage collection.
    values = tuple(
        None if v is None else fmt(v)
        for v, fmt in zip(cols.getter(sample), cols.formats, strict=True)
    )
    if stock:
        values = tuple(None if fam.extra else v
                       for fam, v in zip(cols.families, values, strict=True))
    return _labels(gpu, host_key), values


def _family_lines(fam: Family, col: int, rows: list[_Row]) -> str:
    name = fam.name
    if name == _XID:
        lines = [
            f'{name}{head},err_code="{v}",err_msg="{_esc(xid_message(int(v)))}"{tail} {v}\n'
            for (_, head, tail, _, _), vals in rows
            if (v := vals[col]) is not None
        ]
    else:
        lines = [
            f"{name}{labels[0]} {v}\n" for labels, vals in rows if (v := vals[col]) is not None
        ]
    return fam.header + "".join(lines) if lines else ""


def _xid_count_lines(gpu: Gpu, labels: _Labels, now: float, window_ms: int) -> list[str]:
    """One GPU's DCGM_EXP_XID_ERRORS_COUNT series: per XID in the window, or one zero."""
    _, _, _, prefix, attrs = labels
    name = XID_COUNT.name
    head = f'{name}{prefix},window_size_in_ms="{window_ms}"'
    counts = gpu.xid_counts(now, window_ms / 1000.0)
    if not counts:
        return [f"{head}{attrs}}} 0\n"]
    return [f'{head},xid="{xid}"{attrs}}} {n}\n' for xid, n in counts.items()]


def render_chunks(fleet: Fleet, nodes: Iterable[Node]) -> Iterator[str]:
    """Yield the exposition one family at a time, every node's series merged beneath.

    Values are sampled once per GPU up front, so all families show the same instant.
    """
    cols = _ALL if fleet.extra_fields else _DEFAULT
    now = fleet.clock()
    xid_zero = fleet.xid_series == "zero"
    host_key = fleet.hostname_label
    window_ms = fleet.xid_count_window_ms
    counts: list[str] = []
    if window_ms is None:
        rows = [
            row
            for node in nodes
            for gpu in node.gpus
            if (row := _row(gpu, cols, host_key, now, xid_zero, stock_counters(node)))
            is not None
        ]
    else:
        rows = []
        for node in nodes:
            stock = stock_counters(node)
            for gpu in node.gpus:
                row = _row(gpu, cols, host_key, now, xid_zero, stock)
                if row is not None:  # a GPU DCGM cannot read has no series at all
                    rows.append(row)
                    if not stock:  # the windowed count is opt-in, off in the stock file
                        counts += _xid_count_lines(gpu, row[0], now, window_ms)
    for col, fam in enumerate(cols.families):
        text = _family_lines(fam, col, rows)
        if text:
            yield text
    if counts:
        yield XID_COUNT.header + "".join(counts)


def render_node(fleet: Fleet, node: str) -> str:
    """One node's dcgm-exporter /metrics body."""
    return "".join(render_chunks(fleet, [fleet.node(node)]))


def render_fleet(fleet: Fleet, nodes: Iterable[Node] | None = None) -> str:
    """Many nodes in one exposition, as a federating Prometheus would expose them."""
    return "".join(render_chunks(fleet, fleet.nodes.values() if nodes is None else nodes))


def garble(text: str) -> str:
    """A broken scrape: a body cut mid-label followed by non-exposition bytes.

    Mimics an exporter killed while writing, or a proxy error page served with 200.
    """
    lines = text.splitlines()
    cut = "\n".join(lines[: max(2, len(lines) // 3)])
    if lines:
        cut += "\n" + lines[min(len(lines) - 1, len(lines) // 3)][:40]
    return cut + '\n<html><body>502 Bad Gateway</body></html>\n\x00\x1b{gpu="0" NaN NaN\n'
