"""What ``gpu-remediate version`` reports: the installed distribution's version (not a copy
of it in the source, which drifts) and the versions of the parts that decide behaviour."""

from __future__ import annotations

import hashlib
import platform
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "gpu-remediate"
COMPONENTS = (("temporalio", "temporalio"), ("kubernetes", "kubernetes"),
              ("nvidia-ml-py", "nvidia-ml-py"))


def _installed(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def versions() -> dict[str, str]:
    """``{"gpu-remediate": "0.1.0", "python": "3.11.9", "temporalio": ..., ...}``."""
    found = {DISTRIBUTION: _installed(DISTRIBUTION), "python": platform.python_version()}
    for label, dist in COMPONENTS:
        found[label] = _installed(dist)
    return found


CODE_PACKAGES = ("policy", "workflows", "activities", "worker")
"""This project's packages whose code decides what a worker does."""


def code_build_id(root: Path | None = None) -> str:
    """The build ID of a worker without Worker Deployment Versioning (shown in each workflow
    task it completes): the version and a digest of this project's own source, so two
    builds of one version tell apart. The SDK's default digests the code of every loaded
    module (some 1,700 with the Kubernetes models): 3 s of CPU at every start, a restart
    after a crash included, for a value nothing decides on."""
    root = root or Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for package in CODE_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
    return f"{versions()[DISTRIBUTION]}+{digest.hexdigest()[:12]}"
