"""The simulated nodes' kernel logs (sim/gpu/kmsg.py): an injected XID is the driver's line
in that node's log, in the shape the probe's parser and the node watcher read."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.gpu.fleet import Fleet, NodeSpec
from sim.gpu.kmsg import ENV_DIR, KernelLogs, attach_from, xid_line
from worker.probe.kernel_log import parse_kernel_log


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def fleet(clock: FakeClock) -> Fleet:
    return Fleet([NodeSpec("n1", gpus=2), NodeSpec("n2", gpus=2)], clock=clock)


def test_an_injected_xid_is_appended_to_that_nodes_log_only(tmp_path: Path) -> None:
    clock = FakeClock()
    f = fleet(clock)
    logs = KernelLogs(tmp_path, clock=clock)
    logs.attach(f)
    assert logs.path("n1").read_text() == "" and logs.path("n2").read_text() == ""
    clock.t += 812.5
    f.inject("n1", 1, "xid", 79)
    f.inject("n1", 0, "ecc-dbe")  # not an XID: no line
    [line] = logs.path("n1").read_text().splitlines()
    assert line.startswith("[  812.500000] NVRM: Xid (PCI:0000:")
    assert line.endswith("): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
    assert logs.path("n2").read_text() == ""
    [found] = parse_kernel_log(line)
    assert (found.xid, found.bus_id, found.at_s) == (79, f.gpu("n1", 1).pci_bus_id.upper(),
                                                     812.5)


def test_an_xid_the_table_does_not_know_still_has_the_drivers_shape() -> None:
    line = xid_line("00000000:9A:00.0", 1234, 1.0)
    assert line == ("[    1.000000] NVRM: Xid (PCI:0000:9a:00): 1234, pid='<unknown>', "
                    "name=<unknown>, Unrecognized error")
    assert [x.xid for x in parse_kernel_log(line)] == [1234]


def test_off_unless_a_directory_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_DIR, raising=False)
    f = fleet(FakeClock())
    assert attach_from(None, f) is None and f.kernel_log is None
    monkeypatch.setenv(ENV_DIR, str(tmp_path / "logs"))
    logs = attach_from(None, f)
    assert logs is not None and logs.path("n2").exists()
    f.inject("n2", 0, "xid", 48)
    assert "): 48, " in logs.path("n2").read_text()
