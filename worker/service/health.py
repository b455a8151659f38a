"""The worker's health endpoints: liveness (the worker loop runs) and readiness (connected
and polling), for the Deployment's probes."""

from __future__ import annotations

from aiohttp import web
from temporalio.worker import Worker


class Health:
    """Liveness: the worker loop runs. Readiness: connected and polling."""

    def __init__(self) -> None:
        self.ready = False
        self.worker: Worker | None = None

    async def live(self, _: web.Request) -> web.Response:
        ok = self.worker is None or self.worker.is_running or not self.ready
        return web.json_response({"live": ok}, status=200 if ok else 503)

    async def readyz(self, _: web.Request) -> web.Response:
        ok = self.ready and self.worker is not None and self.worker.is_running
        return web.json_response({"ready": ok}, status=200 if ok else 503)

    async def serve(self, bind: str, port: int) -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/healthz", self.live)
        app.router.add_get("/readyz", self.readyz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, bind, port).start()
        return runner
