"""What the simulated validation and reset containers print, modelled on the real tools.

`dcgmi` is a client of `nv-hostengine`: in a pod with its own network namespace and the
image's entrypoint overridden there is no host engine unless the command starts one
(embedded) before dcgmi runs, or points dcgmi at one with `--host`. Without one, dcgmi
prints its two connection errors and fails. With one, `dcgmi diag -r N -j` prints the DCGM
4.x JSON report: level 1 the Deployment category,
level 2 adds Hardware (memory) and Integration (pcie), level 3 and up add Stress
(targeted_stress, targeted_power, memory_bandwidth, diagnostic). A GPU the GPU simulator
reports unhealthy fails the test that would catch its problem.

`nvidia-smi -r` refuses while any other process holds the GPU; `reset_in_use` is its message,
naming the pods that hold the GPUs.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from sim.cluster.gpulink import Outcome
from sim.cluster.store import Obj

DCGM_VERSION = "4.2.3"
DEFAULT_DRIVER = "570.124.06"
HOST_ENGINE_PORT = 5555
SMI_IN_USE_EXIT = 1
SMI_NOT_FOUND_EXIT = 6
CONNECT_EXIT = 1
DIAG_FAIL_EXIT = 1
HOST_ENGINE_STARTED = (
    f"Started host engine version {DCGM_VERSION} using port number: {HOST_ENGINE_PORT}"
)
NO_HOST_ENGINE = (
    "Error: unable to establish a connection to the specified host: {host}\n"
    "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n"
)
SMI_IN_USE = (
    "Unable to reset GPU {gpu} because it's being used by some other process (e.g. CUDA "
    "application, graphics application like X server, monitoring application like other "
    "instance of nvidia-smi). Please first kill all processes using this GPU and all compute "
    "applications running in the system."
)
# Kubernetes keeps at most this much of a log as the termination message
# (terminationMessagePolicy FallbackToLogsOnError).
FALLBACK_BYTES, FALLBACK_LINES = 2048, 80

_DCGMI = re.compile(r"(?<![\w.-])dcgmi(?![\w.-])")
_HOST_ENGINE = re.compile(r"(?<![\w.-])nv-hostengine(?![\w.-])")
_HOST_OPTION = re.compile(r"(?:^|\s)--host(?:=|\s+)([^\s;&|]+)")
_LEVEL = re.compile(r"(?:^|\s)(?:-r|--run)(?:=|\s+)['\"]?([\w,]+)")
_JSON = re.compile(r"(?:^|\s)(?:-j|--json)(?=\s|$|;|&|\|)")
_NAMED_LEVELS = {"short": 1, "quick": 1, "medium": 2, "long": 3, "xlong": 4}

# (category, tests) per level, as `dcgmi diag -r N` runs them.
_CATEGORIES: tuple[tuple[str, tuple[str, ...], int], ...] = (
    ("Deployment", ("software",), 1),
    ("Hardware", ("memory",), 2),
    ("Integration", ("pcie",), 2),
    ("Stress", ("targeted_stress", "targeted_power", "memory_bandwidth", "diagnostic"), 3),
)
# DCGM error codes (dcgm_errors.h): (error_id, error_category) per kind of problem.
_DCGM_FR = {
    "xid": (101, 5),  # DCGM_FR_XID_ERROR, DCGM_FR_EC_SOFTWARE_XID
    "bus": (101, 13),  # XID 79 / off the bus: HARDWARE_PCIE
    "pcie": (104, 13),  # DCGM_FR_PCIE_REPLAY_VIOLATION
    "nvlink": (71, 11),  # DCGM_FR_NVLINK_ERROR_CRITICAL
    "dbe": (103, 10),  # DCGM_FR_DBE_VIOLATION
    "remap": (84, 10),  # DCGM_FR_UNCORRECTABLE_ROW_REMAP
    "thermal": (40, 9),  # DCGM_FR_THERMAL_VIOLATIONS
    "other": (58, 10),  # DCGM_FR_MEMORY_MISMATCH
}
_SEVERITY_ISOLATE = 2
_GPU_PROBLEM = re.compile(r"^GPU (\d+)\b")


_CASE = re.compile(r'case\s+"?\$\{?(\w+)[^"\s]*"?\s+in\s+(.*?)\s*esac', re.DOTALL)
_BRANCH = re.compile(r"([^\s();]+)\)\s*(.*?)\s*;;", re.DOTALL)


def command_line(pod: Obj, *, resolve: bool = True) -> str:
    """The command of the pod's container that runs dcgmi (else its first), args joined; a
    shell `case "$VAR" in ... esac` on the container's environment is reduced to the
    branch that runs (unless ``resolve`` is False)."""
    lines = []
    for c in (pod.get("spec") or {}).get("containers") or []:
        env = {e.get("name"): str(e.get("value", "")) for e in c.get("env") or []}
        line = " ".join(str(a) for a in [*(c.get("command") or []), *(c.get("args") or [])])
        lines.append(_CASE.sub(functools.partial(_branch, env=env), line) if resolve else line)
    return next((line for line in lines if runs_dcgmi(line)), lines[0] if lines else "")


def _branch(m: re.Match[str], *, env: dict[str, str]) -> str:
    value = env.get(m.group(1), "")
    for pattern, body in _BRANCH.findall(m.group(2)):
        if pattern in (value, "*"):
            return str(body)
    return ""


def runs_dcgmi(command: str) -> bool:
    return _DCGMI.search(command) is not None


def runs_diag(command: str) -> bool:
    m = _DCGMI.search(command)
    return m is not None and command[m.end():].split()[:1] == ["diag"]


@dataclass(frozen=True)
class HostEngine:
    embedded: bool  # the command starts nv-hostengine before dcgmi
    host: str | None  # dcgmi --host HOST: the node's (standalone) host engine


def host_engine(command: str) -> HostEngine:
    """Which host engine the command's dcgmi can reach: nv-hostengine started earlier in
    the same command, or `--host`; neither means none (dcgmi tries localhost)."""
    first = _DCGMI.search(command)
    if first is None:
        return HostEngine(False, None)
    engine = _HOST_ENGINE.search(command)
    option = _HOST_OPTION.search(command, first.end())
    return HostEngine(
        embedded=engine is not None and engine.start() < first.start(),
        host=option.group(1).strip("'\"") if option else None,
    )


def diag_level(command: str) -> int:
    m = _LEVEL.search(command)
    if not m:
        return 1
    value = m.group(1).lower()
    if value.isdigit():
        return max(1, min(4, int(value)))
    return _NAMED_LEVELS.get(value, 1)


def _kind(problem: str) -> str:
    p = problem.lower()
    if "fallen off the bus" in p or "xid 79" in p:
        return "bus"
    for key, kind in (("pcie", "pcie"), ("nvlink", "nvlink"), ("ecc-dbe", "dbe"),
                      ("row-remap", "remap"), ("temperature", "thermal"),
                      ("slowdown", "thermal"), ("clock event", "thermal"), ("xid", "xid")):
        if key in p:
            return kind
    return "other"


def _failing_tests(kind: str, level: int) -> set[str]:
    """The tests a GPU with this kind of problem fails at this level."""
    fails: set[str] = set()
    if kind == "bus":
        fails.add("software")  # the GPU is not accessible at all
    if level >= 2:
        fails.add("pcie" if kind in ("bus", "pcie", "nvlink") else "memory")
    if level >= 3:
        fails.add("diagnostic")
        if kind == "thermal":
            fails.add("targeted_power")
    return fails


def diag_report(level: int, gpus: int, driver: str, problems: dict[int, list[str]],
                only: list[int] | None = None) -> dict[str, Any]:
    """`dcgmi diag -r LEVEL -j` output as DCGM 4.x writes it."""
    categories: list[dict[str, Any]] = []
    for category, tests, since in _CATEGORIES:
        if level < since:
            continue
        out_tests = []
        for test in tests:
            results: list[dict[str, Any]] = []
            for gpu in (range(gpus) if only is None else only):
                entry: dict[str, Any] = {"entity_group": "GPU", "entity_group_id": 1,
                                         "entity_id": gpu, "status": "Pass"}
                warnings = []
                for problem in problems.get(gpu, []):
                    kind = _kind(problem)
                    if test in _failing_tests(kind, level):
                        error_id, error_category = _DCGM_FR[kind]
                        warnings.append({"error_category": error_category,
                                         "error_id": error_id,
                                         "error_severity": _SEVERITY_ISOLATE,
                                         "warning": problem})
                if warnings:
                    entry.update({"status": "Fail", "warnings": warnings})
                results.append(entry)
            failed = any(r["status"] == "Fail" for r in results)
            out_tests.append({"name": test, "results": results,
                              "test_summary": {"status": "Fail" if failed else "Pass"}})
        categories.append({"category": category, "tests": out_tests})
    return {"DCGM Diagnostic": {
        "test_categories": categories,
        "metadata": {"version": DCGM_VERSION, "driver_version_detected": driver},
    }}


def _text_report(report: dict[str, Any]) -> str:
    """dcgmi diag's table, for a command without -j."""
    lines = ["Successfully ran diagnostic for group.",
             "+---------------------------+------------------------------------------------+",
             "| Diagnostic                | Result                                         |",
             "+===========================+================================================+"]
    for cat in report["DCGM Diagnostic"]["test_categories"]:
        lines.append(f"|-----  {cat['category']}  ".ljust(28, "-") + "+" + "-" * 48 + "|")
        for test in cat["tests"]:
            lines.append(f"| {test['name']:<25} | {test['test_summary']['status']:<46} |")
            for r in test["results"]:
                for w in r.get("warnings") or []:
                    lines.append(f"| Warning: GPU{r['entity_id']:<13} | {w['warning'][:46]:<46} |")
    lines.append("+---------------------------+------------------------------------------------+")
    return "\n".join(lines) + "\n"


_GPU_LIST = re.compile(r"""(?:^|\s)(?:-i|--gpuList|--entity-id)[\s=]+['"]?([0-9][0-9,]*)""")
_GPU_LIST_FROM_ENV = re.compile(
    r"""\$\{(\w+):\+(?:-i|--gpuList|--entity-id)[\s=]+["']?\$\{?(\w+)\}?["']?\}""")


def gpu_list(command: str, env: dict[str, str]) -> list[int] | None:
    """The GPUs `dcgmi diag -i LIST` is restricted to (a ``${VAR:+-i "$VAR"}`` expanded
    from the container's environment), or None: every GPU of the node."""
    def expand(m: re.Match[str]) -> str:
        return f"-i {env[m.group(2)]}" if env.get(m.group(1)) and m.group(2) in env else ""
    m = _GPU_LIST.search(_GPU_LIST_FROM_ENV.sub(expand, command))
    if m is None:
        return None
    return sorted({int(x) for x in m.group(1).split(",") if x})


def run(command: str, engine: HostEngine, gpus: int, driver: str,
        health: Outcome | None, only: list[int] | None = None) -> tuple[int, str]:
    """Act out the container's command: (exit code, stdout). ``only``: the GPUs of
    `dcgmi diag -i` (a GPU the node lacks fails as dcgmi does); problems of the others
    are not in the report."""
    out = HOST_ENGINE_STARTED + "\n" if engine.embedded else ""
    if not engine.embedded and engine.host is None:
        return CONNECT_EXIT, out + NO_HOST_ENGINE.format(host="localhost")
    if not runs_diag(command):
        return 0, out
    problems: dict[int, list[str]] = {}
    if health is not None and not health.ok:
        for problem in health.problems or ["GPU health unknown"]:
            m = _GPU_PROBLEM.match(problem)
            if m is None:
                # No answer about the GPUs (the GPU simulator unreachable): no report.
                return DIAG_FAIL_EXIT, out + f"Error: Unable to complete diagnostic: {problem}\n"
            problems.setdefault(int(m.group(1)), []).append(problem)
    if only is not None:
        missing = [g for g in only if g >= gpus]
        if missing or not only:
            return DIAG_FAIL_EXIT, out + (f"Error: Unable to complete diagnostic: GPU "
                                          f"{missing} not found on this host\n")
    report = diag_report(diag_level(command), gpus, driver, problems, only)
    failed = any(t["test_summary"]["status"] == "Fail"
                 for c in report["DCGM Diagnostic"]["test_categories"] for t in c["tests"])
    body = json.dumps(report, indent=4) + "\n" if _JSON.search(command) else _text_report(report)
    return (DIAG_FAIL_EXIT if failed else 0), out + body


SECOND_ENGINE_EXIT = 1
SECOND_ENGINE = (
    "Err: Failed to start DCGM Server: a DCGM host engine already manages the GPUs of this "
    "node ({holders}). DCGM supports one host engine per set of GPUs; a second one beside "
    "it is unsupported and may deadlock.\n")


def second_engine(holders: list[str]) -> tuple[int, str]:
    """nv-hostengine started beside the node's running host engine (simulated wording)."""
    return SECOND_ENGINE_EXIT, SECOND_ENGINE.format(holders=", ".join(holders))


def unreachable_host(host: str) -> tuple[int, str]:
    return CONNECT_EXIT, NO_HOST_ENGINE.format(host=host)


def termination_message(pod: Obj, code: int, out: str) -> str:
    """What Kubernetes reports as the container's termination message: dcgmi writes no
    /dev/termination-log, so only FallbackToLogsOnError shows (the tail of) its output."""
    containers = (pod.get("spec") or {}).get("containers") or []
    policy = (containers[0].get("terminationMessagePolicy") if containers else None) or "File"
    if code == 0 or policy != "FallbackToLogsOnError":
        return ""
    tail = "\n".join(out.rstrip("\n").split("\n")[-FALLBACK_LINES:])
    return tail.encode()[-FALLBACK_BYTES:].decode(errors="ignore")


def reset_in_use(index: str | None, gpus: int, holders: list[Obj],
                 gpu_list: list[dict[str, object]] | None = None) -> str:
    """nvidia-smi -r's refusal, which pods hold the GPUs (what `fuser /dev/nvidia*` would
    have shown), and the holding processes as `nvidia-smi --query-compute-apps=gpu_uuid,
    pid,process_name --format=csv,noheader` lists them (one row per holder and GPU)."""
    targets = [index] if index is not None else [str(i) for i in range(max(gpus, 1))]
    names = ", ".join(
        f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in holders)
    lines = [SMI_IN_USE.format(gpu=t) for t in targets]
    lines.append(f"Processes using the GPUs belong to pods: {names}")
    uuids = {str(g.get("index")): str(g.get("uuid")) for g in gpu_list or []}
    rows = []
    for n, p in enumerate(holders):
        containers = (p.get("spec") or {}).get("containers") or [{}]
        process = " ".join(str(a) for a in containers[0].get("command") or []) or \
            f"/usr/bin/{containers[0].get('name', 'app')}"
        for t in targets:
            rows.append(f"{uuids.get(t, f'GPU-index-{t}')}, {4100 + 17 * n}, {process[:60]}")
    if rows:
        lines.append(COMPUTE_APPS_HEADER)
        lines += rows
    return "\n".join(lines)


COMPUTE_APPS_HEADER = "processes holding the GPUs (gpu_uuid, pid, process_name):"
_PM_OFF = re.compile(r"(?:-pm|--persistence-mode)(?:=|\s+)0\b")
_PM_ON = re.compile(r"(?:-pm|--persistence-mode)(?:=|\s+)1\b")


def turns_persistence_off(command: str) -> bool:
    return _PM_OFF.search(command) is not None


def restores_persistence(command: str) -> bool:
    return _PM_ON.search(command) is not None

