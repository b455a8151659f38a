"""A kernel log per simulated node: when an XID is injected, the GPU simulator appends the
line the NVIDIA driver prints, as ``dmesg`` shows it,

    [  812.345678] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has
    fallen off the bus.

(one line), to ``DIR/<node>.log``, a file a node watcher (``gpu-remediate watch
--kernel-log``) follows as it would ``/dev/kmsg``. The timestamp is seconds since the
simulator started (its "boot"). Off unless a directory is given (``sim gpu serve
--kernel-log-dir``, or ``GPU_SIM_KERNEL_LOG_DIR``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.gpu.device import Gpu
    from sim.gpu.fleet import Fleet

ENV_DIR = "GPU_SIM_KERNEL_LOG_DIR"

# What the driver says after the number, for the XIDs scenarios inject most (NVIDIA's XID
# catalog); anything else gets the number alone, as some driver messages do.
_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
        "0x7f_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
    43: "Ch 00000010",
    45: "Ch 00000010",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
        "at partition 0, subpartition 0.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap row.",
    74: "NVLink: fatal error detected on link 0(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate detected",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: LTC TAG (0x2,0x0). RST: Yes, D-RST: No",
}


def xid_line(bus_id: str, xid: int, seconds: float) -> str:
    """The driver's line for ``xid`` on the GPU at ``bus_id`` (``00000000:18:00.0``)."""
    domain, bus, rest = bus_id.split(":", 2)
    device = rest.split(".", 1)[0]
    pci = f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}"
    # The driver always writes the process after the number; the text is the XID's own
    # message, or a generic one for an XID the table does not know.
    text = _TEXT.get(xid) or "Unrecognized error"
    tail = f", pid='<unknown>', name=<unknown>, {text}"
    return f"[{seconds:12.6f}] NVRM: Xid (PCI:{pci}): {xid}{tail}"


class KernelLogs:
    """``DIR/<node>.log`` for every node of a fleet."""

    def __init__(self, directory: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = directory
        self.clock = clock
        self.booted = clock()
        self._lock = threading.Lock()

    def path(self, node: str) -> Path:
        return self.directory / f"{node}.log"

    def attach(self, fleet: Fleet) -> None:
        """Create each node's (empty) log and have ``fleet`` write XIDs to it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for name in fleet.nodes:
            self.path(name).touch()
        fleet.kernel_log = self.xid

    def xid(self, gpu: Gpu, xid: int, now: float) -> None:
        line = xid_line(gpu.pci_bus_id, xid, max(0.0, now - self.booted)) + "\n"
        # One write of the whole line, so that a watcher never sees half of it interleaved
        # with another injection's.
        with self._lock, self.path(gpu.node).open("a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def attach_from(directory: str | Path | None, fleet: Fleet) -> KernelLogs | None:
    """Kernel logs in ``directory`` (else ``$GPU_SIM_KERNEL_LOG_DIR``), if either is set."""
    chosen = directory or os.environ.get(ENV_DIR)
    if not chosen:
        return None
    logs = KernelLogs(Path(chosen), clock=fleet.clock)
    logs.attach(fleet)
    return logs
