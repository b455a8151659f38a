"""The simulation's clock: a workflow that sleeps for the simulated period.

The time-skipping test server skips time while a client waits on a workflow's result, so
the run waits on this one; the detector and remediations run meanwhile, and time passes
for them exactly as their timers and retries ask.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow


@workflow.defn
class SimulationClockWorkflow:
    @workflow.run
    async def run(self, seconds: float) -> None:
        await workflow.sleep(timedelta(seconds=seconds))
