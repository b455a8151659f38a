"""The Helm chart for the tests: finding the Helm CLI and rendering the chart with it.

The CLI is built from the Go module helm.sh/helm/v4 at the version pinned in
tests/deploy/helm/go.mod, once, into a cache outside git (tests/deploy/helm/build.sh).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.conftest import DEPLOY
from tests.deploy.pins import TEST_DIGEST, TEST_IMAGE, TEST_VALIDATION_IMAGE

CHART = DEPLOY / "helm" / "gpu-remediate"
BUILD = Path(__file__).resolve().parent / "helm" / "build.sh"
RELEASE = "gpu-remediate"
# The oldest Kubernetes the chart claims (Chart.yaml kubeVersion), so that `helm template`
# checks the claim instead of Helm's built-in default version.
KUBE_VERSION = "1.29.0"


class HelmFailed(Exception):
    def __init__(self, argv: list[str], stderr: str) -> None:
        super().__init__(f"{' '.join(argv[1:3])} failed: {stderr.strip()}")
        self.stderr = stderr


class HelmUnavailable(Exception):
    """No Helm CLI and no way to build one here (the reason is the message)."""


def go_command() -> str | None:
    """The go command build.sh would use: $GO, else go on PATH, else Go's default install."""
    for go in (os.environ.get("GO"), shutil.which("go"), "/usr/local/go/bin/go"):
        if go:
            return go if os.access(go, os.X_OK) else None
    return None


def helm_binary() -> Path:
    """$GPU_REMEDIATE_HELM, else the cached build, else a build now (minutes, cold)."""
    given = os.environ.get("GPU_REMEDIATE_HELM")
    if given:
        path = Path(given)
        if not os.access(path, os.X_OK):
            raise HelmUnavailable(f"GPU_REMEDIATE_HELM={given} is not an executable")
        return path
    cached = subprocess.run(
        [str(BUILD), "--print-path"], capture_output=True, text=True, timeout=60
    )
    if cached.returncode == 0:
        return Path(cached.stdout.strip().splitlines()[-1])
    if go_command() is None:
        raise HelmUnavailable(
            "Helm is not built and Go is not installed to build it: install Go >= 1.26 "
            "and run tests/deploy/helm/build.sh (or set GPU_REMEDIATE_HELM)"
        )
    built = subprocess.run([str(BUILD)], capture_output=True, text=True, timeout=3600)
    if built.returncode != 0:
        raise RuntimeError(f"tests/deploy/helm/build.sh failed:\n{built.stderr[-4000:]}")
    return Path(built.stdout.strip().splitlines()[-1])


def run(helm: Path, *args: str, values: dict[str, Any] | None = None) -> str:
    """Run ``helm ARGS [--values FILE]``; HelmFailed with Helm's stderr on failure."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [str(helm), *args]
        if values is not None:
            path = Path(tmp) / "values.yaml"
            path.write_text(yaml.safe_dump(values))
            argv += ["--values", str(path)]
        # Helm keeps no state for template and lint; point its folders at a scratch dir
        # anyway so a developer's repositories and plugins play no part.
        env = {
            **os.environ,
            "HELM_CACHE_HOME": f"{tmp}/cache",
            "HELM_CONFIG_HOME": f"{tmp}/config",
            "HELM_DATA_HOME": f"{tmp}/data",
        }
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    if result.returncode != 0:
        raise HelmFailed(argv, result.stderr)
    return result.stdout




# The chart has no default image (it refuses to render without one), and with
# config.jobs.require_digest on, as shipped, no image by tag: the tests name a site's
# (tests/deploy/pins.py), the same the kustomizations are installed with.


def with_image(values: dict[str, Any] | None, *, pinned: bool = True) -> dict[str, Any]:
    """The values as an install gives them: an image, and (pinned) the digests."""
    values = dict(values or {})
    image = dict(values.get("image") or {})
    image.setdefault("repository", TEST_IMAGE)
    if not pinned:
        return {**values, "image": image}
    image.setdefault("digest", TEST_DIGEST)
    jobs = dict(values.get("jobs") or {})
    jobs["validation"] = {"image": TEST_VALIDATION_IMAGE, **(jobs.get("validation") or {})}
    return {**values, "image": image, "jobs": jobs}


def template(helm: Path, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every object the chart renders with these values (hooks included), as plain dicts."""
    out = run(helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION,
              values=with_image(values))
    return [doc for doc in yaml.safe_load_all(out) if doc]
