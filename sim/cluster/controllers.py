"""kube-controller-manager, scheduler and kubelets in one asyncio task.

Every controller is level-triggered: a tick lists what it owns and converges
it, so controllers never depend on catching an event, exactly like the real
ones after a resync. Ticks are short (50 ms) so tests do not wait on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from sim.cluster import clock, disruption
from sim.cluster import resources as r
from sim.cluster.dra import DraControllers
from sim.cluster.gc import GarbageCollector
from sim.cluster.gpulink import GpuLink
from sim.cluster.jobs import JobController, JobPrograms, JobTiming
from sim.cluster.kubelet import Kubelet
from sim.cluster.machines import NodeTiming
from sim.cluster.mig import MigManager
from sim.cluster.nodelifecycle import NodeLifecycle
from sim.cluster.scheduler import Scheduler
from sim.cluster.store import Store
from sim.cluster.workloads import DaemonSets, ReplicaSets, StatefulSets

log = logging.getLogger(__name__)
TICK_SECONDS = 0.05
_SCALED = {"ReplicaSet": r.REPLICASETS, "StatefulSet": r.STATEFULSETS}


class Controller(Protocol):
    def reconcile(self, now: float) -> None: ...


class DisruptionController:
    def __init__(self, store: Store) -> None:
        self.store = store

    def _scale(self, namespace: str, ref: dict[str, object]) -> int | None:
        rt = _SCALED.get(str(ref.get("kind")))
        if rt is None:
            return None
        owner = self.store.find(rt, namespace, str(ref.get("name")))
        if owner is None:
            return None
        return int(owner["spec"].get("replicas", 1))

    def reconcile(self, now: float) -> None:
        pods = self.store.list(r.PODS)
        for pdb in self.store.list(r.PDBS):
            status = disruption.compute_status(pdb, pods, self._scale, now)
            if status != pdb.get("status"):
                pdb["status"] = status
                self.store.put_internal(r.PDBS, pdb)


class ControllerManager:
    def __init__(self, store: Store, nodes: list[str], gpu: GpuLink, timing: JobTiming,
                 node_timing: NodeTiming | None = None, *, minor: int = r.DEFAULT_MINOR) -> None:
        self.store = store
        self.gpu = gpu
        self.programs = JobPrograms(gpu, timing, None)
        self.kubelet = Kubelet(store, nodes, self.programs.run, node_timing)
        self.programs.kubelet = self.kubelet
        if gpu.base_url is not None:
            self.kubelet.on_new_machine = gpu.reboot
        # Order matters only for latency: status flows kubelet -> workloads -> PDBs.
        self.controllers: list[Controller] = [
            NodeLifecycle(store),
            GarbageCollector(store),
            ReplicaSets(store),
            StatefulSets(store),
            DaemonSets(store),
            JobController(store),
            *([DraControllers(store, nodes)] if minor >= r.RESOURCESLICES.since_minor else []),
            Scheduler(store),
            self.kubelet,
            MigManager(store, self.kubelet.machines),
            DisruptionController(store),
        ]
        self._task: asyncio.Task[None] | None = None
        self._health_task: asyncio.Task[None] | None = None

    def tick(self) -> None:
        now = clock.now()
        for c in self.controllers:
            try:
                c.reconcile(now)
            except Exception:
                # One controller's bug must not stop the others; it is logged, not hidden.
                log.exception("controller %s failed", type(c).__name__)

    async def _run(self) -> None:
        while True:
            self.tick()
            await asyncio.sleep(TICK_SECONDS)

    async def _plugin_health(self) -> None:
        """The device plugins' health checks: one request to the GPU simulator per round
        for the whole fleet, and only while some device plugin runs."""
        while True:
            await asyncio.sleep(self.kubelet.timing.plugin_health_seconds)
            if self.gpu.base_url is None or not self.kubelet.plugin_running():
                continue
            xids = await self.gpu.fleet_xids()
            if xids is not None:
                self.kubelet.plugin_health(xids)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run())
        self._health_task = loop.create_task(self._plugin_health())

    async def stop(self) -> None:
        for task in (self._task, self._health_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.gpu.aclose()
