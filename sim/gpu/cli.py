"""`gpu-remediate sim gpu ...`: run the GPU simulator and poke at it."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from sim.gpu.client import GpuSimClient, GpuSimError
from sim.gpu.faults import CLEARS_ON, FAULT_KINDS
from sim.gpu.fleet import EXPORTER_MODES, Fleet

gpu_app = typer.Typer(
    name="gpu",
    help="Simulated dcgm-exporter for a GPU fleet, with fault injection (no real GPUs).",
    no_args_is_help=True,
)
_out = Console()
_err = Console(stderr=True)

Url = Annotated[str, typer.Option("--url", help="Base URL of a running GPU simulator.")]
NodeArg = Annotated[str, typer.Argument(help="Node name, e.g. gpu-node-01.")]
GpuOpt = Annotated[int | None, typer.Option("--gpu", help="GPU index (default: every GPU).")]
DEFAULT_URL = "http://127.0.0.1:9400"


def _fail(message: str) -> NoReturn:
    _err.print(f"[red]error:[/red] {message}", markup=True, highlight=False)
    raise typer.Exit(1)


def _run(call: Callable[[GpuSimClient], Any], url: str) -> Any:
    with GpuSimClient(url) as client:
        try:
            return call(client)
        except GpuSimError as err:
            _fail(err.message)


@gpu_app.command()
def serve(
    host: Annotated[str, typer.Option(help="Listen address; loopback by default.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Listen port.")] = 9400,
    scenario: Annotated[
        str | None,
        typer.Option(help="Built-in scenario (small, training, inference) or a YAML path."),
    ] = None,
    nodes: Annotated[
        int | None, typer.Option(help="Fleet mode instead of a scenario: N nodes gpu-node-00001...")
    ] = None,
    gpus: Annotated[int, typer.Option(help="GPUs per node in fleet mode.")] = 8,
    hostname_label: Annotated[
        str, typer.Option(help="Hostname (released images) or hostname (exporter main).")
    ] = "Hostname",
    xid_series: Annotated[
        str, typer.Option(help="absent-until-error (current exporter) or zero (older exporter).")
    ] = "absent-until-error",
    extra_fields: Annotated[
        bool,
        typer.Option(
            "--extra-fields/--no-extra-fields",
            help="Also export ECC, remap-pending, clock-event and recovery-action fields.",
        ),
    ] = True,
    xid_count_window_ms: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Also export DCGM_EXP_XID_ERRORS_COUNT over a sliding window of this many ms "
            "(the exporter's --xid-count-window-size; its default is 300000). Off if not given.",
        ),
    ] = None,
    serial_label: Annotated[
        bool,
        typer.Option(
            "--serial-label/--no-serial-label",
            help="Label every series with DCGM_FI_DEV_SERIAL, the GPU's board serial, as "
            "dcgm-exporter does when its counters file lists that field as a label.",
        ),
    ] = False,
    kernel_log_dir: Annotated[
        Path | None,
        typer.Option(envvar="GPU_SIM_KERNEL_LOG_DIR",
                     help="Write each node's kernel log (XID lines) to DIR/<node>.log."),
    ] = None,
) -> None:
    """Serve per-node dcgm-exporter metrics and the control API.

    Example: gpu-remediate sim gpu serve --scenario small --port 9400
    Example: gpu-remediate sim gpu serve --nodes 10000 --gpus 8
    Example: gpu-remediate sim gpu serve --scenario small --xid-count-window-ms 300000
    """
    from sim.gpu.kmsg import attach_from
    from sim.gpu.server import build_fleet, run_gpu_simulator

    if scenario and nodes:
        _fail("give either --scenario or --nodes, not both")
    switches: dict[str, Any] = {
        "hostname_label": hostname_label,
        "xid_series": xid_series,
        "extra_fields": extra_fields,
        "xid_count_window_ms": xid_count_window_ms,
        "serial_label": serial_label,
    }
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        fleet = (
            Fleet.synthetic(nodes, gpus, **switches)
            if nodes
            else build_fleet(scenario or "small", **switches)
        )
    except ValueError as err:
        _fail(str(err))
    attach_from(kernel_log_dir, fleet)
    run_gpu_simulator(host, port, fleet)


@gpu_app.command()
def inject(
    node: NodeArg,
    kind: Annotated[str, typer.Option(help=f"One of: {', '.join(FAULT_KINDS)}.")],
    gpu: Annotated[int, typer.Option(help="GPU index.")] = 0,
    value: Annotated[
        int | None,
        typer.Option(help="XID number, count, °C, bitmask or NVML recovery action, by kind."),
    ] = None,
    clears_on: Annotated[
        str | None, typer.Option(help=f"Override what repair clears it: {', '.join(CLEARS_ON)}.")
    ] = None,
    url: Url = DEFAULT_URL,
) -> None:
    """Inject a fault into one GPU.

    Example: gpu-remediate sim gpu inject gpu-node-01 --gpu 3 --kind xid --value 79
    """
    fault = _run(lambda c: c.inject_fault(node, gpu, kind, value, clears_on), url)
    _out.print(
        f"injected fault {fault['id']} on {node} GPU {gpu}: {fault['description']} "
        f"(clears on {fault['clears_on']})"
    )


@gpu_app.command()
def clear(node: NodeArg, gpu: GpuOpt = None, url: Url = DEFAULT_URL) -> None:
    """Remove faults as if their cause went away (e.g. cooling fixed).

    Example: gpu-remediate sim gpu clear gpu-node-01 --gpu 3
    """
    result = _run(lambda c: c.clear(node, gpu), url)
    _out.print(f"cleared {len(result['cleared'])} fault(s) on {node}")


@gpu_app.command()
def reset(node: NodeArg, gpu: GpuOpt = None, url: Url = DEFAULT_URL) -> None:
    """GPU reset (nvidia-smi -r) of one GPU or all GPUs of a node; refused while a target
    GPU has persistence mode on (see `persistence`).

    Example: gpu-remediate sim gpu reset gpu-node-01 --gpu 3
    """
    result = _run(lambda c: c.reset(node, gpu), url)
    _out.print(f"reset {node}: cleared {len(result['cleared'])} fault(s)")


@gpu_app.command()
def reboot(node: NodeArg, url: Url = DEFAULT_URL) -> None:
    """Reboot a node: clears reset- and reboot-class faults and volatile counters.

    Example: gpu-remediate sim gpu reboot gpu-node-01
    """
    result = _run(lambda c: c.reboot(node), url)
    _out.print(f"rebooted {node}: cleared {len(result['cleared'])} fault(s)")


@gpu_app.command()
def exporter(
    node: NodeArg,
    mode: Annotated[str, typer.Argument(help=f"One of: {', '.join(EXPORTER_MODES)}.")],
    delay: Annotated[float | None, typer.Option(help="Seconds of delay for 'slow'.")] = None,
    url: Url = DEFAULT_URL,
) -> None:
    """Make a node's exporter misbehave (or recover).

    Example: gpu-remediate sim gpu exporter gpu-node-02 slow --delay 15
    """
    state = _run(lambda c: c.set_exporter_mode(node, mode, delay), url)
    _out.print(f"{node} exporter: {state['mode']} (delay {state['delay_seconds']} s)")


@gpu_app.command()
def persistence(
    node: NodeArg,
    gpu: GpuOpt = None,
    on: Annotated[bool, typer.Option("--on/--off", help="Persistence mode on or off.")] = True,
    url: Url = DEFAULT_URL,
) -> None:
    """Persistence mode of one GPU or every GPU (nvidia-smi -i N -pm 1|0). It is on by
    default, as nvidia-persistenced keeps it, and a reset is refused while it is on.

    Example: gpu-remediate sim gpu persistence gpu-node-01 --gpu 3 --off
    """
    result = _run(lambda c: c.set_persistence(node, on, gpu), url)
    for g in result["gpus"]:
        state = "Enabled" if g["persistence_mode"] else "Disabled"
        _out.print(f"{node} GPU {g['index']} ({g['uuid']}): persistence mode {state}")


@gpu_app.command("list")
def list_(
    url: Url = DEFAULT_URL,
    output: Annotated[str, typer.Option(
        "--output", "-o", help="table, or json (every GPU with its persistence_mode).")]
    = "table",
) -> None:
    """Show every node, its exporter mode, health and active faults.

    Example: gpu-remediate sim gpu list --url http://127.0.0.1:9400 -o json
    """
    if output not in ("table", "json"):
        _fail(f"--output: {output!r} is not one of table, json")
    nodes = _run(lambda c: c.list_nodes(), url)
    if output == "json":
        print(json.dumps({"nodes": nodes}, indent=2))
        return
    table = Table("node", "GPUs", "exporter", "healthy", "faults")
    for n in nodes:
        faults = [
            f"gpu{g['index']}: {f['description']} [{f['clears_on']}]"
            for g in n["gpus"]
            for f in g["faults"]
        ]
        healthy = "[green]yes[/green]" if n["healthy"] else "[red]no[/red]"
        table.add_row(
            n["name"], str(len(n["gpus"])), n["exporter"]["mode"], healthy, "\n".join(faults) or "-"
        )
    _out.print(table)


@gpu_app.command()
def health(node: NodeArg, url: Url = DEFAULT_URL) -> None:
    """What `dcgmi diag -r 2` would say about a node; exits 2 when unhealthy.

    Example: gpu-remediate sim gpu health gpu-node-01
    """
    report = _run(lambda c: c.health(node), url)
    if report["healthy"]:
        _out.print(f"{node}: [green]healthy[/green]")
        return
    _out.print(f"{node}: [red]unhealthy[/red]")
    for problem in report["problems"]:
        _out.print(f"  - {problem}", highlight=False)
    raise typer.Exit(2)
