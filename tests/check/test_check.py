"""``gpu-remediate check``: verdicts, exit codes, XIDs and the JSON contract of ``evaluate``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import pytest

from policy.config import PolicySettings
from tests.check.fake_nvml import H100_UUIDS, FakeNvml, fixture_states, h100, pynvml
from worker.probe.check import CheckEnv, run_check
from worker.probe.common import CommandResult
from worker.probe.evaluate import evaluate_sources
from worker.probe.nvml import load_pynvml
from worker.probe.smi import parse_nvidia_smi_xml

FIXTURES = Path(__file__).parent / "fixtures"
STATES = dict(fixture_states())
DMESG_DENIED = CommandResult(1, "", "dmesg: read kernel buffer failed: Operation not permitted\n")


def machine(
    *,
    xml: str | None = None,
    smi_rc: int = 0,
    dmesg: str | None = None,
    nvml: Any = None,
    driver_loaded: bool = False,
    calls: list[str] | None = None,
) -> CheckEnv:
    """A fake machine: ``xml`` is what ``nvidia-smi -q -x`` prints (None: not installed),
    ``dmesg`` the kernel log (None: not permitted), ``nvml`` the binding (None: not installed)."""

    def run(argv: Sequence[str], timeout: float) -> CommandResult:
        if calls is not None:
            calls.append(argv[0])
        if argv[0] == "nvidia-smi":
            if xml is None:
                raise FileNotFoundError("nvidia-smi")
            return CommandResult(smi_rc, xml, "")
        if argv[0] == "dmesg":
            return DMESG_DENIED if dmesg is None else CommandResult(0, dmesg, "")
        if argv[0] == "journalctl":
            return CommandResult(0, "", "")
        raise FileNotFoundError(argv[0])

    return CheckEnv(
        load_nvml=lambda: nvml,
        run=run,
        hostname=lambda: "gpu-node-07",
        environ={},
        uptime_s=lambda: 100_000.0,
        driver_loaded=lambda: driver_loaded,
    )


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def check(
    capsys: pytest.CaptureFixture[str],
    env: CheckEnv,
    *,
    output: Literal["json", "table"] = "json",
    xid_source: str = "dmesg",
    xid_wait: float = 0.0,
    probe: str | None = None,
    node: str | None = None,
    config_path: Path | None = None,
) -> tuple[int, Any, str]:
    if probe is None:  # auto, unless there is no binding: then say nvidia-smi (no "missing" note)
        probe = "auto" if env.load_nvml() is not None else "nvidia-smi"
    code = run_check(
        node=node,
        config_path=config_path,
        output=output,
        xid_source=xid_source,
        xid_wait=xid_wait,
        probe=probe,
        env=env,
    )
    captured = capsys.readouterr()
    if output == "json" and captured.out.strip():
        lines = [line for line in captured.out.splitlines() if line.strip()]
        assert len(lines) == 1, captured.out
        return code, json.loads(lines[0]), captured.err
    return code, captured.out, captured.err


VERDICTS = [
    ("h100x8_healthy.xml", "none", set(), 0),
    (
        "h100_remap_pending_dbe.xml",
        "reset",
        {("1", "ecc-dbe-volatile"), ("1", "row-remap-pending")},
        3,
    ),
    (
        "h100_hot_hw_thermal.xml",
        "thermal",
        {("1", "gpu-temp-over-87"), ("1", "clock-sw-thermal"), ("1", "clock-hw-thermal")},
        2,
    ),
    ("a100_remap_failure.xml", "quarantine", {("1", "row-remap-failure")}, 4),
    ("h100_mig_na.xml", "none", set(), 0),
    ("v100_retired_pages.xml", "reset", {("1", "ecc-dbe-volatile")}, 3),
]


@pytest.mark.parametrize("probe", ["nvidia-smi", "nvml"])
@pytest.mark.parametrize(
    ("name", "action", "rules", "exit_code"), VERDICTS, ids=[v[0] for v in VERDICTS]
)
def test_verdict_of_each_recorded_machine(
    capsys: pytest.CaptureFixture[str],
    probe: str,
    name: str,
    action: str,
    rules: set[tuple[str, str]],
    exit_code: int,
) -> None:
    if probe == "nvml":
        env = machine(nvml=FakeNvml(STATES[name]), dmesg="[ 1.0] Linux version 6.8\n")
    else:
        env = machine(xml=fixture(name), dmesg="[ 1.0] Linux version 6.8\n")
    code, report, err = check(capsys, env, probe=probe)
    assert code == exit_code, err
    (node,) = report["nodes"]
    assert node["node"] == "gpu-node-07"
    assert node["action"] == action
    assert {(f["gpu"], f["rule"]) for f in node["findings"]} == rules
    assert report["errors"] == []


def test_notes_for_mig_and_retired_pages(capsys: pytest.CaptureFixture[str]) -> None:
    _, _, err = check(capsys, machine(xml=fixture("h100_mig_na.xml"), dmesg="x\n"))
    assert "MIG is enabled" in err
    _, _, err = check(capsys, machine(xml=fixture("v100_retired_pages.xml"), dmesg="x\n"))
    assert "GPU 1: 3 page(s) retired" in err and "pending retirement: yes" in err


def test_json_is_exactly_what_evaluate_prints_for_the_same_gpus(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The same GPU state as a dcgm-exporter payload through ``evaluate`` gives the same JSON."""
    code, report, _ = check(capsys, machine(xml=fixture("h100_remap_pending_dbe.xml"), dmesg="x\n"))
    assert code == 3
    assert set(report) == {"nodes", "errors", "warnings", "blind"}
    assert set(report["nodes"][0]) == {"node", "action", "findings"}
    for finding in report["nodes"][0]["findings"]:
        assert set(finding) == {"gpu", "uuid", "serial", "signal", "value", "rule", "action",
                                "detail"}

    metric = {
        "gpu_temp": "DCGM_FI_DEV_GPU_TEMP",
        "memory_temp": "DCGM_FI_DEV_MEMORY_TEMP",
        "ecc_dbe_volatile": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "ecc_sbe_volatile": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "row_remap_pending": "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "row_remap_failure": "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "uncorrectable_remapped_rows": "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "clock_event_reasons": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "recovery_action": "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION",
    }
    lines = []
    for probed in parse_nvidia_smi_xml(fixture("h100_remap_pending_dbe.xml")).gpus:
        r = probed.reading
        labels = (
            f'gpu="{r.gpu}",UUID="{r.uuid}",pci_bus_id="{r.pci_bus_id}",'
            f'modelName="{r.model_name}",Hostname="gpu-node-07"'
        )
        for attr, name in metric.items():
            value = getattr(r, attr)
            if value is not None:
                lines.append(f"{name}{{{labels}}} {value:g}")
    payload = tmp_path / "metrics.prom"
    payload.write_text("\n".join(lines) + "\n")
    expected = evaluate_sources([str(payload)], node=None, config=PolicySettings())
    # The one difference: the payload lacks the windowed XID count, which evaluate lists as a
    # blind rule; check reads the GPUs directly and the kernel log for XIDs.
    assert [(b.signal, b.missing) for b in expected.blind] == [
        ("repeat-xid", ["DCGM_EXP_XID_ERRORS_COUNT"])]
    assert report == json.loads(expected.model_copy(update={"blind": []}).model_dump_json())


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = check(
        capsys,
        machine(xml=fixture("a100_remap_failure.xml"), dmesg="x\n"),
        output="table",
        node="a100-node-3",
    )
    assert code == 4
    assert "GPU node health" in out and "a100-node-3" in out
    assert "row-remap-failure" in out and "quarantine" in out


@pytest.mark.parametrize(
    "env",
    [
        pytest.param(
            machine(nvml=FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)),
            id="nvml-library-not-found",
        ),
        pytest.param(
            machine(nvml=FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)),
            id="nvml-driver-not-loaded",
        ),
        pytest.param(machine(nvml=None), id="no-binding-no-nvidia-smi"),
        pytest.param(
            machine(
                nvml=None,
                smi_rc=9,
                xml=(
                    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                    "Make sure that the latest NVIDIA driver is installed and running.\n"
                ),
            ),
            id="nvidia-smi-exit-9",
        ),
    ],
)
def test_no_driver_exits_11_and_says_so(capsys: pytest.CaptureFixture[str], env: CheckEnv) -> None:
    code, report, err = check(capsys, env, probe="auto")
    assert code == 11
    assert "error: no NVIDIA driver found on this machine" in err
    assert report["nodes"] == []
    assert {e["source"] for e in report["errors"]} == {"nvml", "nvidia-smi"}
    code, out, err = check(capsys, env, output="table", probe="auto")
    assert code == 11 and out == "" and "no NVIDIA driver" in err


def test_no_gpu_exits_11(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = check(capsys, machine(nvml=FakeNvml([])))
    assert code == 11 and "no NVIDIA GPU found" in err
    code, _, err = check(capsys, machine(xml="No devices were found\n", smi_rc=6))
    assert code == 11 and "no NVIDIA GPU found" in err


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia/version"), reason="a driver is loaded")
def test_no_driver_with_the_real_binding(capsys: pytest.CaptureFixture[str]) -> None:
    env = machine(nvml=load_pynvml())
    if env.load_nvml() is None:
        pytest.skip("nvidia-ml-py not installed")
    code, _report, err = check(capsys, env)
    assert code == 11, err
    assert "NVML Shared Library Not Found" in err or "Driver Not Loaded" in err


def test_loaded_driver_without_a_usable_probe_is_not_no_driver(
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = machine(nvml=FakeNvml([], init_error=pynvml.NVML_ERROR_NO_PERMISSION), driver_loaded=True)
    code, _, err = check(capsys, env)
    assert code == 10 and "although the NVIDIA driver is loaded" in err


def test_missing_binding_falls_back_to_nvidia_smi(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    assert load_pynvml() is None
    env = machine(nvml=load_pynvml(), xml=fixture("h100x8_healthy.xml"), dmesg="x\n")
    code, report, _ = check(capsys, env, probe="auto")
    assert code == 0  # the fallback worked: a note, not a failure
    assert report["errors"] == [
        {
            "source": "nvml",
            "message": "nvidia-ml-py (pynvml) is not installed: pip install 'gpu-remediate[gpu]'",
        }
    ]
    code, _, err = check(capsys, env, probe="nvml")
    assert code == 64 and "nvidia-ml-py" in err


def test_nvml_failure_falls_back_to_nvidia_smi(capsys: pytest.CaptureFixture[str]) -> None:
    env = machine(
        nvml=FakeNvml([], init_error=pynvml.NVML_ERROR_NO_PERMISSION),
        xml=fixture("h100_hot_hw_thermal.xml"),
        dmesg="x\n",
    )
    code, report, _ = check(capsys, env)
    assert code == 2 and report["nodes"][0]["action"] == "thermal"
    assert report["errors"][0]["source"] == "nvml"


def test_auto_prefers_nvml_and_does_not_run_nvidia_smi(capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[str] = []
    env = machine(
        nvml=FakeNvml(STATES["h100x8_healthy.xml"]), xml="<broken", dmesg="x\n", calls=calls
    )
    code, _, _ = check(capsys, env)
    assert code == 0 and "nvidia-smi" not in calls


def test_xid_from_the_kernel_log(capsys: pytest.CaptureFixture[str]) -> None:
    env = machine(xml=fixture("h100x8_healthy.xml"), dmesg=fixture("dmesg_xid.txt"))
    code, report, _ = check(capsys, env)
    assert code == 3
    node = report["nodes"][0]
    assert node["action"] == "reboot"
    xid = {f["gpu"]: f for f in node["findings"]}
    assert xid["4"] == {
        "gpu": "4",
        "uuid": H100_UUIDS[4],
        "serial": "",
        "signal": "DCGM_FI_DEV_XID_ERRORS",
        "value": 79.0,
        "rule": "xid-79-restart-bm",
        "action": "reboot",
        "detail": "",
    }
    # XID 31 in two bursts (an hour apart) within the day on GPU 1: the policy's app-XID
    # escalation, which asks for a deeper diagnostic rather than a reset.
    assert (xid["1"]["rule"], xid["1"]["action"]) == ("xid-31-repeated", "diagnose")
    assert (xid["0"]["rule"], xid["0"]["action"]) == ("xid-13-restart-app", "app")


def test_most_severe_xid_wins_over_a_later_harmless_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = (
        "[ 10.0] NVRM: Xid (PCI:0000:18:00): 95, pid=1, name=x, Uncontained: FBHUB.\n"
        "[ 20.0] NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, Graphics Exception\n"
    )
    code, report, _ = check(capsys, machine(xml=fixture("h100x8_healthy.xml"), dmesg=log))
    assert code == 3 and report["nodes"][0]["findings"][0]["rule"] == "xid-95-reset-gpu"


def test_xid_of_a_gpu_that_fell_off_the_bus(capsys: pytest.CaptureFixture[str]) -> None:
    states = [h100(i) for i in range(8)]
    states[4].lost = True
    states[4].errors["handle"] = pynvml.NVML_ERROR_GPU_IS_LOST
    env = machine(nvml=FakeNvml(states), dmesg=fixture("dmesg_xid.txt"))
    code, report, _err = check(capsys, env)
    # A lost GPU makes the check incomplete: 10 outranks the reboot the readable part shows.
    assert code == 10 and report["nodes"][0]["action"] == "reboot"
    finding = report["nodes"][0]["findings"][0]
    assert (finding["gpu"], finding["rule"]) == ("00000000:9A:00.0", "xid-79-restart-bm")
    assert {"source": "nvml:gpu 4", "message": "GPU is lost (fallen off the bus?)"} in (
        report["errors"]
    )


def test_unreadable_kernel_log_does_not_fail_the_check(capsys: pytest.CaptureFixture[str]) -> None:
    code, report, _ = check(capsys, machine(xml=fixture("h100x8_healthy.xml")))
    assert code == 0
    (error,) = report["errors"]
    assert error["source"] == "xid:kernel-log" and "Operation not permitted" in error["message"]


def test_xid_source_nvml(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeNvml([h100(i) for i in range(3)], xid_events=[(2, 48)])
    code, report, _ = check(capsys, machine(nvml=fake), xid_source="nvml", xid_wait=0.2)
    assert code == 3
    finding = report["nodes"][0]["findings"][0]
    assert (finding["gpu"], finding["rule"], finding["action"]) == (
        "2",
        "xid-48-workflow-xid-48",
        "reset",
    )
    assert report["errors"] == []

    fake = FakeNvml([h100(0)], xid_events=[(0, 48)])
    code, report, _ = check(capsys, machine(nvml=fake), xid_source="nvml", xid_wait=0)
    assert code == 0 and "nvmlEventSetCreate" not in fake.calls
    assert "--xid-wait is 0" in report["errors"][0]["message"]


def test_xid_source_none_reads_no_log(capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[str] = []
    env = machine(xml=fixture("h100x8_healthy.xml"), dmesg=fixture("dmesg_xid.txt"), calls=calls)
    code, report, _ = check(capsys, env, xid_source="none")
    assert code == 0 and report["errors"] == [] and calls == ["nvidia-smi"]


def test_recovery_action_from_nvml(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeNvml([h100(0, recovery=pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT)])
    code, report, _ = check(capsys, machine(nvml=fake), xid_source="none")
    finding = report["nodes"][0]["findings"][0]
    assert code == 3 and finding["signal"] == "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"
    assert finding["action"] == "reboot" and finding["value"] == 2.0


def test_a_field_that_errored_makes_the_check_incomplete(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = FakeNvml([h100(0, errors={"nvmlDeviceGetRemappedRows": pynvml.NVML_ERROR_UNKNOWN})])
    code, report, err = check(capsys, machine(nvml=fake), xid_source="none")
    assert code == 10 and report["nodes"][0]["action"] == "none"
    assert report["errors"][0]["source"] == "nvml:gpu 0"
    assert "incomplete" in err


def test_node_name_order(capsys: pytest.CaptureFixture[str]) -> None:
    env = machine(xml=fixture("h100_mig_na.xml"))
    env.environ = {"NODE_NAME": "k8s-node-a"}
    _, report, _ = check(capsys, env, xid_source="none")
    assert report["nodes"][0]["node"] == "k8s-node-a"
    _, report, _ = check(capsys, env, xid_source="none", node="explicit")
    assert report["nodes"][0]["node"] == "explicit"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"probe": "dcgm"}, "--probe"),
        ({"xid_source": "syslog"}, "--xid-source"),
        ({"xid_wait": -1.0}, "--xid-wait"),
        ({"output": "yaml"}, "--output"),
    ],
)
def test_bad_usage_exits_64(
    capsys: pytest.CaptureFixture[str], kwargs: dict[str, Any], message: str
) -> None:
    args: dict[str, Any] = {
        "node": None,
        "config_path": None,
        "output": "json",
        "xid_source": "dmesg",
        "xid_wait": 0.0,
        "probe": "auto",
        "env": machine(xml=fixture("h100x8_healthy.xml")),
    }
    args.update(kwargs)
    assert run_check(**args) == 64
    assert message in capsys.readouterr().err


def test_config_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy:\n  ecc_dbe_action: explode\n")
    env = machine(xml=fixture("h100_remap_pending_dbe.xml"))
    code, _, err = check(capsys, env, config_path=bad)
    assert code == 64 and "ecc_dbe_action" in err
    good = tmp_path / "good.yaml"
    good.write_text("policy:\n  row_remap_pending_action: reboot\n")
    code, report, _ = check(capsys, env, config_path=good, xid_source="none")
    assert code == 3 and report["nodes"][0]["action"] == "reboot"


def test_the_binding_is_imported_lazily() -> None:
    probe: Callable[..., Any] = subprocess.run
    done = probe(
        [
            sys.executable,
            "-c",
            "import sys, worker.probe.check, worker.probe; assert 'pynvml' not in sys.modules",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
