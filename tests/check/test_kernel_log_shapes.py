"""The kernel log as real nodes write it: every format, NVLink5 lines, "fallen off the bus"
without an Xid line, and damaged input that must never be read as another GPU's XID.

The lines are written here from public descriptions of their shapes, not copied: each
constant names where its shape is documented.
"""

from __future__ import annotations

import json

import pytest

from policy.config import PolicySettings
from policy.models import Action, GpuReading, NodeReadings
from policy.rules import evaluate_node
from worker.probe.check import _event, attach_xids
from worker.probe.common import format_pci
from worker.probe.kernel_log import MAX_EVENTS, parse_kernel_log, read_log, read_xid_log_file

XID = "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
"""The Xid line layout of NVIDIA's "Xid Errors" guide ("NVRM: Xid (PCI:...): <n>, ...")."""

# util-linux dmesg(1): the default "[seconds.micros]" prefix, -T's ctime prefix and
# --time-format iso's "YYYY-MM-DDTHH:MM:SS,micros+zone".
DMESG = f"[ 5000.118734] {XID}\n"
DMESG_T = f"[Sun Dec  6 03:18:17 2026] {XID}\n"
DMESG_ISO = f"2026-12-06T03:18:17,118734+00:00 {XID}\n"
# journalctl(1) -o short-iso: "YYYY-MM-DDTHH:MM:SS+zone host kernel: message".
JOURNAL_ISO = f"2026-12-06T03:18:17+0000 gpu-node-07 kernel: {XID}\n"
# rsyslog's traditional file format (/var/log/kern.log), with and without the kernel's bracket.
SYSLOG = f"Dec  6 03:18:17 gpu-node-07 kernel: {XID}\n"
SYSLOG_BRACKET = f"Dec  6 03:18:17 gpu-node-07 kernel: [ 5000.118734] {XID}\n"
# The kernel's /dev/kmsg record format (Documentation/ABI/testing/dev-kmsg):
# "priority,sequence,microseconds,flags;message".
KMSG = f"3,18211,5000118734,-;{XID}\n"
# journalctl -o export (systemd's Journal Export Format): KEY=VALUE lines, records split by an
# empty line; timestamps in microseconds.
EXPORT = (
    "__CURSOR=s=1;i=2\n__REALTIME_TIMESTAMP=1796527097118734\n"
    "__MONOTONIC_TIMESTAMP=5000118734\n_TRANSPORT=kernel\nPRIORITY=3\n"
    f"MESSAGE={XID}\n\n"
    "__CURSOR=s=1;i=3\n__MONOTONIC_TIMESTAMP=5001000000\nMESSAGE=nvidia-modeset: ok\n\n"
)
# journalctl -o json: one object per line with the same field names.
JSON = json.dumps({"__MONOTONIC_TIMESTAMP": "5000118734", "MESSAGE": XID,
                   "_TRANSPORT": "kernel"}) + "\n"

FORMATS = {
    "dmesg": (DMESG, 5000.118734),
    "dmesg -T": (DMESG_T, 1796527097.0),
    "dmesg --time-format iso": (DMESG_ISO, 1796527097.118734),
    "journalctl -o short-iso": (JOURNAL_ISO, 1796527097.0),
    "syslog": (SYSLOG, None),  # a year-less wall clock; checked for its gaps below
    "syslog with kernel time": (SYSLOG_BRACKET, 5000.118734),
    "/dev/kmsg": (KMSG, 5000.118734),
    "journalctl -o export": (EXPORT, 5000.118734),
    "journalctl -o json": (JSON, 5000.118734),
}


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_log_format_reads_the_xid_and_its_time(name: str) -> None:
    text, at = FORMATS[name]
    xids = parse_kernel_log(text)
    assert [(format_pci(x.pci), x.xid) for x in xids] == [("00000000:18:00.0", 79)]
    if at is not None:
        assert xids[0].at_s == pytest.approx(at)


def test_syslog_lines_keep_their_spacing_without_a_year() -> None:
    text = SYSLOG + SYSLOG.replace("03:18:17", "03:21:17").replace("(PCI:0000:18", "(PCI:0000:2a")
    first, second = parse_kernel_log(text)
    assert first.at_s is not None and second.at_s is not None
    assert second.at_s - first.at_s == 180


def test_a_log_with_boot_times_does_not_mix_in_wall_clock_lines() -> None:
    log = read_log(SYSLOG + DMESG.replace("(PCI:0000:18", "(PCI:0000:2a"))
    assert [x.at_s for x in log.xids] == [None, pytest.approx(5000.118734)]
    assert log.last_s == pytest.approx(5000.118734)


# --- "fallen off the bus" without an Xid line (gpud's and NVSentinel's kernel-log tests
# describe both driver messages; both count as XID 79)
FALLEN_SHORT = "[  812.5] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.\n"
FALLEN_LONG = (
    "[  812.5] NVRM: The NVIDIA GPU 0000:3b:00.0 (PCI ID: 10de:2330) installed in this system "
    "has fallen off the bus and is not responding to commands.\n"
)


@pytest.mark.parametrize("text", [FALLEN_SHORT, FALLEN_LONG])
def test_fallen_off_the_bus_alone_is_xid_79(text: str) -> None:
    (x,) = parse_kernel_log(text)
    assert (format_pci(x.pci), x.xid, x.fallen_off) == ("00000000:3B:00.0", 79, True)
    readings, _ = attach_xids([], [_event(x)], PolicySettings(), 900.0)
    verdict = evaluate_node(NodeReadings(node="n", gpus=readings), PolicySettings())
    assert verdict.action == Action.REBOOT
    assert verdict.findings[0].gpu == "00000000:3B:00.0"


def test_fallen_off_the_bus_beside_its_xid_79_counts_once() -> None:
    text = "[  812.4] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
    assert len(parse_kernel_log(text + FALLEN_SHORT)) == 1


# --- NVLink5 (the line layout NVIDIA's catalog gives for WORKFLOW_NVLINK5_ERR)
def nvlink5(xid: int, unit: str, sev: str, intr: int, status: int, pci: str = "0018:01:00") -> str:
    return (f"[ 7000.1] NVRM: Xid (PCI:{pci}): {xid}, pid=1234, name=python3, {unit} {sev} XC0 "
            f"i0 Link 08 (0x{intr:08x} 0x{status:08x} 0x00000000 0x00000000 0x00000000 "
            "0x00000000)\n")


def verdict_of(text: str) -> tuple[Action, str, str]:
    config = PolicySettings()
    events = [_event(x) for x in parse_kernel_log(text)]
    gpu = GpuReading(gpu="0", uuid="GPU-a", pci_bus_id="00000018:01:00.0")
    readings, repeats = attach_xids([gpu], events, config, 8000.0)
    verdict = evaluate_node(NodeReadings(node="n", gpus=readings), config, xid_repeats=repeats)
    f = verdict.findings[0]
    return verdict.action, f.rule, f.detail


def test_a_non_fatal_xid_145_subcode_is_ignored_as_nvidia_decodes_it() -> None:
    action, rule, detail = verdict_of(nvlink5(145, "RLW_REMAP", "Nonfatal", 0x84, 0x100))
    assert (action, rule) == (Action.NONE, "xid-145-rlw-remap-ignore")
    assert "RLW_REMAP" in detail and "IGNORE" in detail and "Non-fatal" in detail


def test_a_fatal_xid_145_subcode_resets() -> None:
    action, rule, _ = verdict_of(nvlink5(145, "RLW_REMAP", "Fatal", 0x84, 0x40))
    assert (action, rule) == (Action.RESET, "xid-145-rlw-remap-reset-gpu")


def test_a_fatal_line_is_not_hidden_by_a_later_nonfatal_one_on_the_same_gpu() -> None:
    text = (nvlink5(144, "SAW_MVB", "Fatal", 0x21, 0x02)
            + nvlink5(144, "SAW_MVB", "Nonfatal", 0x21, 0x04))
    assert verdict_of(text)[:2] == (Action.RESET, "xid-144-saw-mvb-reset-gpu")


def test_an_xid_154_eval_subcode_restarts_the_app_without_a_recovery_action() -> None:
    action, rule, detail = verdict_of(nvlink5(145, "RLW_SRC_TRACK", "Nonfatal", 0x87, 0x04))
    assert (action, rule) == (Action.APP, "xid-145-rlw-src-track-xid-154-eval")
    assert "application restarts" in detail


def test_a_link_down_is_decoded_by_its_reason() -> None:
    # NETIR_LINK_EVT: the reason in intrInfo bits 25:20; 38 is the sheet's IGNORE row.
    assert verdict_of(nvlink5(149, "NETIR_LINK_EVT", "Fatal", (38 << 20) | 0x11, 0))[:2] == (
        Action.NONE, "xid-149-netir-link-evt-ignore")
    assert verdict_of(nvlink5(149, "NETIR_LINK_EVT", "Fatal", (4 << 20) | 0x11, 0))[:2] == (
        Action.RESET, "xid-149-netir-link-evt-reset-gpu")


def test_an_undecodable_nvlink5_line_keeps_the_catalog_fallback() -> None:
    action, rule, detail = verdict_of(nvlink5(145, "RLW_FUTURE_UNIT", "Nonfatal", 0x1, 0x1))
    assert (action, rule) == (Action.RESET, "xid-145-undecoded")
    assert "RLW_FUTURE_UNIT" in detail
    # A 145 line cut before its registers: no decode, the fallback, never "ignore".
    cut = "[ 7000.1] NVRM: Xid (PCI:0018:01:00): 145, RLW_REMAP Nonf\n"
    assert verdict_of(cut)[0] == Action.RESET


# --- damaged lines never speak for another GPU
def test_a_line_cut_inside_the_xid_number_is_not_another_xid() -> None:
    # "79" cut to "7" would read as XID 7 (contact support) without the comma check.
    log = read_log("[ 10.0] NVRM: Xid (PCI:0000:18:00): 7\n")
    assert log.xids == [] and log.damaged == 1


def test_a_line_cut_inside_the_address_names_no_gpu() -> None:
    log = read_log("[ 10.0] NVRM: Xid (PCI:0000:1): 79, pid=1, x\n")
    assert log.xids == [] and log.damaged == 1


def test_interleaved_writes_are_refused_whole() -> None:
    # Two printk writes spliced into one line: neither address can be trusted with the XID.
    line = "[ 10.0] NVRM: Xid (PCI:0000:18:NVRM: Xid (PCI:0000:3b:00): 79, pid=1, x\n"
    log = read_log(line)
    assert log.xids == [] and log.damaged == 1


def test_repeats_are_one_event_and_the_count_is_bounded() -> None:
    line = "[ 10.0] NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, Graphics Exception\n"
    log = read_log(line * 100_000)
    assert len(log.xids) == 1
    distinct = "".join(
        f"[ {i}.0] NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, Graphics Exception\n"
        for i in range(MAX_EVENTS + 50))
    assert len(parse_kernel_log(distinct)) == MAX_EVENTS


def test_a_saved_log_reports_its_end_on_the_xids_clock() -> None:
    _, last = read_xid_log_file(DMESG_T + "[Sun Dec  6 03:19:17 2026] nvidia: still here\n")
    assert last == pytest.approx(1796527157.0)


# --- nvidia-smi XML of a pre-Ampere GPU from a newer driver: <remapped_rows> printed as N/A
# (the facts in NVIDIA's nvidia-smi documentation and netdata issue 10362's XML samples:
# Volta has no row remapper and keeps its retirements in <retired_pages>).
def test_pre_ampere_retired_pages_are_read_whatever_remapped_rows_says() -> None:
    from pathlib import Path

    from worker.probe.smi import parse_nvidia_smi_xml

    xml = (Path(__file__).parent / "fixtures" / "v100_retired_pages.xml").read_text()
    na = "<remapped_rows>N/A</remapped_rows>\n\t\t<retired_pages>"
    newer = xml.replace("<retired_pages>", na)
    assert newer.count("<remapped_rows>N/A") == 2
    for text in (xml, newer):
        gpus = parse_nvidia_smi_xml(text).gpus
        assert [g.retired_pages is not None for g in gpus] == [True, True]
        assert gpus[1].retired_pages is not None and gpus[1].retired_pages.pending


# --- the table docs/check.md prints as "Kernel-log shapes and their verdicts"
KLOG_SHAPES: tuple[tuple[str, str, str], ...] = (
    ("dmesg, Xid 79", DMESG, "reboot:xid-79-restart-bm"),
    ("dmesg -T, Xid 79", DMESG_T, "reboot:xid-79-restart-bm"),
    ("journalctl -o export, Xid 79", EXPORT, "reboot:xid-79-restart-bm"),
    ("fallen off the bus, no Xid line", FALLEN_SHORT, "reboot:xid-79-restart-bm"),
    ("XID 145 RLW_REMAP status 0x100 (Nonfatal)",
     nvlink5(145, "RLW_REMAP", "Nonfatal", 0x84, 0x100, pci="0000:18:00"),
     "none:xid-145-rlw-remap-ignore"),
    ("XID 145 RLW_REMAP status 0x40 (Fatal)",
     nvlink5(145, "RLW_REMAP", "Fatal", 0x84, 0x40, pci="0000:18:00"),
     "reset:xid-145-rlw-remap-reset-gpu"),
    ("XID 145 RLW_SRC_TRACK status 0x4, no XID 154",
     nvlink5(145, "RLW_SRC_TRACK", "Nonfatal", 0x87, 0x4, pci="0000:18:00"),
     "app:xid-145-rlw-src-track-xid-154-eval"),
    ("XID 149 NETIR_LINK_EVT reason 38",
     nvlink5(149, "NETIR_LINK_EVT", "Fatal", (38 << 20) | 0x11, 0, pci="0000:18:00"),
     "none:xid-149-netir-link-evt-ignore"),
    ("XID 145, unit not in the decode sheet",
     nvlink5(145, "RLW_FUTURE_UNIT", "Nonfatal", 1, 1, pci="0000:18:00"),
     "reset:xid-145-undecoded"),
    ("Xid line cut inside the number", "[ 10.0] NVRM: Xid (PCI:0000:18:00): 7\n", "nothing"),
    ("two messages spliced into one line",
     "[ 10.0] NVRM: Xid (PCI:0000:18:NVRM: Xid (PCI:0000:3b:00): 79, pid=1, x\n", "nothing"),
)


def klog_verdict(text: str) -> str:
    events = [_event(x) for x in parse_kernel_log(text)]
    if not events:
        return "nothing"
    gpu = GpuReading(gpu="0", uuid="GPU-a", pci_bus_id="00000000:18:00.0")
    readings, repeats = attach_xids([gpu], events, PolicySettings(), 8000.0)
    verdict = evaluate_node(NodeReadings(node="n", gpus=readings), PolicySettings(),
                            xid_repeats=repeats)
    return f"{verdict.action.value}:{verdict.findings[0].rule}"


@pytest.mark.parametrize(("name", "text", "expect"), KLOG_SHAPES, ids=[s[0] for s in KLOG_SHAPES])
def test_each_kernel_log_shape_gets_its_verdict(name: str, text: str, expect: str) -> None:
    assert klog_verdict(text) == expect


def test_the_docs_kernel_log_table_is_this_table() -> None:
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "check.md").read_text()
    section = doc.split("### Kernel-log shapes and their verdicts")[1].split("\n## ")[0]
    rows = re.findall(r"^\| ([^|]+?) \| `([^`]+)` \|$", section, re.M)
    assert rows == [(name, expect) for name, _, expect in KLOG_SHAPES]
