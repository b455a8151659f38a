"""The simulation's clock: a workflow that waits out the simulated period.

The time-skipping test server skips time while a client waits on a workflow's result, so
the run waits on this one; the detector and remediations run meanwhile, and time passes
for them exactly as their timers and retries ask. The period ends on the detector's tick
grid, not on the server's clock: the fleet signals ``over`` when the detector asks for the
first observation past the period (``SimFleet.close``). The server's clock also moves
while work runs (milliseconds a tick, minutes a month, more on a loaded machine), so a
timer at the period's end would stop the run a varying number of ticks early. The timer
here is only a backstop for a detector that stopped observing.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from temporalio import workflow

CLOCK_WORKFLOW_ID = "simulation-clock"


@workflow.defn
class SimulationClockWorkflow:
    def __init__(self) -> None:
        self.done = False

    @workflow.run
    async def run(self, seconds: float) -> None:
        # Backstop: twice the period and a day (the server's drift is far below it).
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(lambda: self.done,
                                          timeout=timedelta(seconds=2 * seconds + 86_400))

    @workflow.signal
    def over(self) -> None:
        self.done = True
