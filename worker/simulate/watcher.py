"""The node watchers of a simulated fleet (a config with ``reports.enabled``).

In production each node's watcher (``gpu-remediate watch``) reads its kernel log and
reports an XID to the worker at once, and the worker signals the detector
(``node_report``): a node-only tick then evaluates that node and admits it against the
budget. Here one workflow stands in for every watcher: at each full tick the fleet hands it
the XIDs that will appear in the kernel log before the next tick (``Due``: how many whole
seconds after that tick, which node and GPU), and it signals the detector at each one's
time, as the worker would on the watcher's report.

Only faults a kernel log shows as an XID line are reported (the causes with an XID in
worker/simulate/faults.py); heat and the HBM3 counters are seen at the full ticks only, as
dcgm-exporter shows them. Each report's line carries its kernel timestamp (the simulated
second of the fault, as dmesg stamps seconds since boot), and the fleet's node-only
observation takes its time from it, not from the server's clock, which runs ahead by the
run's own processing time: the same seed gives the same result on a loaded machine.
"""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta

from pydantic import BaseModel, Field
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.ids import DETECTOR_WORKFLOW_ID
    from workflows.messages import NodeReport
    from workflows.reports import NODE_REPORT_SIGNAL

WATCHER_WORKFLOW_ID = "simulation-watchers"
SIGNALS_PER_RUN = 2_000
"""Continue as new past this many due signals (each run's history stays small)."""


class Due(BaseModel):
    """One kernel-log XID a node's watcher will report ``after`` whole seconds, which is
    the simulated second ``at`` (its line's kernel timestamp)."""

    after: int = Field(ge=0)
    at: int = Field(ge=0)
    node: str
    gpu: int = Field(ge=0)
    xid: int = Field(ge=1)


_STAMP = re.compile(r"^\[\s*(\d+)\.\d+\]")


def kernel_line(due: Due) -> str:
    """The XID's line as ``dmesg`` prints it: seconds since boot (here, since the run's
    start) in brackets."""
    return (f"[{due.at:>7d}.000000] NVRM: Xid (PCI:0000:{due.gpu:02x}:00): {due.xid}, "
            "pid=1, name=simulated")


def kernel_second(line: str) -> int | None:
    """The whole second a kernel line is stamped with, or None."""
    m = _STAMP.match(line)
    return int(m.group(1)) if m else None


@workflow.defn
class SimulationWatcherWorkflow:
    def __init__(self) -> None:
        self.queue: list[Due] = []
        self.signals = 0
        self.pending = 0

    @workflow.run
    async def run(self) -> None:
        while True:
            await workflow.wait_condition(
                lambda: bool(self.queue) or (self.signals >= SIGNALS_PER_RUN
                                             and not self.pending))
            if not self.queue:
                workflow.continue_as_new()
            batch, self.queue = self.queue, []
            for due in batch:
                self.pending += 1
                asyncio.get_running_loop().create_task(self._report(due))

    async def _report(self, due: Due) -> None:
        try:
            if due.after:
                await workflow.sleep(timedelta(seconds=due.after))
            report = NodeReport(node=due.node, xid=due.xid, gpu=str(due.gpu),
                                line=kernel_line(due), at=workflow.now())
            await workflow.get_external_workflow_handle(DETECTOR_WORKFLOW_ID).signal(
                NODE_REPORT_SIGNAL, report)
        except Exception as err:  # the detector gone at the run's end: nothing to tell
            workflow.logger.info("report of %s not delivered: %s", due.node, err)
        finally:
            self.pending -= 1

    @workflow.signal
    def due(self, batch: list[Due]) -> None:
        self.signals += 1
        self.queue.extend(batch)
