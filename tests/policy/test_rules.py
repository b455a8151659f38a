"""Non-XID signals, severity, acknowledgements, bad values, thermal handling, evidence."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from pydantic import ValidationError

from policy.config import PolicySettings
from policy.models import Action, GpuReading, NodeReadings, Verdict
from policy.rules import (
    XidSighting,
    evaluate_fleet,
    evaluate_node,
    gpu_key,
    is_thermal_recovered,
    xid_repeat_counts,
)

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
SENTINEL = 9223372036854775794.0


def gpu(index: str = "0", **fields: object) -> GpuReading:
    fields.setdefault("model_name", H100)
    return GpuReading(gpu=index, uuid=f"GPU-{index}", **fields)  # type: ignore[arg-type]


def node(*gpus: GpuReading, name: str = "n1") -> NodeReadings:
    return NodeReadings(node=name, gpus=list(gpus))


def evaluate(*gpus: GpuReading, config: PolicySettings | None = None, **kw: object) -> Verdict:
    return evaluate_node(node(*gpus), config or PolicySettings(), **kw)  # type: ignore[arg-type]


def rules(verdict: Verdict) -> list[tuple[str, Action]]:
    return [(f.rule, f.action) for f in verdict.findings]


def test_healthy_gpu_has_no_findings() -> None:
    verdict = evaluate(
        gpu(
            xid=0,
            gpu_temp=45,
            memory_temp=50,
            ecc_dbe_volatile=0,
            ecc_sbe_volatile=12,
            row_remap_pending=0,
            row_remap_failure=0,
            uncorrectable_remapped_rows=3,
            clock_event_reasons=0x1 | 0x4,
            recovery_action=0,
        )
    )
    assert verdict.action == Action.NONE
    assert verdict.findings == []


@pytest.mark.parametrize(
    ("fields", "signal", "rule", "action"),
    [
        ({"ecc_dbe_volatile": 2}, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc-dbe-volatile", "reset"),
        ({"row_remap_pending": 1}, "DCGM_FI_DEV_ROW_REMAP_PENDING", "row-remap-pending", "reset"),
        (
            {"row_remap_failure": 1},
            "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            "row-remap-failure",
            "quarantine",
        ),
        (
            {"uncorrectable_remapped_rows": 512},
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "uncorrectable-remap-limit",
            "quarantine",
        ),
        ({"gpu_temp": 87}, "DCGM_FI_DEV_GPU_TEMP", "gpu-temp-over-87", "thermal"),
        ({"memory_temp": 96}, "DCGM_FI_DEV_MEMORY_TEMP", "memory-temp-over-95", "thermal"),
        (
            {"clock_event_reasons": 0x40},
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
            "clock-hw-thermal",
            "thermal",
        ),
        (
            {"clock_event_reasons": 0x8},
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
            "clock-hw-slowdown",
            "thermal",
        ),
        (
            {"clock_event_reasons": 0x20},
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
            "clock-sw-thermal",
            "thermal",
        ),
        (
            {"clock_event_reasons": 0x80},
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
            "clock-hw-power-brake",
            "thermal",
        ),
        (
            {"recovery_action": 2},
            "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION",
            "recovery-action-node-reboot",
            "reboot",
        ),
        (
            {"recovery_action": 4},
            "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION",
            "recovery-action-drain-and-reset",
            "reset",
        ),
    ],
)
def test_signal(fields: dict[str, float], signal: str, rule: str, action: str) -> None:
    verdict = evaluate(gpu("3", **fields))
    (finding,) = verdict.findings
    assert verdict.action == Action(action)
    assert finding.rule == rule
    assert finding.signal == signal
    assert finding.value == float(next(iter(fields.values())))
    assert (finding.gpu, finding.uuid, finding.action) == ("3", "GPU-3", Action(action))


def test_thresholds_are_inclusive_and_exact() -> None:
    assert evaluate(gpu(gpu_temp=86.9)).action == Action.NONE
    assert evaluate(gpu(memory_temp=94.9)).action == Action.NONE
    assert evaluate(gpu(uncorrectable_remapped_rows=511)).action == Action.NONE
    assert evaluate(gpu(uncorrectable_remapped_rows=511)).findings == []


def test_normal_clock_reasons_are_not_thermal() -> None:
    # idle, app clocks, SW power cap, sync boost, display clocks
    assert evaluate(gpu(clock_event_reasons=0x1 | 0x2 | 0x4 | 0x10 | 0x100)).findings == []


def test_several_clock_reasons_give_one_finding_each() -> None:
    verdict = evaluate(gpu(clock_event_reasons=0x40 | 0x8))
    assert [f.rule for f in verdict.findings] == ["clock-hw-slowdown", "clock-hw-thermal"]
    assert all(f.value == 0x48 for f in verdict.findings)


def test_configured_actions() -> None:
    config = PolicySettings(
        ecc_dbe_action=Action.REBOOT,
        row_remap_pending_action=Action.REBOOT,
        row_remap_failure_action=Action.REBOOT,
        uncorrectable_remap_limit=100,
        uncorrectable_remap_limit_action=Action.RESET,
    )
    assert evaluate(gpu(ecc_dbe_volatile=1), config=config).action == Action.REBOOT
    assert evaluate(gpu(row_remap_pending=1), config=config).action == Action.REBOOT
    assert evaluate(gpu(row_remap_failure=1), config=config).action == Action.REBOOT
    assert evaluate(gpu(uncorrectable_remapped_rows=100), config=config).action == Action.RESET


def test_severity_ordering_across_gpus() -> None:
    verdict = evaluate(
        gpu("0", xid=13),  # app
        gpu("1", gpu_temp=95),  # thermal
        gpu("2", xid=46),  # reset
        gpu("3", xid=79),  # reboot
        gpu("4", row_remap_failure=1),  # quarantine
        gpu("5", xid=43),  # none
    )
    assert verdict.action == Action.QUARANTINE
    assert [f.action for f in verdict.findings] == [
        Action.QUARANTINE,
        Action.REBOOT,
        Action.RESET,
        Action.THERMAL,
        Action.APP,
        Action.NONE,
    ]
    assert verdict.summary == "quarantine: row-remap-failure on GPU 4 (+5 more)"


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        ([gpu("0", xid=13), gpu("1", gpu_temp=90)], Action.THERMAL),
        ([gpu("0", gpu_temp=90), gpu("1", ecc_dbe_volatile=1)], Action.RESET),
        ([gpu("0", row_remap_pending=1), gpu("1", xid=79)], Action.REBOOT),
        ([gpu("0", xid=79), gpu("1", uncorrectable_remapped_rows=600)], Action.QUARANTINE),
        ([gpu("0", xid=31), gpu("1", xid=45)], Action.APP),
    ],
)
def test_node_action_is_most_severe(gpus: list[GpuReading], expected: Action) -> None:
    assert evaluate(*gpus).action == expected


def test_acknowledged_xid_does_not_trigger_again() -> None:
    reading = gpu("0", xid=79)
    assert evaluate(reading).action == Action.REBOOT
    verdict = evaluate(reading, acknowledged_xids={"GPU-0": 79})
    assert verdict.action == Action.NONE and verdict.findings == []


def test_different_xid_after_acknowledgement_is_new() -> None:
    verdict = evaluate(gpu("0", xid=48), acknowledged_xids={"GPU-0": 79})
    assert rules(verdict) == [("xid-48-workflow-xid-48", Action.RESET)]


def test_acknowledgement_is_per_gpu() -> None:
    verdict = evaluate(gpu("0", xid=79), gpu("1", xid=79), acknowledged_xids={"GPU-0": 79})
    assert [(f.gpu, f.rule) for f in verdict.findings] == [("1", "xid-79-restart-bm")]


def test_acknowledgement_keeps_other_signals() -> None:
    verdict = evaluate(gpu("0", xid=48, ecc_dbe_volatile=1), acknowledged_xids={"GPU-0": 48})
    assert rules(verdict) == [("ecc-dbe-volatile", Action.RESET)]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, SENTINEL, 9.3e18])
def test_sentinel_and_nan_are_no_data(bad: float) -> None:
    verdict = evaluate(
        gpu(
            gpu_temp=bad,
            memory_temp=bad,
            ecc_dbe_volatile=bad,
            row_remap_pending=bad,
            row_remap_failure=bad,
            uncorrectable_remapped_rows=bad,
        )
    )
    assert verdict.action == Action.NONE
    assert verdict.findings == []


def test_sentinel_in_integer_fields_is_no_data() -> None:
    big = 9223372036854775794
    verdict = evaluate(gpu(xid=big, clock_event_reasons=big, recovery_action=big))
    assert verdict.findings == []


def test_per_model_thresholds() -> None:
    # A100's Max Operating is 85 °C, H100's 87 °C.
    a100 = gpu("0", model_name=A100, gpu_temp=86)
    h100 = gpu("1", model_name=H100, gpu_temp=86)
    verdict = evaluate(a100, h100)
    assert rules(verdict) == [("gpu-temp-over-85", Action.THERMAL)]
    assert verdict.findings[0].gpu == "0"


def test_per_model_override_from_config_longest_match_wins() -> None:
    config = PolicySettings.model_validate(
        {
            "thermal": {
                "per_model": {
                    "h100": {"gpu_temp_c": 80},
                    "H100 80GB HBM3": {"memory_temp_c": 90},
                }
            }
        }
    )
    # The longer key wins and only overrides memory; GPU temp falls back to the global 87.
    verdict = evaluate(gpu(gpu_temp=84, memory_temp=91), config=config)
    assert rules(verdict) == [("memory-temp-over-90", Action.THERMAL)]
    nvl = gpu(model_name="NVIDIA H100 NVL", gpu_temp=81)
    assert rules(evaluate(nvl, config=config)) == [("gpu-temp-over-80", Action.THERMAL)]


def test_fractional_threshold_in_rule_id() -> None:
    config = PolicySettings.model_validate({"thermal": {"gpu_temp_c": 82.5}})
    assert rules(evaluate(gpu(gpu_temp=83), config=config)) == [
        ("gpu-temp-over-82.5", Action.THERMAL)
    ]


def test_thermal_recovery() -> None:
    config = PolicySettings()
    assert is_thermal_recovered(node(gpu("0", gpu_temp=81), gpu("1", gpu_temp=70)), config)
    # 82 is not 5 °C below 87: still hot enough to flap.
    assert not is_thermal_recovered(node(gpu("0", gpu_temp=82)), config)
    assert not is_thermal_recovered(node(gpu("0", gpu_temp=60, memory_temp=91)), config)
    assert not is_thermal_recovered(node(gpu("0", gpu_temp=60, clock_event_reasons=0x40)), config)
    # Idle and power cap are normal.
    assert is_thermal_recovered(node(gpu("0", gpu_temp=60, clock_event_reasons=0x5)), config)
    # A100 threshold is 85: 80 is at the margin, 79 below it.
    assert not is_thermal_recovered(node(gpu("0", model_name=A100, gpu_temp=80)), config)
    assert is_thermal_recovered(node(gpu("0", model_name=A100, gpu_temp=79)), config)


def test_thermal_recovery_needs_data() -> None:
    config = PolicySettings()
    assert not is_thermal_recovered(node(), config)
    assert not is_thermal_recovered(node(gpu("0")), config)
    assert not is_thermal_recovered(node(gpu("0", gpu_temp=math.nan)), config)
    assert not is_thermal_recovered(node(gpu("0", gpu_temp=SENTINEL)), config)


def test_thermal_recovery_margin_is_configurable() -> None:
    config = PolicySettings.model_validate({"thermal": {"recovery_margin_c": 0}})
    assert is_thermal_recovered(node(gpu("0", gpu_temp=86)), config)


def test_xid_48_with_remap_pending_is_drain_and_reset() -> None:
    verdict = evaluate(gpu("0", xid=48, row_remap_pending=1))
    assert rules(verdict) == [
        ("row-remap-pending", Action.RESET),
        ("xid-48-drain-and-reset", Action.RESET),
    ]


def test_xid_48_with_recent_63_is_drain_and_reset() -> None:
    verdict = evaluate(gpu("0", xid=48), xid_repeats={"GPU-0": {63: 1, 48: 1}})
    assert rules(verdict) == [("xid-48-drain-and-reset", Action.RESET)]


def test_repeated_app_xid_escalates_to_a_diagnostic_not_a_reset() -> None:
    reading = gpu("0", xid=13)
    assert evaluate(reading, xid_repeats={"GPU-0": {13: 4}}).action == Action.APP
    verdict = evaluate(reading, xid_repeats={"GPU-0": {13: 5}})
    assert rules(verdict) == [("xid-13-repeated", Action.DIAGNOSE)]
    # XID 31 escalates at two bursts.
    assert rules(evaluate(gpu("0", xid=31), xid_repeats={"GPU-0": {31: 2}})) == [
        ("xid-31-repeated", Action.DIAGNOSE)
    ]
    # Repeats on another GPU do not count.
    assert evaluate(reading, xid_repeats={"GPU-1": {13: 9}}).action == Action.APP


def test_acknowledged_app_xid_still_escalates_when_it_keeps_repeating() -> None:
    """The gauge still shows the remediated 13; the sightings were cleared with the
    acknowledgement, so repeats counted since are new occurrences on a repaired GPU."""
    reading = gpu("0", xid=13)
    acked = {"GPU-0": 13}
    assert evaluate(reading, acknowledged_xids=acked).findings == []
    assert evaluate(reading, acknowledged_xids=acked,
                    xid_repeats={"GPU-0": {13: 4}}).findings == []
    verdict = evaluate(reading, acknowledged_xids=acked, xid_repeats={"GPU-0": {13: 5}})
    assert rules(verdict) == [("xid-13-repeated", Action.DIAGNOSE)]
    # A hardware XID once acknowledged stays history, however it is counted.
    assert evaluate(gpu("0", xid=79), acknowledged_xids={"GPU-0": 79},
                    xid_repeats={"GPU-0": {79: 9}}).findings == []


def test_a_finding_and_its_reading_give_the_same_gpu_key() -> None:
    """Remediations acknowledge XIDs by the finding's key and the policy looks them up by
    the reading's: a GPU without a UUID must not be remediated again for the same XID."""
    no_uuid = GpuReading(gpu="3", xid=79)
    finding = evaluate(no_uuid).findings[0]
    assert gpu_key(finding) == gpu_key(no_uuid) == "index:3"
    assert evaluate(no_uuid, acknowledged_xids={gpu_key(finding): 79}).findings == []


def test_app_escalation_can_be_disabled() -> None:
    config = PolicySettings.model_validate({"app_xid_escalation": {"enabled": False}})
    verdict = evaluate(gpu("0", xid=31), config=config, xid_repeats={"GPU-0": {31: 50}})
    assert verdict.action == Action.APP


def test_repeats_never_escalate_hardware_xids() -> None:
    verdict = evaluate(gpu("0", xid=79), xid_repeats={"GPU-0": {79: 50}})
    assert rules(verdict) == [("xid-79-restart-bm", Action.REBOOT)]


def test_xid_repeat_counts_window() -> None:
    day = 86400.0
    sightings = [
        XidSighting(gpu="GPU-0", xid=31, at_s=999.0),  # just outside 24 h
        XidSighting(gpu="GPU-0", xid=31, at_s=day + 500.0),
        XidSighting(gpu="GPU-0", xid=31, at_s=day + 900.0),
        XidSighting(gpu="GPU-1", xid=13, at_s=day + 900.0),
    ]
    counts = xid_repeat_counts(sightings, now_s=day + 1000.0, config=PolicySettings())
    assert counts == {"GPU-0": {31: 2}, "GPU-1": {13: 1}}


def sightings_at(*times: float, xid: int = 31, gpu_key: str = "GPU-0") -> list[XidSighting]:
    return [XidSighting(gpu=gpu_key, xid=xid, at_s=t) for t in times]


def test_sightings_closer_than_the_gap_are_one_burst() -> None:
    """NVSentinel counts bursts: one job crashing with XID 31 ten times in two minutes is one
    event, not a failing GPU (the old count reset an 8-GPU node for it)."""
    now = 10_000.0
    crashing_job = sightings_at(*(now - 120 + 12 * i for i in range(10)))
    assert xid_repeat_counts(crashing_job, now_s=now, config=PolicySettings()) == {
        "GPU-0": {31: 1}}
    verdict = evaluate(gpu("0", xid=31), xid_repeats={"GPU-0": {31: 1}})
    assert verdict.action == Action.APP


def test_a_chain_within_the_gap_stays_one_burst_and_a_pause_starts_the_next() -> None:
    config = PolicySettings()  # gap 180 s
    # 0, 170, 340, 510: each within 180 s of the one before, so one burst over 8.5 minutes.
    assert xid_repeat_counts(sightings_at(0, 170, 340, 510), now_s=600,
                             config=config) == {"GPU-0": {31: 1}}
    # A pause just over the gap starts a second burst; exactly the gap does not.
    assert xid_repeat_counts(sightings_at(0, 181), now_s=600, config=config) == {
        "GPU-0": {31: 2}}
    assert xid_repeat_counts(sightings_at(0, 180), now_s=600, config=config) == {
        "GPU-0": {31: 1}}


def test_bursts_are_per_gpu_and_per_xid() -> None:
    sightings = [*sightings_at(0, 1000), *sightings_at(500, xid=13),
                 *sightings_at(10, gpu_key="GPU-1")]
    assert xid_repeat_counts(sightings, now_s=2000, config=PolicySettings()) == {
        "GPU-0": {31: 2, 13: 1}, "GPU-1": {31: 1}}


@pytest.mark.parametrize(("gap", "expected"), [(0, 3), (60, 2), (600, 1)])
def test_burst_gap_is_configurable(gap: int, expected: int) -> None:
    config = PolicySettings.model_validate({"app_xid_escalation": {"burst_gap": gap}})
    assert xid_repeat_counts(sightings_at(100, 100, 200), now_s=300,
                             config=config)["GPU-0"][31] == expected


def test_two_bursts_of_31_ask_for_a_diagnostic_and_reset_is_opt_in() -> None:
    now = 50_000.0
    counts = xid_repeat_counts(sightings_at(now - 7200, now), now_s=now, config=PolicySettings())
    verdict = evaluate(gpu("0", xid=31), xid_repeats=counts)
    assert rules(verdict) == [("xid-31-repeated", Action.DIAGNOSE)]
    old_way = PolicySettings.model_validate({"app_xid_escalation": {"action": "reset"}})
    assert evaluate(gpu("0", xid=31), config=old_way, xid_repeats=counts).action == Action.RESET


@pytest.mark.parametrize(
    ("section", "field"),
    [({"burst_gap": -5}, "burst_gap"), ({"action": "app"}, "action"),
     ({"action": "none"}, "action"), ({"burst_gap": "soon"}, "burst_gap")],
)
def test_escalation_config_rejects_nonsense_naming_it(section: dict, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        PolicySettings.model_validate({"app_xid_escalation": section})
    assert "app_xid_escalation" in str(err.value) and field in str(err.value)


def test_recovery_action_can_be_ignored_without_xid_154() -> None:
    config = PolicySettings(follow_recovery_action=False)
    assert evaluate(gpu(recovery_action=2), config=config).findings == []


def test_unknown_recovery_code_uses_unknown_action() -> None:
    verdict = evaluate(gpu(recovery_action=42))
    assert rules(verdict) == [("recovery-action-code-42", Action.ALERT)]
    held = PolicySettings(unknown_xid_action=Action.QUARANTINE)
    assert rules(evaluate(gpu(recovery_action=42), config=held)) == [
        ("recovery-action-code-42", Action.QUARANTINE)]


def test_gpu_without_uuid_is_keyed_by_index_for_acks() -> None:
    reading = GpuReading(gpu="2", xid=79)
    verdict = evaluate_node(node(reading), PolicySettings(), acknowledged_xids={"index:2": 79})
    assert verdict.findings == []


def test_evaluate_fleet() -> None:
    fleet = [node(gpu("0", xid=79), name="a"), node(gpu("0"), name="b")]
    verdicts = evaluate_fleet(fleet, PolicySettings())
    assert [(v.node, v.action) for v in verdicts] == [("a", Action.REBOOT), ("b", Action.NONE)]


def test_config_rejects_unknown_fields_by_name() -> None:
    with pytest.raises(ValidationError) as err:
        PolicySettings.from_mapping({"thermal": {"gpu_temp": 90}})
    assert err.value.errors()[0]["loc"] == ("thermal", "gpu_temp")
    assert err.value.errors()[0]["type"] == "extra_forbidden"


def test_a_policy_decoded_from_a_workflow_input_ignores_fields_it_does_not_know() -> None:
    """Another release wrote it (a rolling upgrade, a rollback): decode, do not fail."""
    policy = PolicySettings.model_validate({"thermal": {"gpu_temp_c": 90, "new_knob": 1},
                                          "field_of_the_next_release": True})
    assert policy.thermal.gpu_temp_c == 90


def test_config_rejects_bad_clock_reason() -> None:
    with pytest.raises(ValidationError) as err:
        PolicySettings.model_validate({"thermal": {"clock_reasons": ["hot"]}})
    assert err.value.errors()[0]["loc"][:2] == ("thermal", "clock_reasons")


def test_config_survives_json_round_trip() -> None:
    # The config travels inside workflow inputs through the pydantic data converter.
    config = PolicySettings(xid_overrides={74: Action.REBOOT})
    assert PolicySettings.model_validate_json(config.model_dump_json()) == config


def test_from_mapping_accepts_both_shapes() -> None:
    section = {"unknown_xid_action": "quarantine"}
    assert PolicySettings.from_mapping(section).unknown_xid_action == Action.QUARANTINE
    whole = {"policy": section}
    assert PolicySettings.from_mapping(whole).unknown_xid_action == Action.QUARANTINE
    assert PolicySettings.from_mapping(None) == PolicySettings()
    assert PolicySettings.from_mapping({"policy": None}) == PolicySettings()


def test_policy_imports_nothing_with_io() -> None:
    """The policy runs inside the Temporal workflow sandbox: no network or cluster clients."""
    code = (
        "import sys, policy, policy.rules, policy.config, policy.xid;"
        "print(','.join(m for m in ('httpx', 'kubernetes', 'prometheus_client', 'aiohttp',"
        " 'yaml', 'activities', 'worker') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_fewer_gpus_than_declared_is_a_gpu_off_the_bus() -> None:
    config = PolicySettings()
    seven = [gpu(str(i)) for i in range(7)]
    v = evaluate_node(NodeReadings(node="n", gpus=seven, declared_gpus=8), config)
    assert v.action == Action.REBOOT and v.findings[0].rule == "gpus-missing-1-of-8"
    # As many as declared, a count not known, or nothing read at all: no evidence.
    for readings in (NodeReadings(node="n", gpus=seven, declared_gpus=7),
                     NodeReadings(node="n", gpus=seven),
                     NodeReadings(node="n", gpus=[], declared_gpus=8)):
        assert evaluate_node(readings, config).action == Action.NONE
    quarantine = PolicySettings(missing_gpu_action=Action.QUARANTINE)
    assert evaluate_node(NodeReadings(node="n", gpus=seven, declared_gpus=8),
                         quarantine).action == Action.QUARANTINE


def test_missing_gpu_action_cannot_be_a_reset() -> None:
    with pytest.raises(ValidationError, match="missing_gpu_action"):
        PolicySettings(missing_gpu_action=Action.RESET)


# --- link rates (policy.links): off by default, DCGM's health-watch limits when on -------------

LINKS_ON = PolicySettings.from_mapping({"links": {"pcie_replay_enabled": True,
                                                "nvlink_enabled": True}})


def test_link_rates_are_ignored_by_default() -> None:
    bad = gpu(pcie_replays_per_minute=600.0, nvlink_crc_errors_per_second=1e4,
              nvlink_errors_per_minute=50.0)
    assert evaluate(bad).action == Action.NONE


def test_link_rates_over_dcgms_limits_alert_when_on() -> None:
    v = evaluate(gpu("0", pcie_replays_per_minute=9.0),
                 gpu("1", nvlink_crc_errors_per_second=101.0),
                 gpu("2", nvlink_errors_per_minute=0.5), config=LINKS_ON)
    assert v.action == Action.ALERT, "a human looks: a reset does not reseat a card"
    assert sorted((f.gpu, f.rule) for f in v.findings) == [
        ("0", "pcie-replays-over-8-per-minute"),
        ("1", "nvlink-crc-errors-over-100-per-second"),
        ("2", "nvlink-replay-recovery-errors")]


def test_link_rates_at_the_limit_or_unknown_are_not_evidence() -> None:
    at_limit = gpu(pcie_replays_per_minute=8.0, nvlink_crc_errors_per_second=100.0,
                   nvlink_errors_per_minute=0.0)
    # Totals alone (a year-old node has replays) and sentinels say nothing.
    totals_only = gpu("1", pcie_replay_total=1e6, nvlink_replay_total=1e3,
                      pcie_replays_per_minute=SENTINEL)
    assert evaluate(at_limit, totals_only, config=LINKS_ON).action == Action.NONE


def test_link_actions_and_thresholds_are_configurable_and_checked() -> None:
    config = PolicySettings.from_mapping({"links": {
        "pcie_replay_enabled": True, "pcie_replays_per_minute": 100,
        "pcie_replay_action": "quarantine"}})
    assert evaluate(gpu(pcie_replays_per_minute=50.0), config=config).action == Action.NONE
    assert evaluate(gpu(pcie_replays_per_minute=150.0), config=config).action == \
        Action.QUARANTINE
    for bad, field in ((({"nvlink_action": "thermal"}), "links.nvlink_action"),
                       ({"pcie_replays_per_minute": 0}, "links.pcie_replays_per_minute"),
                       ({"nvlink_errors_per_minute": -1}, "links.nvlink_errors_per_minute")):
        with pytest.raises(ValueError, match=field.replace(".", r"\.")):
            PolicySettings.from_mapping({"links": bad})
