"""Reading the GPUs of the fleet's nodes: each node's dcgm-exporter (found from a URL
template or its pod), scraped concurrently within limits and parsed (here, in a thread, or
in the helper process), or the Prometheus source. An exporter that cannot be read makes
its node "unreadable", never "unhealthy". ``ExporterReading`` is a part of
``FleetActivities`` (activities/fleet.py), which sets up the state it reads.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity

from activities import metrics
from activities.counter_rates import CounterRates
from activities.exporter_settings import ExporterSettings
from activities.fleet_nodes import GpuNode
from activities.gpus import declared_gpus
from activities.kube import REQUEST_TIMEOUT, raise_typed
from activities.parse_pool import (
    PARSE_ON_LOOP_BYTES,
    BodyError,
    ParsePool,
    default_workers,
    read_body,
)
from activities.parse_pool import looks_intact as looks_intact  # re-exported: same check
from activities.prometheus_source import PrometheusSource
from policy.config import LinkPolicy
from policy.models import GpuReading, NodeReadings


class ScrapeError(Exception):
    pass


class ExporterReading:
    """FleetActivities' readings: from each node's exporter or from Prometheus."""

    core: client.CoreV1Api
    exporter: ExporterSettings
    prometheus: PrometheusSource | None
    rates: CounterRates

    def endpoints(self, nodes: list[str]) -> dict[str, str]:
        if self.exporter.mode == "template":
            return {n: self.exporter.url_template.format(node=n) for n in nodes}
        try:
            pods = self.core.list_namespaced_pod(
                self.exporter.namespace, label_selector=self.exporter.label_selector,
                _request_timeout=REQUEST_TIMEOUT,
            ).items
        except ApiException as err:
            raise_typed(err, "list dcgm-exporter pods")
        wanted = set(nodes)
        found: dict[str, str] = {}
        for pod in pods:
            node = pod.spec.node_name if pod.spec else None
            ip = pod.status.pod_ip if pod.status else None
            phase = pod.status.phase if pod.status else None
            if node in wanted and ip and phase == "Running":
                host = f"[{ip}]" if ":" in ip else ip
                found[node] = f"http://{host}:{self.exporter.port}{self.exporter.path}"
        return found

    # ------------------------------------------------------------ exporter side

    async def scrape(self, http: aiohttp.ClientSession, node: str, url: str, *,
                     pool: ParsePool | None = None) -> NodeReadings:
        """One node's readings from its exporter, or ``ScrapeError``. With ``pool``, the
        body may be parsed in the helper process; the result or the error is the same."""
        return await self._readings(node, await self._fetch(http, url), pool)

    async def _fetch(self, http: aiohttp.ClientSession, url: str) -> bytes:
        try:
            # Never follow a redirect: an exporter must not send the worker to another
            # address (blind requests inside the cluster, their status shown to operators).
            async with http.get(url, allow_redirects=False) as resp:
                if resp.status != 200:
                    raise ScrapeError(f"HTTP {resp.status}" + (
                        " (redirects are not followed)" if 300 <= resp.status < 400 else ""))
                chunks, size = [], 0
                async for chunk in resp.content.iter_chunked(1 << 16):
                    size += len(chunk)
                    if size > self.exporter.max_bytes:
                        raise ScrapeError(f"larger than {self.exporter.max_bytes} bytes")
                    chunks.append(chunk)
        except TimeoutError as err:
            raise ScrapeError("timed out") from err
        except aiohttp.ClientError as err:
            raise ScrapeError(f"{type(err).__name__}: {err}") from err
        return b"".join(chunks)

    async def _readings(self, node: str, raw: bytes, pool: ParsePool | None) -> NodeReadings:
        # Corruption check, parse and this node's series (activities/parse_pool.read_body),
        # here or in the helper process: the same fields or the same error either way.
        try:
            if pool is not None:
                gpus = await pool.read(raw, node)
            elif len(raw) > PARSE_ON_LOOP_BYTES:
                # A big body is parsed off the event loop: health checks and the other
                # nodes' scrapes keep running meanwhile (the GIL is handed over every 5 ms).
                gpus = await asyncio.to_thread(read_body, raw, node)
            else:
                gpus = read_body(raw, node)
        except BodyError as err:
            raise ScrapeError(str(err)) from err
        return NodeReadings(node=node, gpus=[GpuReading(**g) for g in gpus])

    async def scrape_many(self, targets: dict[str, str]) -> tuple[dict[str, NodeReadings],
                                                                   dict[str, str]]:
        # aiohttp rather than httpx here: measured at 10,000 nodes, httpx's connection
        # pool cost ~8 ms of CPU per request against ~0.2 ms (docs/performance.md).
        connector = aiohttp.TCPConnector(limit=self.exporter.concurrency)
        timeout = aiohttp.ClientTimeout(total=self.exporter.timeout_seconds)
        sem = asyncio.Semaphore(self.exporter.concurrency)
        readings: dict[str, NodeReadings] = {}
        errors: dict[str, str] = {}
        done = 0
        # Parsing is most of a scrape's CPU: a large fleet spreads it over a second core.
        pool: ParsePool | None = None
        if 0 < self.exporter.parse_helper_from <= len(targets) and default_workers():
            pool = ParsePool()
            pool.start()

        try:
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
                async def one(node: str, url: str) -> None:
                    nonlocal done
                    try:
                        # The slot is for the connection: parsing does not hold it.
                        async with sem:
                            raw = await self._fetch(http, url)
                        readings[node] = await self._readings(node, raw, pool)
                    except ScrapeError as err:
                        errors[node] = f"{node}: {url}: {err}"
                        metrics.SCRAPE_ERRORS.labels(_reason(str(err))).inc()
                    done += 1
                    if done % 500 == 0 and activity.in_activity():
                        activity.heartbeat(done)

                # A fixed set of workers rather than a task per node: 10,000 waiting tasks
                # are 10,000 coroutines, futures and frames for the garbage collector to walk.
                todo = iter(targets.items())

                async def worker() -> None:
                    for node, url in todo:
                        await one(node, url)

                # Enough workers to keep every connection busy while the helper process
                # holds its full share of bodies.
                workers = min(len(targets), self.exporter.concurrency
                              + (pool.capacity if pool is not None else 0))
                await asyncio.gather(*(worker() for _ in range(workers)))
        finally:
            if pool is not None:
                await pool.close()
        return readings, errors

    async def read_many(self, names: list[str], nodes: list[GpuNode],
                        links: LinkPolicy | None = None) -> tuple[
            dict[str, NodeReadings], dict[str, str]]:
        """Readings per node from the configured source, with the GPU count each node
        declares; a node without any readings is in errors. With a link rule on (``links``),
        scraped counters become rates against this process's previous reading of the node
        (activities/counter_rates.py); the Prometheus source computes them itself."""
        readings, errors = await self._read_many(names, nodes)
        if links is not None and (links.pcie_replay_enabled or links.nvlink_enabled) and \
                self.exporter.mode != "prometheus":
            now = time.monotonic()
            readings = {n: self.rates.apply(r, now) for n, r in readings.items()}
            self.rates.forget_older_than(now)
        declared = {n.name: declared_gpus(n.labels) for n in nodes}
        return {name: (r.model_copy(update={"declared_gpus": declared[name]})
                       if declared.get(name) is not None else r)
                for name, r in readings.items()}, errors

    async def _read_many(self, names: list[str], nodes: list[GpuNode]) -> tuple[
            dict[str, NodeReadings], dict[str, str]]:
        prom = self.prometheus
        if self.exporter.mode == "prometheus" and prom is not None:
            readings, errors = await prom.read(
                names, thermal_hold=self.exporter.prometheus_thermal_hold,
                acknowledged_by_node={n.name: n.acknowledged for n in nodes})
            for _ in errors:
                metrics.SCRAPE_ERRORS.labels("prometheus").inc()
            return readings, errors
        targets = await asyncio.to_thread(self.endpoints, names)
        readings, errors = await self.scrape_many(targets)
        for n in names:
            if n not in targets:
                errors[n] = f"{n}: no dcgm-exporter endpoint found"
        return readings, errors


def _reason(message: str) -> str:
    for word in ("timed out", "HTTP", "ConnectError", "larger", "no GPU"):
        if word in message:
            return word.lower().replace(" ", "_")
    return "unparsable"
