"""The NVML probe against a fake binding, and its agreement with the nvidia-smi probe."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.check.fake_nvml import FakeGpu, FakeNvml, fixture_states, h100, pynvml
from worker.probe import nvml as nvml_probe
from worker.probe.common import NoDriverError, ProbeUnavailable
from worker.probe.nvml import NvmlSession
from worker.probe.smi import parse_nvidia_smi_xml

FIXTURES = Path(__file__).parent / "fixtures"


def read(fake: FakeNvml):  # type: ignore[no-untyped-def]
    with NvmlSession(fake) as session:
        return session.read()


@pytest.mark.parametrize(("name", "states"), list(fixture_states()), ids=lambda v: str(v)[:30])
def test_both_probes_read_the_same_gpu_state_the_same(name: str, states: list[FakeGpu]) -> None:
    from_smi = parse_nvidia_smi_xml((FIXTURES / name).read_text())
    from_nvml = read(FakeNvml(states))
    assert [g.reading for g in from_nvml.gpus] == [g.reading for g in from_smi.gpus]
    assert [g.mig_enabled for g in from_nvml.gpus] == [g.mig_enabled for g in from_smi.gpus]
    assert [g.retired_pages for g in from_nvml.gpus] == [g.retired_pages for g in from_smi.gpus]
    assert from_nvml.issues == from_smi.issues == []


def test_every_binding_name_the_probe_uses_exists_in_nvidia_ml_py() -> None:
    source = Path(nvml_probe.__file__).read_text()
    names = set(re.findall(r"nvml\.(\w+)", source)) | set(re.findall(r'"(nvml\w+)"', source))
    names |= set(re.findall(r'"(NVML_\w+)"', source))
    names.discard("NVMLError")
    missing = sorted(n for n in names if not hasattr(pynvml, n) and not n.startswith("NVML_FI_"))
    assert not missing
    assert hasattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")
    assert issubclass(pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError)


@pytest.mark.parametrize(
    ("code", "no_driver"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, True),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, True),
        (pynvml.NVML_ERROR_NO_PERMISSION, False),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, False),
    ],
)
def test_init_failures(code: int, no_driver: bool) -> None:
    with pytest.raises(ProbeUnavailable) as info, NvmlSession(FakeNvml([], init_error=code)):
        pass
    assert info.value.no_driver is no_driver


def test_no_gpu_and_shutdown() -> None:
    fake = FakeNvml([])
    with pytest.raises(NoDriverError), NvmlSession(fake) as session:
        session.read()
    assert fake.initialised == 0  # nvmlShutdown ran


def test_not_supported_is_absent_other_errors_are_fatal() -> None:
    fake = FakeNvml(
        [
            h100(0, errors={"nvmlDeviceGetTotalEccErrors": pynvml.NVML_ERROR_NOT_SUPPORTED}),
            h100(1, errors={"nvmlDeviceGetTemperature": pynvml.NVML_ERROR_UNKNOWN}),
        ]
    )
    result = read(fake)
    assert result.gpus[0].reading.ecc_dbe_volatile is None
    assert result.gpus[1].reading.gpu_temp is None
    assert [(i.source, i.fatal) for i in result.issues] == [("nvml:gpu 1", True)]
    assert "GPU temperature: Unknown Error" in result.issues[0].message


def test_lost_gpu_keeps_its_identity_and_is_fatal() -> None:
    result = read(FakeNvml([h100(0), h100(1, lost=True)]))
    assert result.gpus[1].reading.gpu_temp is None
    assert result.issues[0].fatal and "lost" in result.issues[0].message
    lost_handle = read(FakeNvml([h100(0), h100(1, lost=True, errors={"handle": 15})]))
    assert len(lost_handle.gpus) == 1 and lost_handle.issues[0].fatal


def test_binding_without_the_recovery_action_field() -> None:
    result = read(FakeNvml([h100(0, recovery=2)], has_recovery_field=False))
    assert result.gpus[0].reading.recovery_action is None
    assert read(FakeNvml([h100(0, recovery=2)])).gpus[0].reading.recovery_action == 2


def test_xid_events_during_the_wait() -> None:
    fake = FakeNvml([h100(0), h100(1)], xid_events=[(1, 48), (0, 13)])
    with NvmlSession(fake) as session:
        session.read()
        found, issues = session.wait_xids(0.5)
    assert found == [(h100(1).uuid, 48), (h100(0).uuid, 13)]
    assert not issues
    assert fake.registered == [0, 1] and "nvmlEventSetFree" in fake.calls
