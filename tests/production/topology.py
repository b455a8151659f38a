"""The production topology on one machine, with no container engine.

* **PostgreSQL** from the distribution (Debian's ``postgresql`` package), a throwaway
  cluster whose superuser is ``temporal``/``temporal`` like docker-compose.yml's
  ``postgres`` image.
* **Temporal server** built from ``go.temporal.io/server`` (tests/production/build.sh),
  started the way docker-compose.yml's ``temporalio/server`` service starts: the image's
  config template (``config/docker.yaml``) rendered from the compose service's environment,
  with SQL (advanced) visibility on PostgreSQL and compose's dynamic config file. Only
  addresses and ports differ (ephemeral, loopback).
* **Schemas and setup** by the compose stack's own scripts: deploy/compose/temporal-schema.sh
  (databases, schema migrations, version check) and deploy/compose/temporal-setup.sh
  (namespace, search attributes).
* **Several worker processes** (the Deployment's replicas), each with its own health and
  metrics ports, optionally running another release's code (a rolling upgrade).

No dev server anywhere: ``ProductionStack`` replaces ``LocalStack.start_temporal``.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from worker.config import TemporalSettings, merge, nest
from worker.stack.local import (
    LocalStack,
    Part,
    StackError,
    _tail,
    _tcp_open,
    free_port,
    scripts_binary,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
COMPOSE = REPO / "docker-compose.yml"
SCHEMA_SCRIPT = REPO / "deploy" / "compose" / "temporal-schema.sh"
SETUP_SCRIPT = REPO / "deploy" / "compose" / "temporal-setup.sh"
SEARCH_ATTRIBUTES_SCRIPT = REPO / "deploy" / "base" / "scripts" / "search-attributes.sh"
DYNAMIC_CONFIG = REPO / "deploy" / "compose" / "temporal-dynamicconfig.yaml"
BUILD = HERE / "build.sh"
ENV = "GPU_REMEDIATE_PRODUCTION"


class TopologyError(StackError):
    """A part of the production topology did not start or misbehaved."""


def free_small_port() -> int:
    """A free port below 32768: the server keeps membership ports in a SQL smallint, and
    the kernel's ephemeral ports start at 32768."""
    for _ in range(200):
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise TopologyError("no free port below 32768")


# ---------------------------------------------------------------- the built server


def built_server() -> Path | None:
    """The folder build.sh fills (server, SQL tool, config template, schemas), or None."""
    choice = os.environ.get(ENV, "").strip()
    if choice and choice not in ("1", "cached", "auto"):
        path = Path(choice).expanduser()
        return path if (path / "temporal-server").exists() else None
    result = subprocess.run([str(BUILD), "--print-path"], capture_output=True, text=True)
    return Path(result.stdout.strip()) if result.returncode == 0 else None


def compose_environment(service: str) -> dict[str, str]:
    """A docker-compose.yml service's environment (anchors resolved), as strings."""
    doc = yaml.safe_load(COMPOSE.read_text())
    env = doc["services"][service].get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def compose_image_tag(service: str) -> str:
    image = yaml.safe_load(COMPOSE.read_text())["services"][service]["image"]
    return str(image).rsplit(":", 1)[1]


# ---------------------------------------------------------------- PostgreSQL


def postgres_bindir() -> Path | None:
    """The newest PostgreSQL server installed by the distribution (initdb, pg_ctl)."""
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name
                        .isdigit() else 0)
    if candidates:
        return candidates[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@dataclass
class Postgres:
    """One PostgreSQL cluster in a folder of its own, listening on 127.0.0.1:``port``.

    As root (CI) it runs as the distribution's ``postgres`` user: PostgreSQL refuses root.
    ``fsync=off``: a killed server loses nothing the kernel already has; only a machine
    crash could, and these tests never crash the machine."""

    bindir: Path
    port: int = field(default_factory=free_port)
    user: str = "temporal"
    password: str = "temporal"
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpu-remediate-pg-")))

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "postgres.log"

    def _as_owner(self, argv: list[str]) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *argv]
        return argv

    def _run(self, argv: list[str], timeout: float = 120) -> str:
        result = subprocess.run(self._as_owner(argv), capture_output=True, text=True,
                                timeout=timeout, cwd=self.root)
        if result.returncode != 0:
            raise TopologyError(f"{argv[0]} failed ({result.returncode}): "
                                f"{result.stderr or result.stdout}\n{_tail(self.log)}")
        return result.stdout

    def init(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        if os.geteuid() == 0:
            shutil.chown(pwfile, "postgres", "postgres")
        self._run([str(self.bindir / "initdb"), "-D", str(self.data), "-U", self.user,
                   f"--pwfile={pwfile}", "--auth-local=trust", "--auth-host=scram-sha-256",
                   "-E", "UTF8", "--no-instructions"])
        pwfile.unlink()

    def start(self) -> None:
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c max_connections=200")
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                   "-o", opts, "-w", "-t", "60", "start"])

    def stop(self, mode: str = "fast") -> None:
        """``fast`` (a clean restart) or ``immediate`` (as a crash: recovery on start)."""
        with contextlib.suppress(TopologyError, subprocess.TimeoutExpired):
            self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w",
                       "stop"], timeout=60)

    def running(self) -> bool:
        return _tcp_open(self.port)

    def psql(self, sql: str, db: str = "postgres") -> str:
        psql = self.bindir / "psql"
        argv = [str(psql) if psql.exists() else "psql", "-h", "127.0.0.1", "-p",
                str(self.port), "-U", self.user, "-d", db, "-At", "-v", "ON_ERROR_STOP=1",
                "-c", sql]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                                env={**os.environ, "PGPASSWORD": self.password})
        if result.returncode != 0:
            raise TopologyError(f"psql failed: {result.stderr}")
        return result.stdout.strip()

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


# ---------------------------------------------------------------- the stack


@dataclass
class Replica:
    """One worker process of the Deployment."""

    name: str
    part: Part
    health_port: int
    metrics_port: int
    config: Path
    code: Path | None = None

    @property
    def pid(self) -> int:
        return self.part.proc.pid

    def alive(self) -> bool:
        return self.part.proc.poll() is None


@dataclass
class ProductionStack(LocalStack):
    """``LocalStack`` with the production Temporal (PostgreSQL, the real server, compose's
    scripts) and ``replicas`` worker processes."""

    server: Path = field(default_factory=lambda: Path("."))
    replicas: int = 2
    deployment_name: str | None = None
    build_id: str | None = None
    pg: Postgres | None = None
    workers: dict[str, Replica] = field(default_factory=dict)
    temporal_ports: dict[str, int] = field(default_factory=dict)
    # Authorization (tests/production/auth.py): the server's extra environment (JWT claim
    # mapper, authorizer, TLS), the services it runs, the setup scripts' environment (an
    # admin token) and the settings the tests' own clients connect with.
    server_extra_env: dict[str, str] = field(default_factory=dict)
    server_services: list[str] = field(default_factory=list)
    setup_extra_env: dict[str, str] = field(default_factory=dict)
    client_temporal: TemporalSettings | None = None

    # ------------------------------------------------------------ Temporal

    def _tool_path(self) -> str:
        return os.pathsep.join([str(self.server), str(Path(scripts_binary("temporal")).parent),
                                os.environ.get("PATH", "")])

    def schema_env(self) -> dict[str, str]:
        assert self.pg is not None
        return {**os.environ, **compose_environment("temporal-schema"),
                "POSTGRES_SEEDS": "127.0.0.1", "DB_PORT": str(self.pg.port),
                "TEMPORAL_SCHEMA_DIR": str(self.server / "schema" / "postgresql" / "v12"),
                "PATH": self._tool_path()}

    def run_schema_script(self) -> subprocess.CompletedProcess[str]:
        """deploy/compose/temporal-schema.sh, as the compose stack's one-shot runs it."""
        return subprocess.run(["sh", str(SCHEMA_SCRIPT)], env=self.schema_env(),
                              capture_output=True, text=True, timeout=300)

    def start_postgres(self) -> None:
        bindir = postgres_bindir()
        if bindir is None:
            raise TopologyError("PostgreSQL is not installed (apt-get install postgresql)")
        self.pg = Postgres(bindir)
        self.pg.init()
        self.pg.start()

    def server_env(self) -> dict[str, str]:
        assert self.pg is not None
        if not self.temporal_ports:
            names = ["FRONTEND_HTTP_PORT", "FRONTEND_MEMBERSHIP_PORT", "MATCHING_GRPC_PORT",
                     "MATCHING_MEMBERSHIP_PORT", "HISTORY_GRPC_PORT", "HISTORY_MEMBERSHIP_PORT",
                     "WORKER_GRPC_PORT", "WORKER_MEMBERSHIP_PORT"]
            self.temporal_ports = {n: free_small_port() if 'MEMBERSHIP' in n else free_port()
                                   for n in names}
        env = compose_environment("temporal")
        env.update({
            "POSTGRES_SEEDS": "127.0.0.1", "DB_PORT": str(self.pg.port),
            # The template reads the visibility store's port from these, not DB_PORT.
            "VISIBILITY_DB_PORT": str(self.pg.port),
            "BIND_ON_IP": "127.0.0.1", "TEMPORAL_BROADCAST_ADDRESS": "127.0.0.1",
            "DYNAMIC_CONFIG_FILE_PATH": str(DYNAMIC_CONFIG),
            "FRONTEND_GRPC_PORT": str(self.ports.temporal), "LOG_LEVEL": "warn",
            **{k: str(v) for k, v in self.temporal_ports.items()},
            **self.server_extra_env,
        })
        return {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/"),
                **env}

    def start_temporal_server(self) -> Part:
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / "temporal.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [str(self.server / "temporal-server"), "--config-file",
                 str(self.server / "config" / "docker.yaml"), "--allow-no-auth", "start",
                 *(arg for name in self.server_services for arg in ("--service", name))],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=self.server_env(), cwd=self.data_dir)
        part = Part("temporal", proc, log)
        self.parts.append(part)
        self._wait(part, lambda: _tcp_open(self.ports.temporal), timeout=120)
        return part

    def run_setup_script(self) -> None:
        """deploy/compose/temporal-setup.sh: the namespace and the search attributes."""
        env = {**os.environ, **compose_environment("temporal-setup"),
               "TEMPORAL_ADDRESS": self.temporal_address,
               "SEARCH_ATTRIBUTES_SCRIPT": str(SEARCH_ATTRIBUTES_SCRIPT),
               "WAIT_SECONDS": "120", "PATH": self._tool_path(), **self.setup_extra_env}
        result = subprocess.run(["sh", str(SETUP_SCRIPT)], env=env, capture_output=True,
                                text=True, timeout=300)
        if result.returncode != 0:
            raise TopologyError(f"temporal-setup.sh failed ({result.returncode}): "
                                f"{result.stderr or result.stdout}")

    def start_temporal(self) -> None:
        if self.pg is None:
            self.start_postgres()
        schema = self.run_schema_script()
        if schema.returncode != 0:
            raise TopologyError(f"temporal-schema.sh failed ({schema.returncode}): "
                                f"{schema.stderr or schema.stdout}")
        self.start_temporal_server()
        self.run_setup_script()

    def restart_temporal(self) -> None:
        """SIGKILL the server and start it again on the same ports and database."""
        self.kill_temporal()
        deadline = time.monotonic() + 30
        while _tcp_open(self.ports.temporal) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.start_temporal_server()

    # ------------------------------------------------------------ workers

    def replica_config(self, name: str, health: int, metrics: int, sdk_metrics: int,
                       build_id: str | None) -> Path:
        base = yaml.safe_load(self.write_worker_config().read_text())
        mine: dict[str, Any] = {"worker": {"health_port": health, "metrics_port": metrics,
                                           "sdk_metrics_port": sdk_metrics}}
        if self.deployment_name is not None:
            mine["worker"].update({"deployment_name": self.deployment_name,
                                   "build_id": build_id or self.build_id or "current"})
        path = self.data_dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(merge(base, nest(mine)), sort_keys=False))
        return path

    def start_replica(self, name: str, *, code: Path | None = None,
                      build_id: str | None = None, wait: bool = True) -> Replica:
        """A worker process; ``code``: a checkout of another release to run instead."""
        health, metrics, sdk = free_port(), free_port(), free_port()
        config = self.replica_config(name, health, metrics, sdk, build_id)
        env = {"GPU_REMEDIATE_WORKER__LOG_FORMAT": "json"}
        if code is not None:
            env["PYTHONPATH"] = str(code)
        part = self._spawn(name, [sys.executable, "-m", "worker", "worker", "--config",
                                  str(config)], env=env, cwd=code)
        replica = Replica(name, part, health, metrics, config, code)
        self.workers[name] = replica
        if wait:
            self.wait_ready(replica)
        return replica

    def ready(self, replica: Replica) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{replica.health_port}/readyz",
                             timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, replica: Replica, timeout: float = 90) -> None:
        self._wait(replica.part, lambda: self.ready(replica), timeout=timeout)

    def start_worker(self) -> Part:
        """All replicas (``LocalStack.start`` calls this once)."""
        first = None
        for i in range(self.replicas):
            replica = self.start_replica(f"worker-{i}")
            first = first or replica
        assert first is not None
        return first.part

    def kill_replica(self, name: str, sig: int = signal.SIGKILL) -> None:
        replica = self.workers.pop(name)
        if replica.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(replica.pid, sig)
            try:
                replica.part.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(replica.pid, signal.SIGKILL)
                replica.part.proc.wait()
        self.parts = [p for p in self.parts if p is not replica.part]

    def replica_by_pid(self, pid: int) -> Replica | None:
        return next((r for r in self.workers.values() if r.pid == pid), None)

    def worker_logs(self) -> str:
        logs = self.data_dir / "logs"
        return "\n".join(p.read_text(errors="replace") for p in sorted(logs.glob("worker-*.log")))

    def stop(self) -> None:
        super().stop()
        self.workers.clear()
        if self.pg is not None:
            self.pg.destroy()
            self.pg = None
