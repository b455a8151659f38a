"""What ``gpu-remediate version`` reports: the installed distribution's version (not a copy
of it in the source, which drifts) and the versions of the parts that decide behaviour."""

from __future__ import annotations

import platform
from importlib import metadata

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
