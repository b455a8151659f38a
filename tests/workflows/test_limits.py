"""The config is the ceiling: every setting a reconfigure can loosen is bounded by
``limits``, and every other setting is listed with why it cannot loosen anything."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from policy.config import PolicySettings
from policy.models import Action
from workflows.limits import (
    CHECKS,
    UNBOUNDED,
    LimitsSettings,
    LimitViolation,
    budget_may_exceed,
    violations,
)
from workflows.settings import DetectorSettings, JobTemplateNames, limit_for

# Settings compared as a whole: a nested model whose parts only matter together.
WHOLE = {"policy", "remediation.job_templates"}


def leaves(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        path = prefix + name
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel) and path not in WHOLE:
            out += leaves(sub, path + ".")
        else:
            out.append(path)
    return out


def put(s: DetectorSettings, dotted: str, value: Any) -> DetectorSettings:
    """``s`` with one nested field replaced (validated as the model would be)."""
    head, _, rest = dotted.partition(".")
    if not rest:
        return type(s).model_validate({**s.model_dump(), head: value})
    inner = put(getattr(s, head), rest, value)  # type: ignore[arg-type]
    return s.model_copy(update={head: inner})


def test_every_setting_is_bounded_or_says_why_it_cannot_loosen_anything() -> None:
    settings = set(leaves(DetectorSettings))
    bounded, free = set(CHECKS), set(UNBOUNDED)
    assert not bounded & free
    assert settings - bounded - free == set(), "a setting neither bounded nor explained"
    assert (bounded | free) - settings == set(), "a check names no setting"
    assert all(len(why) > 20 for why in UNBOUNDED.values())


# For each bounded setting: the limits that make its check apply, a value past them, and
# one inside them. Written out here, not derived from the code, so that removing a check
# fails its test.
DAY = timedelta(days=1)
CASES: dict[str, tuple[dict[str, Any], Any, Any]] = {
    "max_unavailable": ({"max_unavailable": 2}, 3, 1),
    "pool_max_unavailable": ({"pool_max_unavailable": {"a": 1}}, {"a": 2}, {"a": 0, "*": 1}),
    "pool_max_unavailable_gpus": ({"pool_max_unavailable_gpus": {"a": 8, "*": "10%"}},
                                  {"a": 16, "*": "10%"}, {"a": 4, "*": "5%"}),
    "pool_label": ({"pool_label": "rack", "pool_max_unavailable": {"*": 1}}, "zone", "rack"),
    "max_quarantined": ({"max_quarantined": "5%"}, "6%", "4%"),
    "max_unavailable_gpus": ({"max_unavailable_gpus": 16}, 17, 8),
    "fault_domains": (
        {"fault_domains": [{"label": "rack", "max_unavailable": 1, "incident_threshold": 3}]},
        [{"label": "rack", "max_unavailable": 2, "incident_threshold": 3}],
        [{"label": "rack", "max_unavailable": 1, "incident_threshold": 2},
         {"label": "clique", "max_unavailable": 4}]),
    "max_thermal_cordoned": ({"max_thermal_cordoned": 3}, 4, 2),
    "cordoned_counts_against_budget": ({"cordons_may_skip_budget": False}, False, True),
    "dry_run": ({"dry_run_may_end": False}, False, True),
    "trust_node_writable_labels": ({"node_writable_labels_allowed": False}, True, False),
    "remediation.drain.out_of_service_taint": ({"out_of_service_taint_allowed": False}, True,
                                               False),
    "remediation.server_authorizes": ({"server_authorizes_allowed": False}, True, False),
    "interval": ({"interval_min": timedelta(seconds=30)}, timedelta(seconds=1),
                 timedelta(minutes=1)),
    "thermal_debounce": ({"thermal_debounce_min": timedelta(minutes=1)}, timedelta(0),
                         timedelta(minutes=2)),
    "breaker_max_flagged_percent": ({"breaker_max_flagged_percent": 20.0}, 100.0, 10.0),
    "breaker_max_flagged_nodes": ({"breaker_max_flagged_nodes": 50}, 51, 5),
    "breaker_min_flagged_nodes": ({"breaker_min_flagged_nodes": 3}, 40, 1),
    "breaker_window": ({"breaker_window_min": timedelta(hours=1)}, timedelta(0), DAY),
    "breaker_max_quarantines": ({"breaker_max_quarantines": 3}, 0, 1),
    "breaker_quarantine_window": ({"breaker_quarantine_window_min": timedelta(hours=1)},
                                  timedelta(minutes=5), DAY),
    "observe_task_queue": ({"observe_task_queue": "gpu-remediate-observe"}, "rogue",
                           "gpu-remediate-observe"),
    "policy": ({"policy": PolicySettings()}, PolicySettings(unknown_xid_action=Action.QUARANTINE),
               PolicySettings()),
    "remediation.approval.required_for": (
        {"approval_required_for": [Action.REBOOT]}, [Action.RESET],
        [Action.REBOOT, Action.RESET]),
    "remediation.approval.on_timeout": ({"approval_may_auto_approve": False}, "approve",
                                        "reject"),
    "remediation.approval.timeout": (
        {"approval_may_auto_approve": True, "approval_timeout_min": DAY},
        timedelta(minutes=1), 2 * DAY),
    "remediation.drain.deadline_policy": ({"drain_force_allowed": False}, "force", "release"),
    "remediation.drain.deadline": (
        {"drain_force_allowed": True, "drain_deadline_min": timedelta(hours=1)},
        timedelta(seconds=1), timedelta(hours=2)),
    "remediation.drain.gpu_pods_only": ({"drain_gpu_pods_only_allowed": False}, True, False),
    "remediation.drain.not_ready_terminating_timeout": (
        {"drain_not_ready_terminating_timeout_min": timedelta(minutes=5)},
        timedelta(seconds=1), timedelta(minutes=10)),
    "remediation.job_templates": ({"job_templates": JobTemplateNames()},
                                  JobTemplateNames(validation="always-pass"),
                                  JobTemplateNames()),
    "remediation.reset_method": ({"external_repair_allowed": False}, "external", "gpu-reset"),
    "remediation.reboot_method": ({"external_repair_allowed": False}, "external", "reboot"),
    "remediation.gpu_isolation": ({"gpu_isolation_allowed": False}, "dra", "off"),
    "remediation.max_repair_attempts": ({"max_repair_attempts": 2}, 10, 1),
    "remediation.repeat_offender_count": ({"repeat_offender_count_max": 3}, 30, 2),
    "remediation.repeat_offender_window": ({"repeat_offender_window_min": timedelta(days=7)},
                                           timedelta(minutes=1), timedelta(days=30)),
    "remediation.thermal.hold": ({"thermal_hold_min": timedelta(minutes=10)},
                                 timedelta(0), timedelta(hours=1)),
    "remediation.thermal.escalate_after": ({"thermal_escalate_after_min": timedelta(hours=1)},
                                           timedelta(minutes=1), None),
    "ledger.probation": ({"ledger_probation_min": timedelta(hours=24)}, timedelta(0),
                         timedelta(hours=48)),
    "ledger.lemon_faults": ({"ledger_lemon_faults_max": 3}, 5, 2),
    "ledger.lemon_window": ({"ledger_lemon_window_min": timedelta(days=30)},
                            timedelta(days=7), timedelta(days=60)),
}

# Settings that make the conditional checks apply to the value under test.
CONTEXT: dict[str, dict[str, Any]] = {
    "pool_label": {"pool_max_unavailable": {"*": 1}},
    "remediation.approval.timeout": {"remediation.approval.on_timeout": "approve"},
    "remediation.drain.deadline": {"remediation.drain.deadline_policy": "force"},
}


def case(field: str, value: Any) -> tuple[DetectorSettings, LimitsSettings]:
    limits_update, _, _ = CASES[field]
    settings = DetectorSettings()
    limits = LimitsSettings.from_settings(settings)
    limits = LimitsSettings.model_validate({**limits.model_dump(), **limits_update})
    for where, v in CONTEXT.get(field, {}).items():
        settings = put(settings, where, v)
    return put(settings, field, value), limits


def test_every_bounded_setting_has_a_case() -> None:
    assert set(CASES) == set(CHECKS)


@pytest.mark.parametrize("field", sorted(CASES))
def test_loosening_past_the_limit_is_refused_naming_the_field(field: str) -> None:
    settings, limits = case(field, CASES[field][1])
    found = violations(settings, limits)
    assert [v.field.split(".")[0] for v in found] == [field.split(".")[0]], found
    assert found[0].field.startswith(field)
    line = str(found[0])
    assert "\n" not in line and field in line and "limits." in line


@pytest.mark.parametrize("field", sorted(CASES))
def test_tightening_is_always_accepted(field: str) -> None:
    settings, limits = case(field, CASES[field][2])
    assert violations(settings, limits) == []


@pytest.mark.parametrize("start", [
    DetectorSettings(),
    DetectorSettings(max_unavailable="10%", pool_label="rack",
                     pool_max_unavailable={"*": 1, "a": "50%"}, max_quarantined=None,
                     dry_run=True, breaker_max_quarantines=0),
])
def test_the_default_limits_are_the_settings_the_worker_starts_with(
        start: DetectorSettings) -> None:
    assert violations(start, LimitsSettings.from_settings(start)) == []


def test_a_reconfigure_to_100_percent_after_up_with_budget_1_is_refused() -> None:
    running = DetectorSettings(max_unavailable=1)
    limits = LimitsSettings.from_settings(running)
    found = violations(running.model_copy(update={"max_unavailable": "100%"}), limits)
    assert [(v.field, v.requested, v.limit) for v in found] == [
        ("max_unavailable", "100%", "1")]


def test_a_stray_client_loosening_everything_is_refused_on_every_count() -> None:
    # budget 40, breaker closed wide, approval off, drain force on.
    running = DetectorSettings(remediation={"approval": {"required_for": ["reboot", "reset"]}})
    limits = LimitsSettings.from_settings(running)
    stray = put(put(put(running, "max_unavailable", 40), "breaker_max_flagged_percent", 100.0),
                "breaker_max_flagged_nodes", 1000)
    stray = put(put(stray, "remediation.approval.required_for", []),
                "remediation.drain.deadline_policy", "force")
    assert [v.field for v in violations(stray, limits)] == [
        "max_unavailable", "breaker_max_flagged_percent", "breaker_max_flagged_nodes",
        "remediation.approval.required_for", "remediation.drain.deadline_policy"]


@pytest.mark.parametrize(("requested", "limit", "exceeds"), [
    (1, 1, False), (2, 1, True), (0, 0, False),
    ("10%", "10%", False), ("11%", "10%", True),
    (1, "1%", False), (2, "50%", True), (5, "100%", False), (1, "0%", True), (0, "0%", False),
    ("1%", 1000, True), ("0%", 1, False),
    (None, 3, True), (3, None, False), (None, None, False),
])
def test_counts_and_percents_compare_for_every_fleet_size(
        requested: int | str | None, limit: int | str | None, exceeds: bool) -> None:
    assert budget_may_exceed(requested, limit) is exceeds
    # Checked by brute force over fleet sizes where both are bounded (no budget takes out
    # more nodes than there are).
    if requested is not None and limit is not None:
        def slots(spec: int | str, n: int) -> int:
            return min(n, limit_for(spec, n))
        over = any(slots(requested, n) > slots(limit, n) for n in range(1, 2001))
        assert over is exceeds or (exceeds and isinstance(requested, str))


def test_a_pool_limited_by_star_keeps_a_budget_of_its_own() -> None:
    limits = LimitsSettings.from_settings(DetectorSettings(pool_max_unavailable={"*": 1}))
    found = violations(DetectorSettings(pool_max_unavailable={"a": 1}), limits)
    assert [v.field for v in found] == ["pool_max_unavailable.*"]
    assert "no budget of its own" in str(found[0])


def test_resolve_fills_unset_limits_from_the_running_settings() -> None:
    running = DetectorSettings(max_unavailable=2, breaker_max_flagged_nodes=7)
    limits = LimitsSettings.resolve(running, {"max_unavailable": "25%"})
    assert limits.max_unavailable == "25%"
    assert limits.breaker_max_flagged_nodes == 7
    assert LimitsSettings.resolve(running, None) == LimitsSettings.from_settings(running)


def test_resolve_refuses_unknown_and_bad_fields_by_name() -> None:
    with pytest.raises(ValueError, match=r"limits\.max_unavailble: unknown field"):
        LimitsSettings.resolve(DetectorSettings(), {"max_unavailble": 3})
    with pytest.raises(ValidationError, match="max_unavailable"):
        LimitsSettings.resolve(DetectorSettings(), {"max_unavailable": "lots"})


def test_a_violation_reads_as_one_line_for_an_operator() -> None:
    v = LimitViolation(field="remediation.drain.deadline", requested="1s",
                       limit_field="drain_deadline_min", limit="1h", why="sooner")
    assert str(v) == ("remediation.drain.deadline: 1s is past the limit "
                      "limits.drain_deadline_min = 1h (sooner)")


def test_settings_and_limits_survive_the_wire_unchanged() -> None:
    # The detector compares a reconfigure's payload with read_limits' result, both decoded
    # by Temporal's converter: a config's own settings must still be inside its limits.
    from temporalio.contrib.pydantic import pydantic_data_converter

    convert = pydantic_data_converter.payload_converter
    running = DetectorSettings(max_unavailable="10%", pool_max_unavailable={"*": 1},
                               remediation={"approval": {"required_for": ["reboot"]}})
    limits = LimitsSettings.from_settings(running)
    [sent] = convert.from_payloads(convert.to_payloads([running]), [DetectorSettings])
    [read] = convert.from_payloads(convert.to_payloads([limits]), [LimitsSettings])
    assert (sent, read) == (running, limits)
    assert violations(sent, read) == []


@pytest.mark.parametrize(("requested", "why"), [
    ([], "dropped"),
    ([{"label": "rack", "max_unavailable": 1, "max_unavailable_gpus": 9,
       "incident_threshold": 3}], "more of one domain out at once"),
    ([{"label": "rack", "max_unavailable": 1, "max_unavailable_gpus": 8,
       "incident_threshold": 0}], "node by node"),
    ([{"label": "rack", "max_unavailable": 1, "max_unavailable_gpus": 8,
       "incident_threshold": 4}], "node by node"),
    ([{"label": "rack", "max_unavailable": 1, "max_unavailable_gpus": 8,
       "incident_threshold": 3, "incident_window": "PT1M"}], "shorter window"),
])
def test_a_fault_domain_level_cannot_be_loosened_past_its_limit(
        requested: list[dict[str, Any]], why: str) -> None:
    limits = LimitsSettings.model_validate({
        **LimitsSettings.from_settings(DetectorSettings()).model_dump(),
        "fault_domains": [{"label": "rack", "max_unavailable": 1, "max_unavailable_gpus": 8,
                           "incident_threshold": 3}]})
    found = violations(put(DetectorSettings(), "fault_domains", requested), limits)
    assert [v.field.split(".")[0] for v in found] == ["fault_domains"], found
    assert why in found[0].why


def test_a_pool_gpu_budget_cannot_be_dropped_or_regrouped_by_a_client() -> None:
    running = DetectorSettings(pool_label="rack", pool_max_unavailable_gpus={"*": 8})
    limits = LimitsSettings.from_settings(running)
    assert violations(running, limits) == []
    dropped = violations(DetectorSettings(pool_label="rack"), limits)
    assert [(v.field, v.requested, v.why) for v in dropped] == [
        ("pool_max_unavailable_gpus.*", "null", "no budget of its own")]
    moved = violations(running.model_copy(update={"pool_label": "zone"}), limits)
    assert [v.field for v in moved] == ["pool_label"]
