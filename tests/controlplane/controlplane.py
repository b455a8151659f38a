"""Find and run the one-process Kubernetes control plane built by build.sh.

Where the binary comes from (``--controlplane`` pytest option, else the
``GPU_REMEDIATE_CONTROLPLANE`` environment variable):

* a path to a binary: use it;
* ``cached`` (or ``1``/``auto``): the binary build.sh cached for the current sources, if any;
* ``build``: run build.sh first (a cold build takes many minutes);
* unset/empty/``0``: the fidelity tier is skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

HERE = Path(__file__).parent
BUILD = HERE / "build.sh"
ENV = "GPU_REMEDIATE_CONTROLPLANE"
# The tier's second Kubernetes version (tests/controlplane/k8s137, its own go.mod): one that
# serves DeviceTaintRule, for the DRA contract tests. Its binary comes from DRA_ENV, else
# from ENV when that says cached or build.
DRA_MODULE = "k8s137"
DRA_ENV = "GPU_REMEDIATE_CONTROLPLANE_DRA"


class ControlPlaneError(Exception):
    pass


def _env(module: str) -> dict[str, str]:
    return {**os.environ, "MODULE": module} if module else dict(os.environ)


def cached_binary(module: str = "") -> Path | None:
    result = subprocess.run(["bash", str(BUILD), "--print-path"], capture_output=True,
                            text=True, check=False, env=_env(module))
    path = Path(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else None
    return path if result.returncode == 0 and path is not None else None


def build(module: str = "") -> Path:
    result = subprocess.run(["bash", str(BUILD)], stdout=subprocess.PIPE, text=True,
                            check=False, env=_env(module))
    if result.returncode != 0:
        raise ControlPlaneError(f"{BUILD} failed with exit code {result.returncode}")
    return Path(result.stdout.strip().splitlines()[-1])


def resolve(choice: str | None, module: str = "") -> tuple[Path | None, str]:
    """The binary to use for `choice`, or None with the reason the tier is skipped.
    ``module``: build.sh's MODULE (another Kubernetes version); "" the tier's first."""
    choice = (choice or "").strip()
    if choice in ("", "0", "no", "off"):
        return None, (f"the real control plane tier is off: set {ENV}=cached|build|PATH or "
                      "pass --controlplane=cached|build|PATH (see docs/controlplane.md)")
    if choice in ("1", "auto", "cached", "yes"):
        path = cached_binary(module)
        if path is None:
            return None, ("no cached control plane binary for the current sources: build it "
                          f"with {BUILD.relative_to(HERE.parent.parent)} (docs/controlplane.md)")
        return path, ""
    if choice == "build":
        return build(module), ""
    path = Path(choice).expanduser()
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ControlPlaneError(f"{ENV}/--controlplane: {path} is not an executable file")
    return path, ""


@dataclass
class ControlPlane:
    """A running control plane: kube-apiserver (embedded etcd), controllers, scheduler."""

    binary: Path
    data_dir: Path
    apiserver_args: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    """More of the binary's own flags (main.go), e.g. ``--controllers=...``."""
    start_timeout: float = 180.0
    proc: subprocess.Popen[str] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    startup_seconds: float = 0.0

    @property
    def log(self) -> Path:
        return self.data_dir / "controlplane.log"

    @property
    def kubeconfig(self) -> Path:
        return Path(self.info["kubeconfig"])

    @property
    def server(self) -> str:
        return str(self.info["server"])

    @property
    def token(self) -> str:
        return str(self.info["token"])

    def start(self) -> ControlPlane:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = [str(self.binary), "--data-dir", str(self.data_dir),
                *(f"--apiserver-arg={a}" for a in self.apiserver_args), *self.args]
        began = time.monotonic()
        log: TextIO = self.log.open("a")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log,
                                     stdin=subprocess.DEVNULL, text=True,
                                     start_new_session=True)
        ready: list[str] = []
        assert self.proc.stdout is not None
        out = self.proc.stdout

        def read() -> None:
            for line in out:
                log.write(line)
                log.flush()
                if line.startswith("READY ") and not ready:
                    ready.append(line[len("READY "):])

        threading.Thread(target=read, daemon=True).start()
        deadline = began + self.start_timeout
        while not ready:
            if self.proc.poll() is not None:
                raise ControlPlaneError(f"control plane exited with {self.proc.returncode}; "
                                        f"see {self.log}:\n{_tail(self.log)}")
            if time.monotonic() > deadline:
                self.stop()
                raise ControlPlaneError(f"control plane not ready after {self.start_timeout}s; "
                                        f"see {self.log}:\n{_tail(self.log)}")
            time.sleep(0.1)
        self.info = json.loads(ready[0])
        self.startup_seconds = time.monotonic() - began
        return self

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
