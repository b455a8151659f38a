"""The digests a site names where the shipped configs set jobs.require_digest (docs/install.md,
"Pin every image by digest"): stand-ins the deploy tests install with, for the chart and the
kustomizations alike, so both render the same objects."""

from __future__ import annotations

from typing import Any

# The image the kustomize base names until a site sets its own; the chart's tests name it too.
TEST_IMAGE = "registry.invalid/set-images-in-kustomization/gpu-remediate"
TEST_DIGEST = "sha256:" + "d" * 64
VALIDATION_IMAGE = "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04"
TEST_VALIDATION_IMAGE = f"{VALIDATION_IMAGE}@sha256:{'e' * 64}"


def pin_config(config: dict[str, Any]) -> dict[str, Any]:
    """A worker config file as a site pins it: jobs.worker_image by digest and the built-in
    validation image pinned (its other fields stay the built-in's)."""
    jobs = dict(config.get("jobs") or {})
    if "worker_image" in jobs and "@" not in jobs["worker_image"]:
        jobs["worker_image"] = f"{jobs['worker_image']}@{TEST_DIGEST}"
    templates = dict(jobs.get("templates") or {})
    given = templates.get("validation") or {}
    templates["validation"] = {"image": TEST_VALIDATION_IMAGE, **given}
    return {**config, "jobs": {**jobs, "templates": templates}}
