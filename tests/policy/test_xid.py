"""The XID catalog: every row's action, unknown XIDs, and overrides from config."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from policy.config import PolicyConfig
from policy.models import Action, GpuReading, NodeReadings
from policy.rules import evaluate_node
from policy.xid import BUCKET_ACTION, DEFAULT_XID_TABLE, RECOVERY_ACTIONS, Bucket

A = Action
EXPECTED: dict[int, tuple[Bucket, Action]] = {
    8: (Bucket.RESTART_APP, A.APP),
    13: (Bucket.RESTART_APP, A.APP),
    31: (Bucket.RESTART_APP, A.APP),
    32: (Bucket.RESTART_APP, A.APP),
    43: (Bucket.IGNORE, A.NONE),
    45: (Bucket.WORKFLOW_XID_45, A.NONE),
    46: (Bucket.RESET_GPU, A.RESET),
    48: (Bucket.WORKFLOW_XID_48, A.RESET),
    54: (Bucket.CHECK_MECHANICALS, A.QUARANTINE),
    61: (Bucket.CONTACT_SUPPORT, A.QUARANTINE),
    62: (Bucket.RESET_GPU, A.RESET),
    63: (Bucket.IGNORE, A.NONE),
    64: (Bucket.RESET_GPU, A.RESET),
    68: (Bucket.RESTART_APP, A.APP),
    69: (Bucket.RESTART_APP, A.APP),
    74: (Bucket.WORKFLOW_NVLINK_ERR, A.RESET),
    79: (Bucket.RESTART_BM, A.REBOOT),
    92: (Bucket.IGNORE, A.NONE),
    93: (Bucket.IGNORE, A.NONE),
    94: (Bucket.RESTART_APP, A.APP),
    95: (Bucket.RESET_GPU, A.RESET),
    109: (Bucket.RESET_GPU, A.RESET),
    110: (Bucket.RESET_GPU, A.RESET),
    119: (Bucket.RESET_GPU, A.RESET),
    120: (Bucket.RESET_GPU, A.RESET),
    121: (Bucket.IGNORE, A.NONE),
    122: (Bucket.CONTACT_SUPPORT, A.QUARANTINE),
    123: (Bucket.CONTACT_SUPPORT, A.QUARANTINE),
    124: (Bucket.CONTACT_SUPPORT, A.QUARANTINE),
    136: (Bucket.RESET_GPU, A.RESET),
    137: (Bucket.IGNORE, A.NONE),
    140: (Bucket.RESET_GPU, A.RESET),
    143: (Bucket.RESET_GPU, A.RESET),
    **{x: (Bucket.WORKFLOW_NVLINK5_ERR, A.RESET) for x in range(144, 151)},
    151: (Bucket.RESTART_VM, A.REBOOT),
    154: (Bucket.XID_154, A.RESET),
    155: (Bucket.RESET_GPU, A.RESET),
    156: (Bucket.RESET_GPU, A.RESET),
    157: (Bucket.IGNORE, A.QUARANTINE),
    158: (Bucket.RESET_GPU, A.RESET),
    171: (Bucket.WORKFLOW_XID_48, A.RESET),
    172: (Bucket.WORKFLOW_XID_48, A.RESET),
}

# The only rows whose action is not their bucket's, each for a documented reason.
DEVIATIONS = {157}


def verdict_for(xid: int, config: PolicyConfig | None = None, **gpu: object):
    reading = GpuReading(gpu="0", uuid="GPU-aaaa", xid=xid, **gpu)  # type: ignore[arg-type]
    return evaluate_node(NodeReadings(node="n1", gpus=[reading]), config or PolicyConfig())


def test_table_covers_exactly_the_expected_xids() -> None:
    assert set(DEFAULT_XID_TABLE) == set(EXPECTED)


@pytest.mark.parametrize("xid", sorted(EXPECTED))
def test_catalog_row(xid: int) -> None:
    bucket, action = EXPECTED[xid]
    row = DEFAULT_XID_TABLE[xid]
    assert row.xid == xid
    assert row.bucket == bucket
    assert row.action == action
    assert row.mnemonic and row.mnemonic.upper() == row.mnemonic
    assert row.why
    if xid not in DEVIATIONS:
        assert row.action == BUCKET_ACTION[bucket]


@pytest.mark.parametrize("xid", sorted(EXPECTED))
def test_xid_drives_node_action(xid: int) -> None:
    _, action = EXPECTED[xid]
    verdict = verdict_for(xid)
    assert verdict.action == action
    (finding,) = verdict.findings
    assert finding.signal == "DCGM_FI_DEV_XID_ERRORS"
    assert finding.value == float(xid)
    assert finding.action == action
    assert finding.gpu == "0" and finding.uuid == "GPU-aaaa"
    if xid != 154:
        assert finding.rule == f"xid-{xid}-{EXPECTED[xid][0].value.lower().replace('_', '-')}"


def test_rule_ids_read_like_the_bucket() -> None:
    assert DEFAULT_XID_TABLE[79].rule_id == "xid-79-restart-bm"
    assert DEFAULT_XID_TABLE[48].rule_id == "xid-48-workflow-xid-48"
    assert DEFAULT_XID_TABLE[13].rule_id == "xid-13-restart-app"


@pytest.mark.parametrize("xid", [0, None])
def test_no_xid(xid: int | None) -> None:
    verdict = verdict_for(xid)  # type: ignore[arg-type]
    assert verdict.action == Action.NONE
    assert verdict.findings == []


def test_unknown_xid_uses_reset_by_default() -> None:
    verdict = verdict_for(999)
    assert verdict.action == Action.RESET
    assert verdict.findings[0].rule == "xid-999-unknown"


@pytest.mark.parametrize("action", [Action.NONE, Action.REBOOT, Action.QUARANTINE])
def test_unknown_xid_action_is_configurable(action: Action) -> None:
    verdict = verdict_for(999, PolicyConfig(unknown_xid_action=action))
    assert verdict.action == action
    assert verdict.findings[0].rule == "xid-999-unknown"


def test_override_replaces_catalog_action() -> None:
    config = PolicyConfig(xid_overrides={74: Action.REBOOT, 13: Action.NONE})
    assert verdict_for(74, config).action == Action.REBOOT
    assert verdict_for(74, config).findings[0].rule == "xid-74-override"
    assert verdict_for(13, config).action == Action.NONE
    # Untouched rows keep the catalog action.
    assert verdict_for(79, config).action == Action.REBOOT
    assert verdict_for(46, config).action == Action.RESET


def test_override_of_unknown_xid() -> None:
    config = PolicyConfig(xid_overrides={200: Action.APP})
    verdict = verdict_for(200, config)
    assert (verdict.action, verdict.findings[0].rule) == (Action.APP, "xid-200-override")


def test_override_from_yaml_shaped_mapping() -> None:
    config = PolicyConfig.from_mapping({"policy": {"xid_overrides": {"79": "quarantine"}}})
    assert config.xid_overrides == {79: Action.QUARANTINE}
    assert verdict_for(79, config).action == Action.QUARANTINE


def test_override_rejects_bad_action_and_names_field() -> None:
    with pytest.raises(ValidationError) as err:
        PolicyConfig.model_validate({"xid_overrides": {79: "explode"}})
    assert err.value.errors()[0]["loc"][0] == "xid_overrides"


@pytest.mark.parametrize(
    ("code", "action", "rule"),
    [
        (0, Action.NONE, "xid-154-none"),
        (1, Action.RESET, "xid-154-gpu-reset"),
        (2, Action.REBOOT, "xid-154-node-reboot"),
        (3, Action.RESET, "xid-154-drain-p2p"),
        (4, Action.RESET, "xid-154-drain-and-reset"),
        (6, Action.REBOOT, "xid-154-bus-reset"),
        (7, Action.REBOOT, "xid-154-system-reboot"),
    ],
)
def test_xid_154_follows_recovery_action(code: int, action: Action, rule: str) -> None:
    verdict = verdict_for(154, recovery_action=code)
    xid_findings = [f for f in verdict.findings if f.signal == "DCGM_FI_DEV_XID_ERRORS"]
    assert [(f.rule, f.action) for f in xid_findings] == [(rule, action)]
    assert verdict.action == action


def test_xid_154_without_recovery_action_falls_back_to_reset() -> None:
    verdict = verdict_for(154)
    assert verdict.action == Action.RESET
    assert verdict.findings[0].rule == "xid-154-recovery-unreadable"


def test_recovery_enum_is_complete() -> None:
    assert set(RECOVERY_ACTIONS) == set(range(8))


def test_docs_table_matches_catalog() -> None:
    """docs/xid-policy.md shows the whole catalog; it must not drift from the data."""
    doc = Path(__file__).resolve().parents[2] / "docs" / "xid-policy.md"
    rows: dict[int, tuple[str, str, str]] = {}
    buckets = {b.value for b in Bucket}
    for line in doc.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].isdigit() and cells[2] in buckets:
            rows[int(cells[0])] = (cells[1], cells[2], cells[3])
    assert rows == {
        x: (r.mnemonic, r.bucket.value, r.action.value) for x, r in DEFAULT_XID_TABLE.items()
    }
