"""Start and stop a whole simulated cluster: store, controllers, HTTP server."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from sim.cluster import fleet
from sim.cluster import resources as r
from sim.cluster.controllers import ControllerManager
from sim.cluster.faults import FaultInjector
from sim.cluster.gpulink import GpuLink
from sim.cluster.jobs import JobTiming
from sim.cluster.machines import NodeTiming
from sim.cluster.server import ClusterApi
from sim.cluster.store import Store, WriteLog
from sim.scenario import Scenario, load_scenario

BANNER = (
    "gpu-remediate cluster simulator listening on {url} (loopback only). This is a simulator "
    "for tests and demos, never a production component."
)


def parse_version(text: str) -> int:
    """`1.37` (or `v1.37.0`) -> 37, for the releases the simulator can pose as."""
    parts = text.strip().lstrip("v").split(".")
    minor = int(parts[1]) if len(parts) >= 2 and parts[0] == "1" and parts[1].isdigit() else -1
    if minor not in r.MINORS:
        raise ValueError(f"kubernetes_version: {text!r} is not one of "
                         f"{', '.join(f'1.{m}' for m in r.MINORS)}")
    return minor


@dataclass
class RunningClusterSim:
    url: str
    port: int
    store: Store
    writes: WriteLog
    faults: FaultInjector
    controllers: ControllerManager
    _runner: web.AppRunner

    async def stop(self) -> None:
        await self.controllers.stop()
        await self._runner.cleanup()


async def start_cluster_simulator(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    scenario: str | Scenario = "small",
    gpu_sim_url: str | None = None,
    job_seconds: float = 2.0,
    reboot_seconds: float = 3.0,
    node_timing: NodeTiming | None = None,
    kubernetes_version: str = "1.33",
) -> RunningClusterSim:
    """Seed a cluster from a scenario and serve it; port 0 picks a free port.

    ``reboot_seconds`` is the NotReady window of a reboot; ``node_timing`` sets every
    machine timing (and the reboot draw's seed) and then wins over it.
    """
    minor = parse_version(kubernetes_version)
    loaded = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    store, writes, faults = Store(), WriteLog(), FaultInjector()
    timing = node_timing or NodeTiming(reboot_seconds=reboot_seconds)
    nodes = fleet.seed(store, loaded, operand_seconds=timing.operand_seconds)
    controllers = ControllerManager(
        store, nodes, GpuLink(gpu_sim_url), JobTiming(job_seconds), timing, minor=minor,
    )
    # Converge once before serving so the first client sees running workloads' pods.
    controllers.tick()
    runner = web.AppRunner(
        ClusterApi(store, writes, faults, controllers.kubelet, minor=minor).app(), access_log=None,
        shutdown_timeout=1.0,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    controllers.start()
    return RunningClusterSim(
        f"http://{host}:{bound}", bound, store, writes, faults, controllers, runner
    )
