"""``gpu-remediate check``: a one-shot health check of this machine's GPUs.

Reads every local GPU through NVML (nvidia-ml-py) or, without it, ``nvidia-smi -q -x``, adds the
XIDs of the kernel log (or of NVML events), and runs the same policy as ``evaluate``, printing
the same report (``{"nodes": [...], "errors": [{"source", "message"}]}`` or the same table).

Exit codes:

- 0: healthy (the node's action is ``none`` or ``app``) and every GPU and health field was read;
- 1: a node action is needed (``thermal``, ``reset``, ``reboot``, ``quarantine``), or the check
  is incomplete (a GPU or a health field could not be read: no data never passes as healthy);
- 2: bad usage (bad option value, bad config file, ``--probe nvml`` without nvidia-ml-py);
- 3: no NVIDIA driver or no NVIDIA GPU on this machine.

``errors`` lists every source that could not be read, including ones that do not fail the check
(nvidia-ml-py not installed when nvidia-smi answered, a kernel log we may not read).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from policy.config import PolicyConfig
from policy.models import SEVERITY, Action, GpuReading, NodeReadings
from policy.rules import XidSighting, evaluate_node, gpu_key, xid_repeat_counts
from worker.evaluate import (
    ConfigError,
    EvaluationReport,
    SourceError,
    _print_table,
    load_policy_config,
)
from worker.gpu_probe.common import (
    NoDriverError,
    ProbedGpu,
    ProbeIssue,
    ProbeResult,
    ProbeUnavailable,
    Runner,
    format_pci,
    pci_key,
    run_command,
)
from worker.gpu_probe.kernel_log import KernelXid, parse_kernel_log, read_kernel_log
from worker.gpu_probe.nvml import NvmlSession, load_pynvml
from worker.gpu_probe.smi import probe_nvidia_smi

EXIT_HEALTHY = 0
EXIT_ACTION_NEEDED = 1
EXIT_USAGE = 2
EXIT_NO_DRIVER = 3

PROBES = ("auto", "nvml", "nvidia-smi")
XID_SOURCES = ("dmesg", "nvml", "none")
HEALTHY_ACTIONS = (Action.NONE, Action.APP)

RETIRED_PAGES_LIMIT = 63
"""DCGM fails a pre-Ampere GPU at 63 retired pages (``DCGM_FR_RETIRED_PAGES_LIMIT``)."""


def _read_uptime() -> float | None:
    try:
        with open("/proc/uptime", encoding="ascii") as handle:
            return float(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _driver_loaded() -> bool:
    return os.path.exists("/proc/driver/nvidia/version")


@dataclass
class CheckEnv:
    """Everything ``check`` touches on the machine, so tests can replace it."""

    load_nvml: Callable[[], Any] = load_pynvml
    run: Runner = run_command
    hostname: Callable[[], str] = socket.gethostname
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    uptime_s: Callable[[], float | None] = _read_uptime
    driver_loaded: Callable[[], bool] = _driver_loaded


@dataclass
class CheckOutcome:
    """What ``check`` found: the report, the exit code and lines for humans on stderr."""

    report: EvaluationReport
    exit_code: int
    problem: str | None = None
    """Why there is no verdict (no driver, no usable probe); None when there is one."""
    notes: list[str] = field(default_factory=list)
    readings: NodeReadings | None = None


class UsageError(Exception):
    pass


@dataclass(frozen=True)
class _XidEvent:
    xid: int
    at_s: float | None
    pci: tuple[int, int, int] | None = None
    uuid: str = ""


def node_name(node: str | None, env: CheckEnv) -> str:
    """``--node``, else ``NODE_NAME`` (the Kubernetes node name from the downward API, which a
    pod's hostname is not), else the hostname."""
    return node or env.environ.get("NODE_NAME") or env.hostname()


# ---------------------------------------------------------------------------------- probing
def _probe(
    probe: str, env: CheckEnv, stack: contextlib.ExitStack, issues: list[ProbeIssue]
) -> tuple[ProbeResult | None, NvmlSession | None, str | None, bool]:
    """(result, open NVML session, why no result, whether that is "no driver/GPU")."""
    failures: list[str] = []
    all_no_driver = True
    no_gpu: str | None = None
    if probe in ("auto", "nvml"):
        nvml = env.load_nvml()
        if nvml is None:
            if probe == "nvml":
                raise UsageError(
                    "--probe nvml needs nvidia-ml-py: pip install 'gpu-remediate[gpu]'"
                )
            message = "nvidia-ml-py (pynvml) is not installed: pip install 'gpu-remediate[gpu]'"
            issues.append(ProbeIssue("nvml", message))
            failures.append("NVML: nvidia-ml-py not installed")
        else:
            session = NvmlSession(nvml)
            try:
                stack.enter_context(session)
                return session.read(), session, None, False
            except NoDriverError as exc:
                no_gpu = f"NVML: {exc}"
                failures.append(no_gpu)
            except ProbeUnavailable as exc:
                issues.append(ProbeIssue("nvml", str(exc)))
                failures.append(f"NVML: {exc}")
                all_no_driver &= exc.no_driver
    if probe in ("auto", "nvidia-smi") and no_gpu is None:
        try:
            return probe_nvidia_smi(env.run), None, None, False
        except NoDriverError as exc:
            no_gpu = str(exc)
            failures.append(no_gpu)
        except ProbeUnavailable as exc:
            issues.append(ProbeIssue("nvidia-smi", str(exc)))
            failures.append(str(exc))
            all_no_driver &= exc.no_driver
    if no_gpu is not None:
        return None, None, f"no NVIDIA GPU found on this machine ({no_gpu})", True
    reasons = "; ".join(failures)
    if all_no_driver and not env.driver_loaded():
        return None, None, f"no NVIDIA driver found on this machine ({reasons})", True
    hint = " although the NVIDIA driver is loaded" if env.driver_loaded() else ""
    return None, None, f"cannot read the GPUs{hint} ({reasons})", False


# ---------------------------------------------------------------------------------- XIDs
def _kernel_xids(env: CheckEnv, issues: list[ProbeIssue]) -> list[_XidEvent]:
    text, problems = read_kernel_log(env.run)
    issues.extend(problems)
    if text is None:
        return []
    found: list[KernelXid] = parse_kernel_log(text)
    return [_XidEvent(xid=x.xid, at_s=x.at_s, pci=x.pci) for x in found]


def _xid_severity(xid: int, config: PolicyConfig) -> int:
    row = config.xid_rule(xid)
    return SEVERITY[row.action if row is not None else config.unknown_xid_action]


def attach_xids(
    gpus: list[GpuReading], events: list[_XidEvent], config: PolicyConfig, now_s: float | None
) -> tuple[list[GpuReading], dict[str, dict[int, int]]]:
    """Put each GPU's XID into its reading and count repeats for the app-XID escalation.

    A reading holds one XID; a one-shot check must not let a later harmless XID (13, 31) hide an
    earlier fatal one, so it takes the most severe XID the GPU logged (the latest among equals).
    An XID whose PCI address is no listed GPU (one that fell off the bus vanishes from NVML)
    becomes a reading of its own, named by the address, so its XID still counts.
    """
    by_pci: dict[tuple[int, int, int], int] = {}
    by_uuid: dict[str, int] = {}
    readings = list(gpus)
    for i, gpu in enumerate(readings):
        pci = pci_key(gpu.pci_bus_id) if gpu.pci_bus_id else None
        if pci is not None:
            by_pci.setdefault(pci, i)
        if gpu.uuid:
            by_uuid.setdefault(gpu.uuid, i)
    per_gpu: dict[int, list[_XidEvent]] = {}
    for event in events:
        index = by_uuid.get(event.uuid) if event.uuid else None
        if index is None and event.pci is not None:
            index = by_pci.get(event.pci)
            if index is None:
                bus_id = format_pci(event.pci)
                readings.append(GpuReading(gpu=bus_id, pci_bus_id=bus_id))
                index = by_pci[event.pci] = len(readings) - 1
        if index is None:
            continue
        per_gpu.setdefault(index, []).append(event)
    sightings: list[XidSighting] = []
    now = now_s if now_s is not None else 0.0
    for index, seen in per_gpu.items():
        # max() keeps the first of equals: walk newest first so the latest wins.
        worst = max(reversed(seen), key=lambda e: _xid_severity(e.xid, config))
        readings[index] = readings[index].model_copy(update={"xid": worst.xid})
        key = gpu_key(readings[index])
        for event in seen:
            at = event.at_s if event.at_s is not None and now_s is not None else now
            sightings.append(XidSighting(gpu=key, xid=event.xid, at_s=at))
    return readings, xid_repeat_counts(sightings, now_s=now, config=config)


# ---------------------------------------------------------------------------------- check
def _notes(gpus: list[ProbedGpu]) -> list[str]:
    notes: list[str] = []
    for probed in gpus:
        gpu = probed.reading
        if probed.mig_enabled and gpu.row_remap_pending is None:
            notes.append(
                f"GPU {gpu.gpu}: MIG is enabled; row-remap state is not readable while MIG "
                "instances exist (check it with MIG disabled or through DCGM)"
            )
        pages = probed.retired_pages
        if pages is None:
            continue
        total = (pages.single_bit or 0) + (pages.double_bit or 0)
        if pages.pending or total:
            severity = "over DCGM's limit of 63" if total >= RETIRED_PAGES_LIMIT else "retired"
            notes.append(
                f"GPU {gpu.gpu}: {total} page(s) {severity} (single-bit {pages.single_bit}, "
                f"double-bit {pages.double_bit}), pending retirement: "
                f"{'yes (takes effect after a reboot)' if pages.pending else 'no'}; "
                "the policy has no rule for pre-Ampere page retirement, so this is not in "
                "the verdict"
            )
    return notes


def check_host(
    *,
    node: str | None,
    config: PolicyConfig,
    xid_source: str,
    xid_wait: float,
    probe: str = "auto",
    env: CheckEnv | None = None,
) -> CheckOutcome:
    """Probe, add XIDs, evaluate. Raises ``UsageError`` for bad option values."""
    env = env or CheckEnv()
    if probe not in PROBES:
        raise UsageError(f"--probe must be one of {', '.join(PROBES)}, not {probe!r}")
    if xid_source not in XID_SOURCES:
        raise UsageError(
            f"--xid-source must be one of {', '.join(XID_SOURCES)}, not {xid_source!r}"
        )
    if not xid_wait >= 0:
        raise UsageError(f"--xid-wait must be >= 0 seconds, not {xid_wait!r}")
    issues: list[ProbeIssue] = []
    with contextlib.ExitStack() as stack:
        result, session, problem, no_driver = _probe(probe, env, stack, issues)
        if result is None:
            report = EvaluationReport(
                errors=[SourceError(source=i.source, message=i.message) for i in issues]
            )
            if not report.errors:
                report.errors.append(SourceError(source="check", message=problem or ""))
            code = EXIT_NO_DRIVER if no_driver else EXIT_ACTION_NEEDED
            return CheckOutcome(report=report, exit_code=code, problem=problem)
        issues.extend(result.issues)
        events: list[_XidEvent] = []
        if xid_source == "dmesg":
            events = _kernel_xids(env, issues)
        elif xid_source == "nvml":
            if session is None:
                issues.append(
                    ProbeIssue(
                        "xid:nvml", "NVML is not in use (nvidia-smi probe), XID events not read"
                    )
                )
            elif xid_wait <= 0:
                issues.append(
                    ProbeIssue(
                        "xid:nvml",
                        "--xid-wait is 0: XID events not listened for (NVML keeps no XID history; "
                        "give --xid-wait seconds or use --xid-source dmesg)",
                    )
                )
            else:
                found, problems = session.wait_xids(xid_wait)
                issues.extend(problems)
                events = [_XidEvent(xid=x, at_s=None, uuid=u) for u, x in found]
    config_now = env.uptime_s() if xid_source == "dmesg" else None
    gpus, repeats = attach_xids([g.reading for g in result.gpus], events, config, config_now)
    readings = NodeReadings(node=node_name(node, env), gpus=gpus)
    verdict = evaluate_node(readings, config, xid_repeats=repeats)
    report = EvaluationReport(
        nodes=[verdict],
        errors=[SourceError(source=i.source, message=i.message) for i in issues],
    )
    incomplete = any(i.fatal for i in issues)
    needed = verdict.action not in HEALTHY_ACTIONS
    code = EXIT_ACTION_NEEDED if needed or incomplete else EXIT_HEALTHY
    return CheckOutcome(report=report, exit_code=code, notes=_notes(result.gpus), readings=readings)


def run_check(
    *,
    node: str | None,
    config_path: Path | None,
    output: Literal["json", "table"],
    xid_source: str,
    xid_wait: float,
    probe: str = "auto",
    env: CheckEnv | None = None,
) -> int:
    """The ``check`` command: prints the report to stdout, humans' notes to stderr, and returns
    the exit code (0 healthy, 1 action needed or check incomplete, 2 bad usage, 3 no driver)."""
    if output not in ("json", "table"):
        print(f"error: --output must be 'json' or 'table', not {output!r}", file=sys.stderr)
        return EXIT_USAGE
    try:
        config = load_policy_config(config_path) if config_path else PolicyConfig()
        outcome = check_host(
            node=node,
            config=config,
            xid_source=xid_source,
            xid_wait=xid_wait,
            probe=probe,
            env=env,
        )
    except (ConfigError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if outcome.problem is not None:
        print(f"error: {outcome.problem}", file=sys.stderr)
    if output == "json":
        sys.stdout.write(outcome.report.model_dump_json() + "\n")
    elif outcome.problem is None:
        _print_table(outcome.report, sys.stdout)
    for note in outcome.notes:
        print(f"note: {note}", file=sys.stderr)
    incomplete = (
        outcome.problem is None
        and outcome.exit_code == EXIT_ACTION_NEEDED
        and (outcome.report.nodes[0].action in HEALTHY_ACTIONS)
    )
    if incomplete:
        print(
            "error: the check is incomplete (see the failed sources): not reporting healthy",
            file=sys.stderr,
        )
    sys.stdout.flush()
    return outcome.exit_code
