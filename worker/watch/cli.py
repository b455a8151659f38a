"""``gpu-remediate watch``: its options (the DaemonSet sets them through the environment)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from worker.logs import configure_logging
from worker.watch.reporter import ReporterSettings
from worker.watch.watcher import WatchSettings, load_nvml, run_watch

watch_app = typer.Typer(add_completion=False)


@watch_app.command(help="Report this node's XIDs (kernel log, NVML) to the worker at once.")
def watch(
    url: Annotated[str, typer.Option(
        envvar="GPU_REMEDIATE_WATCH_URL",
        help="The worker's report endpoint, e.g. https://gpu-remediate-reports.gpu-remediate"
             ".svc:8443/v1/reports")],
    node: Annotated[str, typer.Option(
        envvar="NODE_NAME", help="This node's name (the DaemonSet sets it from "
                                 "spec.nodeName); the worker accepts only its token's node.")],
    token_file: Annotated[Path, typer.Option(
        envvar="GPU_REMEDIATE_WATCH_TOKEN_FILE",
        help="The projected ServiceAccount token, read again for each report.")] =
        Path("/var/run/secrets/gpu-remediate/token"),
    ca_file: Annotated[Path | None, typer.Option(
        envvar="GPU_REMEDIATE_WATCH_CA_FILE",
        help="PEM CA of the endpoint's certificate (default: the system's).")] = None,
    kernel_log: Annotated[Path, typer.Option(
        envvar="GPU_REMEDIATE_WATCH_KERNEL_LOG",
        help="/dev/kmsg, or a file that grows (a saved log, a simulator's).")] =
        Path("/dev/kmsg"),
    from_start: Annotated[bool, typer.Option(
        help="Read what the log already holds too (default: only new lines).")] = False,
    nvml: Annotated[bool, typer.Option(
        envvar="GPU_REMEDIATE_WATCH_NVML",
        help="Also NVML's XID events, where nvidia-ml-py and a driver are present.")] = True,
    per_second: Annotated[float, typer.Option(min=0.01, help="Reports per second, beyond "
                                                             "the burst.")] = 2.0,
    burst: Annotated[int, typer.Option(min=1)] = 10,
    dedupe_seconds: Annotated[float, typer.Option(
        min=0, help="A repeat of the same GPU and XID within this is one report.")] = 10.0,
    log_level: Annotated[str, typer.Option(envvar="GPU_REMEDIATE_WATCH_LOG_LEVEL")] = "info",
) -> None:
    if not url.startswith("https://"):
        raise typer.BadParameter("the endpoint must be https:// (it receives the token)",
                                 param_hint="--url")
    configure_logging("auto", log_level)
    reporter = ReporterSettings(url=url, token_file=token_file, ca_file=ca_file,
                                per_second=per_second, burst=burst,
                                dedupe_seconds=dedupe_seconds)
    try:
        run_watch(WatchSettings(node=node, reporter=reporter, kernel_log=kernel_log,
                                from_start=from_start, nvml=load_nvml() if nvml else None))
    except OSError as err:
        typer.echo(f"error: cannot read {kernel_log}: {err}", err=True)
        raise typer.Exit(1) from err
    except KeyboardInterrupt:
        pass
