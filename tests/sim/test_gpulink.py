"""The simulated Job containers' calls to the GPU simulator (sim/cluster/gpulink.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest_asyncio
from aiohttp import web

from sim.cluster.gpulink import GpuLink
from worker.stack import free_port


@dataclass
class FlakyGpuSim:
    """Answers 503 to the first ``failures`` requests of each path, then like the simulator."""

    failures: int = 0
    url: str = ""
    seen: dict[str, int] = field(default_factory=dict)

    async def handle(self, request: web.Request) -> web.Response:
        n = self.seen[request.path] = self.seen.get(request.path, 0) + 1
        if n <= self.failures:
            return web.json_response({"error": "overloaded"}, status=503)
        if request.path.endswith("/health"):
            return web.json_response({"healthy": False, "problems": ["GPU 3: XID 79"]})
        if "unknown" in request.path:
            return web.json_response({"error": "no node unknown"}, status=404)
        return web.json_response({}, status=200)


@pytest_asyncio.fixture
async def flaky() -> AsyncIterator[FlakyGpuSim]:
    sim = FlakyGpuSim()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", sim.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    sim.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    yield sim
    await runner.cleanup()


async def test_health_is_retried_through_an_overloaded_simulator(flaky: FlakyGpuSim) -> None:
    flaky.failures = 3
    link = GpuLink(flaky.url, backoff=0.01)
    try:
        outcome = await link.health("n1")
    finally:
        await link.aclose()
    assert (outcome.ok, outcome.problems) == (False, ["GPU 3: XID 79"])
    assert flaky.seen["/api/v1/nodes/n1/health"] == 4


async def test_health_gives_up_at_the_deadline_with_the_reason(flaky: FlakyGpuSim) -> None:
    flaky.failures = 1000
    link = GpuLink(flaky.url, deadline=0.3, backoff=0.05)
    try:
        outcome = await link.health("n1")
    finally:
        await link.aclose()
    assert not outcome.ok and "503" in outcome.problems[0]
    assert flaky.seen["/api/v1/nodes/n1/health"] >= 2


async def test_a_repair_is_never_sent_twice_after_the_simulator_answered(
        flaky: FlakyGpuSim) -> None:
    flaky.failures = 1
    link = GpuLink(flaky.url, backoff=0.01)
    try:
        reset = await link.reset("n1", "3")
        flaky.failures = 0
        missing = await link.reboot("unknown")
    finally:
        await link.aclose()
    assert (reset.ok, reset.problems) == (False, ["HTTP 503: overloaded"])
    assert flaky.seen["/api/v1/nodes/n1/reset"] == 1
    assert (missing.ok, missing.problems) == (False, ["HTTP 404: no node unknown"])


async def test_a_repair_that_cannot_connect_is_retried_then_reported() -> None:
    link = GpuLink(f"http://127.0.0.1:{free_port()}", deadline=0.3, backoff=0.05)
    try:
        outcome = await link.reboot("n1")
    finally:
        await link.aclose()
    assert not outcome.ok and outcome.problems[0].startswith("GPU simulator unreachable")
