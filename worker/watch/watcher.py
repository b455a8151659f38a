"""The watcher process: kernel-log lines and NVML events in, reports out.

Each kernel line goes through the probe's parser (``worker.probe.kernel_log``), the one
that reads saved logs for ``check``; a line it cannot read (truncated, interleaved with
another CPU's output) is not a report. The reading threads hand lines to the event loop,
which offers reports to the ``Reporter`` and never waits for the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from worker.probe.kernel_log import parse_kernel_log
from worker.watch.follow import follow
from worker.watch.nvml_events import gpu_names, watch_xids
from worker.watch.reporter import Reporter, ReporterSettings

log = logging.getLogger("gpu_remediate.watch")

MAX_REPORTED_LINE = 512


@dataclass
class WatchSettings:
    node: str
    reporter: ReporterSettings
    kernel_log: Path = Path("/dev/kmsg")
    from_start: bool = False
    nvml: ModuleType | None = None
    """The ``pynvml`` module (None: no NVML events, GPUs named by PCI bus id)."""


class Watcher:
    def __init__(self, settings: WatchSettings, reporter: Reporter | None = None) -> None:
        self.settings = settings
        self.reporter = reporter or Reporter(settings.reporter)
        self.uuid_of: dict[str, str] = {}
        """PCI bus id -> UUID (from NVML): a kernel line names the GPU as NVML events do."""
        self.lines = 0

    def report(self, gpu: str, xid: int, line: str) -> bool:
        return self.reporter.offer(gpu, xid, lambda: {
            "node": self.settings.node, "gpu": gpu, "xid": xid,
            "line": line[:MAX_REPORTED_LINE], "at": datetime.now(UTC).isoformat()})

    def on_line(self, line: str) -> None:
        """One kernel-log line: a report for each XID it holds."""
        self.lines += 1
        for found in parse_kernel_log(line):
            bus = found.bus_id.upper()
            self.report(self.uuid_of.get(bus, bus), found.xid, line.strip())

    def on_nvml(self, uuid: str, xid: int, text: str) -> None:
        self.report(uuid, xid, text)

    async def run(self) -> None:
        """Until cancelled: read, parse, report."""
        loop = asyncio.get_running_loop()
        stop = threading.Event()

        def to_loop(fn: Any) -> Any:
            return lambda *args: loop.call_soon_threadsafe(fn, *args)

        s = self.settings
        # Threads of its own: a reader blocks for as long as the watcher runs.
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="watch") as pool:
            readers: list[asyncio.Future[Any]] = []
            if s.nvml is not None:
                self.uuid_of = gpu_names(s.nvml)
                readers.append(loop.run_in_executor(
                    pool, watch_xids, s.nvml, to_loop(self.on_nvml), stop))
            readers.append(loop.run_in_executor(
                pool, lambda: follow(s.kernel_log, to_loop(self.on_line), stop,
                                     from_start=s.from_start)))
            sender = asyncio.create_task(self.reporter.run())
            log.info("watching %s for node %s%s; reporting to %s", s.kernel_log, s.node,
                     " and NVML XID events" if s.nvml is not None else "", s.reporter.url)
            try:
                # A reader that fails (the log cannot be read) ends the watcher: the
                # DaemonSet restarts it, and the failure shows in its status.
                done, _ = await asyncio.wait(readers, return_when=asyncio.FIRST_EXCEPTION)
                for d in done:
                    d.result()
            finally:
                stop.set()
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sender
                await asyncio.gather(*readers, return_exceptions=True)


def load_nvml() -> ModuleType | None:
    """``pynvml`` initialised, or None (no binding, no driver): then the kernel log alone."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        log.info("NVML not available (%s): reading the kernel log only", err)
        return None
    return pynvml


def run_watch(settings: WatchSettings) -> None:
    try:
        asyncio.run(Watcher(settings).run())
    finally:
        if settings.nvml is not None:
            with contextlib.suppress(Exception):
                settings.nvml.nvmlShutdown()
