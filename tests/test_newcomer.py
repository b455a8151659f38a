"""What a newcomer copies from the terminal: the `up` banner's commands and the UI link."""

from __future__ import annotations

import io
import shlex
from pathlib import Path

import pytest
from rich.console import Console

from worker.stack import LocalStack, up_banner
from worker.ui_links import SHELL_DIR_ENV, command_name, node_workflows_url, ui_base


def rendered(text: str, width: int) -> list[str]:
    buffer = io.StringIO()
    Console(file=buffer, width=width, force_terminal=False).print(
        text, soft_wrap=True, highlight=False)
    return buffer.getvalue().splitlines()


@pytest.mark.parametrize("width", [40, 80, 200])
def test_banner_commands_stay_whole_on_any_terminal_width(tmp_path: Path, width: int) -> None:
    data = tmp_path / "a dir with spaces" / ".gpu-remediate"
    stack = LocalStack(data_dir=data)
    lines = rendered(up_banner(stack, dry_run=False, command=".venv/bin/gpu-remediate"), width)
    kubectl = [line for line in lines if "kubectl get nodes" in line]
    assert kubectl == [
        f"  KUBECONFIG={shlex.quote(str(data / 'kubeconfig'))} kubectl get nodes "
        "-L gpu-remediate.io/state"]
    # The line is a valid shell command: the quoted path survives word splitting.
    words = shlex.split(kubectl[0])
    assert words[0] == f"KUBECONFIG={data / 'kubeconfig'}" and words[-1] == \
        "gpu-remediate.io/state"
    injects = [line.strip() for line in lines if "sim gpu inject" in line]
    assert injects == [".venv/bin/gpu-remediate sim gpu inject gpu-node-02 --gpu 3 --kind xid "
                       "--value 79"]


def test_command_name_is_the_bare_name_only_when_path_finds_this_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SHELL_DIR_ENV, raising=False)  # ./dev.sh test sets it
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    script = venv / "gpu-remediate"
    script.write_text("#!/bin/sh\n")
    other = tmp_path / "elsewhere" / "gpu-remediate"
    assert command_name(which=lambda _: None, argv0=".venv/bin/gpu-remediate",
                        cwd=tmp_path) == ".venv/bin/gpu-remediate"
    assert command_name(which=lambda _: str(script), argv0=".venv/bin/gpu-remediate",
                        cwd=tmp_path) == "gpu-remediate"
    # Another install on PATH is not this one: name this one by its path.
    assert command_name(which=lambda _: str(other), argv0=str(script),
                        cwd=tmp_path / "elsewhere") == str(script)
    # ./dev.sh up from another directory: dev.sh changed into the repository, the shell did not.
    assert command_name(which=lambda _: None, argv0=".venv/bin/gpu-remediate", cwd=tmp_path,
                        shell_dir=str(tmp_path.parent)) == \
        f"{tmp_path.name}/.venv/bin/gpu-remediate"
    assert command_name(which=lambda _: None, argv0=".venv/bin/gpu-remediate", cwd=tmp_path,
                        shell_dir="/somewhere/else") == str(script)
    # python -m worker: the script next to the interpreter.
    assert command_name(which=lambda _: None, argv0="/src/worker/__main__.py",
                        executable=str(venv / "python"), cwd=tmp_path) == \
        ".venv/bin/gpu-remediate"


def test_ui_link_filters_by_gpu_node() -> None:
    assert ui_base("localhost:7233", None) == "http://localhost:8233"
    assert ui_base("127.0.0.1:17233", None) == "http://127.0.0.1:18233"
    assert ui_base("temporal-frontend.temporal:7233", None) is None
    assert ui_base("temporal-frontend.temporal:7233", "https://t.example/ui/") == \
        "https://t.example/ui"
    assert node_workflows_url("http://localhost:8233", "default", "gpu-node-02") == (
        "http://localhost:8233/namespaces/default/workflows?query=GpuNode%3D%22gpu-node-02%22")
