"""Run the simulator on its own event loop in a background thread.

The official kubernetes client is synchronous; calling it from the loop that
serves it would deadlock, so tests and scripts use this wrapper instead.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from sim.cluster.kubeconfig import write_kubeconfig
from sim.cluster.runtime import RunningClusterSim, start_cluster_simulator


class ThreadedClusterSim:
    def __init__(self, **options: Any) -> None:
        self._options = options
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="cluster-sim"
        )
        self.sim: RunningClusterSim | None = None

    def __enter__(self) -> ThreadedClusterSim:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 30.0) -> RunningClusterSim:
        self._thread.start()
        fut: Future[RunningClusterSim] = asyncio.run_coroutine_threadsafe(
            start_cluster_simulator(**self._options), self._loop
        )
        self.sim = fut.result(timeout)
        return self.sim

    @property
    def url(self) -> str:
        assert self.sim is not None, "simulator not started"
        return self.sim.url

    def call(self, fn: Any, *args: Any, timeout: float = 10.0) -> Any:
        """Run a plain function on the simulator's loop (safe access to its store)."""

        async def wrapper() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(wrapper(), self._loop).result(timeout)

    def kubeconfig(self, path: str | Path) -> Path:
        return write_kubeconfig(path, self.url)

    def stop(self) -> None:
        if self.sim is not None:
            asyncio.run_coroutine_threadsafe(self.sim.stop(), self._loop).result(10)
            self.sim = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
