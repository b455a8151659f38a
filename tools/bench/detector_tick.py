"""One fleet observation at fleet scale: scrape every exporter over HTTP, parse, evaluate.

Run: ``.venv/bin/python -m tools.bench.detector_tick [--nodes 1000 10000] [--repeat 3]
[--servers sim static] [--extra-fields] [--parse-helper-from N]``

For each fleet size and each server kind it starts the exporter fleet in a separate
process, then measures, in a fresh child process per run (so peak RSS is that run's):

- ``FleetActivities.scrape_many`` over loopback HTTP with per-node endpoints (template
  mode, ``/nodes/<node>/metrics``, the product's default concurrency of 64), run inside a
  Temporal activity context (``ActivityEnvironment``) because it heartbeats;
- ``evaluate_node`` with the default policy for every node read.

It reports wall time, CPU time of the measuring process (user + system), its peak RSS
(``ru_maxrss``), the CPU time and peak RSS of the parse helper process that
``scrape_many`` starts for large fleets (``ExporterSettings.parse_helper_from``; 0 when
none ran), and the CPU the server process spent meanwhile. Server kinds:

- ``sim``: the GPU simulator in fleet mode (``sim gpu serve --nodes N``), which renders
  every body on request; on a 2-core machine it competes with the scraper for CPU.
- ``static``: ``tools/bench/static_exporter.py``, the same bodies pre-rendered once, so the
  figures are the product's own cost.

The default metric set is dcgm-exporter's stock ``default-counters.csv`` (the simulator's
``--no-extra-fields``); ``--extra-fields`` adds the opt-in health fields (+50 % lines).
The first run against each server is a warm-up (the simulator's label cache) and is
reported separately, not in the medians. The list of nodes from Kubernetes is not part
of this benchmark (see docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tools.bench._common import (
    ROOT,
    cpu_seconds,
    free_port,
    median,
    peak_rss_mib,
    proc_cpu_seconds,
    proc_status_kib,
    save,
    spawn,
    stop,
    table,
    wait_until,
)

TARGET_WALL_S = 10.0
AIM_WALL_S = 3.0
TARGET_RSS_MIB = 1536


def child(url_template: str, nodes: int, concurrency: int, helper_from: int | None
          ) -> dict[str, Any]:
    """One measured observation; runs in its own process."""
    import httpx
    from kubernetes import client
    from temporalio.testing import ActivityEnvironment

    from activities import parse_pool
    from activities.exporter_settings import ExporterSettings
    from activities.fleet import FleetActivities
    from policy.config import PolicySettings
    from policy.models import Action
    from policy.rules import evaluate_node

    # The helper's own peak RSS, read just before it is stopped (RUSAGE_CHILDREN's maxrss
    # would count the fork of this process that precedes its exec).
    helper_hwm: list[float] = []
    close = parse_pool.ParsePool.close

    async def measured_close(self: parse_pool.ParsePool) -> None:
        if self.pid is not None:
            with contextlib.suppress(OSError):
                helper_hwm.append(proc_status_kib(self.pid, "VmHWM") / 1024)
        await close(self)

    parse_pool.ParsePool.close = measured_close  # type: ignore[method-assign]
    names = [f"gpu-node-{i:05d}" for i in range(1, nodes + 1)]
    settings = ExporterSettings(mode="template", url_template=url_template,
                                concurrency=concurrency)
    if helper_from is not None:
        settings = settings.model_copy(update={"parse_helper_from": helper_from})
    fleet = FleetActivities(client.ApiClient(), settings)
    policy = PolicySettings()
    targets = fleet.endpoints(names)
    httpx.get(url_template.format(node=names[0]), timeout=10)  # imports and DNS warm
    rss_before = peak_rss_mib()

    wall0, cpu0 = time.perf_counter(), cpu_seconds()
    readings, errors = asyncio.run(ActivityEnvironment().run(fleet.scrape_many, targets))
    wall1, cpu1 = time.perf_counter(), cpu_seconds()
    flagged = 0
    for name in names:
        r = readings.get(name)
        if r is None:
            continue
        verdict = evaluate_node(r, policy, acknowledged_xids={})
        if verdict.action not in (Action.NONE, Action.APP):
            flagged += 1
    wall2, cpu2 = time.perf_counter(), cpu_seconds()
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "nodes": nodes, "readable": len(readings), "errors": len(errors),
        "first_error": next(iter(errors.values()), ""), "flagged": flagged,
        "gpus": sum(len(r.gpus) for r in readings.values()),
        "scrape_wall_s": wall1 - wall0, "scrape_cpu_s": cpu1 - cpu0,
        "evaluate_wall_s": wall2 - wall1, "evaluate_cpu_s": cpu2 - cpu1,
        "wall_s": wall2 - wall0, "cpu_s": cpu2 - cpu0,
        "rss_before_mib": rss_before, "peak_rss_mib": peak_rss_mib(),
        # The parse helper process (activities/parse_pool.py), when the fleet is large enough.
        "helper_cpu_s": float(kids.ru_utime + kids.ru_stime),
        "helper_peak_rss_mib": max(helper_hwm, default=0.0),
    }


def start_server(kind: str, nodes: int, gpus: int, extra: bool, logs: Path
                 ) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    if kind == "sim":
        argv = [sys.executable, "-m", "worker", "sim", "gpu", "serve", "--port", str(port),
                "--nodes", str(nodes), "--gpus", str(gpus),
                "--extra-fields" if extra else "--no-extra-fields"]
    else:
        argv = [sys.executable, "-m", "tools.bench.static_exporter", "--port", str(port),
                "--nodes", str(nodes), "--gpus", str(gpus), *(["--extra-fields"] if extra else [])]
    proc = spawn(argv, logs / f"{kind}-{nodes}.log")
    base = f"http://127.0.0.1:{port}"
    import httpx

    def ready() -> bool:
        if proc.poll() is not None:
            raise SystemExit(f"{kind} server exited; see {logs}/{kind}-{nodes}.log")
        return httpx.get(base + "/healthz", timeout=2).status_code == 200

    wait_until(ready, 300, f"{kind} server with {nodes} nodes")
    return proc, base + "/nodes/{node}/metrics"


def run_child(url_template: str, nodes: int, concurrency: int, server_pid: int,
              helper_from: int | None) -> dict[str, Any]:
    server_cpu0 = proc_cpu_seconds(server_pid)
    extra = [] if helper_from is None else ["--parse-helper-from", str(helper_from)]
    out = subprocess.run([sys.executable, "-m", "tools.bench.detector_tick", "--child",
                          "--url-template", url_template, "--nodes", str(nodes),
                          "--concurrency", str(concurrency), *extra],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"measuring child failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result["server_cpu_s"] = proc_cpu_seconds(server_pid) - server_cpu0
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--servers", nargs="+", choices=["sim", "static"], default=["sim", "static"])
    p.add_argument("--extra-fields", action="store_true")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--parse-helper-from", type=int, default=None,
                   help="ExporterSettings.parse_helper_from (default: the product's; 0: no "
                        "helper process)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--url-template", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.child:
        print(json.dumps(child(args.url_template, args.nodes[0], args.concurrency,
                               args.parse_helper_from)))
        return

    logs = Path(tempfile.mkdtemp(prefix="bench-detector-tick-"))
    rows, runs = [], []
    for kind in args.servers:
        for n in args.nodes:
            proc, template = start_server(kind, n, args.gpus, args.extra_fields, logs)
            try:
                warm = run_child(template, n, args.concurrency, proc.pid,
                                 args.parse_helper_from)
                measured = [run_child(template, n, args.concurrency, proc.pid,
                                      args.parse_helper_from) for _ in range(args.repeat)]
            finally:
                stop(proc)
            bad = [m for m in [warm, *measured] if m["errors"] or m["readable"] != n]
            if bad:
                raise SystemExit(f"{kind} {n}: unreadable nodes: {bad[0]['first_error']}")
            med = {k: median([m[k] for m in measured]) for k in measured[0]
                   if isinstance(measured[0][k], float)}
            runs.append({"server": kind, "nodes": n, "gpus": args.gpus,
                         "extra_fields": args.extra_fields, "concurrency": args.concurrency,
                         "warmup": warm, "runs": measured, "median": med})
            rows.append([kind, n, warm["wall_s"], med["wall_s"],
                         min(m["wall_s"] for m in measured), max(m["wall_s"] for m in measured),
                         med["scrape_wall_s"], med["evaluate_wall_s"], med["cpu_s"],
                         med["helper_cpu_s"], med["server_cpu_s"], med["peak_rss_mib"],
                         med["helper_peak_rss_mib"], f"{n / med['wall_s']:.0f}"])
            print(f"{kind:6s} {n:6d} nodes: median {med['wall_s']:.2f}s wall, "
                  f"{med['cpu_s']:.2f}s CPU, {med['peak_rss_mib']:.0f} MiB peak RSS", flush=True)

    print()
    print(table(["server", "nodes", "warm-up s", "median s", "min s", "max s", "scrape s",
                 "evaluate s", "CPU s", "helper CPU s", "server CPU s", "peak RSS MiB",
                 "helper RSS MiB", "nodes/s"], rows))
    for r in runs:
        if r["nodes"] == 10000:
            # Memory: the measuring process plus its parse helper, both at their peaks.
            wall = r["median"]["wall_s"]
            rss = r["median"]["peak_rss_mib"] + r["median"]["helper_peak_rss_mib"]
            verdict = ("met (aim too)" if wall <= AIM_WALL_S else "met") \
                if wall <= TARGET_WALL_S and rss <= TARGET_RSS_MIB else "NOT met"
            print(f"target 10,000 nodes <= {TARGET_WALL_S:.0f}s and <= {TARGET_RSS_MIB} MiB "
                  f"({r['server']}): {wall:.1f}s, {rss:.0f} MiB: {verdict}")
    save("detector_tick", {"results": runs, "logs": str(logs)})


if __name__ == "__main__":
    main()
