"""nvidia-smi XML and kernel-log parsing, value helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.probe.common import (
    CommandResult,
    NoDriverError,
    ProbeUnavailable,
    format_pci,
    pci_key,
    recovery_action_code,
)
from worker.probe.kernel_log import parse_kernel_log, read_kernel_log
from worker.probe.smi import parse_nvidia_smi_xml, probe_nvidia_smi

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_healthy_h100_fixture_reads_every_field() -> None:
    result = parse_nvidia_smi_xml(fixture("h100x8_healthy.xml"))
    assert result.driver_version == "570.124.06"
    assert not result.issues
    assert [g.reading.gpu for g in result.gpus] == [str(i) for i in range(8)]
    first = result.gpus[0].reading
    assert first.uuid == "GPU-5c2a9f3e-1b7d-4e0a-9c61-2f8d3a7b4e10"
    assert first.model_name == "NVIDIA H100 80GB HBM3"
    assert first.pci_bus_id == "00000000:18:00.0"
    assert (first.gpu_temp, first.memory_temp) == (31.0, 38.0)
    assert (first.ecc_dbe_volatile, first.row_remap_pending, first.row_remap_failure) == (0, 0, 0)
    assert first.clock_event_reasons == 0x1  # gpu_idle: normal
    assert first.recovery_action == 0
    assert result.gpus[0].mig_enabled is False


def test_square_bracket_na_reads_as_absent() -> None:
    plain = parse_nvidia_smi_xml(fixture("h100_mig_na.xml"))
    bracketed = parse_nvidia_smi_xml(fixture("h100_mig_na.xml").replace(">N/A<", ">[N/A]<"))
    assert [g.reading for g in bracketed.gpus] == [g.reading for g in plain.gpus]
    reading = plain.gpus[0].reading
    assert reading.memory_temp is None
    assert reading.row_remap_pending is None and reading.uncorrectable_remapped_rows is None
    assert reading.recovery_action is None
    assert plain.gpus[0].mig_enabled is True
    assert not plain.issues


def test_remap_flags_as_one_and_zero() -> None:
    text = fixture("a100_remap_failure.xml")
    text = text.replace("<remapped_row_failure>Yes<", "<remapped_row_failure>1<")
    text = text.replace("<remapped_row_pending>No<", "<remapped_row_pending>0<")
    gpus = parse_nvidia_smi_xml(text).gpus
    assert gpus[1].reading.row_remap_failure == 1.0
    assert gpus[1].reading.row_remap_pending == 0.0


def test_legacy_v100_ecc_and_throttle_reasons() -> None:
    result = parse_nvidia_smi_xml(fixture("v100_retired_pages.xml"))
    sick = result.gpus[1]
    assert sick.reading.ecc_dbe_volatile == 1.0 and sick.reading.ecc_sbe_volatile == 4.0
    assert sick.reading.row_remap_pending is None  # no <remapped_rows> before Ampere
    assert result.gpus[0].reading.clock_event_reasons == 0x1  # from clocks_throttle_reasons
    assert sick.retired_pages is not None
    assert (sick.retired_pages.single_bit, sick.retired_pages.double_bit) == (2, 1)
    assert sick.retired_pages.pending is True


def test_error_text_in_a_health_field_is_a_fatal_issue() -> None:
    text = fixture("h100_remap_pending_dbe.xml").replace(
        "<gpu_temp>34 C</gpu_temp>", "<gpu_temp>Unknown Error</gpu_temp>"
    )
    result = parse_nvidia_smi_xml(text)
    assert result.gpus[1].reading.gpu_temp is None
    assert [(i.source, i.fatal) for i in result.issues] == [("nvidia-smi:gpu 1", True)]
    assert "Unknown Error" in result.issues[0].message


def test_unknown_recovery_action_is_a_fatal_issue() -> None:
    text = fixture("h100_remap_pending_dbe.xml").replace(
        "<gpu_recovery_action>None<", "<gpu_recovery_action>Reinstall Universe<", 1
    )
    result = parse_nvidia_smi_xml(text)
    assert result.issues and result.issues[0].fatal
    assert result.gpus[0].reading.recovery_action is None


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("None", 0),
        ("Reset", 1),
        ("GPU Reset", 1),
        ("Reboot", 2),
        ("Node Reboot", 2),
        ("Drain P2P", 3),
        ("Drain and Reset", 4),
        ("NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET", 4),
        ("Bus Reset", 6),
        ("System Reboot", 7),
        ("5", 5),
        ("banana", None),
    ],
)
def test_recovery_action_words(text: str, code: int | None) -> None:
    assert recovery_action_code(text) == code


@pytest.mark.parametrize(
    ("bus_id", "key"),
    [
        ("00000000:18:00.0", (0, 0x18, 0)),
        ("PCI:0000:9a:00", (0, 0x9A, 0)),
        ("0000:2A:00.0", (0, 0x2A, 0)),
        ("0001:c1:00", (1, 0xC1, 0)),
        ("garbage", None),
    ],
)
def test_pci_keys(bus_id: str, key: tuple[int, int, int] | None) -> None:
    assert pci_key(bus_id) == key
    if key is not None:
        assert pci_key(format_pci(key)) == key


def test_not_xml_and_no_gpu() -> None:
    with pytest.raises(ProbeUnavailable):
        parse_nvidia_smi_xml("Failed to initialize NVML: Driver/library version mismatch")
    with pytest.raises(NoDriverError):
        parse_nvidia_smi_xml(
            "<nvidia_smi_log><driver_version>570.124.06</driver_version>"
            "<attached_gpus>0</attached_gpus></nvidia_smi_log>"
        )


def test_nvidia_smi_exit_codes() -> None:
    def runner(rc: int, out: str):  # type: ignore[no-untyped-def]
        return lambda argv, timeout: CommandResult(rc, out, "")

    no_driver = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.\n"
    )
    with pytest.raises(ProbeUnavailable) as info:
        probe_nvidia_smi(runner(9, no_driver))
    assert info.value.no_driver and "couldn't communicate" in str(info.value)
    with pytest.raises(NoDriverError):
        probe_nvidia_smi(runner(6, "No devices were found\n"))
    with pytest.raises(ProbeUnavailable) as info:
        probe_nvidia_smi(runner(255, "Unknown Error\n"))
    assert not info.value.no_driver

    def missing(argv, timeout):  # type: ignore[no-untyped-def]
        raise FileNotFoundError(argv[0])

    with pytest.raises(ProbeUnavailable) as info:
        probe_nvidia_smi(missing)
    assert info.value.no_driver and "not found" in str(info.value)


def test_nvidia_smi_partial_output_with_a_lost_gpu() -> None:
    xml = fixture("h100_remap_pending_dbe.xml")
    out = "Unable to determine the device handle for GPU0000:3A:00.0: Unknown Error\n" + xml
    result = probe_nvidia_smi(lambda argv, timeout: CommandResult(15, out, ""))
    assert len(result.gpus) == 2
    assert result.issues[-1].fatal and "0000:3A:00.0" in result.issues[-1].message


def test_kernel_log_xids() -> None:
    xids = parse_kernel_log(fixture("dmesg_xid.txt"))
    assert [(format_pci(x.pci), x.xid) for x in xids] == [
        ("00000000:18:00.0", 13),
        ("00000000:18:00.0", 13),
        ("00000000:2A:00.0", 31),
        ("00000000:2A:00.0", 31),
        ("00000000:9A:00.0", 79),
        ("00000000:18:00.0", 13),
    ]
    assert xids[4].at_s == pytest.approx(98765.4321)


def test_kernel_log_formats() -> None:
    text = (
        "Mar 11 09:42:17 node7 kernel: NVRM: Xid (PCI:0000:18:00): 48, pid=1, name=x, DBE\n"
        "[  312.5] NVRM: Xid (0000:2a:00): 63, pid=1, Row Remapper: New row marked for remapping\n"
        "[  313.0] nvidia 0000:2a:00.0: not an Xid line\n"
    )
    xids = parse_kernel_log(text)
    assert [(x.xid, x.at_s) for x in xids] == [(48, None), (63, 312.5)]


def test_kernel_log_falls_back_to_journalctl_and_reports_denial() -> None:
    calls: list[str] = []

    def denied(argv, timeout):  # type: ignore[no-untyped-def]
        calls.append(argv[0])
        if argv[0] == "dmesg":
            return CommandResult(
                1, "", "dmesg: read kernel buffer failed: Operation not permitted\n"
            )
        return CommandResult(0, "", "")

    text, issues = read_kernel_log(denied)
    assert text is None and calls == ["dmesg", "journalctl"]
    assert not issues[0].fatal and "Operation not permitted" in issues[0].message

    def journal(argv, timeout):  # type: ignore[no-untyped-def]
        if argv[0] == "dmesg":
            raise FileNotFoundError("dmesg")
        return CommandResult(0, "[ 1.0] node kernel: NVRM: Xid (PCI:0000:18:00): 79, x\n", "")

    text, issues = read_kernel_log(journal)
    assert text is not None and not issues
