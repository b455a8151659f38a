"""The fault model of `gpu-remediate simulate`: what breaks, how often, and how repairs end.

Policy as data with a why: each cause carries its published count and what a real exporter
shows for it, so a fault goes through the production policy (policy/rules.py) like any
reading. The default rates are the Llama 3 training run's interruptions (arXiv 2407.21783,
§3.3.4: 419 in 54 days on 16,384 H100s) per GPU-day; docs/simulate.md gives the sources and
tests/simulate/test_faults.py checks the table against them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from worker.yamlfile import load_yaml

LLAMA3_DAYS = 54
LLAMA3_GPUS = 16_384
HBM3_REMAPPED = 0.92
"""NCSA Delta (arXiv 2503.11901): row remapping absorbs about 92 % of H100 uncorrectable ECC;
the rest exhaust the bank's spare rows (a remap failure: RMA)."""


@dataclass(frozen=True)
class Cause:
    """One cause of interruption: its count in the Llama 3 run and what the node shows."""

    count: int
    shows: str
    """What a real dcgm-exporter shows for it ("" : nothing DCGM can see)."""
    xid: int | None = None
    gpu_temp: float | None = None
    hbm3: bool = False

    @property
    def rate(self) -> float:
        return self.count / (LLAMA3_DAYS * LLAMA3_GPUS)


CAUSES: dict[str, Cause] = {
    "gpu": Cause(148, "XID 79 (GPU fell off the bus): the reboot bucket", xid=79),
    "hbm3": Cause(72, "double-bit ECC with a row remap pending (92 %) or a row remap "
                      "failure (8 %)", hbm3=True),
    "software": Cause(54, "XID 13 (graphics engine exception): an application's fault, "
                          "reported, not remediated", xid=13),
    "switch_cable": Cause(35, "XID 74 (NVLink error)", xid=74),
    "host_maintenance": Cause(32, ""),
    "sram": Cause(19, "XID 95 (uncontained ECC error in SRAM)", xid=95),
    "gsp": Cause(17, "XID 119 (GSP RPC timeout)", xid=119),
    "nic": Cause(7, ""),
    "silent_data_corruption": Cause(6, ""),
    "thermal": Cause(6, "GPU temperature 92 °C, over the H100 limit", gpu_temp=92.0),
    "other": Cause(23, ""),
}
"""The Llama 3 interruption causes (arXiv 2407.21783, Table 5), by what DCGM shows of each.
``other`` is the rest of that table (NCCL watchdog timeouts, SSD, power supply, chassis, IO
expansion board, dependency, CPU, system memory). Host maintenance, NIC faults, silent data
corruption and ``other`` show nothing DCGM reads: they count as faults the detector cannot
see."""

OUTCOMES = ("success", "relapse", "hang", "node_lost")


class RepairMinutes(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reset: float = Field(default=2.0, ge=0, le=24 * 60,
                         description="A GPU reset Job, from creation to done.")
    reboot: float = Field(default=10.0, ge=0, le=24 * 60,
                          description="A reboot, from the Job to the node back (new boot ID).")
    validation: float = Field(default=5.0, ge=0, le=24 * 60,
                              description="The validation Job (dcgmi diag).")
    cool_down: float = Field(default=20.0, ge=0, le=24 * 60,
                             description="A hot node, from its cordon until it is cool.")


class FaultModel(BaseModel):
    """A fault model file (YAML or JSON). Causes left out have rate 0."""

    model_config = ConfigDict(extra="forbid")

    rates_per_gpu_day: dict[str, float] = Field(
        default_factory=lambda: {name: c.rate for name, c in CAUSES.items()})
    outcomes: dict[str, float] = Field(
        default_factory=lambda: {"success": 0.90, "relapse": 0.05, "hang": 0.03,
                                 "node_lost": 0.02},
        description="How a repair ends, as probabilities summing to 1: success; relapse (the "
                    "same fault shows again within relapse_within_hours); hang (the repair "
                    "never finishes: its timeout decides); node_lost (the machine is gone "
                    "and replaced after replace_lost_node_days).")
    hbm3_remapped: float = Field(default=HBM3_REMAPPED, ge=0, le=1)
    repair_minutes: RepairMinutes = Field(default_factory=RepairMinutes)
    relapse_within_hours: float = Field(default=72.0, gt=0, le=24 * 365)
    replace_lost_node_days: float = Field(default=7.0, ge=0, le=365)

    @field_validator("rates_per_gpu_day")
    @classmethod
    def _known_causes(cls, v: dict[str, float]) -> dict[str, float]:
        for name, rate in v.items():
            if name not in CAUSES:
                raise ValueError(f"{name}: unknown cause (known: {', '.join(CAUSES)})")
            if not math.isfinite(rate) or rate < 0:
                raise ValueError(f"{name}: rate must be a number >= 0, not {rate}")
        total = sum(v.values())
        if total > 1:
            raise ValueError(f"rates sum to {total:g} faults per GPU-day, past one per GPU-day")
        return {name: v.get(name, 0.0) for name in CAUSES}

    @field_validator("outcomes")
    @classmethod
    def _outcomes(cls, v: dict[str, float]) -> dict[str, float]:
        for name, p in v.items():
            if name not in OUTCOMES:
                raise ValueError(f"{name}: unknown outcome (known: {', '.join(OUTCOMES)})")
            if not math.isfinite(p) or p < 0:
                raise ValueError(f"{name}: probability must be >= 0, not {p}")
        if abs(sum(v.values()) - 1) > 1e-9:
            raise ValueError(f"probabilities sum to {sum(v.values()):g}, not 1")
        return {name: v.get(name, 0.0) for name in OUTCOMES}


class FaultModelError(Exception):
    """A fault model file that does not load; the message names the file and the field."""


def _field(loc: tuple[Any, ...], msg: str) -> str:
    where = ".".join(str(p) for p in loc)
    msg = msg.removeprefix("Value error, ")
    # A dict validator names the entry in its message: put it in the path.
    head, sep, rest = msg.partition(": ")
    if sep and " " not in head and head and not head[0].isupper():
        return f"{where}.{head}: {rest}"
    return f"{where}: {msg}"


def load_fault_model(path: Path | None) -> FaultModel:
    if path is None:
        return FaultModel()
    try:
        data = load_yaml(path.read_text(encoding="utf-8")) or {}
    except OSError as err:
        raise FaultModelError(f"{path}: cannot read: {err.strerror}") from err
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise FaultModelError(f"{path}: not valid YAML or JSON: {err}") from err
    if not isinstance(data, dict):
        raise FaultModelError(f"{path}: a mapping of fields expected, not "
                              f"{type(data).__name__}")
    try:
        return FaultModel.model_validate(data)
    except ValidationError as err:
        raise FaultModelError(f"{path}: " + "; ".join(
            _field(e["loc"], e["msg"]) for e in err.errors())) from err
