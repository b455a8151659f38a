"""The XID catalog: every XID's bucket and action, unknown XIDs, bad entries, recovery codes,
the generated docs table, and overrides from config."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from policy import xid_doc
from policy.config import PolicySettings
from policy.models import NODE_ACTIONS, WARNING_ACTIONS, Action, GpuReading, NodeReadings
from policy.rules import evaluate_node
from policy.xid import (
    BUCKET_ACTION,
    CATALOG,
    DEFAULT_XID_TABLE,
    RECOVERY_ACTIONS,
    Bucket,
    CatalogError,
    Entry,
    load_catalog,
)

A = Action
B = Bucket


def _buckets(spec: dict[Bucket, str]) -> dict[int, Bucket]:
    out: dict[int, Bucket] = {}
    for bucket, ranges in spec.items():
        for part in ranges.split(","):
            lo, _, hi = part.strip().partition("-")
            for xid in range(int(lo), int(hi or lo) + 1):
                assert xid not in out, f"XID {xid} written twice in the test"
                out[xid] = bucket
    return out


# NVIDIA's catalog, transcribed a second time and independently of policy/xid.py (from the
# "Resolution Bucket (Immediate Action)" column of Xid-Catalog.xlsx): the oracle for the data.
CATALOG_BUCKETS: dict[int, Bucket] = _buckets({
    B.CONTACT_SUPPORT: "1-7, 9-10, 12, 15-24, 26-30, 33-36, 42, 47, 49-53, 55-59, 61, 65, 73, "
                       "81, 87, 90-91, 111-118, 122-125, 138, 142",
    B.RESTART_APP: "8, 11, 13, 25, 31-32, 39-41, 60, 68-72, 75-77, 80, 82-86, 88-89, 94, "
                   "96-105, 126-135, 139",
    B.IGNORE: "14, 37-38, 43-44, 63, 66-67, 92-93, 106-108, 121, 137, 141, 152-153, 157, "
              "160-161",
    B.RESET_GPU: "46, 62, 64, 95, 109-110, 119-120, 136, 140, 143, 155-156, 158",
    B.WORKFLOW_XID_45: "45",
    B.WORKFLOW_XID_48: "48",
    B.CHECK_MECHANICALS: "54",
    B.WORKFLOW_NVLINK_ERR: "74",
    B.UPDATE_SWFW: "78",
    B.RESTART_BM: "79",
    B.WORKFLOW_NVLINK5_ERR: "144-150",
    B.RESTART_VM: "151",
    B.XID_154: "154",
    B.CHECK_UVM: "159",
    B.NO_BUCKET: "162-172",
})

# The only rows whose action is not their bucket's, each with a why in the catalog.
DEVIATIONS: dict[int, Action] = {157: A.QUARANTINE, 169: A.RESET, 171: A.RESET, 172: A.RESET}

# What each bucket means for the node, written out again so a change to BUCKET_ACTION is seen.
BUCKET_MEANS: dict[Bucket, Action] = {
    B.IGNORE: A.NONE, B.RESTART_APP: A.APP, B.RESET_GPU: A.RESET, B.RESTART_BM: A.REBOOT,
    B.RESTART_VM: A.REBOOT, B.WORKFLOW_XID_48: A.RESET, B.WORKFLOW_XID_45: A.NONE,
    B.WORKFLOW_NVLINK_ERR: A.RESET, B.WORKFLOW_NVLINK5_ERR: A.RESET, B.XID_154: A.RESET,
    B.CHECK_MECHANICALS: A.QUARANTINE, B.CONTACT_SUPPORT: A.QUARANTINE, B.CHECK_UVM: A.ALERT,
    B.UPDATE_SWFW: A.ALERT, B.NO_BUCKET: A.ALERT,
}

EXPECTED: dict[int, tuple[Bucket, Action]] = {
    x: (b, DEVIATIONS.get(x, BUCKET_MEANS[b])) for x, b in CATALOG_BUCKETS.items()
}

# Issue 16: XIDs NVIDIA files as "restart the app" or "ignore" that used to drain and reset
# the node (87 is listed there too, but the catalog says CONTACT_SUPPORT; 159 is CHECK_UVM).
USED_TO_RESET = [11, 14, 25, *range(37, 42), 44, 60, 66, 67, *range(70, 73), *range(75, 78), 80,
                 *range(82, 87), 88, 89, *range(96, 108), *range(126, 136), 139, 141, 152, 153,
                 161]


def verdict_for(xid: int, config: PolicySettings | None = None, **gpu: object):
    reading = GpuReading(gpu="0", uuid="GPU-aaaa", xid=xid, **gpu)  # type: ignore[arg-type]
    return evaluate_node(NodeReadings(node="n1", gpus=[reading]), config or PolicySettings())


def test_table_covers_every_xid_of_the_catalog() -> None:
    assert set(CATALOG_BUCKETS) == set(range(1, 173))
    assert set(DEFAULT_XID_TABLE) == set(CATALOG_BUCKETS)
    assert len(CATALOG) == len(DEFAULT_XID_TABLE)


def test_every_bucket_has_an_action_and_it_is_the_documented_one() -> None:
    assert BUCKET_ACTION == BUCKET_MEANS
    assert set(BUCKET_ACTION) == set(Bucket)


@pytest.mark.parametrize("xid", sorted(EXPECTED))
def test_catalog_row(xid: int) -> None:
    bucket, action = EXPECTED[xid]
    row = DEFAULT_XID_TABLE[xid]
    assert row.xid == xid
    assert row.bucket == bucket
    assert row.action == action
    assert row.mnemonic and row.mnemonic.upper() == row.mnemonic
    assert len(row.why) > 20
    assert row.deviates == (xid in DEVIATIONS)


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


@pytest.mark.parametrize("xid", USED_TO_RESET)
def test_app_and_ignore_xids_never_drain(xid: int) -> None:
    assert CATALOG_BUCKETS[xid] in (B.RESTART_APP, B.IGNORE)
    assert verdict_for(xid).action in (A.APP, A.NONE)


def test_no_restart_app_or_ignore_xid_takes_a_node_out_but_the_documented_one() -> None:
    drains = {x for x, r in DEFAULT_XID_TABLE.items()
              if r.bucket in (B.RESTART_APP, B.IGNORE) and r.action in NODE_ACTIONS}
    assert drains == {157}


def test_unknown_bucket_fails_at_load_naming_the_xid() -> None:
    good = list(CATALOG[:3])
    bad = Entry(200, "NEW_ERROR", "RESTART_RACK", "A bucket from a newer catalog.")
    with pytest.raises(CatalogError, match=r"XID catalog entry 200 \(NEW_ERROR\): unknown "
                                           r"bucket 'RESTART_RACK' \(known: IGNORE, "):
        load_catalog([*good, bad])
    assert set(load_catalog(good)) == {1, 2, 3}


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        (Entry(1, "DUP", "IGNORE", "Listed again with another bucket."), "entry 1 .*twice"),
        (Entry(201, "X", "IGNORE", "A deviation to an action that does not exist.", "explode"),
         "entry 201 .*unknown action 'explode'"),
        (Entry(202, "X", "IGNORE", "A deviation that is no deviation at all.", "none"),
         "entry 202 .*bucket's own action"),
        (Entry(203, "X", "IGNORE", "  "), "entry 203 .*why"),
        (Entry(0, "X", "IGNORE", "Zero is the exporter's no-XID value."), "entry 0 "),
    ],
)
def test_bad_catalog_entries_fail_naming_the_xid(entry: Entry, problem: str) -> None:
    with pytest.raises(CatalogError, match=problem):
        load_catalog([CATALOG[0], entry])


def test_a_bad_shipped_catalog_stops_the_start_naming_the_xid(tmp_path: Path) -> None:
    """A copy of the policy package whose catalog has a typo in one bucket: importing it, as
    the worker and every command do first, fails with the XID in the message."""
    src = Path(__file__).resolve().parents[2] / "policy"
    shutil.copytree(src, tmp_path / "policy", ignore=shutil.ignore_patterns("__pycache__"))
    catalog = tmp_path / "policy" / "xid.py"
    text = catalog.read_text(encoding="utf-8")
    row = '_E(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM",'
    assert row in text
    catalog.write_text(text.replace(row, row.replace("RESTART_BM", "RESTART_BMC")),
                       encoding="utf-8")
    done = subprocess.run([sys.executable, "-c", "import policy.config"], cwd=tmp_path,
                          capture_output=True, text=True, check=False,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode != 0
    assert ("CatalogError: XID catalog entry 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS): "
            "unknown bucket 'RESTART_BMC'") in done.stderr


def test_rule_ids_read_like_the_bucket() -> None:
    assert DEFAULT_XID_TABLE[79].rule_id == "xid-79-restart-bm"
    assert DEFAULT_XID_TABLE[48].rule_id == "xid-48-workflow-xid-48"
    assert DEFAULT_XID_TABLE[13].rule_id == "xid-13-restart-app"


@pytest.mark.parametrize("xid", [0, None])
def test_no_xid(xid: int | None) -> None:
    verdict = verdict_for(xid)  # type: ignore[arg-type]
    assert verdict.action == Action.NONE
    assert verdict.findings == []


def test_unknown_xid_alerts_by_default() -> None:
    verdict = verdict_for(999)
    assert verdict.action == Action.ALERT
    assert [(f.rule, f.action) for f in verdict.findings] == [("xid-999-unknown", Action.ALERT)]
    assert Action.ALERT not in NODE_ACTIONS and Action.ALERT in WARNING_ACTIONS


def test_unknown_xid_can_be_held_for_review() -> None:
    verdict = verdict_for(999, PolicySettings(unknown_xid_action=Action.QUARANTINE))
    assert verdict.action == Action.QUARANTINE
    assert verdict.findings[0].rule == "xid-999-unknown"


@pytest.mark.parametrize("action", ["reset", "reboot", "none", "app", "thermal", "diagnose"])
def test_unknown_xid_action_allows_only_alert_or_quarantine(action: str) -> None:
    with pytest.raises(ValidationError) as err:
        PolicySettings.from_mapping({"unknown_xid_action": action})
    (problem,) = err.value.errors()
    assert problem["loc"] == ("unknown_xid_action",)
    assert "must be alert or quarantine" in problem["msg"]


def test_a_workflow_input_recorded_with_the_old_reset_still_decodes() -> None:
    """Remediations started before unknown XIDs alerted carry "reset" in their input: an
    upgraded worker must still decode them (a config file may not say it)."""
    assert PolicySettings.model_validate({"unknown_xid_action": "reset"}).unknown_xid_action \
        == Action.RESET


def test_unknown_xid_alongside_a_hardware_xid_does_not_soften_it() -> None:
    readings = NodeReadings(node="n1", gpus=[GpuReading(gpu="0", xid=999),
                                             GpuReading(gpu="1", xid=79)])
    verdict = evaluate_node(readings, PolicySettings())
    assert verdict.action == Action.REBOOT
    assert [f.action for f in verdict.findings] == [Action.REBOOT, Action.ALERT]


def test_override_replaces_catalog_action() -> None:
    config = PolicySettings(xid_overrides={74: Action.REBOOT, 13: Action.NONE})
    assert verdict_for(74, config).action == Action.REBOOT
    assert verdict_for(74, config).findings[0].rule == "xid-74-override"
    assert verdict_for(13, config).action == Action.NONE
    # Untouched rows keep the catalog action.
    assert verdict_for(79, config).action == Action.REBOOT
    assert verdict_for(46, config).action == Action.RESET


def test_override_of_unknown_xid() -> None:
    config = PolicySettings(xid_overrides={200: Action.APP})
    verdict = verdict_for(200, config)
    assert (verdict.action, verdict.findings[0].rule) == (Action.APP, "xid-200-override")


def test_override_from_yaml_shaped_mapping() -> None:
    config = PolicySettings.from_mapping({"policy": {"xid_overrides": {"79": "quarantine"}}})
    assert config.xid_overrides == {79: Action.QUARANTINE}
    assert verdict_for(79, config).action == Action.QUARANTINE


def test_override_rejects_bad_action_and_names_field() -> None:
    with pytest.raises(ValidationError) as err:
        PolicySettings.model_validate({"xid_overrides": {79: "explode"}})
    assert err.value.errors()[0]["loc"][0] == "xid_overrides"


@pytest.mark.parametrize(
    ("code", "action", "rule"),
    [
        (0, Action.NONE, "xid-154-none"),
        (1, Action.RESET, "xid-154-gpu-reset"),
        (2, Action.REBOOT, "xid-154-node-reboot"),
        (3, Action.RESET, "xid-154-drain-p2p"),
        (4, Action.RESET, "xid-154-drain-and-reset"),
        (5, Action.QUARANTINE, "xid-154-recover-imex-domain"),
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
    assert all(r.why for r in RECOVERY_ACTIONS.values())


def test_recovery_codes_match_nvml() -> None:
    """Codes and names as NVIDIA's own binding (nvidia-ml-py, pinned) defines them, not as a
    document remembers them: every NVML_GPU_RECOVERY_ACTION_* constant, and nothing else."""
    pynvml = pytest.importorskip("pynvml")
    prefix = "NVML_GPU_RECOVERY_ACTION_"
    nvml = {getattr(pynvml, n): n.removeprefix(prefix) for n in dir(pynvml)
            if n.startswith(prefix)}
    assert {c: r.name for c, r in RECOVERY_ACTIONS.items()} == nvml


def test_xid_154_with_a_code_newer_than_nvml_alerts() -> None:
    """Readable but unknown is not unreadable: a human decides, as for an unknown XID."""
    verdict = verdict_for(154, recovery_action=8)
    assert verdict.action == Action.ALERT
    assert sorted((f.rule, f.action) for f in verdict.findings) == [
        ("recovery-action-code-8", A.ALERT), ("xid-154-code-8", A.ALERT)]
    held = verdict_for(154, PolicySettings(unknown_xid_action=A.QUARANTINE), recovery_action=8)
    assert held.action == A.QUARANTINE


def test_docs_tables_are_generated_from_the_data_and_not_stale() -> None:
    """docs/xid-policy.md shows the whole catalog; `python -m policy.xid_doc` writes it."""
    doc = Path(__file__).resolve().parents[2] / "docs" / "xid-policy.md"
    text = doc.read_text(encoding="utf-8")
    assert xid_doc.fill(text) == text, "stale: run python -m policy.xid_doc"
    rows: dict[int, tuple[str, str, str]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].isdigit() and cells[2] in {b.value for b in Bucket}:
            rows[int(cells[0])] = (cells[1], cells[2], cells[3].strip("*"))
    assert rows == {
        x: (r.mnemonic, r.bucket.value, r.action.value) for x, r in DEFAULT_XID_TABLE.items()
    }


def test_a_stale_doc_is_caught() -> None:
    doc = Path(__file__).resolve().parents[2] / "docs" / "xid-policy.md"
    text = doc.read_text(encoding="utf-8")
    stale = text.replace("| 79 | ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS | RESTART_BM | reboot |",
                         "| 79 | ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS | RESTART_BM | reset |")
    assert stale != text and xid_doc.fill(stale) == text
    with pytest.raises(ValueError, match="xid-catalog"):
        xid_doc.fill(text.replace("<!-- END xid-catalog -->", ""))
