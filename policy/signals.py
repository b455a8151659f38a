"""Which rules a node's exporter can feed: the signals, the fields each needs, and why.

A rule reads fields (policy/dcgm.py) that an exporter serves only when its counter file enables
them. The GPU Operator's stock file (``dcp-metrics-included.csv``) leaves out double-bit ECC,
row-remap-pending, the clock-event reasons, the driver's recovery action, the NVLink error
counters and the windowed XID count, so on a stock fleet those rules can never fire, and
nothing else would say so. ``blind_signals`` names the rules a node cannot feed, from the
fields its readings held (over recent observations: one scrape can miss a series), so that
the observation can announce them (``SignalUnavailable``), count them
(``gpu_remediate_signal_blind_nodes``) and ``evaluate`` can list them.

Never blind: the XID gauge (recent exporters drop its series until the first XID, so its
absence means "no XID yet") and the memory temperature (absent or 0 on parts without HBM
sensors); a signal with alternatives (the clock reasons' old and new names) needs one.

Pure data and pure functions: imported by the Temporal workflow sandbox.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from policy import dcgm
from policy.config import PolicySettings
from policy.models import Action, GpuReading, NodeReadings


@dataclass(frozen=True)
class Signal:
    """One rule's input: fed when every group has at least one of its families present."""

    name: str
    groups: tuple[tuple[str, ...], ...]
    """Families the rule needs: all groups, any family within a group."""
    enabled: Callable[[PolicySettings], bool]
    """Whether the policy runs the rule at all (a rule turned off is not blind)."""
    why: str


def _acts(action: Action) -> bool:
    return action != Action.NONE


SIGNALS: tuple[Signal, ...] = (
    Signal("ecc-dbe", ((dcgm.ECC_DBE_VOLATILE,),),
           lambda c: _acts(c.ecc_dbe_action),
           "Double-bit ECC errors: uncorrectable memory errors go unseen without it."),
    Signal("row-remap-pending", ((dcgm.ROW_REMAP_PENDING,),),
           lambda c: _acts(c.row_remap_pending_action),
           "A row remap waiting for a reset: the reset it needs is never scheduled."),
    Signal("row-remap-failure", ((dcgm.ROW_REMAP_FAILURE,),),
           lambda c: _acts(c.row_remap_failure_action),
           "A failed remap, the RMA signal."),
    Signal("uncorrectable-remap-limit", ((dcgm.UNCORRECTABLE_REMAPPED_ROWS,),),
           lambda c: _acts(c.uncorrectable_remap_limit_action),
           "Uncorrectable remaps at DCGM's limit."),
    Signal("gpu-temp", ((dcgm.GPU_TEMP,),), lambda c: True,
           "GPU core temperature: the thermal cordon."),
    Signal("clock-reasons", ((dcgm.CLOCK_EVENTS, dcgm.CLOCK_THROTTLE),),
           lambda c: bool(c.thermal.clock_reasons),
           "Thermal and power-brake slowdowns the driver reports."),
    Signal("recovery-action", ((dcgm.RECOVERY_ACTION,),), lambda c: c.follow_recovery_action,
           "The driver's own recovery verdict: without it XID 154 always falls back to a reset."),
    Signal("repeat-xid", ((dcgm.XID_COUNT,),), lambda c: True,
           "DCGM_EXP_XID_ERRORS_COUNT: the XID gauge keeps its last value, so a repeat of an "
           "acknowledged XID on the same GPU is seen only through this count."),
    Signal("pcie-replay", ((dcgm.PCIE_REPLAY,),), lambda c: c.links.pcie_replay_enabled,
           "PCIe replay rate."),
    Signal("nvlink-crc", ((dcgm.NVLINK_CRC_FLIT,), (dcgm.NVLINK_CRC_DATA,)),
           lambda c: c.links.nvlink_enabled, "NVLink CRC error rate."),
    Signal("nvlink-errors", ((dcgm.NVLINK_REPLAY,), (dcgm.NVLINK_RECOVERY,)),
           lambda c: c.links.nvlink_enabled, "NVLink replay and recovery rate."),
)
"""Every signal a rule reads that an exporter may not serve, in the order they are shown."""

SIGNAL_NAMES: tuple[str, ...] = tuple(s.name for s in SIGNALS)


class BlindSignal(BaseModel):
    """A rule that cannot fire on a node, and the exporter families it lacks."""

    model_config = ConfigDict(frozen=True)

    signal: str
    missing: list[str]


def fields_present(gpus: Iterable[GpuReading]) -> set[str]:
    """The exporter families any of ``gpus`` held a series of (policy/dcgm.py names)."""
    present: set[str] = set()
    readings = list(gpus)
    for family in dcgm.FAMILIES:
        if family.metric in present:
            continue
        if any(getattr(g, family.field) is not None for g in readings):
            present.add(family.metric)
    # A rate filled by the source itself (Prometheus' rate()) stands for its counters.
    for rate in dcgm.RATES:
        if any(getattr(g, rate.field) is not None for g in readings):
            present.update(rate.families)
    return present


def blind_signals(present: set[str], config: PolicySettings) -> list[BlindSignal]:
    """The enabled signals that ``present`` (families seen) cannot feed, with what is
    missing. Nothing seen at all is not blindness but an unreadable node: []."""
    if not present:
        return []
    out = []
    for signal in SIGNALS:
        if not signal.enabled(config):
            continue
        missing = [m for group in signal.groups if not present.intersection(group)
                   for m in group[:1]]
        if missing:
            out.append(BlindSignal(signal=signal.name, missing=missing))
    return out


def node_blind_signals(readings: NodeReadings, config: PolicySettings) -> list[BlindSignal]:
    """``blind_signals`` of one reading of a node."""
    return blind_signals(fields_present(readings.gpus), config)
