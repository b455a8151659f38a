"""Links into the Temporal UI and copy-pastable commands for what the CLI prints."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from workflows.search_attributes import GPU_NODE

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]")
DEV_SERVER_UI_OFFSET = 1000
"""``temporal server start-dev`` serves its UI on the frontend port + 1000 (7233 -> 8233)."""


def ui_base(address: str, ui_url: str | None) -> str | None:
    """The UI's base URL: ``ui_url`` when configured, else the dev server's for a local
    address; None when it cannot be known (a production frontend says nothing about its UI)."""
    if ui_url:
        return ui_url.rstrip("/")
    host, _, port = address.rpartition(":")
    if host in LOCAL_HOSTS and port.isdecimal():
        return f"http://{host}:{int(port) + DEV_SERVER_UI_OFFSET}"
    return None


def node_workflows_url(base: str, namespace: str, node: str) -> str:
    """The UI's workflow list filtered to one node's remediations (``GpuNode="NODE"``)."""
    query = f'{GPU_NODE.name}="{node}"'
    return f"{base}/namespaces/{quote(namespace, safe='')}/workflows?query={quote(query, safe='')}"


SHELL_DIR_ENV = "GPU_REMEDIATE_SHELL_DIR"
"""The caller's working directory, which ``dev.sh`` sets before it changes to the repository."""


def command_name(*, which: Callable[[str], str | None] = shutil.which,
                 argv0: str = sys.argv[0], executable: str = sys.executable,
                 cwd: Path | None = None, shell_dir: str | None = None) -> str:
    """How to type ``gpu-remediate`` in the caller's shell: the bare name when PATH finds this
    very install, else its path, relative to the caller's directory when under it (so
    ``./dev.sh up`` prints ``.venv/bin/gpu-remediate``), else absolute."""
    here = Path.cwd() if cwd is None else cwd
    shell = Path(shell_dir or os.environ.get(SHELL_DIR_ENV) or here)
    script = Path(argv0)
    if script.name != "gpu-remediate":  # python -m worker: the script next to the interpreter
        script = Path(executable).parent / "gpu-remediate"
    script = (here / script).absolute() if not script.is_absolute() else script
    found = which("gpu-remediate")
    if found is not None and Path(found).resolve() == script.resolve():
        return "gpu-remediate"
    try:
        shown = str(script.relative_to(shell))
    except ValueError:
        shown = str(script)
    return shlex.quote(shown)
