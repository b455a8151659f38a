"""NVIDIA's XID 144-150 decode sheet as the rules apply it."""

from __future__ import annotations

import pytest

from policy import nvlink5
from policy.config import PolicySettings
from policy.models import Action, GpuReading, NodeReadings, XidDetail
from policy.nvlink5 import ROWS, Resolution, decode
from policy.rules import evaluate_node


def detail(xid: int, unit: str, status: int, intr: int = 0, severity: str = "") -> XidDetail:
    return XidDetail(xid=xid, unit=unit, severity=severity, link=3, intr_info=intr,
                     error_status=status)


def test_every_row_is_an_nvlink5_xid_and_no_unit_status_is_listed_twice() -> None:
    keys = [(r.xid, u, r.key) for r in ROWS for u in r.units]
    assert len(keys) == len(set(keys))
    assert {r.xid for r in ROWS} == set(nvlink5.NVLINK5_XIDS)


def test_every_row_decodes_to_its_own_resolution() -> None:
    for row in ROWS:
        for unit in row.units:
            if unit in ("NETIR_LINK_EVT", "NETIR_LINK_DOWN", "NETIR", "NETIR_INT"):
                intr = (max(row.key, 0) << 20)
                status = 0
            else:
                intr, status = 0, row.key
            decoded = decode(detail(row.xid, unit, status, intr))
            assert decoded is not None, (row, unit)
            assert decoded.resolution == row.resolution, (row, unit)


@pytest.mark.parametrize(
    ("status", "expected"),
    [(0x100 | 0x200, Resolution.IGNORE),          # two ignorable bits
     (0x100 | 0x40, Resolution.RESET_GPU),        # the fatal bit wins
     (0x01 | 0x100, Resolution.XID_154_EVAL),
     (0x400, None)],                              # a bit the sheet does not list
)
def test_several_status_bits_take_the_strongest_resolution(
    status: int, expected: Resolution | None
) -> None:
    decoded = decode(detail(145, "RLW_REMAP", status))
    assert (decoded.resolution if decoded else None) == expected


def test_value_units_decode_only_exact_values() -> None:
    assert decode(detail(149, "NETIR_MFDE_EVENT", 3)).resolution == Resolution.IGNORE  # type: ignore[union-attr]
    assert decode(detail(149, "NETIR_MFDE_EVENT", 6)) is None


def test_rxpipe_action_2_bit_turns_ignore_into_reset_on_both_driver_generations() -> None:
    assert decode(detail(145, "RLW_RXPIPE", 0x1, 0b0000110)).resolution == Resolution.IGNORE  # type: ignore[union-attr]
    new = decode(detail(145, "RLW_RXPIPE", 0x1, 0b10000110))  # >= R575: intrInfo[6:0]
    old = decode(detail(145, "RLW_RXPIPE", 0x2, 0b10011000010))  # < R575: intrInfo[9:0]
    assert new is not None and new.resolution == Resolution.RESET_GPU
    assert old is not None and old.resolution == Resolution.RESET_GPU
    assert decode(detail(145, "RLW_RXPIPE", 0x8, 0b10000110)).resolution == Resolution.IGNORE  # type: ignore[union-attr]


def test_renamed_units_decode_in_either_spelling() -> None:
    for unit in ("TLW_RX", "TLW_RX_PIPE1", "TLW_RX/TLW_RX_PIPE0", "NVLPW", "NVLPW_CTRL"):
        xid = 148 if unit.startswith("NVLPW") else 146
        assert decode(detail(xid, unit, 0x80000000)) is not None, unit


def verdict(gpu: GpuReading, config: PolicySettings | None = None) -> tuple[Action, str]:
    v = evaluate_node(NodeReadings(node="n", gpus=[gpu]), config or PolicySettings())
    return v.action, v.findings[0].rule


def test_xid_154_eval_follows_the_drivers_recovery_action_when_readable() -> None:
    line = detail(145, "RLW_REMAP", 0x01, severity="nonfatal")
    v = evaluate_node(NodeReadings(node="n", gpus=[
        GpuReading(gpu="0", xid=145, xid_detail=line, recovery_action=4)]), PolicySettings())
    xid = [f for f in v.findings if f.signal == "DCGM_FI_DEV_XID_ERRORS"]
    assert [(f.action, f.rule) for f in xid] == [
        (Action.RESET, "xid-145-rlw-remap-xid-154-eval-drain-and-reset")]
    assert "DRAIN_AND_RESET" in xid[0].detail
    assert verdict(GpuReading(gpu="0", xid=145, xid_detail=line)) == (
        Action.APP, "xid-145-rlw-remap-xid-154-eval")


def test_the_gauge_alone_keeps_the_catalog_fallback() -> None:
    assert verdict(GpuReading(gpu="0", xid=145)) == (Action.RESET, "xid-145-workflow-nvlink5-err")


def test_a_detail_of_another_xid_is_not_used() -> None:
    line = detail(144, "SAW_MVB", 0x04)
    assert verdict(GpuReading(gpu="0", xid=145, xid_detail=line))[0] == Action.RESET


def test_an_operator_override_beats_the_decode() -> None:
    config = PolicySettings.from_mapping({"xid_overrides": {145: "quarantine"}})
    line = detail(145, "RLW_REMAP", 0x100)
    assert verdict(GpuReading(gpu="0", xid=145, xid_detail=line), config) == (
        Action.QUARANTINE, "xid-145-override")
