"""``gpu-remediate evaluate``: run the health policy over dcgm-exporter payloads, offline.

Other tools script against this command, so its JSON output is a contract:

    {"nodes": [{"node", "action", "findings": [{"gpu", "uuid", "signal", "value", "rule",
                                                "action", "detail"}]}],
     "errors": [{"source", "message"}],
     "warnings": [{"source", "message"}],
     "blind": [{"node", "signal", "missing": [metric, ...]}]}

``warnings``: sources read with a caveat (a host label that is the exporter pod's name).
``blind``: per node, the rules its payload cannot feed because the exporter does not serve
their fields (policy/signals.py): on the GPU Operator's stock counters, double-bit ECC,
row-remap-pending, clock reasons, recovery action, NVLink errors and repeat XIDs.

Exit codes: 0 every source was evaluated, 1 at least one source failed (it is listed in
``errors`` and contributes no node), 2 bad usage (no source, bad config file).

A source either counts whole or not at all: one unparsable line, unlabelled series or an empty
payload fails the source, because a half-read payload could hide the sick GPU, and "no data"
must never read as "healthy". A payload is refused by the same checks as a scrape of the node's
exporter (``activities.exposition.check_body``: cut, corrupted, not UTF-8, content after
``# EOF``, over the caps of ``FLEET_LIMITS``), so what the detector would not judge, ``evaluate``
does not judge either. HTTP redirects are not followed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Literal, TextIO

import httpx
import yaml
from pydantic import BaseModel, Field, ValidationError
from rich.console import Console
from rich.table import Table

from activities.exposition import (
    FLEET_LIMITS,
    ExpositionError,
    ParseResult,
    check_body,
    parse_exposition,
)
from policy.config import PolicySettings
from policy.models import GpuReading, NodeReadings, Verdict
from policy.rules import evaluate_fleet
from policy.signals import node_blind_signals
from worker.yamlfile import load_yaml

MAX_PAYLOAD_BYTES = FLEET_LIMITS.max_bytes
"""A fleet-wide federation payload is tens of MiB; more than this is not a metrics endpoint."""


class SourceError(BaseModel):
    """A source that could not be evaluated, and why."""

    source: str
    message: str


class NodeBlindSignal(BaseModel):
    """A rule that cannot fire on a node: its exporter serves none of the families named."""

    node: str
    signal: str
    missing: list[str]


class EvaluationReport(BaseModel):
    """The JSON document ``evaluate --output json`` prints."""

    nodes: list[Verdict] = Field(default_factory=list)
    errors: list[SourceError] = Field(default_factory=list)
    warnings: list[SourceError] = Field(
        default_factory=list,
        description="Sources evaluated with a caveat: a host label that names the exporter's "
                    "pod rather than a node.")
    blind: list[NodeBlindSignal] = Field(
        default_factory=list,
        description="Per node, the rules its payload cannot feed (policy/signals.py).")

    @property
    def ok(self) -> bool:
        return not self.errors


class ConfigError(Exception):
    """The config file cannot be used; the message names the file and the field."""


class _SourceFailed(Exception):
    pass


def load_policy_config(path: Path) -> PolicySettings:
    """Read the policy from a YAML file: a whole service config with a ``policy:`` key, or just
    the policy section."""
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping at the top level")
    prefix = "policy." if isinstance(data, dict) and "policy" in data else ""
    try:
        return PolicySettings.from_mapping(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{prefix}{'.'.join(str(p) for p in err['loc']) or '(policy)'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(f"invalid config file {path}: {problems}") from exc


def _read_limited(stream: Any) -> bytes:
    data: bytes = stream.read(MAX_PAYLOAD_BYTES + 1)
    if len(data) > MAX_PAYLOAD_BYTES:
        raise _SourceFailed(f"payload larger than {MAX_PAYLOAD_BYTES // (1024 * 1024)} MiB")
    return data


def _fetch(url: str, timeout_s: float) -> bytes:
    try:
        with (
            httpx.Client(timeout=timeout_s, follow_redirects=False) as client,
            client.stream("GET", url, headers={"Accept": "text/plain"}) as response,
        ):
            if response.status_code != 200:
                moved = " (redirects are not followed)" if response.is_redirect else ""
                raise _SourceFailed(f"HTTP {response.status_code} from {url}{moved}")
            chunks: list[bytes] = []
            size = 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > MAX_PAYLOAD_BYTES:
                    raise _SourceFailed(
                        f"payload larger than {MAX_PAYLOAD_BYTES // (1024 * 1024)} MiB"
                    )
                chunks.append(chunk)
            return b"".join(chunks)
    except httpx.TimeoutException as exc:
        raise _SourceFailed(f"timed out after {timeout_s:g} s fetching {url}") from exc
    except httpx.HTTPError as exc:
        raise _SourceFailed(f"cannot fetch {url}: {exc}") from exc


def _read_source(source: str, timeout_s: float) -> bytes:
    if source == "-":
        raw = _read_limited(sys.stdin.buffer)
    elif source.startswith(("http://", "https://")):
        raw = _fetch(source, timeout_s)
    else:
        try:
            with open(source, "rb") as handle:
                raw = _read_limited(handle)
        except OSError as exc:
            raise _SourceFailed(f"cannot read file: {exc.strerror or exc}") from exc
    return raw


def _parse_source(raw: bytes, node: str | None) -> ParseResult:
    try:
        check_body(raw, FLEET_LIMITS)
        result = parse_exposition(raw.decode("utf-8"), default_node=node, limits=FLEET_LIMITS)
    except ExpositionError as exc:
        raise _SourceFailed(str(exc)) from exc
    if result.bad_lines:
        raise _SourceFailed(
            f"{result.bad_lines} health metric line(s) did not parse; first: {result.examples[0]}"
        )
    if result.unlabelled:
        raise _SourceFailed(
            f"{result.unlabelled} sample(s) carry no Hostname/hostname label; "
            "name the node with --node"
        )
    if result.empty:
        raise _SourceFailed("no DCGM health samples in the payload (empty scrape?)")
    if not result.nodes:
        # Only NVSwitch/CPU entities: a scrape of such a node is refused too ("no GPU series").
        raise _SourceFailed("no GPU series in the payload")
    return result


_POD_SUFFIX_RE = re.compile(r"-[bcdfghjklmnpqrstvwxz2456789]{5}$")
"""The random suffix Kubernetes gives a DaemonSet's pods (its alphabet has no vowels and no
0, 1, 3): ``nvidia-dcgm-exporter-x7k2p``."""


def looks_like_exporter_pod(name: str) -> bool:
    """True when a host label reads as dcgm-exporter's pod name, not a node name: what the
    exporter writes when ``NODE_NAME`` is not set (it then names the pod it runs in)."""
    return ("dcgm" in name or "exporter" in name) and _POD_SUFFIX_RE.search(name) is not None


def _name_nodes(result: ParseResult, node: str | None, source: str,
                warnings: list[SourceError]) -> list[NodeReadings]:
    """The source's nodes as the user named them. ``--node`` names the node of a one-host
    payload whatever its host label says (as the scrape does: one exporter, one node), and
    picks that node out of a federation payload. Without it, a host label that is an exporter
    pod's name is used, with a warning saying so."""
    if node is not None:
        if len(result.nodes) == 1:
            return [result.nodes[0].model_copy(update={"node": node})]
        mine = [n for n in result.nodes if n.node == node]
        if not mine:
            names = ", ".join(n.node[:80] for n in result.nodes[:5])
            raise _SourceFailed(
                f"the payload holds {len(result.nodes)} hosts ({names}), none named {node}")
        return mine
    for readings in result.nodes:
        if looks_like_exporter_pod(readings.node):
            warnings.append(SourceError(source=source, message=(
                f"the host label {readings.node[:80]!r} looks like the dcgm-exporter pod's "
                "name, not a node name (an exporter without NODE_NAME writes its pod's name "
                "in its Hostname/hostname label): the verdict is named after the pod; give "
                "--node NODE, or set NODE_NAME in the exporter")))
    return result.nodes


def _merge(nodes: list[NodeReadings]) -> list[NodeReadings]:
    """One entry per node name; a GPU seen in two sources keeps the first source's reading."""
    merged: dict[str, dict[str, GpuReading]] = {}
    for readings in nodes:
        gpus = merged.setdefault(readings.node, {})
        for gpu in readings.gpus:
            gpus.setdefault(gpu.uuid or f"index:{gpu.gpu}", gpu)
    return [NodeReadings(node=n, gpus=list(g.values())) for n, g in sorted(merged.items())]


def evaluate_sources(
    sources: list[str], *, node: str | None, config: PolicySettings, timeout_s: float = 10
) -> EvaluationReport:
    """Read, parse and evaluate every source; failures are collected, never raised."""
    report = EvaluationReport()
    readings: list[NodeReadings] = []
    for source in sources:
        try:
            result = _parse_source(_read_source(source, timeout_s), node)
            readings.extend(_name_nodes(result, node, source, report.warnings))
        except _SourceFailed as exc:
            report.errors.append(SourceError(source=source, message=str(exc)))
            continue
    merged = _merge(readings)
    report.nodes = evaluate_fleet(merged, config)
    report.blind = [NodeBlindSignal(node=r.node, signal=b.signal, missing=b.missing)
                    for r in merged for b in node_blind_signals(r, config)]
    return report


def _print_table(report: EvaluationReport, out: TextIO) -> None:
    # Piped output has no terminal width; rich would squeeze it to 80 columns and split rule ids
    # across lines, which breaks grep.
    width = None if getattr(out, "isatty", lambda: False)() else 200
    # Node names, UUIDs and messages come from the payload: never read them as markup.
    console = Console(file=out, width=width, markup=False, emoji=False)
    table = Table(title="GPU node health")
    for column in ("Node", "Action", "GPU", "UUID", "Rule", "Signal", "Value", "Finding action"):
        table.add_column(column, no_wrap=column in ("Node", "UUID", "Rule", "Signal"))
    for verdict in report.nodes:
        if not verdict.findings:
            table.add_row(verdict.node, verdict.action.value, "", "", "", "", "", "")
        for i, f in enumerate(verdict.findings):
            table.add_row(
                verdict.node if i == 0 else "",
                verdict.action.value if i == 0 else "",
                f.gpu,
                f.uuid,
                f.rule,
                f.signal,
                f"{f.value:g}",
                f.action.value,
            )
    console.print(table)
    for w in report.warnings:
        console.print(f"warning: {w.source}: {w.message}")
    if report.blind:
        blind = Table(title="Rules the exporter cannot feed (blind)")
        for column in ("Node", "Signal", "Missing families"):
            blind.add_column(column)
        for b in report.blind:
            blind.add_row(b.node, b.signal, ", ".join(b.missing))
        console.print(blind)
    if report.errors:
        errors = Table(title="Sources that failed")
        errors.add_column("Source")
        errors.add_column("Message")
        for e in report.errors:
            errors.add_row(e.source, e.message)
        console.print(errors)


def run_evaluate(
    sources: list[str],
    node: str | None,
    config_path: Path | None,
    output: Literal["json", "table"],
) -> int:
    """The ``evaluate`` command: prints the report to stdout and returns the exit code."""
    if not sources:
        print("error: give at least one metrics source (file, '-' or http(s) URL)", file=sys.stderr)
        return 2
    if output not in ("json", "table"):
        print(f"error: --output must be 'json' or 'table', not {output!r}", file=sys.stderr)
        return 2
    try:
        config = load_policy_config(config_path) if config_path else PolicySettings()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = evaluate_sources(sources, node=node, config=config)
    if output == "json":
        sys.stdout.write(report.model_dump_json() + "\n")
    else:
        _print_table(report, sys.stdout)
    sys.stdout.flush()
    return 0 if report.ok else 1
