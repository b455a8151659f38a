"""``check`` without touching the GPUs: ``--from-file`` (a saved ``nvidia-smi -q -x``),
``--xid-log`` (a saved kernel log), ``--nvidia-smi PATH``, and the severity exit codes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.check.fake_nvml import FakeNvml, fixture_states
from worker.probe.check import CheckEnv, run_check
from worker.probe.common import CommandResult
from worker.probe.exit_codes import EXIT_BY_ACTION, EXIT_CODES
from worker.probe.kernel_log import parse_kernel_log, read_xid_log_file

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[2]


def nothing_local(calls: list[Sequence[str]]) -> CheckEnv:
    """A machine whose every tool records its call and fails: an offline check runs none."""

    def run(argv: Sequence[str], timeout: float) -> CommandResult:
        calls.append(argv)
        raise FileNotFoundError(argv[0])

    return CheckEnv(
        load_nvml=lambda: FakeNvml(dict(fixture_states())["h100x8_healthy.xml"]),
        run=run,
        hostname=lambda: "this-host",
        environ={},
        uptime_s=lambda: 10.0,
        driver_loaded=lambda: False,
    )


def check(
    capsys: pytest.CaptureFixture[str], env: CheckEnv, **options: Any
) -> tuple[int, Any, str]:
    args: dict[str, Any] = {"node": None, "config_path": None, "output": "json",
                            "xid_source": None, "xid_wait": 0.0, "probe": "auto", "env": env}
    args.update(options)
    code = run_check(**args)
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else None, err


def test_from_file_reads_the_saved_xml_and_touches_nothing_local(
    capsys: pytest.CaptureFixture[str],
) -> None:
    calls: list[Sequence[str]] = []
    code, report, err = check(capsys, nothing_local(calls),
                              from_file=str(FIXTURES / "a100_remap_failure.xml"))
    assert code == 4, err
    (node,) = report["nodes"]
    assert node["node"] == "a100_remap_failure.xml"  # the file's, not this host's
    assert node["action"] == "quarantine"
    assert report["errors"] == []
    assert calls == []  # no nvidia-smi, no dmesg: the kernel log here is not the file's


def test_from_file_with_xid_log_escalates_on_the_logs_own_clock(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, report, _ = check(capsys, nothing_local([]), node="gpu-node-07",
                            from_file=str(FIXTURES / "h100x8_healthy.xml"),
                            xid_log=str(FIXTURES / "dmesg_xid.txt"))
    assert code == 3
    node = report["nodes"][0]
    assert node["node"] == "gpu-node-07" and node["action"] == "reboot"
    rules = {f["gpu"]: f["rule"] for f in node["findings"]}
    # The log ends at 99001 s; the two XID 31 at 91234 s and 95012 s lie within the day
    # before it, although this machine has been up 10 s.
    assert rules["1"] == "xid-31-repeated"
    assert rules["4"] == "xid-79-restart-bm"


def test_xid_log_on_a_live_probe_reads_the_file_not_dmesg(
    capsys: pytest.CaptureFixture[str],
) -> None:
    calls: list[str] = []
    xml = (FIXTURES / "h100x8_healthy.xml").read_text()

    def run(argv: Sequence[str], timeout: float) -> CommandResult:
        calls.append(argv[0])
        if argv[0] == "nvidia-smi":
            return CommandResult(0, xml, "")
        raise AssertionError(f"{argv[0]} must not run with --xid-log")

    env = CheckEnv(load_nvml=lambda: None, run=run, hostname=lambda: "gpu-node-07", environ={},
                   uptime_s=lambda: 5000.0, driver_loaded=lambda: True)
    code, report, _ = check(capsys, env, probe="nvidia-smi",
                            xid_log=str(FIXTURES / "kern_log_xid.txt"))
    assert calls == ["nvidia-smi"]
    assert code == 3
    findings = {f["gpu"]: (f["value"], f["action"]) for f in report["nodes"][0]["findings"]}
    assert findings == {"0": (13.0, "app"), "1": (31.0, "app"), "2": (48.0, "reset")}


def test_kern_log_lines_keep_their_boot_timestamps() -> None:
    text = (FIXTURES / "kern_log_xid.txt").read_text()
    assert [(x.xid, x.at_s) for x in parse_kernel_log(text)] == [
        (13, 72.118734), (31, 139.551020), (48, 2143.004417)]
    _, last = read_xid_log_file(text)
    assert last == pytest.approx(2144.1002)  # any line's timestamp, Xid or not
    assert read_xid_log_file("Mar 11 kernel: NVRM: Xid (PCI:0000:18:00): 79, x\n")[1] is None


def test_app_xids_exit_0_and_an_unknown_xid_exits_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = tmp_path / "app.log"
    log.write_text("[ 50.0] NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, Graphics Exception\n")
    code, report, _ = check(capsys, nothing_local([]),
                            from_file=str(FIXTURES / "h100x8_healthy.xml"), xid_log=str(log))
    assert code == 0 and report["nodes"][0]["action"] == "app"
    # An XID no catalog lists: a human should look (the original's "watch").
    log.write_text("[ 50.0] NVRM: Xid (PCI:0000:18:00): 999, pid=1, name=x, ?\n")
    code, report, _ = check(capsys, nothing_local([]),
                            from_file=str(FIXTURES / "h100x8_healthy.xml"), xid_log=str(log))
    assert code == 1 and report["nodes"][0]["action"] == "alert"


def test_from_file_on_stdin(capsys: pytest.CaptureFixture[str],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(
        (FIXTURES / "h100_hot_hw_thermal.xml").read_text()))
    env = nothing_local([])
    env.read_text = CheckEnv().read_text
    code, report, _ = check(capsys, env, from_file="-")
    assert code == 2 and report["nodes"][0]["node"] == "stdin"


@pytest.mark.parametrize(("options", "message"), [
    ({"from_file": "/nonexistent/saved.xml"}, "--from-file /nonexistent/saved.xml: cannot read"),
    ({"from_file": str(FIXTURES / "dmesg_xid.txt")}, "is not XML"),
    ({"from_file": str(FIXTURES / "h100x8_healthy.xml"),
      "xid_log": "/nonexistent/kern.log"}, "--xid-log /nonexistent/kern.log: cannot read"),
    ({"from_file": str(FIXTURES / "h100x8_healthy.xml"), "xid_source": "dmesg"},
     "--xid-source dmesg reads this machine"),
    ({"from_file": str(FIXTURES / "h100x8_healthy.xml"), "probe": "nvml"}, "drop --probe nvml"),
    ({"from_file": str(FIXTURES / "h100x8_healthy.xml"), "nvidia_smi": "/usr/bin/nvidia-smi"},
     "--from-file and --nvidia-smi"),
    ({"nvidia_smi": "/usr/bin/nvidia-smi", "probe": "nvml"}, "--nvidia-smi and --probe nvml"),
    ({"xid_log": str(FIXTURES / "dmesg_xid.txt"), "xid_source": "nvml"},
     "--xid-log and --xid-source nvml"),
])
def test_conflicting_or_unreadable_inputs_exit_64_naming_them(
    capsys: pytest.CaptureFixture[str], options: dict[str, Any], message: str,
) -> None:
    code, report, err = check(capsys, nothing_local([]), **options)
    assert code == 64 and report is None
    assert message in err


def test_nvidia_smi_path_is_run_and_a_missing_one_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ran: list[str] = []
    xml = (FIXTURES / "h100_remap_pending_dbe.xml").read_text()

    def run(argv: Sequence[str], timeout: float) -> CommandResult:
        ran.append(argv[0])
        if argv[0] == "/opt/nvidia/bin/nvidia-smi":
            return CommandResult(0, xml, "")
        if argv[0] == "dmesg":
            return CommandResult(0, "[ 1.0] Linux\n", "")
        raise FileNotFoundError(argv[0])

    nvml = FakeNvml(dict(fixture_states())["h100x8_healthy.xml"])
    env = CheckEnv(load_nvml=lambda: nvml, run=run, hostname=lambda: "n", environ={},
                   uptime_s=lambda: 10.0, driver_loaded=lambda: True)
    code, report, _ = check(capsys, env, nvidia_smi="/opt/nvidia/bin/nvidia-smi")
    # NVML would have said healthy: the path given means nvidia-smi is the probe.
    assert code == 3 and report["nodes"][0]["action"] == "reset"
    assert ran[0] == "/opt/nvidia/bin/nvidia-smi"
    code, _, err = check(capsys, env, nvidia_smi="/opt/typo/nvidia-smi")
    assert code == 64 and "--nvidia-smi /opt/typo/nvidia-smi" in err and "no such file" in err


def test_exit_codes_grow_with_severity() -> None:
    from policy.models import SEVERITY

    assert set(EXIT_BY_ACTION) == set(SEVERITY)  # every verdict has a code
    by_severity = sorted(EXIT_BY_ACTION, key=lambda a: SEVERITY[a])
    codes = [EXIT_BY_ACTION[a] for a in by_severity]
    assert codes == sorted(codes) and codes[0] == 0 and codes[-1] == 4
    assert len({c for c, _ in EXIT_CODES}) == len(EXIT_CODES)


def test_docs_and_help_list_every_exit_code() -> None:
    doc = (REPO / "docs" / "check.md").read_text()
    table = dict(re.findall(r"^\| (\d+) \| (.+?) \|$", doc, re.M))
    assert {int(c) for c in table} == {c for c, _ in EXIT_CODES}
    done = subprocess.run([sys.executable, "-m", "worker", "check", "--help"],
                          capture_output=True, text=True, check=False, cwd=REPO,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    for code, meaning in EXIT_CODES:
        assert f"{code} {meaning}" in done.stdout


def test_option_parse_errors_exit_64_not_2() -> None:
    """2 means thermal: click's own usage code must not reach a script."""
    done = subprocess.run([sys.executable, "-m", "worker", "check", "--no-such-option"],
                          capture_output=True, text=True, check=False, cwd=REPO)
    assert done.returncode == 64, done.stderr


def test_the_command_line_wires_the_offline_options() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "worker", "check", "-o", "json", "--node", "gpu-node-07",
         "--from-file", str(FIXTURES / "h100x8_healthy.xml"),
         "--xid-log", str(FIXTURES / "kern_log_xid.txt")],
        capture_output=True, text=True, check=False, cwd=REPO)
    assert done.returncode == 3, done.stderr
    (node,) = json.loads(done.stdout)["nodes"]
    assert node["node"] == "gpu-node-07" and node["action"] == "reset"
