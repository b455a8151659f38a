"""Run every benchmark in turn; each prints its table and appends to
tools/bench/results/<name>.json.

Run from the repository root: ``.venv/bin/python -m tools.bench.run_all [--quick]
[--only drain parse]``

``--quick`` shrinks each benchmark (1,000 nodes only, fewer repeats and injections) for a
smoke run of a few minutes; the full run takes about 30-40 minutes on a 2-core machine,
most of it in the 10,000-node detector tick. The benchmarks are not part of the test suite.
Run them on an otherwise idle machine when possible: they share the CPUs with the
simulators they start, and every figure is CPU-bound.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from tools.bench._common import ROOT

FULL: list[list[str]] = [
    ["parse", "--nodes", "1000", "--repeat", "5"],
    ["scrape_breakdown", "--nodes", "2000", "--repeat", "3"],
    ["detector_tick", "--nodes", "1000", "10000", "--repeat", "2"],
    ["temporal_cost", "--ticks", "8"],
    ["fault_to_cordon", "--injections", "20", "--interval", "5"],
    ["drain", "--repeat", "3"],
    ["node_behaviour"],
    ["throughput", "--nodes", "200"],
]
QUICK: list[list[str]] = [
    ["parse", "--nodes", "200", "--repeat", "3"],
    ["scrape_breakdown", "--nodes", "300", "--repeat", "1"],
    ["detector_tick", "--nodes", "1000", "--repeat", "1"],
    ["temporal_cost", "--ticks", "4"],
    ["fault_to_cordon", "--injections", "3", "--interval", "5"],
    ["drain", "--repeat", "1"],
    ["node_behaviour"],
    ["throughput", "--nodes", "20"],
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", nargs="*",
                   help="benchmarks to run by module name, e.g. drain parse")
    args = p.parse_args()
    failed = []
    for argv in QUICK if args.quick else FULL:
        if args.only and argv[0] not in {name.removesuffix(".py") for name in args.only}:
            continue
        print(f"\n=== {' '.join(argv)}", flush=True)
        t0 = time.monotonic()
        rc = subprocess.call([sys.executable, "-m", f"tools.bench.{argv[0]}", *argv[1:]],
                             cwd=ROOT)
        print(f"=== {argv[0]}: exit {rc} after {time.monotonic() - t0:.0f}s", flush=True)
        if rc:
            failed.append(argv[0])
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
