"""The `gpu-remediate` command line."""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, TypeVar

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from policy.models import Action
from worker import tokens
from worker.cli import operator as ops
from worker.cli.locate import (
    Located,
    kubernetes_unreachable,
    locate,
    running_stack,
    temporal_unreachable,
)
from worker.cli.output import (
    EXIT_FAILED,
    EXIT_USAGE,
    exit_codes_help,
    plain_table,
    print_table,
    rich_table,
    shown,
)
from worker.config import ConfigError, Settings, TemporalSettings, load_settings
from worker.logs import configure_logging
from worker.temporal_client import connect
from workflows.detector import DetectorWorkflow
from workflows.ids import DETECTOR_WORKFLOW_ID, MAX_REASON_CHARS
from workflows.incidents import DomainIncident
from workflows.messages import (
    DetectorInput,
    GpuUse,
    IncidentCommand,
    ManualRemediation,
    OperatorAck,
    OperatorCommand,
    OrphanRelease,
    RemediationView,
    node_problem,
)
from workflows.settings import domain_name

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

app = typer.Typer(
    name="gpu-remediate",
    help="Detect sick GPU nodes from DCGM metrics and remediate them with Temporal workflows.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
    epilog=exit_codes_help(),
)
detector_app = typer.Typer(help="Start, stop, pause and inspect the detector.",
                           no_args_is_help=True)
app.add_typer(detector_app, name="detector")
incident_app = typer.Typer(help="Domain incidents: a fault domain whose nodes failed together.",
                           no_args_is_help=True)
app.add_typer(incident_app, name="incident")


@app.command("sim", add_help_option=False,
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sim(ctx: typer.Context) -> None:
    """Simulators for laptops and tests: a GPU fleet and a cluster (`sim --help`)."""
    # Loaded here, not at import: no other command (and not the worker) loads a simulator.
    from sim.cli import sim_app

    typer.main.get_command(sim_app).main(args=list(ctx.args), prog_name="gpu-remediate sim")

@app.command()
def simulate(
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="The config to simulate (its detector, policy and remediation "
                               "sections). Default: the built-in defaults.")] = None,
    nodes: Annotated[int, typer.Option(min=1, help="GPU nodes in the fleet.")] = 2000,
    gpus_per_node: Annotated[int, typer.Option(min=1, max=64, help="GPUs per node.")] = 8,
    domains: Annotated[int, typer.Option(
        min=1, help="Fault domains (the value of detector.pool_label, when set).")] = 1,
    days: Annotated[float, typer.Option(min=0.01, help="Simulated days.")] = 7.0,
    seed: Annotated[int, typer.Option(help="The fault sequence: same seed, same faults.")] = 1,
    faults: Annotated[Path | None, typer.Option(
        "--faults", help="Fault model (YAML or JSON): rates per GPU-day by cause, repair "
                         "outcomes. Default: the published figures (docs/simulate.md).")] = None,
    compare: Annotated[Path | None, typer.Option(
        "--compare", help="Another config, run on the same faults, printed beside.")] = None,
    segment_days: Annotated[float | None, typer.Option(
        "--segment-days", min=0.0,
        help="Run the period over several test servers, this many simulated days each "
             "(handed over at the first quiet tick past each boundary). Default: automatic "
             "(about a day at 10,000 nodes and a 10-minute interval; one server for a short "
             "run). 0, or at least --days: one server.")] = None,
    output: OutputOpt = "table",
) -> None:
    """A fleet-month in minutes: the real detector and remediation workflows on Temporal's
    time-skipping test server, against an in-memory fleet with a fault model. Prints GPU-hours
    lost, MTTR per action, the most nodes out of service (as the budget counts) with the
    budget, breaker trips, quarantines and faults by cause. Try a policy or budget change
    here before `detector reconfigure`.

    Example: `gpu-remediate simulate --nodes 2000 --days 7 --seed 1 --compare new.yaml`
    """
    from worker.simulate.faults import FaultModelError, load_fault_model
    from worker.simulate.run import (
        Comparison,
        SimulationTooLarge,
        check_size,
        rows,
    )
    from worker.simulate.run import (
        simulate as run_simulation,
    )

    try:
        model = load_fault_model(faults)
    except FaultModelError as e:
        fail(str(e), EXIT_USAGE)
    configs = [(config, settings_of(config), watchers_of(config))]
    if compare is not None:
        configs.append((compare, settings_of(compare), watchers_of(compare)))
    size = {"nodes": nodes, "gpus": gpus_per_node, "days": days}
    try:
        for _, s, _ in configs:
            check_size(model, s, **size)  # type: ignore[arg-type]
    except SimulationTooLarge as e:
        fail(str(e), EXIT_USAGE)

    async def go() -> list[Any]:
        return [await run_simulation(s, model, **size, domains=domains,  # type: ignore[arg-type]
                                     seed=seed, config=str(path or "defaults"),
                                     watchers=watch, segment_days=segment_days)
                for path, s, watch in configs]

    try:
        results = asyncio.run(go())
    except FileNotFoundError as e:
        fail(str(e))
    if output == "json":
        print(results[0].model_dump_json(indent=2) if len(results) == 1 else
              Comparison(config=results[0], compare=results[1]).model_dump_json(indent=2))
        return
    table = rows(results)
    print_table(out, table[0], table[1:])


def settings_of(config: Path | None) -> Any:
    """The detector settings a config file runs with (the defaults without one)."""
    try:
        return load_settings(config).detector_settings()
    except ConfigError as e:
        fail(str(e), EXIT_USAGE)


def watchers_of(config: Path | None) -> bool:
    """Whether a config runs node watchers (its report endpoint is on: reports.enabled)."""
    try:
        return load_settings(config).reports.enabled
    except ConfigError as e:
        fail(str(e), EXIT_USAGE)


@app.command("watch", add_help_option=False,
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def watch(ctx: typer.Context) -> None:
    """The node watcher (a DaemonSet): report this node's XIDs to the worker (`watch --help`)."""
    from worker.watch.cli import watch_app

    typer.main.get_command(watch_app).main(args=list(ctx.args), prog_name="gpu-remediate watch")

# No markup or emoji codes in what is printed: node names, reasons, errors and exporter
# labels are text from operators and nodes ("[/x]" made every plan and status crash). Styles
# are given as Text spans instead; such text also goes through `shown` (output.py), so a
# control character or terminal escape in it reaches the terminal as its code, never raw.
out = Console(markup=False, emoji=False)
err = Console(stderr=True, markup=False, emoji=False)

ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", "-c", envvar="GPU_REMEDIATE_CONFIG",
    help="Service config file (YAML). Default: the config of the stack `gpu-remediate up` "
         "runs in this directory, if one runs.", exists=False)]
ReasonOpt = Annotated[str | None, typer.Option(
    "--reason", "-r", help=f"Why (required): one line of text, at most {MAX_REASON_CHARS} "
                           "characters; recorded on the node, in its Event and in the "
                           "workflow.")]
OperatorOpt = Annotated[str | None, typer.Option(
    "--operator", help="Who: defaults to $GPU_REMEDIATE_OPERATOR, else user@host.")]


def _node_name(name: str) -> str:
    # Before any call: a name no node can have is refused with one line, nothing written.
    problem = node_problem(name)
    if problem is not None:
        raise typer.BadParameter(problem)
    return name


NodeArg = Annotated[str, typer.Argument(help="Kubernetes node name.", callback=_node_name)]
OutputOpt = Annotated[Literal["table", "json"], typer.Option(
    "--output", "-o", help="table (whole values when not a terminal) or json.")]

VERBOSE = False
"""-v: errors show the details behind their one line (the SDK's or the client's text)."""


@app.callback()
def _global(verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", envvar="GPU_REMEDIATE_VERBOSE",
        help="Show the details behind an error.")] = False) -> None:
    global VERBOSE
    VERBOSE = verbose


def fail(message: str, code: int = EXIT_FAILED, detail: str = "") -> NoReturn:
    """One line (a few for a hint of what to run next), no traceback; -v adds ``detail``."""
    first, *rest = shown_lines(message)
    err.print(Text.assemble(("error:", "red"), f" {first}"), soft_wrap=True, highlight=False)
    for line in rest:
        err.print(f"  {line}", soft_wrap=True, highlight=False)
    if detail and VERBOSE:
        for line in shown_lines(detail):
            err.print(Text(f"  {line}", style="dim"), soft_wrap=True, highlight=False)
    raise typer.Exit(code)


def shown_lines(text: str) -> list[str]:
    return [shown(line) for line in str(text).split("\n")] or [""]


def _context(config: Path | None) -> tuple[Settings, Located]:
    located = locate(config)
    try:
        settings = load_settings(located.config)
        if config is not None:
            settings, located = _where_up_runs(settings, located)
    except ConfigError as e:
        fail(str(e), EXIT_USAGE)
    return settings, located


def _where_up_runs(settings: Settings, located: Located) -> tuple[Settings, Located]:
    """A --config beside a running `up` that says nothing of where Temporal, the cluster or
    the exporters are (one written to try other detector settings) talks to that stack."""
    stack = running_stack()
    if stack is None or not isinstance(stack.get("config"), str):
        return settings, located
    missing = [s for s in CONNECTION_SECTIONS if s not in settings.model_fields_set]
    if not missing:
        return settings, located
    theirs = load_settings(Path(str(stack["config"])))
    return (settings.model_copy(update={s: getattr(theirs, s) for s in missing}),
            Located(located.config, f"{located.source}; {', '.join(missing)} from the stack "
                                    "`gpu-remediate up` runs here"))


CONNECTION_SECTIONS = ("temporal", "kubernetes", "exporter")


def settings_from(config: Path | None) -> Settings:
    return _context(config)[0]


def with_client(config: Path | None, work: Callable[[Client], Awaitable[T]],
                hint: Callable[[str], str] | None = None, needs: str = "write") -> T:
    """Run ``work`` with a Temporal client; every failure becomes one line and an exit
    code (``hint`` may add to an OperatorError's message what to run next; ``needs``: the
    Temporal role the work needs, for a refusal's explanation)."""
    settings, located = _context(config)

    async def go() -> T:
        try:
            client = await connect(settings.temporal)
        except ConfigError as e:
            fail(str(e), EXIT_USAGE)
        except RuntimeError as e:
            if _REFUSED.search(str(e)):
                # The server checks the token on every call, the connection's first too.
                fail(_refusal(settings, needs), detail=str(e))
            fail(temporal_unreachable(settings, located, str(e)), detail=str(e))
        return await work(client)

    try:
        return asyncio.run(go())
    except ops.OperatorError as e:
        fail(hint(str(e)) if hint is not None else str(e))
    except RPCError as e:
        if e.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
            fail(temporal_unreachable(settings, located, e.message), detail=e.message)
        if e.status in (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNAUTHENTICATED):
            fail(_refusal(settings, needs), detail=repr(e))
        fail(f"Temporal: {e.message}", detail=repr(e))


_REFUSED = re.compile(r"unauthori[sz]ed|permission ?denied|unauthenticated", re.I)


def _refusal(settings: Settings, needs: str) -> str:
    facts = tokens.read(settings.temporal.current_api_key())
    return tokens.refusal(facts, settings.temporal.namespace, needs)


def _identity(config: Path | None, operator: str | None) -> str:
    """Who acts. With a JWT in temporal.api_key_file, the token's subject: the name the
    Temporal server authenticates and stamps as the principal of the history events the
    command writes; ``--operator`` may not name anyone else. Otherwise ``--operator``,
    $GPU_REMEDIATE_OPERATOR or user@host, which nothing verifies."""
    facts = tokens.read(settings_from(config).temporal.current_api_key())
    if facts is not None and facts.subject is not None:
        if operator is not None and operator != facts.subject:
            fail("--operator names someone other than the subject of the Temporal token in "
                 "temporal.api_key_file, whom the server authenticates and records; leave "
                 "--operator out", EXIT_USAGE)
        return facts.subject
    return ops.operator_identity(operator)


def _reason(reason: str | None) -> str:
    if reason is None:
        fail("--reason/-r is required: say why (one line; it is recorded on the node, in "
             "its Event and in the workflow)", EXIT_USAGE)
    return reason


def _checked(model: type[M], **fields: Any) -> M:
    """The command as the workflow will check it; a refusal is bad usage (exit 2), said
    without the refused value."""
    try:
        return model(**fields)
    except ValidationError as e:
        fail(ops.problems(e), EXIT_USAGE)


def _checked_node(node: str) -> str:
    if (problem := node_problem(node)) is not None:
        fail(problem, EXIT_USAGE)
    return node


def _print_ack(output: str, ack: OperatorAck, node: str | None = None) -> None:
    if output == "json":
        print(json.dumps({"node": node, **ack.model_dump(mode="json")}))
        return
    out.print(shown(f"{node}: {ack.message}" if node else ack.message), soft_wrap=True,
              highlight=False)


# ---------------------------------------------------------------- services


@app.command()
def worker(config: ConfigOpt = None) -> None:
    """Run the worker: remediation and detector workflows and their activities.

    Example: `gpu-remediate worker --config /etc/gpu-remediate/config.yaml`
    """
    from worker.service import run_worker

    settings = settings_from(config)
    configure_logging(settings.worker.log_format, settings.worker.log_level)
    try:
        asyncio.run(run_worker(settings))
    except ConfigError as e:
        fail(str(e), 2)
    except RuntimeError as e:
        fail(f"worker: {e}")


@app.command()
def up(
    scenario: Annotated[str, typer.Option(
        help="small|training|inference|gpu-operator|gb200 or a YAML file.")] = (
        "small"),
    config: ConfigOpt = None,
    data_dir: Annotated[Path, typer.Option(help="Temporal database, kubeconfig and logs.")] = (
        Path(".gpu-remediate")),
    dry_run: Annotated[bool, typer.Option(help="Plan only: change nothing in the cluster.")] = (
        False),
    max_unavailable: Annotated[str, typer.Option(help="Budget: a count or a percent.")] = "1",
    interval: Annotated[float, typer.Option(help="Seconds between fleet observations.")] = 5.0,
    fresh: Annotated[bool, typer.Option(help="Forget remediations of earlier runs.")] = False,
) -> None:
    """Run everything locally: Temporal dev server (UI on :8233), GPU and cluster
    simulators, the worker and the detector. Ctrl-C stops it all.

    Example: `gpu-remediate up --scenario training --max-unavailable 2`
    """
    from worker.stack import LocalStack, StackError

    if fresh:
        (data_dir / "temporal.db").unlink(missing_ok=True)
    stack = LocalStack(data_dir=data_dir.resolve(), scenario=scenario, config_path=config,
                       overrides={"detector.dry_run": dry_run,
                                  "detector.max_unavailable": max_unavailable,
                                  "detector.interval": f"PT{interval}S",
                                  "remediation.thermal.hold": "PT60S",
                                  "remediation.thermal.poll_interval": "PT5S"})
    # SIGTERM (from `timeout`, a service manager, a closed terminal) stops the stack
    # as cleanly as Ctrl-C does, rather than orphaning its processes.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    with out.status("starting Temporal, simulators, worker and detector…"):
        try:
            stack.start()
        except StackError as e:
            fail(str(e))
    from worker.stack import up_banner

    # soft_wrap: the terminal may fold a long line, but Rich must not cut a command in the
    # middle of an argument (a copied command would then break).
    out.print(Text.from_markup(up_banner(stack, dry_run=dry_run)), soft_wrap=True,
              highlight=False)
    try:
        dead = asyncio.run(_watch_stack(stack, live=sys.stdout.isatty()))
        err.print(Text(f"{', '.join(p.name for p in dead)} stopped; see {dead[0].log}",
                       style="red"))
    except KeyboardInterrupt:
        out.print("stopping…")
    finally:
        stack.stop()


async def _watch_stack(stack: Any, *, live: bool) -> list[Any]:
    """Until a part of the stack dies: a live table of remediations in a terminal."""
    from temporalio.client import Client as TemporalClient

    client: TemporalClient | None = None
    display = Live(_status_table([]), console=out, refresh_per_second=1) if live else None
    with display or contextlib.nullcontext():
        while True:
            dead = [part for part in stack.parts if part.proc.poll() is not None]
            if dead:
                return dead
            if display is not None:
                try:
                    client = client or await connect(TemporalSettings(
                        address=stack.temporal_address))
                    display.update(_status_table(await ops.remediation_views(client)))
                except (RPCError, RuntimeError, ops.OperatorError):
                    pass  # the table catches up on the next refresh
            await asyncio.sleep(2)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


# ---------------------------------------------------------------- detector


@detector_app.command("start")
def detector_start(config: ConfigOpt = None, output: OutputOpt = "table") -> None:
    """Start the singleton detector with the config's detector, policy and remediation
    sections. It does nothing if a detector is already running: to change a running
    detector's settings, use `detector reconfigure` (it keeps pause, breaker and pending
    starts), not `stop` and `start`.

    Example: `gpu-remediate detector start -c config.yaml`
    """
    settings = settings_from(config)

    async def go(client: Client) -> str:
        handle = await client.start_workflow(
            DetectorWorkflow.run, DetectorInput(settings=settings.detector_settings()),
            id=DETECTOR_WORKFLOW_ID, task_queue=settings.temporal.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            static_summary="GPU fleet detector",
        )
        return handle.result_run_id or ""

    run_id = with_client(config, go)
    if output == "json":
        print(json.dumps({"workflow_id": DETECTOR_WORKFLOW_ID, "run_id": run_id}))
        return
    out.print(f"detector running: workflow {DETECTOR_WORKFLOW_ID} (run {run_id})")


@detector_app.command("stop")
def detector_stop(config: ConfigOpt = None, reason: Annotated[str, typer.Option(
        "--reason", "-r", help="Why: recorded as the termination's reason.")] = (
        "stopped by operator"), output: OutputOpt = "table") -> None:
    """Stop the detector. Running remediations continue (they are not its children
    in life: ParentClosePolicy ABANDON). Not the way to change settings: use `detector
    reconfigure`; stop forgets the pause, the breaker and the breaker window, and a new
    detector learns the running remediations from Temporal visibility."""
    async def go(client: Client) -> None:
        await client.get_workflow_handle(DETECTOR_WORKFLOW_ID).terminate(reason)

    with_client(config, go)
    if output == "json":
        print(json.dumps({"workflow_id": DETECTOR_WORKFLOW_ID, "stopped": True}))
        return
    out.print("detector stopped; remediations in flight continue")


@detector_app.command("pause")
def detector_pause(config: ConfigOpt = None, reason: ReasonOpt = None,
                   operator: OperatorOpt = None, output: OutputOpt = "table") -> None:
    """Stop admitting new remediations; running ones continue.
    Example: `gpu-remediate detector pause -r "network maintenance until 14:00"`"""
    cmd = _checked(OperatorCommand, operator=_identity(config, operator),
                   reason=_reason(reason))
    _print_ack(output, with_client(config, lambda c: ops.detector_update(c, "pause", cmd)))


@detector_app.command("resume")
def detector_resume(config: ConfigOpt = None, reason: ReasonOpt = None,
                    operator: OperatorOpt = None, output: OutputOpt = "table") -> None:
    """Resume admissions after a pause or a tripped circuit breaker.
    Example: `gpu-remediate detector resume -r "maintenance over"`"""
    cmd = _checked(OperatorCommand, operator=_identity(config, operator),
                   reason=_reason(reason))
    _print_ack(output, with_client(config, lambda c: ops.detector_update(c, "resume", cmd)))


@detector_app.command("status")
def detector_status(config: ConfigOpt = None, output: OutputOpt = "table") -> None:
    """Budget, in-flight and waiting nodes, breaker and pause state."""
    view = with_client(config, ops.detector_view, needs="read")
    if output == "json":
        print(view.model_dump_json(indent=2))
        return
    rows: list[tuple[str, str]] = [
        ("budget", f"{len(view.in_flight)}/{view.budget} in use"),
        *((("GPUs", gpu_line(view.gpus)),) if view.gpus is not None else ()),
        ("in flight", ", ".join(view.in_flight) or "-"),
        *(("GPU lease", f"{lease.node}: {lease.gpus} GPU, no node slot (the node in "
                        "service)") for lease in view.leases if lease.isolating),
        ("waiting", ", ".join(view.waiting) or "-"),
        ("paused", "yes" if view.paused else "no"),
        ("breaker", f"open: {view.breaker_reason}" if view.breaker_open else "closed"),
        ("last tick", str(view.last_tick or "-")),
        ("ticks / started", f"{view.ticks_total} / {view.started_total}"),
        *(("error", e) for e in view.last_errors[:5]),
        *(("refused signal", f"{r.name} from {r.operator or '?'}: {r.why}")
          for r in view.rejected_commands[-5:]),
        *(("domain incident", f"{r[0]} since {r[1]}: {r[3]}; nodes {r[2]}")
          for r in incident_rows([i for i in view.incidents if i.closed_at is None])),
        *(("domain", f"{u.label}={domain_name(u.domain)}: {u.in_use}/"
                     f"{'-' if u.budget is None else u.budget} nodes of {u.nodes}"
                     + (f", {u.gpus_in_use}/{u.gpu_budget} GPUs" if u.gpu_budget is not None
                        else ""))
          for u in view.domains),
    ]
    print_table(out, ("field", "value"), rows)


def gpu_line(g: GpuUse) -> str:
    """GPUs out of service against the GPU budget, and how many are isolated."""
    return (f"{g.out_of_service}/{'-' if g.budget is None else g.budget} out of service "
            f"({g.isolated} isolated GPUs, node in service) of {g.gpus}"
            + "".join(f"; pool {pool or '(none)'} {used}/{g.pool_budgets.get(pool, '-')}"
                      for pool, used in sorted(g.pools.items())[:20]))


def incident_rows(incidents: list[DomainIncident]) -> list[tuple[str, ...]]:
    """One row per incident: the domain, since when, its nodes, what holds them."""
    rows: list[tuple[str, ...]] = []
    for i in incidents:
        state = ("closed: " + i.closed_by) if i.closed_at is not None else (
            f"released by {i.released_by}" if i.released_by else "open: cordoned, not drained")
        rows.append((f"{i.label}={domain_name(i.domain)}", f"{i.opened_at:%Y-%m-%d %H:%M:%S}",
                     ", ".join(i.nodes) or "-", state, i.reason))
    return rows


def incident_json(i: DomainIncident) -> dict[str, object]:
    """One incident in `status -o json`: the domain, its nodes, when it opened, its state."""
    row = incident_rows([i])[0]
    return {"domain": row[0], "label": i.label, "value": i.domain, "nodes": list(i.nodes),
            "opened": i.opened_at.isoformat(), "state": row[3], "reason": i.reason}


INCIDENT_COLUMNS = ("domain", "opened", "nodes", "state", "reason")
DomainArg = Annotated[str, typer.Argument(
    help="The domain: its label value (e.g. the clique id), or label=value.")]


@incident_app.command("list")
def incident_list(config: ConfigOpt = None, output: OutputOpt = "table") -> None:
    """Open domain incidents, then the recently closed ones."""
    view = with_client(config, ops.detector_view, needs="read")
    if output == "json":
        print(json.dumps([i.model_dump(mode="json") for i in view.incidents], indent=2))
        return
    print_table(out, INCIDENT_COLUMNS, incident_rows(view.incidents))


@incident_app.command("resolve")
def incident_resolve(domain: DomainArg, reason: ReasonOpt = None, operator: OperatorOpt = None,
                     config: ConfigOpt = None, output: OutputOpt = "table") -> None:
    """The shared part is fixed: close the incident. Its nodes whose faults cleared are
    uncordoned; any still flagged are remediated one by one, through every budget.

    Example: `gpu-remediate incident resolve nvl72-rack-07 -r "NVLink switch tray replaced"`
    """
    cmd = _checked(IncidentCommand, domain=domain, operator=ops.operator_identity(operator),
                   reason=_reason(reason))
    _print_ack(output, with_client(config, lambda c: ops.detector_update(
        c, "resolve_incident", cmd)))


@incident_app.command("release")
def incident_release(domain: DomainArg, reason: ReasonOpt = None, operator: OperatorOpt = None,
                     config: ConfigOpt = None, output: OutputOpt = "table") -> None:
    """Not a shared fault after all: remediate the incident's nodes one by one (each
    through the domain's, pool's and fleet's budgets). It stays open until they are clear.

    Example: `gpu-remediate incident release nvl72-rack-07 -r "separate XIDs, not the tray"`
    """
    cmd = _checked(IncidentCommand, domain=domain, operator=ops.operator_identity(operator),
                   reason=_reason(reason))
    _print_ack(output, with_client(config, lambda c: ops.detector_update(
        c, "release_incident", cmd)))


@detector_app.command("reconfigure")
def detector_reconfigure(config: ConfigOpt = None, output: OutputOpt = "table") -> None:
    """Give the running detector the config's detector, policy and remediation sections,
    from its next tick on (for example to leave dry-run). Remediations in flight keep the
    settings they started with.

    Example: `gpu-remediate detector reconfigure -c config.yaml`
    """
    settings = settings_from(config)
    _print_ack(output, with_client(config, lambda c: ops.detector_update(
        c, "reconfigure", settings.detector_settings())))


@app.command("release-orphan")
def release_orphan(node: NodeArg, reason: ReasonOpt = None, operator: OperatorOpt = None,
                   config: ConfigOpt = None, output: OutputOpt = "table") -> None:
    """Release a node left in remediation by a workflow that is gone (terminated): our
    label and taint go, and it is uncordoned unless it was cordoned before us.

    Example: `gpu-remediate release-orphan gpu-node-05 -r "checked, GPUs fine"`
    """
    req = _checked(OrphanRelease, node=_checked_node(node),
                   operator=_identity(config, operator), reason=_reason(reason))
    _require_node(config, node)
    _print_ack(output, with_client(config, lambda c: ops.detector_update(
        c, "release_orphan", req)), node)


@app.command()
def plan(config: ConfigOpt = None, output: OutputOpt = "table") -> None:
    """What the detector would do now: which nodes it would start, with which action, and
    which wait and why. With a detector running, its plan: its effective settings (read
    from it, and said so in the first line), its pause and breaker; a config file that
    differs is listed. Reads the fleet like the detector; changes nothing.

    Example: `gpu-remediate plan` (beside `up`), `gpu-remediate plan -c config.yaml`
    """
    from worker.cli.plan import make_plan

    settings, located = _context(config)
    try:
        result = asyncio.run(make_plan(settings, located.source))
    except Exception as e:  # the message is the point: Kubernetes, exporter or config
        fail(_plan_failure(settings, located, e), detail=repr(e))
    if output == "json":
        print(result.model_dump_json(indent=2))
        return
    out.print(shown(f"plan with {result.settings_from}"), soft_wrap=True, highlight=False)
    header = Text(f"budget {len(result.in_use)}/{result.budget} in use · "
                  f"{result.managed_nodes} GPU nodes, {result.readable_nodes} readable"
                  + (f" · {len(result.gpu_leases)} GPU leases (no node slot)"
                     if result.gpu_leases else "")
                  + (f" · GPUs {gpu_line(result.gpus)}" if result.gpus is not None else ""))
    if result.dry_run:
        header.append(" · ").append("dry-run", style="bold")
    out.print(header)
    out.print(Text(shown(result.detector), style="dim"), soft_wrap=True)
    if result.quarantine_cap:
        out.print(shown(result.quarantine_cap), soft_wrap=True, highlight=False)
    if result.differences:
        out.print(shown(f"the config file ({located.source}) differs from the running "
                        "detector; the plan uses the detector's:"), soft_wrap=True,
                  highlight=False)
        for line in result.differences:
            out.print(f"  {shown(line)}", soft_wrap=True, highlight=False)
    if result.breaker:
        out.print(Text.assemble(("breaker", "red"), f": {shown(result.breaker)}"))
    out.print("would start:")
    print_table(out, ("node", "action", "why"),
                [(s.node, s.action, s.reason) for s in result.start])
    for s in result.start:
        if s.scope:
            out.print(shown(f"  {s.node}: {s.scope}"), soft_wrap=True, highlight=False)
    for w in result.waiting:
        out.print(f"waits: {shown(w)}", soft_wrap=True, highlight=False)
    for o in result.orphans:
        out.print(Text.assemble(("orphan", "yellow"), f": {shown(o)}"))
    for line in result.errors[:10]:
        out.print(Text(f"unreadable: {shown(line)}", style="dim"), soft_wrap=True)
    for line in result.prerequisites:
        out.print(Text.assemble(("missing", "yellow"), f": {shown(line)}"), soft_wrap=True)


@app.command()
def report(config: ConfigOpt = None,
           since: Annotated[str, typer.Option(
               help="The period: 30d, 12h, 2w or ISO 8601 (P30D).")] = "30d",
           fleet_gpus: Annotated[int | None, typer.Option(
               min=1, help="GPUs in the fleet, for the availability lost (default: the "
                           "nodes' nvidia.com/gpu capacity now).")] = None,
           output: OutputOpt = "table") -> None:
    """Repair quality from the repair ledger: MTTR and relapse rate per action, relapse rate
    per action and fault, the lemons (GPUs by serial and nodes over ledger.lemon_faults
    within ledger.lemon_window) and the GPU-hours and availability lost. Reads the ledger
    (one List); changes nothing. docs/operations.md, "Reading `report`".

    Example: `gpu-remediate report --since 30d -o json`
    """
    from worker.cli.report import make_report, parse_since, report_tables

    try:
        period = parse_since(since)
    except ValueError as e:
        fail(str(e), EXIT_USAGE)
    settings, located = _context(config)
    try:
        result = make_report(settings, period, gpus=fleet_gpus)
    except Exception as e:  # the message is the point: most often the Kubernetes API
        fail(_plan_failure(settings, located, e).replace("plan: ", "report: ", 1),
             detail=repr(e))
    if output == "json":
        print(result.model_dump_json(indent=2))
        return
    out.print(shown(f"repair ledger {result.since:%Y-%m-%d %H:%M} .. "
                    f"{result.until:%Y-%m-%d %H:%M} UTC: {result.entries} entries"
                    + (f", {result.unreadable} unreadable (skipped)" if result.unreadable
                       else "")), soft_wrap=True, highlight=False)
    for title, columns, rows in report_tables(result):
        out.print(f"{title}:")
        print_table(out, columns, rows)
    avail = ("-" if result.availability_lost is None
             else f"{result.availability_lost * 100:.3f}% of the fleet's GPU-hours")
    out.print(f"GPU-hours lost: {result.gpu_hours_lost:.1f} (availability lost: {avail})",
              soft_wrap=True, highlight=False)


def _plan_failure(settings: Settings, located: Located, e: Exception) -> str:
    """One line for a plan that could not read the fleet: the Kubernetes API (its address
    and what sets it) when that is what failed."""
    names = {type(x).__name__ for x in _chain(e)}
    if names & {"MaxRetryError", "NewConnectionError", "ConnectionRefusedError",
                "ConfigException", "ProtocolError", "ConnectTimeoutError", "ReadTimeoutError",
                "ApiException", "KubernetesUnavailable", "OSError", "FileNotFoundError"}:
        return kubernetes_unreachable(settings, located, " ".join(str(x) for x in _chain(e)))
    return f"plan: {e}"


def _chain(e: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while e is not None and e not in seen:
        seen.append(e)
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return seen


def _require_node(config: Path | None, node: str) -> None:
    """Refuse a node the cluster does not have, naming close matches; a cluster that
    cannot be asked leaves the check to the workflow."""
    settings, _ = _context(config)
    names = _node_names(settings)
    if names is None or node in names:
        return
    fail(no_such_node(node, names))


def no_such_node(node: str, names: list[str]) -> str:
    close = difflib.get_close_matches(node, names, n=5, cutoff=0.6)
    return (f"no node named {node} in the cluster" + (
        f"; close matches: {', '.join(close)}" if close else
        f" ({len(names)} nodes; `kubectl get nodes` lists them)"))


def _node_names(settings: Settings) -> list[str] | None:
    """The cluster's node names, or None when the API cannot be asked quickly."""
    try:
        from kubernetes import client

        from worker.service import kube_client

        with kube_client(settings) as api:
            nodes = client.CoreV1Api(api).list_node(_request_timeout=5)
        return [n.metadata.name for n in nodes.items if n.metadata and n.metadata.name]
    except Exception:  # any failure: the check is a courtesy, the workflow still decides
        return None


# ---------------------------------------------------------------- operator actions


def _node_action(verb: ops.RemediationVerb, node: str, reason: str | None,
                 operator: str | None, config: Path | None, output: str) -> None:
    cmd = _checked(OperatorCommand, operator=_identity(config, operator),
                   reason=_reason(reason))
    _checked_node(node)
    ack = with_client(config, lambda c: ops.remediation_update(c, node, verb, cmd),
                      hint=lambda message: _with_node_hint(config, node, message))
    _print_ack(output, ack, node)


def _with_node_hint(config: Path | None, node: str, message: str) -> str:
    """A node Temporal never remediated may not exist at all: say so, with close matches."""
    if not message.startswith(ops.NO_REMEDIATION) or ops.NONE_KNOWN not in message:
        return message
    return node_hint(node, message, _node_names(settings_from(config)))


def node_hint(node: str, message: str, names: list[str] | None) -> str:
    """``message`` (no remediation, none known) for a node the cluster has, or could not
    be asked about; for one it does not have, only that, with close matches: what to run
    "next" on a name that is not a node would lead nowhere."""
    if names is None or node in names:
        return message
    return no_such_node(node, names)


@app.command()
def approve(node: NodeArg, reason: ReasonOpt = None, operator: OperatorOpt = None,
            config: ConfigOpt = None, output: OutputOpt = "table") -> None:
    """Approve a remediation waiting for approval.
    Example: `gpu-remediate approve gpu-node-02 -r "no jobs on it, checked"`"""
    _node_action("approve", node, reason, operator, config, output)


@app.command()
def reject(node: NodeArg, reason: ReasonOpt = None, operator: OperatorOpt = None,
           config: ConfigOpt = None, output: OutputOpt = "table") -> None:
    """Reject a remediation waiting for approval; the node is released untouched.
    Example: `gpu-remediate reject gpu-node-02 -r "training run ends at 18:00"`"""
    _node_action("reject", node, reason, operator, config, output)


@app.command()
def quarantine(node: NodeArg, reason: ReasonOpt = None, operator: OperatorOpt = None,
               config: ConfigOpt = None, output: OutputOpt = "table") -> None:
    """Quarantine a node in remediation: it stays cordoned until released.
    Example: `gpu-remediate quarantine gpu-node-02 -r "RMA ticket 4411"`"""
    _node_action("quarantine", node, reason, operator, config, output)


@app.command()
def release(node: NodeArg, reason: ReasonOpt = None, operator: OperatorOpt = None,
            config: ConfigOpt = None, output: OutputOpt = "table") -> None:
    """Release a quarantined node: validate it and return it to service if it passes.
    Example: `gpu-remediate release gpu-node-02 -r "GPU swapped"`"""
    _node_action("release", node, reason, operator, config, output)


@app.command()
def repaired(node: NodeArg, reason: ReasonOpt = None, operator: OperatorOpt = None,
             config: ConfigOpt = None, output: OutputOpt = "table") -> None:
    """Report that an external repair of a node is done; validation follows.
    Example: `gpu-remediate repaired gpu-node-02 -r "reseated GPU 3"`"""
    _node_action("repaired", node, reason, operator, config, output)


@app.command()
def abort(node: NodeArg, reason: ReasonOpt = None, operator: OperatorOpt = None,
          config: ConfigOpt = None, output: OutputOpt = "table") -> None:
    """Abort a remediation: uncordon if we cordoned, remove our taint and label.
    Example: `gpu-remediate abort gpu-node-02 -r "wrong node"`"""
    cmd = _checked(OperatorCommand, operator=_identity(config, operator),
                   reason=_reason(reason))
    _checked_node(node)
    message = with_client(config, lambda c: ops.abort(c, node, cmd))
    if output == "json":
        print(json.dumps({"node": node, "message": message}))
        return
    out.print(shown(message), soft_wrap=True, highlight=False)


@app.command()
def remediate(
    node: NodeArg,
    action: Annotated[Action, typer.Option(help="thermal, reset, reboot or quarantine.")],
    reason: ReasonOpt = None,
    operator: OperatorOpt = None, config: ConfigOpt = None, output: OutputOpt = "table",
) -> None:
    """Ask the detector to remediate a node now; it goes through the same budget.
    Example: `gpu-remediate remediate gpu-node-03 --action reboot -r "hung NCCL"`"""
    req = _checked(ManualRemediation, node=_checked_node(node), action=action,
                   operator=_identity(config, operator), reason=_reason(reason))
    _require_node(config, node)
    _print_ack(output, with_client(config, lambda c: ops.manual_remediation(c, req)), node)


# ---------------------------------------------------------------- status


def _quarantine_orders(v: RemediationView) -> list[str]:
    """Who ordered a quarantine and why: an operator's order and the policy's, apart."""
    lines = []
    if (order := v.quarantine_ordered_by) is not None:
        lines.append(f"quarantine ordered by operator {order.operator}"
                     + (f": {order.reason}" if order.reason else ""))
    if v.quarantine_policy_reason is not None:
        lines.append(f"quarantine ordered by the policy: {v.quarantine_policy_reason}")
    return lines


STATUS_COLUMNS = ("node", "state", "action", "step", "since", "attempt", "pods left",
                  "blocked by", "reason")


def _status_rows(views: list[RemediationView | dict[str, str]]) -> list[list[str]]:
    rows = []
    for v in views:
        if isinstance(v, dict):
            rows.append([v["node"], v["state"], "?", "(no worker answering)", "", "", "", "",
                         ""])
            continue
        rows.append([v.node, v.state.value, v.action.value, v.step.value,
                     f"{v.since:%H:%M:%S}" if v.since else "", str(v.attempt),
                     str(v.pods_left), v.blocking_pdb, v.reason])
    return rows


async def _open_incidents(client: Client) -> list[DomainIncident]:
    """Open domain incidents, shown under the remediations (their nodes wait, cordoned, in
    none of them): best effort, the detector may not be running."""
    try:
        view = await ops.detector_view(client)
    except ops.OperatorError:
        return []
    return [i for i in view.incidents if i.closed_at is None]


def _status_table(views: list[RemediationView | dict[str, str]]) -> Table:
    return rich_table(STATUS_COLUMNS, _status_rows(views), title="remediations in flight")


def _print_status(views: list[RemediationView | dict[str, str]]) -> None:
    if out.is_terminal:
        out.print(_status_table(views))
    else:
        out.print(plain_table(STATUS_COLUMNS, _status_rows(views)), soft_wrap=True,
                  highlight=False)


def _print_ui_link(config: Path | None, node: str) -> None:
    """The Temporal UI's list of this node's remediations (every run, past ones included)."""
    from worker.ui_links import node_workflows_url, ui_base

    t = settings_from(config).temporal
    base = ui_base(t.address, t.ui_url)
    if base is None:
        out.print(f'Temporal UI: filter GpuNode="{node}" (set temporal.ui_url for a link)',
                  soft_wrap=True, highlight=False)
        return
    out.print(f"Temporal UI: {node_workflows_url(base, t.namespace, node)}", soft_wrap=True,
              highlight=False)


def snapshot(views: list[RemediationView | dict[str, str]], output: str) -> str:
    """What `status --watch` writes to a pipe or a file when something changed."""
    if output == "json":
        return json.dumps([v if isinstance(v, dict) else v.model_dump(mode="json")
                           for v in views], sort_keys=True)
    return plain_table(STATUS_COLUMNS, _status_rows(views))


async def watch_changes(fetch: Callable[[], Awaitable[list[RemediationView | dict[str, str]]]],
                        write: Callable[[str], None], output: str, *, every: float = 2.0,
                        now: Callable[[], datetime] = lambda: datetime.now(UTC),
                        rounds: int | None = None) -> None:
    """Poll ``fetch``; write a timestamped snapshot first and whenever it changed (one JSON
    line with ``-o json``). ``rounds`` bounds the polls (tests); None: until interrupted."""
    last: str | None = None
    done = 0
    while rounds is None or done < rounds:
        views = await fetch()
        current = snapshot(views, output)
        if current != last:
            stamp = f"{now():%Y-%m-%dT%H:%M:%SZ}"
            if output == "json":
                write(json.dumps({"at": stamp, "remediations": json.loads(current)}) + "\n")
            else:
                write(f"# {stamp} ({len(views)} in flight)\n{current}\n\n")
            last = current
        done += 1
        if rounds is None or done < rounds:
            await asyncio.sleep(every)


@app.command()
def status(
    node: Annotated[str | None, typer.Argument(help="Show one node in full.")] = None,
    output: OutputOpt = "table",
    watch: Annotated[bool, typer.Option(
        "--watch", "-w", help="Refresh every 2 s; to a pipe or a file, a timestamped "
                              "snapshot whenever something changed.")] = False,
    config: ConfigOpt = None,
) -> None:
    """In-flight remediations, or one node's full view with its transitions. Exits 0
    whatever the state (a quarantined node is a state, not an error).

    Examples: `gpu-remediate status --watch`, `gpu-remediate status gpu-node-02 -o json`,
    `gpu-remediate status --watch >> remediations.log`
    """
    if node is not None:
        _checked_node(node)
        view = with_client(config, lambda c: ops.remediation_view(c, node),
                           hint=lambda message: _with_node_hint(config, node, message),
                           needs="read")
        if output == "json":
            print(view.model_dump_json(indent=2))
            return
        _print_status([view])
        for line in _quarantine_orders(view):
            out.print(shown(line), soft_wrap=True, highlight=False)
        if view.lease_scope == "gpu":
            out.print("lease: one GPU, no node slot (the node stays in service; the whole "
                      "node only once the detector grants a slot)", soft_wrap=True,
                      highlight=False)
        if view.gpu_isolation is not None:
            iso = view.gpu_isolation
            out.print(shown(f"GPU {iso.gpu} ({iso.uuid}) isolated: DeviceTaintRule {iso.rule} "
                            f"({iso.api_version}, device {iso.device}, {iso.effect}), owner "
                            f"{iso.owner}: {iso.reason}. The node stays schedulable; "
                            f"`gpu-remediate release {node} -r REASON` removes the rule."),
                      soft_wrap=True, highlight=False)
        _print_ui_link(config, node)
        for t in view.transitions:
            out.print(f"  {t.at:%Y-%m-%d %H:%M:%S}  {t.state.value:<18} {t.step.value}")
        if view.plan:
            out.print("plan:")
            for line in view.plan:
                out.print(f"  - {shown(line)}", soft_wrap=True, highlight=False)
        return
    if not watch:
        views = with_client(config, ops.remediation_views, needs="read")
        incidents = with_client(config, _open_incidents, needs="read")
        if output == "json":
            print(json.dumps({
                "remediations": [v if isinstance(v, dict) else v.model_dump(mode="json")
                                 for v in views],
                "incidents": [incident_json(i) for i in incidents]}, indent=2))
            return
        _print_status(views)
        for v in views:
            if not isinstance(v, dict):
                for line in _quarantine_orders(v):
                    out.print(shown(f"{v.node}: {line}"), soft_wrap=True, highlight=False)
        for row in incident_rows(incidents):
            out.print(shown(f"domain incident {row[0]} since {row[1]} ({row[3]}): nodes "
                            f"{row[2]}"), soft_wrap=True, highlight=False)
        return

    async def live(client: Client) -> None:
        with Live(_status_table([]), console=out, refresh_per_second=1) as shown_live:
            while True:
                shown_live.update(_status_table(await ops.remediation_views(client)))
                await asyncio.sleep(2)

    async def piped(client: Client) -> None:
        def write(text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        await watch_changes(lambda: ops.remediation_views(client), write, output)

    with contextlib.suppress(KeyboardInterrupt):
        with_client(config, live if out.is_terminal and output == "table" else piped)


# ---------------------------------------------------------------- offline tools


@app.command()
def evaluate(
    metrics: Annotated[list[str], typer.Option(
        "--metrics", "-m", help="A file, '-' for stdin, or an http(s) dcgm-exporter URL.")],
    node: Annotated[str | None, typer.Option(help="Node name for sources without one.")] = None,
    config: ConfigOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Evaluate dcgm-exporter metrics offline and print each node's verdict.
    Exit 0: all sources read; 1: a source failed; 2: bad usage.

    Example: `curl -s node:9400/metrics | gpu-remediate evaluate -m - -o json`
    """
    from worker.probe.evaluate import run_evaluate

    raise typer.Exit(run_evaluate(metrics, node, config, output))


class _CheckCommand(typer.core.TyperCommand):
    """`check` exits 2 for a thermal verdict, so its usage errors (click's code 2) exit 64."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except Exception as exc:
            if getattr(exc, "exit_code", None) == 2:
                from worker.probe.exit_codes import EXIT_USAGE

                exc.exit_code = EXIT_USAGE  # type: ignore[attr-defined]
            raise


def _check_help() -> str:
    from worker.probe.exit_codes import EXIT_CODES

    codes = "\n".join(f"* **{code}** {meaning}" for code, meaning in EXIT_CODES)
    return f"""Check the GPUs of this machine (NVML, else nvidia-smi) or of a saved
`nvidia-smi -q -x` (`--from-file`), and print the same verdict as `evaluate`.

Exit codes, by severity (scripts gate on them, as with the original tool's `check`):

{codes}

Examples: `gpu-remediate check -o json`,
`gpu-remediate check --from-file saved.xml --xid-log kern.log --node gpu-node-07`
"""


@app.command(cls=_CheckCommand, help=_check_help())
def check(
    node: Annotated[str | None, typer.Option(help="Node name (default $NODE_NAME or the "
                                                   "hostname; with --from-file the file's "
                                                   "name).")] = None,
    config: ConfigOpt = None,
    output: OutputOpt = "table",
    probe: Annotated[str, typer.Option(help="auto, nvml or nvidia-smi.")] = "auto",
    nvidia_smi: Annotated[str | None, typer.Option(
        "--nvidia-smi", metavar="PATH",
        help="The nvidia-smi to run (implies --probe nvidia-smi).")] = None,
    from_file: Annotated[str | None, typer.Option(
        "--from-file", metavar="FILE",
        help="A saved `nvidia-smi -q -x` ('-' for stdin) instead of this machine's GPUs; "
             "reads no XIDs unless --xid-log.")] = None,
    xid_log: Annotated[str | None, typer.Option(
        "--xid-log", metavar="FILE",
        help="Read XIDs from this kernel log (dmesg, journalctl -k or kern.log lines with "
             "'NVRM: Xid') instead of the live one.")] = None,
    xid_source: Annotated[str | None, typer.Option(
        help="dmesg, nvml or none (default dmesg; none with --from-file).")] = None,
    xid_wait: Annotated[float, typer.Option(help="Seconds to wait for NVML XID events.")] = 0.0,
) -> None:
    from worker.probe.check import run_check

    raise typer.Exit(run_check(node=node, config_path=config, output=output,
                               xid_source=xid_source, xid_wait=xid_wait, probe=probe,
                               nvidia_smi=nvidia_smi, from_file=from_file, xid_log=xid_log))


@app.command()
def version(
    output: OutputOpt = "table",
) -> None:
    """Print the version of gpu-remediate and of what it runs on (Python, Temporal SDK,
    Kubernetes client). Example: `gpu-remediate version -o json`"""
    from worker.version import versions

    found = versions()
    if output == "json":
        print(json.dumps(found, indent=2))
        return
    print(f"gpu-remediate {found['gpu-remediate']}")
    for name, value in found.items():
        if name != "gpu-remediate":
            print(f"  {name:<12} {value}")


def main() -> NoReturn:
    """The console entry point. It ends the process without interpreter finalization: the
    Temporal client's runtime threads can outlive the event loop, and tearing the
    interpreter down under them sometimes aborts a command that had already succeeded
    (temporalio/sdk-python#300), turning its exit status into a lie for scripts."""
    code: int = 0
    try:
        app(prog_name="gpu-remediate")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    except BaseException as e:  # what the interpreter would have printed, then its status
        sys.excepthook(type(e), e, e.__traceback__)
        code = 130 if isinstance(e, KeyboardInterrupt) else 1
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
