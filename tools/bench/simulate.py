"""`gpu-remediate simulate` at fleet scale: wall time, CPU and peak memory of one run.

Run: ``.venv/bin/python -m tools.bench.simulate [--nodes 10000] [--days 30] [--seed 1]
[--config FILE] [--compare FILE] [--faults FILE] [--segment-days D]``

Runs the command in a child process (as an operator would) and samples, every second, the
resident memory of it and of the time-skipping test server it starts (VmHWM of each at the
end: the peak), and their CPU time. Prints the figures and the run's own JSON result, and
appends both to tools/bench/results/simulate.json. The target (docs/simulate.md): 10,000
nodes x 30 days in 10 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tools.bench._common import ROOT, proc_cpu_seconds, proc_status_kib, save, table

TARGET_WALL_S = 600.0


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = (task / "children").read_text().split()
            except OSError:
                continue
            for k in kids:
                out.append(int(k))
                todo.append(int(k))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--days", type=float, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--config", type=Path)
    ap.add_argument("--compare", type=Path)
    ap.add_argument("--faults", type=Path)
    ap.add_argument("--segment-days", type=float)
    args = ap.parse_args()
    argv = [str(Path(sys.executable).parent / "gpu-remediate"), "simulate",
            "--nodes", str(args.nodes), "--days", str(args.days), "--seed", str(args.seed),
            "-o", "json"]
    if args.segment_days is not None:
        argv += ["--segment-days", str(args.segment_days)]
    for opt in ("config", "compare", "faults"):
        if getattr(args, opt) is not None:
            argv += [f"--{opt}" if opt != "config" else "-c", str(getattr(args, opt))]
    peak: dict[int, tuple[str, int, float]] = {}
    with tempfile.TemporaryFile() as stdout:
        start = time.monotonic()
        proc = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.PIPE, cwd=ROOT)
        while proc.poll() is None:
            for pid in [proc.pid, *descendants(proc.pid)]:
                try:
                    name = Path(f"/proc/{pid}/comm").read_text().strip()
                    peak[pid] = (name, proc_status_kib(pid, "VmHWM"), proc_cpu_seconds(pid))
                except (OSError, IndexError):
                    continue
            time.sleep(1.0)
        wall = time.monotonic() - start
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        stdout.seek(0)
        text = stdout.read().decode()
    if proc.returncode != 0:
        sys.exit(f"simulate failed ({proc.returncode}): {err[-2000:]}")
    result: dict[str, Any] = json.loads(text)
    # A run over several test servers (segments) starts them one after another: each name
    # is one row, its peak the highest of its processes, its CPU their sum, and the CPU of
    # everything the run started, waited for, from the kernel's own count.
    cpu_all = resource.getrusage(resource.RUSAGE_CHILDREN)
    by_name: dict[str, list[tuple[int, float]]] = {}
    for name, kib, cpu in peak.values():
        by_name.setdefault(name, []).append((kib, cpu))
    procs = sorted(((n, max(k for k, _ in v), sum(c for _, c in v), len(v))
                    for n, v in by_name.items()), key=lambda p: -p[1])
    figures = {
        "nodes": args.nodes, "days": args.days, "seed": args.seed, "wall_s": round(wall, 1),
        "target_wall_s": TARGET_WALL_S,
        "processes": [{"name": n, "count": count, "peak_rss_mib": round(k / 1024, 1),
                       "cpu_s": round(c, 1)} for n, k, c, count in procs],
        "cpu_s_total": round(cpu_all.ru_utime + cpu_all.ru_stime, 1),
        "peak_rss_mib_total": round(sum(k for _, k, _, _ in procs) / 1024, 1),
        "segments": result.get("segments"),  # None for a --compare (two runs)
    }
    print(table(["figure", "value"], [
        ["nodes x days", f"{args.nodes} x {args.days:g}"],
        ["wall (s)", figures["wall_s"]],
        ["target (s)", TARGET_WALL_S],
        ["CPU, all processes (s)", figures["cpu_s_total"]],
        ["segments (test servers)", figures["segments"]],
        *[[f"{p['name']} (x{p['count']}) peak RSS (MiB) / CPU (s)",
           f"{p['peak_rss_mib']} / {p['cpu_s']}"] for p in figures["processes"]],
    ]))
    print(json.dumps(result, indent=1))
    save("simulate", {**figures, "result": result})


if __name__ == "__main__":
    main()
