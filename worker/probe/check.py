"""``gpu-remediate check``: a one-shot health check of this machine's GPUs.

Reads every local GPU through NVML (nvidia-ml-py) or, without it, ``nvidia-smi -q -x`` (or a
saved copy of that XML: ``--from-file``), adds the XIDs of the kernel log (or of NVML events, or
of a saved log: ``--xid-log``), and runs the same policy as ``evaluate``, printing the same
report (``{"nodes": [...], "errors": [{"source", "message"}]}`` or the same table).

The exit code encodes the node's action by severity, the same numbers the original Go tool's
``check`` used, so scripts that gate on it keep working (``EXIT_CODES``; docs/check.md).

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

from policy import nvlink5
from policy.config import PolicySettings
from policy.models import SEVERITY, Action, GpuReading, NodeReadings, XidDetail
from policy.rules import XidSighting, evaluate_node, gpu_key, xid_repeat_counts
from worker.probe.common import (
    NoDriverError,
    ProbedGpu,
    ProbeIssue,
    ProbeMissing,
    ProbeResult,
    ProbeUnavailable,
    Runner,
    format_pci,
    pci_key,
    run_command,
)
from worker.probe.evaluate import (
    ConfigError,
    EvaluationReport,
    SourceError,
    _print_table,
    load_policy_config,
)
from worker.probe.exit_codes import (
    EXIT_BY_ACTION,
    EXIT_ERROR,
    EXIT_NO_DRIVER,
    EXIT_USAGE,
)
from worker.probe.kernel_log import (
    KernelXid,
    parse_kernel_log,
    read_kernel_log,
    read_xid_log_file,
)
from worker.probe.nvml import NvmlSession, load_pynvml
from worker.probe.smi import parse_nvidia_smi_xml, probe_nvidia_smi

PROBES = ("auto", "nvml", "nvidia-smi")
XID_SOURCES = ("dmesg", "nvml", "none")
HEALTHY_ACTIONS = (Action.NONE, Action.APP)
STDIN = "-"

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


def _read_text(path: str) -> str:
    """A file's text, ``-`` for stdin; ``OSError`` as the file system says."""
    if path == STDIN:
        return sys.stdin.read()
    return Path(path).read_text(encoding="utf-8", errors="replace")


@dataclass
class CheckEnv:
    """Everything ``check`` touches on the machine, so tests can replace it."""

    load_nvml: Callable[[], Any] = load_pynvml
    run: Runner = run_command
    hostname: Callable[[], str] = socket.gethostname
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    uptime_s: Callable[[], float | None] = _read_uptime
    driver_loaded: Callable[[], bool] = _driver_loaded
    read_text: Callable[[str], str] = _read_text


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
    detail: XidDetail | None = None


def node_name(node: str | None, env: CheckEnv) -> str:
    """``--node``, else ``NODE_NAME`` (the Kubernetes node name from the downward API, which a
    pod's hostname is not), else the hostname."""
    return node or env.environ.get("NODE_NAME") or env.hostname()


# ---------------------------------------------------------------------------------- probing
def _from_file(path: str, env: CheckEnv) -> ProbeResult:
    """The GPUs of a saved ``nvidia-smi -q -x``; bad input is a usage error naming the file."""
    try:
        text = env.read_text(path)
    except OSError as exc:
        raise UsageError(f"--from-file {path}: cannot read: {exc.strerror or exc}") from exc
    try:
        return parse_nvidia_smi_xml(text)
    except ProbeUnavailable as exc:
        raise UsageError(f"--from-file {path}: {exc}") from exc


def _probe(
    probe: str,
    env: CheckEnv,
    stack: contextlib.ExitStack,
    issues: list[ProbeIssue],
    nvidia_smi: str = "nvidia-smi",
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
            return probe_nvidia_smi(env.run, binary=nvidia_smi), None, None, False
        except ProbeMissing as exc:
            if nvidia_smi != "nvidia-smi":
                # A path the user gave that is not there is their typo, not "no driver".
                raise UsageError(f"--nvidia-smi {nvidia_smi}: {exc}") from exc
            issues.append(ProbeIssue("nvidia-smi", str(exc)))
            failures.append(str(exc))
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
def _xid_log(path: str, env: CheckEnv) -> tuple[list[_XidEvent], float | None]:
    """The XIDs of a saved kernel log and the latest boot timestamp in it."""
    try:
        text = env.read_text(path)
    except OSError as exc:
        raise UsageError(f"--xid-log {path}: cannot read: {exc.strerror or exc}") from exc
    found, last_s = read_xid_log_file(text)
    return [_event(x) for x in found], last_s


def _kernel_xids(env: CheckEnv, issues: list[ProbeIssue]) -> list[_XidEvent]:
    text, problems = read_kernel_log(env.run)
    issues.extend(problems)
    if text is None:
        return []
    found: list[KernelXid] = parse_kernel_log(text)
    return [_event(x) for x in found]


def _event(x: KernelXid) -> _XidEvent:
    return _XidEvent(xid=x.xid, at_s=x.at_s, pci=x.pci, detail=x.detail)


def _xid_severity(event: _XidEvent, config: PolicySettings) -> int:
    """How bad one logged XID is: an NVLink5 line as NVIDIA's decode sheet resolves it (a
    non-fatal subcode must not hide a fatal one of the same XID), any other by its row."""
    if event.detail is not None and event.xid not in config.xid_overrides:
        decoded = nvlink5.decode(event.detail)
        if decoded is not None:
            return SEVERITY[nvlink5.RESOLUTION_ACTION[decoded.resolution]]
    row = config.xid_rule(event.xid)
    return SEVERITY[row.action if row is not None else config.unknown_xid_action]


def attach_xids(
    gpus: list[GpuReading], events: list[_XidEvent], config: PolicySettings, now_s: float | None
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
        worst = max(reversed(seen), key=lambda e: _xid_severity(e, config))
        readings[index] = readings[index].model_copy(
            update={"xid": worst.xid, "xid_detail": worst.detail})
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


def _sources(
    *,
    probe: str,
    xid_source: str | None,
    nvidia_smi: str | None,
    from_file: str | None,
    xid_log: str | None,
) -> tuple[str, str]:
    """The probe and XID source the options mean; conflicting options name each other."""
    if probe not in PROBES:
        raise UsageError(f"--probe must be one of {', '.join(PROBES)}, not {probe!r}")
    if xid_source is not None and xid_source not in XID_SOURCES:
        raise UsageError(
            f"--xid-source must be one of {', '.join(XID_SOURCES)}, not {xid_source!r}"
        )
    if from_file is not None:
        if probe != "auto":
            raise UsageError(f"--from-file reads a saved nvidia-smi -q -x: drop --probe {probe}")
        if nvidia_smi is not None:
            raise UsageError("--from-file and --nvidia-smi both say where the GPUs come from")
        if xid_source not in (None, "none"):
            # The saved file comes from another time, often another machine: this one's
            # kernel log or NVML events would be pinned on GPUs that are not here.
            raise UsageError(
                f"--xid-source {xid_source} reads this machine, --from-file a saved one: "
                "give the saved kernel log with --xid-log FILE"
            )
    if nvidia_smi is not None:
        if probe == "nvml":
            raise UsageError("--nvidia-smi and --probe nvml: choose one probe")
        probe = "nvidia-smi"
    if xid_log is not None:
        if xid_source not in (None, "dmesg"):
            raise UsageError(f"--xid-log and --xid-source {xid_source}: choose one XID source")
        return probe, "file"
    if xid_source is None:
        return probe, "none" if from_file is not None else "dmesg"
    return probe, xid_source


def check_host(
    *,
    node: str | None,
    config: PolicySettings,
    xid_source: str | None,
    xid_wait: float,
    probe: str = "auto",
    nvidia_smi: str | None = None,
    from_file: str | None = None,
    xid_log: str | None = None,
    env: CheckEnv | None = None,
) -> CheckOutcome:
    """Probe (or read ``from_file``), add XIDs, evaluate. Raises ``UsageError`` for bad option
    values, conflicting options and unreadable ``from_file``/``xid_log``."""
    env = env or CheckEnv()
    probe, xid_source = _sources(
        probe=probe,
        xid_source=xid_source,
        nvidia_smi=nvidia_smi,
        from_file=from_file,
        xid_log=xid_log,
    )
    if not xid_wait >= 0:
        raise UsageError(f"--xid-wait must be >= 0 seconds, not {xid_wait!r}")
    issues: list[ProbeIssue] = []
    with contextlib.ExitStack() as stack:
        session: NvmlSession | None = None
        result: ProbeResult | None
        problem: str | None
        if from_file is not None:
            problem, no_driver = None, False
            try:
                result = _from_file(from_file, env)
            except NoDriverError as exc:
                result, problem, no_driver = None, f"{from_file}: {exc}", True
        else:
            result, session, problem, no_driver = _probe(
                probe, env, stack, issues, nvidia_smi or "nvidia-smi"
            )
        if result is None:
            report = EvaluationReport(
                errors=[SourceError(source=i.source, message=i.message) for i in issues]
            )
            if not report.errors:
                report.errors.append(SourceError(source="check", message=problem or ""))
            code = EXIT_NO_DRIVER if no_driver else EXIT_ERROR
            return CheckOutcome(report=report, exit_code=code, problem=problem)
        issues.extend(result.issues)
        events: list[_XidEvent] = []
        log_end_s: float | None = None
        if xid_source == "file":
            assert xid_log is not None
            events, log_end_s = _xid_log(xid_log, env)
        elif xid_source == "dmesg":
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
    now_s = _escalation_now(xid_source, live=from_file is None, log_end_s=log_end_s, env=env)
    gpus, repeats = attach_xids([g.reading for g in result.gpus], events, config, now_s)
    name = node or (_file_node(from_file) if from_file is not None else node_name(None, env))
    readings = NodeReadings(node=name, gpus=gpus)
    verdict = evaluate_node(readings, config, xid_repeats=repeats)
    report = EvaluationReport(
        nodes=[verdict],
        errors=[SourceError(source=i.source, message=i.message) for i in issues],
    )
    incomplete = any(i.fatal for i in issues)
    code = EXIT_ERROR if incomplete else EXIT_BY_ACTION[verdict.action]
    return CheckOutcome(report=report, exit_code=code, notes=_notes(result.gpus), readings=readings)


def _escalation_now(
    xid_source: str, *, live: bool, log_end_s: float | None, env: CheckEnv
) -> float | None:
    """Seconds since boot that the app-XID escalation window ends at: this machine's uptime
    for its own kernel log; for a saved log the last time it reaches, or the uptime when the
    check is live and the log is of this boot (the uptime is then later)."""
    if xid_source == "dmesg":
        return env.uptime_s()
    if xid_source != "file":
        return None
    uptime = env.uptime_s() if live else None
    known = [t for t in (log_end_s, uptime) if t is not None]
    return max(known) if known else None


def _file_node(path: str) -> str:
    """A saved file's node name when ``--node`` is not given: the file, not this host."""
    return "stdin" if path == STDIN else Path(path).name


def run_check(
    *,
    node: str | None,
    config_path: Path | None,
    output: Literal["json", "table"],
    xid_source: str | None,
    xid_wait: float,
    probe: str = "auto",
    nvidia_smi: str | None = None,
    from_file: str | None = None,
    xid_log: str | None = None,
    env: CheckEnv | None = None,
) -> int:
    """The ``check`` command: prints the report to stdout, humans' notes to stderr, and returns
    the exit code (``EXIT_CODES``)."""
    if output not in ("json", "table"):
        print(f"error: --output must be 'json' or 'table', not {output!r}", file=sys.stderr)
        return EXIT_USAGE
    try:
        config = load_policy_config(config_path) if config_path else PolicySettings()
        outcome = check_host(
            node=node,
            config=config,
            xid_source=xid_source,
            xid_wait=xid_wait,
            probe=probe,
            nvidia_smi=nvidia_smi,
            from_file=from_file,
            xid_log=xid_log,
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
    if outcome.problem is None and outcome.exit_code == EXIT_ERROR:
        action = outcome.report.nodes[0].action.value
        print(
            "error: the check is incomplete (see the failed sources): the action "
            f"{action!r} is only what the readable fields show",
            file=sys.stderr,
        )
    sys.stdout.flush()
    return outcome.exit_code
