"""Where a fleet observation's time goes, per node: HTTP client, body checks, parse, evaluate.

Run: ``.venv/bin/python -m tools.bench.scrape_breakdown [--nodes 2000] [--repeat 3] [--httpx]``

Starts ``tools/bench/static_exporter.py`` (pre-rendered bodies, stock metric set) and measures,
in this process:

1. the product's ``FleetActivities.scrape_many`` end to end (aiohttp, concurrency 64), with
   the parse helper process off (``parse_helper_from=0``) and on (``=1``); CPU is this
   process's only (the helper's is reported separately);
2. the same GETs with ``aiohttp.ClientSession`` (limit 64), body read only, no checks and no
   parse: the HTTP client's share, read the way ``scrape`` reads (``iter_chunked``) and with
   ``resp.read()``;
3. with ``--httpx``: the same GETs with ``httpx.AsyncClient`` (the client the product used
   before aiohttp; ~8 ms per request, slow to run at 2,000 nodes);
4. in memory, per body: the steps of ``activities/parse_pool.read_body`` (``looks_intact`` on
   bytes and, for comparison, on decoded text; the health-line selection; the line parser;
   the whole ``read_body``), the same on decoded text (decode + ``parse_exposition``),
   building the models from the fields, and ``evaluate_node``.

Figures are microseconds per node: the median over ``--repeat`` runs for 1-3, the best of
``--repeat`` (at least 3) runs over 200 bodies for 4 (CPU-bound, so the best run is the one
least disturbed by the other processes on the machine).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.bench._common import free_port, median, save, spawn, stop, table, wait_until


async def httpx_bodies(urls: list[str], concurrency: int) -> int:
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    sem = asyncio.Semaphore(concurrency)
    total = 0
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(5.0)) as http:
        async def one(url: str) -> None:
            nonlocal total
            async with sem, http.stream("GET", url) as resp:
                async for chunk in resp.aiter_bytes():
                    total += len(chunk)
        await asyncio.gather(*(one(u) for u in urls))
    return total


async def aiohttp_bodies(urls: list[str], concurrency: int, chunked: bool) -> int:
    import aiohttp

    sem = asyncio.Semaphore(concurrency)
    total = 0
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=5)) as http:
        async def one(url: str) -> None:
            nonlocal total
            async with sem, http.get(url) as resp:
                if chunked:
                    chunks = [c async for c in resp.content.iter_chunked(1 << 16)]
                    total += len(b"".join(chunks))
                else:
                    total += len(await resp.read())
        await asyncio.gather(*(one(u) for u in urls))
    return total


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def this_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float, float]:
    """Median (wall, CPU of this process, CPU of children that exited meanwhile)."""
    walls, cpus, kids = [], [], []
    for _ in range(repeat):
        w0, c0, k0 = time.perf_counter(), this_cpu(), children_cpu()
        fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(this_cpu() - c0)
        kids.append(children_cpu() - k0)
    return median(walls), median(cpus), median(kids)


def per_body(fn: Callable[[], Any], count: int, repeat: int) -> float:
    """Seconds per body: best of ``repeat`` runs over ``count`` bodies (CPU-bound, so the
    best run is the one least disturbed by the other processes on the machine)."""
    best = float("inf")
    for _ in range(max(3, repeat)):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best / count


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--httpx", action="store_true", help="also time httpx (slow)")
    args = p.parse_args()

    import httpx
    from kubernetes import client
    from temporalio.testing import ActivityEnvironment

    from activities.exporter_settings import ExporterSettings
    from activities.exposition import (
        _Fleet,
        _parse_lines,
        parse_exposition,
        select_health_lines_bytes,
    )
    from activities.fleet import FleetActivities
    from activities.parse_pool import looks_intact, read_body
    from policy.config import PolicySettings
    from policy.models import GpuReading, NodeReadings
    from policy.rules import evaluate_node

    port = free_port()
    logs = Path(tempfile.mkdtemp(prefix="bench-breakdown-"))
    server = spawn([sys.executable, "-m", "tools.bench.static_exporter", "--port",
                    str(port), "--nodes", str(args.nodes), "--gpus", str(args.gpus)],
                   logs / "static.log")
    n = args.nodes
    rows: list[list[Any]] = []
    try:
        wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200,
                   300, "static exporter")
        template = f"http://127.0.0.1:{port}/nodes/{{node}}/metrics"
        names = [f"gpu-node-{i:05d}" for i in range(1, n + 1)]
        urls = [template.format(node=name) for name in names]
        inline = ExporterSettings(mode="template", url_template=template,
                                  concurrency=args.concurrency, parse_helper_from=0)
        env = ActivityEnvironment()
        helper = inline.model_copy(update={"parse_helper_from": 1})
        for label, settings in [("helper process off", inline), ("helper process on", helper)]:
            fa = FleetActivities(client.ApiClient(), settings)
            targets = fa.endpoints(names)
            asyncio.run(env.run(fa.scrape_many, dict(list(targets.items())[:50])))  # warm
            wall, cpu, kids = timed(lambda fa=fa, t=targets: asyncio.run(  # type: ignore[misc]
                env.run(fa.scrape_many, t)), args.repeat)
            rows.append([f"scrape_many, {label}: wall", wall / n * 1e6, wall])
            rows.append([f"  CPU of this process (+ helper: {kids:.2f} s)", cpu / n * 1e6, cpu])
        for label, chunked in [("iter_chunked(64 KiB), as scrape", True), ("resp.read()", False)]:
            wall, cpu, _ = timed(lambda c=chunked: asyncio.run(  # type: ignore[misc]
                aiohttp_bodies(urls, args.concurrency, c)), args.repeat)
            rows.append([f"aiohttp GET + body only, {label}: CPU", cpu / n * 1e6, cpu])
        if args.httpx:
            wall, cpu, _ = timed(lambda: asyncio.run(httpx_bodies(urls, args.concurrency)),
                                 args.repeat)
            rows.append(["httpx GET + body only, same pool settings: CPU", cpu / n * 1e6, cpu])

        raws = [httpx.get(u).content for u in urls[:200]]
        texts = [r.decode("utf-8", errors="replace") for r in raws]
        k = len(raws)
        lines = [select_health_lines_bytes(r) for r in raws]

        def fold() -> None:
            for i, ls in enumerate(lines):
                _parse_lines(ls, _Fleet(names[i]))

        fields = [read_body(r, names[i]) for i, r in enumerate(raws)]
        readings = [NodeReadings(node=names[i], gpus=[GpuReading(**g) for g in f])
                    for i, f in enumerate(fields)]
        policy = PolicySettings()

        def text_path() -> None:
            for i, r in enumerate(raws):
                text = r.decode("utf-8", errors="replace")
                if looks_intact(text):
                    parse_exposition(text, default_node=names[i])

        steps: list[tuple[str, Callable[[], Any]]] = [
            ("read_body (whole CPU part of a scrape)",
             lambda: [read_body(r, names[i]) for i, r in enumerate(raws)]),
            ("  looks_intact(bytes)", lambda: [looks_intact(r) for r in raws]),
            ("  health-line selection on bytes", lambda: [select_health_lines_bytes(r)
                                                          for r in raws]),
            ("  line parser + fold into GPUs", fold),
            ("models from fields (GpuReading, NodeReadings)",
             lambda: [NodeReadings(node=names[i], gpus=[GpuReading(**g) for g in f])
                      for i, f in enumerate(fields)]),
            ("evaluate_node", lambda: [evaluate_node(r, policy, acknowledged_xids={})
                                       for r in readings]),
            ("the same on decoded text: decode, looks_intact(str), parse_exposition", text_path),
            ("  looks_intact(str)", lambda: [looks_intact(t) for t in texts]),
        ]
        for label, fn in steps:
            seconds = per_body(fn, k, args.repeat)
            rows.append([label, seconds * 1e6, seconds * n])
    finally:
        stop(server)

    body_lines = raws[0].count(b"\n")
    print(f"{n} nodes x {args.gpus} GPUs, stock metric set, body "
          f"{len(raws[0]) / 1024:.0f} KiB, {body_lines} lines, {len(lines[0])} health lines")
    print(table(["step", "µs per node", f"s per {n} nodes"], rows))
    save("scrape_breakdown", {"nodes": n, "gpus": args.gpus, "concurrency": args.concurrency,
                              "us_per_node": {r[0].strip(): r[1] for r in rows}})


if __name__ == "__main__":
    main()
