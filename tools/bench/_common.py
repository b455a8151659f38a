"""Shared helpers for the benchmarks: machine description, results files, subprocesses.

Every benchmark appends one JSON document per run to ``tools/bench/results/<name>.json``
(a JSON list; the folder is git-ignored) with the machine it ran on, so figures from different
machines or days are never compared by accident.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# The repository root: the benchmarks run as `python -m tools.bench.<name>` from there, and
# so do the processes they start.
ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "tools" / "bench" / "results"

# Fixed ports of a developer's `gpu-remediate up` and of the other engineers' runs.
RESERVED_PORTS = {7233, 8233, 9400, 6443, 8080, 9464, 9465}


def machine() -> dict[str, Any]:
    """nproc, memory, CPU model, Python version and load when the run started."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        model = platform.processor()
    mem_kib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "memory_gib": round(mem_kib / (1 << 20), 1),
        "cpu_model": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg": os.getloadavg(),
    }


def save(name: str, results: dict[str, Any]) -> Path:
    """Append one run to tools/bench/results/<name>.json."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    runs: list[Any] = []
    if path.exists():
        try:
            runs = json.loads(path.read_text())
        except ValueError:
            runs = []
    runs.append({"benchmark": name, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                 "machine": machine(), "argv": sys.argv[1:], **results})
    path.write_text(json.dumps(runs, indent=1, default=str) + "\n")
    print(f"results appended to {path.relative_to(ROOT)}")
    return path


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a small sample."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-p * len(ordered) // 100))))
    return float(ordered[rank - 1])


def free_port() -> int:
    """An ephemeral loopback port that is not one of the fixed development ports."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in RESERVED_PORTS:
            return port


def peak_rss_mib() -> float:
    """Peak resident set size of this process (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of another process, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_status_kib(pid: int, key: str) -> int:
    """A field of /proc/<pid>/status in KiB (VmHWM is the peak RSS, VmRSS the current)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def wait_until(check: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as err:  # transient while a server starts
            last = err
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}"
                       + (f" (last error: {last!r})" if last else ""))


def spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=ROOT)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a process this benchmark started (its own session), by pid only."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, 15)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table (also readable in a terminal)."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
             for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


# ---------------------------------------------------------------- the real local stack


def write_scenario(path: Path, nodes: int, *, gpus: int = 8, pods_per_node: int = 0,
                   name: str = "bench", pdb: bool = True) -> Path:
    """A scenario with one pool of ``nodes`` nodes named bench-0001... and, optionally, a
    ReplicaSet with ``pods_per_node`` one-GPU pods per node (with ``pdb``, a PDB
    maxUnavailable 50 %)."""
    import yaml

    pool: dict[str, Any] = {"name": name, "names": [f"{name}-{i:04d}" for i in range(1, nodes + 1)],
                            "gpus": gpus, "labels": {"gpu-remediate.io/pool": name}}
    workloads: list[dict[str, Any]] = []
    if pods_per_node:
        workloads.append({"name": "trainer", "namespace": "team-a", "kind": "ReplicaSet",
                          "replicas": nodes * pods_per_node, "gpus_per_pod": 1,
                          "labels": {"app": "trainer"},
                          **({"pdb": {"max_unavailable": "50%"}} if pdb else {}),
                          "termination_grace_seconds": 0, "readiness_delay_seconds": 0.2})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"name": name, "pools": [pool], "workloads": workloads},
                                   sort_keys=False))
    return path


def make_stack(data_dir: Path, scenario: Path | str, overrides: dict[str, Any], *,
               job_seconds: float = 1.0, reboot_seconds: float = 2.0) -> Any:
    """A LocalStack (real dev server, both simulators, worker) on ephemeral ports."""
    from worker.stack import LocalStack, Ports

    return LocalStack(data_dir=data_dir, scenario=str(scenario),
                      ports=Ports(*(free_port() for _ in range(7))), headless=True,
                      persistent=False, job_seconds=job_seconds, reboot_seconds=reboot_seconds,
                      overrides=overrides)


def worker_log_problems(log: Path) -> dict[str, int]:
    """Counts of task-timeout and deadlock markers in a worker log."""
    text = log.read_text(errors="replace") if log.exists() else ""
    markers = {"TMPRL1101": "TMPRL1101", "TMPRL1104": "TMPRL1104",
               "workflow task timed out": "WorkflowTaskTimedOut",
               "activity timed out": "Activity task timed out",
               "tracebacks": "Traceback",
               "urllib3 pool full": "Connection pool is full, discarding connection"}
    return {k: text.count(v) for k, v in markers.items()}
