"""Where a fleet observation's time goes, per node: HTTP client, body checks, parse, evaluate.

Run: ``.venv/bin/python bench/scrape_breakdown.py [--nodes 2000] [--repeat 3]``

Starts ``bench/static_exporter.py`` (pre-rendered bodies, stock metric set) and measures,
in this process:

1. the product's ``FleetActivities.scrape_many`` (httpx pool, concurrency 64), end to end;
2. the same GETs with the same ``httpx.AsyncClient`` settings, body read only (no checks,
   no parse): the HTTP client's share;
3. the same GETs with ``aiohttp.ClientSession`` (limit 64), body read only: what another
   HTTP client costs on the same server;
4. in-memory, per body: the ``_NOT_EXPOSITION`` corruption regex that ``scrape`` runs,
   ``parse_exposition``, and ``evaluate_node``.

Each figure is a median over ``--repeat`` runs, in microseconds per node.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import ROOT, free_port, median, save, spawn, stop, table, wait_until


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


async def aiohttp_bodies(urls: list[str], concurrency: int) -> int:
    import aiohttp

    sem = asyncio.Semaphore(concurrency)
    total = 0
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=5)) as http:
        async def one(url: str) -> None:
            nonlocal total
            async with sem, http.get(url) as resp:
                total += len(await resp.read())
        await asyncio.gather(*(one(u) for u in urls))
    return total


def timed(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=64)
    args = p.parse_args()

    import httpx
    from kubernetes import client
    from temporalio.testing import ActivityEnvironment

    from activities import fleet as fleet_mod
    from activities.exposition import parse_exposition
    from activities.fleet import ExporterSettings, FleetActivities
    from policy.config import PolicyConfig
    from policy.rules import evaluate_node

    port = free_port()
    logs = Path(tempfile.mkdtemp(prefix="bench-breakdown-"))
    server = spawn([sys.executable, str(ROOT / "bench" / "static_exporter.py"), "--port",
                    str(port), "--nodes", str(args.nodes), "--gpus", str(args.gpus)],
                   logs / "static.log")
    try:
        wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200,
                   300, "static exporter")
        template = f"http://127.0.0.1:{port}/nodes/{{node}}/metrics"
        names = [f"gpu-node-{i:05d}" for i in range(1, args.nodes + 1)]
        urls = [template.format(node=n) for n in names]
        fa = FleetActivities(client.ApiClient(), ExporterSettings(
            mode="template", url_template=template, concurrency=args.concurrency))
        targets = fa.endpoints(names)
        env = ActivityEnvironment()
        asyncio.run(env.run(fa.scrape_many, dict(list(targets.items())[:50])))  # warm

        n = args.nodes
        product = timed(lambda: asyncio.run(env.run(fa.scrape_many, targets)), args.repeat)
        raw_httpx = timed(lambda: asyncio.run(httpx_bodies(urls, args.concurrency)), args.repeat)
        raw_aiohttp = timed(lambda: asyncio.run(aiohttp_bodies(urls, args.concurrency)),
                            args.repeat)
        bodies = [httpx.get(u).text for u in urls[:200]]
        k = len(bodies)
        pattern: re.Pattern[str] = fleet_mod._NOT_EXPOSITION
        check = timed(lambda: [pattern.search(b) for b in bodies], args.repeat) / k
        parsed = [parse_exposition(b, default_node=names[i]) for i, b in enumerate(bodies)]
        parse = timed(lambda: [parse_exposition(b, default_node=names[i])
                               for i, b in enumerate(bodies)], args.repeat) / k
        policy = PolicyConfig()
        from policy.models import NodeReadings
        readings = [NodeReadings(node=names[i], gpus=list(r.nodes[0].gpus))
                    for i, r in enumerate(parsed)]
        evaluate = timed(lambda: [evaluate_node(r, policy, acknowledged_xids={})
                                  for r in readings], args.repeat) / k
    finally:
        stop(server)

    us = 1e6
    rows = [
        ["scrape_many (product, end to end)", product / n * us, product],
        ["  httpx GET + body only, same pool settings", raw_httpx / n * us, raw_httpx],
        ["  aiohttp GET + body only, limit 64", raw_aiohttp / n * us, raw_aiohttp],
        ["  _NOT_EXPOSITION corruption regex", check * us, check * n],
        ["  parse_exposition", parse * us, parse * n],
        ["evaluate_node", evaluate * us, evaluate * n],
    ]
    print(f"{n} nodes x {args.gpus} GPUs, stock metric set, body "
          f"{len(bodies[0]) / 1024:.0f} KiB, {bodies[0].count(chr(10))} lines")
    print(table(["step", "µs per node", f"s per {n} nodes"], rows))
    save("scrape_breakdown", {"nodes": n, "gpus": args.gpus, "concurrency": args.concurrency,
                              "us_per_node": {r[0].strip(): r[1] for r in rows}})


if __name__ == "__main__":
    main()
