"""``dcgmi diag -j`` output to evidence: both real formats (3.x, 4.x) and their quirks, log noise,
hostile input that must never read as a pass, and the one-line summary's bound."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from policy.diag import DiagReport, DiagResult, DiagUnparseable, parse_dcgmi_json

FIXTURES = Path(__file__).parent / "fixtures" / "dcgmi"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def doc4(*tests: dict[str, Any], category: str = "Hardware", **root: Any) -> str:
    """A DCGM 4.x document with ``tests`` in one category."""
    return json.dumps({"DCGM Diagnostic": {"test_categories": [
        {"category": category, "tests": list(tests)}]}, **root})


def gpu(entity: int, status: str = "Pass", **extra: Any) -> dict[str, Any]:
    return {"entity_group": "GPU", "entity_group_id": 1, "entity_id": entity, "status": status,
            **extra}


def doc3(results: Any, name: str = "memory", category: str = "Hardware") -> str:
    """A DCGM 3.x document with one test."""
    return json.dumps({"DCGM GPU Diagnostic": {"test_categories": [
        {"category": category, "tests": [{"name": name, "results": results}]}]}})


# --- the real formats -----------------------------------------------------------------------


def test_dcgm3_pass() -> None:
    report = parse_dcgmi_json(fixture("dcgm3_pass.json"), level=2)
    assert report.passed is True
    assert (report.version, report.level, len(report.results)) == ("3.3.5", 2, 13)
    assert report.gpus_seen() == {"0", "1"}
    deployment = [r for r in report.results if r.category == "Deployment"]
    assert len(deployment) == 9 and {r.gpu for r in deployment} == {None}
    pcie0 = next(r for r in report.results if r.test == "PCIe" and r.gpu == "0")
    # No warning: the info explains; the tabs of dcgmi's text are collapsed to one line.
    assert pcie0.message == "GPU 0 GPU to Host bandwidth: 24.61 GB/s"
    assert report.failed == ()
    assert report.summary() == "dcgmi diag: all 13 results passed on GPUs 0-1"


def test_dcgm3_fail_reads_the_deployment_warning_quirk() -> None:
    report = parse_dcgmi_json(fixture("dcgm3_fail.json"))
    assert report.passed is False
    assert [(r.category, r.test, r.gpu, r.codes) for r in report.failed] == [
        ("Deployment", "Persistence Mode", "0", ("error_id 5",)),
        ("Hardware", "GPU Memory", "1", ("error_id 83",)),
    ]
    # 3.x dcgmi writes a deployment warning's text under "warnings" and its gpu_id as a number.
    assert report.failed[0].message.startswith("Persistence mode for GPU 0 is currently disabled")
    assert report.failed[1].message.endswith("an uncorrectable ECC error was detected.")
    assert report.summary().startswith(
        "dcgmi diag: 11 passed, 2 failed (Persistence Mode on GPU 0: error_id 5 - Persistence")
    assert "GPU Memory on GPU 1: error_id 83 - Error using CUDA API" in report.summary()


def test_dcgm3_nvvs_quirks() -> None:
    """gpu_ids as "0,1,2,3" and as a number, capitals, null holes, the version inside."""
    report = parse_dcgmi_json(fixture("dcgm3_nvvs_quirks.json"))
    assert report.version == "3.1.0"
    assert [(r.test, r.gpu, r.status) for r in report.results if r.test == "Denylist"] == [
        ("Denylist", "0", "pass"), ("Denylist", "1", "pass"),
        ("Denylist", "2", "pass"), ("Denylist", "3", "pass")]
    assert len(report.results) == 12
    skipped = [r for r in report.results if r.status == "skip"]
    assert [(r.test, r.gpu, r.message) for r in skipped] == [
        ("software", "3", "Test skipped on GPU 3")]
    assert report.passed is True
    assert report.summary() == "dcgmi diag: 11 passed, 1 skipped"


def test_dcgm4_pass_eight_gpus_level_2() -> None:
    report = parse_dcgmi_json(fixture("dcgm4_pass_8gpu.json"), level=2)
    assert report.passed is True
    assert (report.version, report.level) == ("4.2.3", 2)  # from the root "metadata"
    assert len(report.results) == 24
    assert report.gpus_seen() == {str(g) for g in range(8)}
    assert {(r.category, r.test) for r in report.results} == {
        ("Deployment", "software"), ("Integration", "pcie"), ("Hardware", "memory")}
    assert report.summary() == "dcgmi diag: all 24 results passed on GPUs 0-7"


def test_dcgm4_fail_one_gpu_memory() -> None:
    report = parse_dcgmi_json(fixture("dcgm4_fail.json"), level=2)
    assert report.passed is False
    assert report.failed == (DiagResult(
        category="Hardware", test="memory", gpu="3", status="fail", codes=("error_id 83",),
        message="A memory mismatch was detected on GPU 3, but no error was reported by CUDA "
                "or NVML. Run a field diagnostic on the GPU."),)
    # The test_summary's "Fail" says nothing the GPU 3 result does not: no extra result.
    assert len(report.results) == 24
    assert report.summary() == (
        "dcgmi diag: 23 passed, 1 failed (memory on GPU 3: error_id 83 - A memory mismatch was "
        "detected on GPU 3, but no error was reported by CUDA or NVML. Run a field diagnostic "
        "on the GPU.)")


def test_log_noise_around_the_json() -> None:
    """nv-hostengine's banner, shell tracing, an unrelated JSON object, a stray brace after."""
    log = fixture("dcgm4_noise.log")
    assert log.startswith("Started host engine version")
    assert parse_dcgmi_json(log) == parse_dcgmi_json(fixture("dcgm4_pass_8gpu.json"))


def test_the_last_diagnostic_in_the_log_wins() -> None:
    first = doc3([{"gpu_id": "0", "status": "Fail"}])
    second = doc3([{"gpu_id": "0", "status": "Pass"}])
    assert parse_dcgmi_json(f"{first}\nretrying\n{second}").passed is True
    assert parse_dcgmi_json(f"{second}\nretrying\n{first}").passed is False


def test_metadata_inside_the_diagnostic_and_warnings_as_strings() -> None:
    text = json.dumps({"DCGM Diagnostic": {
        "test_categories": [{"category": "Integration", "tests": [{"name": "pcie", "results": [
            {"gpu_ids": "2", "status": "Fail", "warnings": ["PCIe replay rate too high", "x"]}]}]}],
        "metadata": {"version": "4.1.1"}}})
    report = parse_dcgmi_json(text)
    assert report.version == "4.1.1"
    assert report.failed == (DiagResult(category="Integration", test="pcie", gpu="2",
                                        status="fail", message="PCIe replay rate too high"),)


def test_warn_alone_passes_and_shows() -> None:
    report = parse_dcgmi_json(doc4({"name": "pcie", "results": [
        gpu(0), gpu(2, "Warn", warnings=[{"warning": "bandwidth below expected",
                                          "error_id": 22, "error_category": 3,
                                          "error_severity": 1}])]}))
    assert report.passed is True
    assert report.summary() == (
        "dcgmi diag: 1 passed, 1 warned (pcie on GPU 2: error_id 22 - bandwidth below expected)")


def test_a_test_without_results_did_not_run() -> None:
    """4.x drops the results (and summary) of a test that did not run: not a pass."""
    report = parse_dcgmi_json(doc4({"name": "memory", "results": [gpu(0)]},
                                   {"name": "targeted_stress"}))
    assert report.results[1] == DiagResult(category="Hardware", test="targeted_stress",
                                           gpu=None, status="not-run")
    assert report.passed is True  # one pass, nothing failed: the not-run is visible, not fatal
    assert report.summary() == "dcgmi diag: 1 passed, 1 not run"


def test_a_failing_test_summary_with_passing_entities_is_kept() -> None:
    """4.x puts errors that belong to no entity only in test_summary."""
    report = parse_dcgmi_json(doc4({
        "name": "memory", "results": [gpu(0), gpu(1)],
        "test_summary": {"status": "Fail", "warnings": [
            {"warning": "Plugin failed to initialise", "error_id": 1, "error_category": 0,
             "error_severity": 2}]}}))
    assert report.passed is False
    assert report.failed == (DiagResult(category="Hardware", test="memory", gpu=None,
                                        status="fail", codes=("error_id 1",),
                                        message="Plugin failed to initialise"),)


def test_non_gpu_entities_are_kept_without_a_gpu() -> None:
    report = parse_dcgmi_json(doc4({"name": "cpu_eud", "results": [
        {"entity_group": "CPU", "entity_group_id": 7, "entity_id": 0, "status": "Fail",
         "warnings": [{"warning": "CPU EUD found a fault", "error_id": 99,
                       "error_category": 0, "error_severity": 2}]},
        {"entity_group_id": 1, "entity_id": 4, "status": "Pass"},  # a GPU, by group id alone
    ]}))
    assert report.failed == (DiagResult(category="Hardware", test="cpu_eud", gpu=None,
                                        status="fail", codes=("error_id 99",),
                                        message="CPU 0: CPU EUD found a fault"),)
    assert report.gpus_seen() == {"4"}
    assert report.passed is False


def test_the_3x_cpu_eud_result() -> None:
    report = parse_dcgmi_json(doc3([{"cpu_id": "1", "status": "Skip - All"},
                                     {"gpu_id": "0", "status": "Pass - All"}], name="CPU EUD Test"))
    assert [(r.gpu, r.status, r.message) for r in report.results] == [
        (None, "skip", "CPU 1"), ("0", "pass", "")]


@pytest.mark.parametrize("status", ["Partial", "", "Passed?", "Unknown", "P4SS"])
def test_an_unknown_status_is_a_fail(status: str) -> None:
    report = parse_dcgmi_json(doc3([{"gpu_id": "0", "status": "Pass"},
                                     {"gpu_id": "1", "status": status}]))
    assert report.passed is False
    assert [(r.gpu, r.status) for r in report.failed] == [("1", "fail")]
    assert report.failed[0].message == f"unrecognised dcgmi status {status!r}"


@pytest.mark.parametrize(("raw", "status"), [
    ("Pass", "pass"), ("PASS", "pass"), ("Fail", "fail"), ("FAIL", "fail"), ("Warn", "warn"),
    ("Skip", "skip"), ("SKIP", "skip"), ("Not Run", "not-run"), ("NOT_RUN", "not-run"),
])
def test_status_mapping(raw: str, status: str) -> None:
    assert parse_dcgmi_json(doc3([{"gpu_id": "0", "status": raw}])).results[0].status == status


def test_iterations_are_merged() -> None:
    run_pass = json.loads(doc3([{"gpu_id": "0", "status": "Pass"}]))
    wrapped = {"iterations": [run_pass, None, run_pass], "Overall Result": "Pass"}
    report = parse_dcgmi_json(json.dumps(wrapped))
    assert (len(report.results), report.passed) == (2, True)
    wrapped = {"iterations": [run_pass], "Overall Result": "Fail", "Warning": "Timeout"}
    report = parse_dcgmi_json(json.dumps(wrapped))
    assert report.passed is False
    assert report.failed[0].test == "iterations"
    assert report.failed[0].message == "Overall Result Fail: Timeout"


# --- hostile input ---------------------------------------------------------------------------

TRUNCATED = fixture("dcgm4_pass_8gpu.json")[:3000]

UNPARSEABLE: list[tuple[str, str, str]] = [
    ("empty", "", "no JSON object"),
    ("blank", "  \n\t ", "no JSON object"),
    ("prose", "Error: Unable to start an embedded host engine. Host engine stopped.",
     "no JSON object"),
    ("a list", "[1, 2, 3]", "no JSON object"),
    ("no diagnostic key", '{"foo": {"test_categories": []}}', "no JSON object"),
    ("diagnostic not an object", '{"DCGM Diagnostic": []}', "not an object"),
    ("no test_categories", '{"DCGM Diagnostic": {}}', "no 'test_categories'"),
    ("test_categories not a list", '{"DCGM Diagnostic": {"test_categories": {"a": 1}}}',
     "'test_categories' is a dict, not a list"),
    ("zero categories", '{"DCGM Diagnostic": {"test_categories": []}}', "no test results"),
    ("category a string", '{"DCGM Diagnostic": {"test_categories": ["Hardware"]}}',
     "a test category is a str, not an object"),
    ("tests missing", '{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware"}]}}',
     "is a missing value, not a list"),
    ("results not a list", doc4({"name": "memory", "results": "Pass"}), "not a list"),
    ("result a number", doc4({"name": "memory", "results": [7]}), "not an object"),
    ("name missing", doc4({"results": [gpu(0)]}), "'name'"),
    ("status a number", doc3([{"gpu_id": "0", "status": 1}]), "status of test 'memory'"),
    ("status missing", doc3([{"gpu_id": "0"}]), "is not text"),
    ("status null", doc4({"name": "memory", "results": [gpu(0, None)]}), "is not text"),
    ("summary status a list", doc4({"name": "m", "results": [gpu(0)],
                                    "test_summary": {"status": ["Pass"]}}), "is not text"),
    ("gpu_id text", doc3([{"gpu_id": "GPU-0", "status": "Pass"}]), "not an index"),
    ("gpu_id negative", doc3([{"gpu_id": -1, "status": "Pass"}]), "out of range"),
    ("gpu_id absurd", doc3([{"gpu_id": 10**9, "status": "Pass"}]), "out of range"),
    ("entity_id text", doc4({"name": "m", "results": [gpu("x")]}), "not an index"),  # type: ignore[arg-type]
    ("entity_id bool", doc4({"name": "m", "results": [gpu(True)]}), "not an index"),
    ("entity_group a number", doc4({"name": "m", "results": [
        {"entity_group": 1, "entity_id": 0, "status": "Pass"}]}), "'entity_group'"),
    ("NaN", '{"DCGM Diagnostic": {"test_categories": [], "x": NaN}}', "NaN"),
    ("Infinity", '{"DCGM GPU Diagnostic": {"test_categories": [], "t": Infinity}}', "Infinity"),
    ("-Infinity", '{"DCGM Diagnostic": {"x": -Infinity}}', "-Infinity"),
    ("duplicate status", '{"DCGM Diagnostic": {"test_categories": [{"category": "H", "tests": '
     '[{"name": "m", "results": [{"gpu_id": "0", "status": "Fail", "status": "Pass"}]}]}]}}',
     "duplicate key 'status'"),
    ("duplicate diagnostic", '{"DCGM Diagnostic": {}, "DCGM Diagnostic": {}}', "duplicate key"),
    ("deep nesting", '{"DCGM Diagnostic": ' + "[" * 200_000 + "]" * 200_000 + "}",
     "nested too deeply"),
    ("deep objects", '{"a":' * 200_000, "nested too deeply"),
    ("truncated", TRUNCATED, "no JSON object"),
    ("runtime error", '{"DCGM Diagnostic": {"version": "4.2.3", "runtime_error": '
     '"Error: Diagnostic could not be run while DCGM is paused."}}',
     "runtime error instead of results: 'Error: Diagnostic could not be run while DCGM is "
     "paused.'"),
    ("iterations empty", '{"iterations": [], "Overall Result": "Pass"}', "without runs"),
    ("iteration a string", '{"iterations": ["x"], "Overall Result": "Pass"}', "not an object"),
    ("JSON-like noise", '{"a":"' * 400_000, "gave up"),
    ("empty objects", "{}" * 1_000_000, "gave up"),
]


@pytest.mark.parametrize(("text", "why"), [(t, w) for _, t, w in UNPARSEABLE],
                         ids=[name for name, _, _ in UNPARSEABLE])
def test_hostile_input_is_unparseable(text: str, why: str) -> None:
    # No clock here: a parser that blew up on these would hang the test into the suite's
    # timeout (pyproject: timeout), whatever the machine's speed.
    with pytest.raises(DiagUnparseable) as caught:
        parse_dcgmi_json(text)
    assert why in str(caught.value)
    assert len(str(caught.value)) <= 420  # the reason and at most ~200 chars of what was seen


NOT_PASSED: list[tuple[str, str, str]] = [
    ("only skips", doc4({"name": "pcie", "results": [gpu(0, "Skip"), gpu(1, "Skip")]}),
     "dcgmi diag: 0 passed, 2 skipped - nothing passed"),
    ("only not run", doc4({"name": "memory"}, {"name": "pcie", "results": []}),
     "dcgmi diag: 0 passed, 2 not run - nothing passed"),
    ("not run by word", doc3([{"gpu_id": "0", "status": "Not Run"}]),
     "dcgmi diag: 0 passed, 1 not run - nothing passed"),
    ("unknown status only", doc3([{"gpu_id": "0", "status": "Partial"}]),
     "dcgmi diag: 0 passed, 1 failed (memory on GPU 0: unrecognised dcgmi status 'Partial')"),
    ("fail among passes", doc4({"name": "memory", "results": [gpu(0), gpu(1, "Fail")]}),
     "dcgmi diag: 1 passed, 1 failed (memory on GPU 1)"),
    ("summary only, failing", doc4({"name": "memory", "test_summary": {"status": "Fail"}}),
     "dcgmi diag: 0 passed, 1 failed (memory)"),
    ("runtime error beside results", json.dumps({"DCGM Diagnostic": {
        "runtime_error": "Cuda context lost", "test_categories": [{"category": "Hardware",
        "tests": [{"name": "memory", "results": [gpu(0)]}]}]}}),
     "dcgmi diag: 1 passed, 1 failed (runtime_error: Cuda context lost)"),
]


@pytest.mark.parametrize(("text", "summary"), [(t, s) for _, t, s in NOT_PASSED],
                         ids=[name for name, _, _ in NOT_PASSED])
def test_readable_but_not_passed(text: str, summary: str) -> None:
    report = parse_dcgmi_json(text)
    assert report.passed is False
    assert report.summary() == summary


def test_over_max_bytes_is_refused_without_parsing() -> None:
    text = fixture("dcgm4_pass_8gpu.json")
    assert parse_dcgmi_json(text, max_bytes=len(text)).passed is True
    with pytest.raises(DiagUnparseable, match="over the 100-byte limit"):
        parse_dcgmi_json(text, max_bytes=100)
    # Multi-byte characters count as bytes, not characters.
    with pytest.raises(DiagUnparseable, match="limit"):
        parse_dcgmi_json(text + "é" * 10, max_bytes=len(text) + 15)
    with pytest.raises(DiagUnparseable, match="bytes, over the 100 limit"):
        parse_dcgmi_json(text.encode(), max_bytes=100)
    assert parse_dcgmi_json(text.encode()).passed is True


def test_not_text_is_unparseable() -> None:
    with pytest.raises(DiagUnparseable, match="is a NoneType, not text"):
        parse_dcgmi_json(None)  # type: ignore[arg-type]


def test_the_error_shows_a_short_excerpt() -> None:
    with pytest.raises(DiagUnparseable) as caught:
        parse_dcgmi_json("nonsense " * 10_000)
    message = str(caught.value)
    assert "'nonsense nonsense" in message and message.endswith("…")
    assert len(message) < 300


# --- the report -------------------------------------------------------------------------------


def test_summary_never_exceeds_its_limit_and_keeps_the_counts() -> None:
    long = "x" * 2000
    report = parse_dcgmi_json(doc4(
        {"name": "memory", "results": [gpu(g, "Fail", warnings=[{"warning": long, "error_id": g}])
                                       for g in range(8)]},
        {"name": "pcie", "results": [gpu(0, "Warn", warnings=[long]), gpu(1), gpu(2, "Skip")]}))
    assert all(len(r.message) <= 300 for r in report.results)
    assert report.results[0].message.endswith("…")
    for limit in (1, 20, 60, 120, 200, 600, 5000):
        assert len(report.summary(limit)) <= limit
    counts = "dcgmi diag: 1 passed, 8 failed"
    assert report.summary(200).startswith(counts + " (memory on GPU 0: error_id 0 - xxx")
    assert report.summary(200).endswith(", 1 warned, 1 skipped")  # counts survive the details
    assert "+5 more" not in report.summary(200)
    assert report.summary(5000).count("memory on GPU") == 3 and "+5 more" in report.summary(5000)
    assert report.summary(0) == ""


def test_gpus_seen() -> None:
    report = parse_dcgmi_json(doc4({"name": "memory", "results": [
        gpu(0), gpu(1), gpu(3, "Fail"), gpu(5, "Skip"), gpu(6), gpu(7),
        {"entity_group": "Switch", "entity_group_id": 3, "entity_id": 2, "status": "Pass"}]}))
    assert report.gpus_seen() == {"0", "1", "3", "5", "6", "7"}
    assert DiagReport(results=()).gpus_seen() == set()
    everything_passed = parse_dcgmi_json(doc4({"name": "memory", "results": [
        gpu(0), gpu(1), gpu(3), gpu(5), gpu(6), gpu(7)]}))
    assert everything_passed.summary() == "dcgmi diag: all 6 results passed on GPUs 0-1,3,5-7"


def test_an_empty_report_is_not_passed() -> None:
    assert DiagReport(results=()).passed is False


def test_models_are_frozen_and_strict() -> None:
    result = DiagResult(category="Hardware", test="memory", gpu="0", status="pass")
    with pytest.raises(ValidationError):
        result.status = "fail"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        DiagResult(category="H", test="m", gpu="0", status="ok")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        DiagResult(category="H", test="m", gpu="0", status="pass", extra=1)  # type: ignore[call-arg]
