"""Which installation a command talks to, and how to say that it could not be reached.

The config file comes from ``--config`` (or ``GPU_REMEDIATE_CONFIG``); without one, a
command run from the directory where ``gpu-remediate up`` runs finds that stack by the state
file ``up`` writes (``.gpu-remediate/stack.json``: its config, so its Temporal address,
kubeconfig and exporters), with no environment set. Environment variables still override
either, as for the worker.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from worker.config import Settings

STACK_STATE = Path(".gpu-remediate") / "stack.json"
"""Where ``up`` (default ``--data-dir``) says what it runs, relative to where it runs."""

STATE_FILE_NAME = "stack.json"


@dataclass(frozen=True)
class Located:
    """The config file a command uses, and where it came from (for its first line)."""

    config: Path | None
    source: str


def running_stack(cwd: Path | None = None) -> dict[str, object] | None:
    """The state of the stack ``up`` runs from this directory, or None (none written, or
    the ``up`` that wrote it has ended)."""
    path = (cwd or Path.cwd()) / STACK_STATE
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or not _alive(state.get("pid")):
        return None
    return state


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def locate(config: Path | None, cwd: Path | None = None) -> Located:
    if config is not None:
        source = ("GPU_REMEDIATE_CONFIG" if os.environ.get("GPU_REMEDIATE_CONFIG") == str(config)
                  else "--config")
        return Located(config, f"{config} ({source})")
    stack = running_stack(cwd)
    if stack is not None and isinstance(stack.get("config"), str):
        path = Path(str(stack["config"]))
        return Located(path, f"{path} (the stack `gpu-remediate up` runs here)")
    return Located(None, "built-in defaults (no --config, and no `gpu-remediate up` "
                         "running in this directory)")


def temporal_unreachable(settings: Settings, located: Located, detail: str) -> str:
    """One line: the address, what sets it, and the transport's reason in a few words."""
    return (f"cannot reach Temporal at {settings.temporal.address} ({_why(detail)}); it is "
            f"set by temporal.address in the config file [{located.source}] or "
            "GPU_REMEDIATE_TEMPORAL__ADDRESS")


def kubernetes_unreachable(settings: Settings, located: Located, detail: str) -> str:
    k = settings.kubernetes
    path = k.kubeconfig or (None if k.in_cluster else
                            os.environ.get("KUBECONFIG") or str(Path.home() / ".kube/config"))
    where = f"kubeconfig {path}" if path else "in-cluster config"
    server = kube_server(path, k.context) if path else None
    at = f" at {server}" if server else ""
    return (f"cannot reach the Kubernetes API{at} ({_why(detail)}; {where}); it is set by "
            f"kubernetes.kubeconfig in the config file [{located.source}] or "
            "GPU_REMEDIATE_KUBERNETES__KUBECONFIG, else KUBECONFIG")


def kube_server(path: str, context: str | None = None) -> str | None:
    """The API server address a kubeconfig's (current) context points at, if readable."""
    import yaml

    try:
        doc = yaml.safe_load(Path(path.split(os.pathsep)[0]).expanduser().read_text())
        name = context or doc.get("current-context")
        ctx = next(c["context"] for c in doc.get("contexts") or [] if c.get("name") == name)
        cluster = next(c["cluster"] for c in doc.get("clusters") or []
                       if c.get("name") == ctx.get("cluster"))
        server = cluster.get("server")
    except (OSError, ValueError, AttributeError, KeyError, StopIteration, TypeError):
        return None
    return str(server) if server else None


_REASONS = (
    (re.compile(r"connection refused", re.I), "connection refused"),
    (re.compile(r"dns error|name or service not known|nodename nor servname|"
                r"failed to resolve|getaddrinfo", re.I), "name not found"),
    (re.compile(r"timed? ?out|deadline", re.I), "timed out"),
    (re.compile(r"certificate|tls|ssl", re.I), "TLS failed"),
    (re.compile(r"no such file|not found|invalid kube-config|service host/port", re.I),
     "configuration not found"),
    (re.compile(r"unauthori[sz]ed|forbidden|401|403", re.I), "not authorised"),
)


def _why(detail: str) -> str:
    """The transport's reason in words an operator reads; the SDK's text stays for -v."""
    for pattern, words in _REASONS:
        if pattern.search(detail):
            return words
    return "not reachable"
