"""What a node Job runs: templates from the worker's own configuration, never workflow input.

A remediation names the template it wants for a step (``RemediationSettings.job_templates``);
the worker resolves the name against the ``jobs:`` section of its mounted configuration
and refuses a name it does not know or a template made for another step. So whoever can
start a workflow or send the detector ``reconfigure`` picks among the templates the
cluster's operator installed, and cannot make a privileged, host-mounted Job run an image
or a command of their own.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

JobKind = Literal["validate", "gpu-reset", "reboot"]

DEFAULT_TEMPLATE: dict[str, str] = {"validate": "validation", "gpu-reset": "gpu-reset",
                                    "reboot": "reboot"}
"""The template each step uses when the remediation names none (runs started before
templates existed, or settings that keep the defaults)."""

_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
_IMAGE = re.compile(r"[^\s]{1,512}")


class JobTemplate(BaseModel):
    """One node Job: image, command and what it may touch on the host."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    purpose: JobKind = Field(description="The step it serves: validate, gpu-reset or reboot. "
                                         "A step refuses a template made for another one.")
    image: str = Field(description="Container image; by digest (name@sha256:...) where "
                                   "jobs.require_digest is set.")
    command: list[str] = Field(min_length=1, max_length=64)
    deadline: timedelta = Field(gt=timedelta(0), le=timedelta(hours=12),
                                description="The Job's activeDeadlineSeconds.")
    privileged: bool = Field(
        default=False,
        description="Privileged container with hostPID and the host's / at /host: only what "
                    "a GPU reset or a reboot needs.")
    run_as_user: int | None = Field(
        default=None, ge=1, le=2**31 - 1,
        description="Run as this non-root UID (runAsNonRoot, no privilege escalation, no "
                    "capabilities). Not with privileged.")
    runtime_class_name: str | None = Field(
        default=None, max_length=253,
        description="RuntimeClass of the pod, e.g. nvidia where the GPU Operator installs it "
                    "and containerd does not default to the NVIDIA runtime.")
    service_account: str | None = Field(
        default=None, max_length=253,
        description="ServiceAccount of the pod (no API token is mounted).")
    env: dict[str, str] = Field(
        default_factory=dict, max_length=32,
        description="Extra environment of the container (NODE_NAME and GPU_INDEX are set by "
                    "the worker and cannot be overridden).")
    output: Literal["exit-code", "dcgmi-json"] = Field(
        default="exit-code",
        description="How the result is read: the exit code alone, or (validation) the exit "
                    "code and the `dcgmi diag -j` JSON in the pod's log, parsed into which "
                    "test passed or failed on which GPU; output that cannot be read fails "
                    "the validation.")

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", name):
                raise ValueError(f"{name[:40]!r} is not an environment variable name")
            if name in ("NODE_NAME", "GPU_INDEX"):
                raise ValueError(f"{name} is set by the worker")
            if len(text) > 4096:
                raise ValueError(f"{name}: a value must be at most 4096 characters")
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        if not _IMAGE.fullmatch(value):
            raise ValueError("must be an image reference without blanks (1 to 512 characters)")
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str]) -> list[str]:
        if any(len(arg) > 4096 for arg in value):
            raise ValueError("each argument must be at most 4096 characters")
        return value

    @model_validator(mode="after")
    def _root_or_not(self) -> JobTemplate:
        if self.privileged and self.run_as_user is not None:
            raise ValueError("run_as_user: a privileged template runs as root; drop one")
        return self

    @property
    def pinned(self) -> bool:
        return bool(_DIGEST.search(self.image))


VALIDATION_COMMAND = (
    # dcgmi is a client of nv-hostengine: a pod with its own network namespace has none
    # unless it starts one (embedded), so the Job starts its own, then runs the medium
    # diagnostic (memory, PCIe; about 2 minutes) with JSON output for the evidence.
    "nv-hostengine --pid /tmp/nv-hostengine.pid --log-filename /tmp/nv-hostengine.log "
    "&& exec dcgmi diag -r 2 -j")

REBOOT_COMMAND = (
    "nsenter -t 1 -m -u -i -n -p -- systemctl reboot "
    "|| { sync; echo b > /proc/sysrq-trigger; }")

RESET_COMMAND = (
    # The flagged GPU where the remediation names one (GPU_INDEX), else every GPU of the
    # node (remediation.reset_scope "node", as NVSwitch baseboards require).
    'exec nvidia-smi --gpu-reset ${GPU_INDEX:+-i "$GPU_INDEX"}')


def _defaults() -> dict[str, JobTemplate]:
    return {
        # dcgmi diag with its own host engine needs the GPUs the Job requests, not root.
        "validation": JobTemplate(
            purpose="validate", image="nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04",
            command=["/bin/sh", "-c", VALIDATION_COMMAND], deadline=timedelta(minutes=20),
            run_as_user=1000, output="dcgmi-json"),
        # nvidia-smi --gpu-reset needs the device nodes of GPUs nothing holds: privileged,
        # the NVIDIA runtime to bring the driver's tools and devices in (the GPU Operator
        # installs RuntimeClass nvidia), and the operands turned off first (the workflow).
        "gpu-reset": JobTemplate(
            purpose="gpu-reset", image="nvcr.io/nvidia/cuda:12.8.0-base-ubuntu22.04",
            command=["/bin/sh", "-c", RESET_COMMAND], deadline=timedelta(minutes=10),
            privileged=True, runtime_class_name="nvidia",
            env={"NVIDIA_VISIBLE_DEVICES": "all"}),
        # Reboot through the host's PID 1: nsenter into its namespaces and ask systemd;
        # where the host has no systemctl (Bottlerocket, Talos), the kernel's sysrq.
        "reboot": JobTemplate(
            purpose="reboot", image="busybox:1.37",
            command=["/bin/sh", "-c", REBOOT_COMMAND],
            deadline=timedelta(minutes=30), privileged=True),
    }


class JobsSettings(BaseModel):
    """The ``jobs:`` section of the worker's configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str = Field(
        default="gpu-remediate-jobs", min_length=1, max_length=63,
        description="Where every node Job runs: the one namespace that admits privileged "
                    "pods (deploy/base/namespaces.yaml) and the only one where the worker "
                    "may create Jobs.")
    require_digest: bool = Field(
        default=False,
        description="Refuse templates whose image is not pinned by digest (set in the "
                    "shipped deploy configuration once the digests are filled in).")
    templates: dict[str, JobTemplate] = Field(
        default_factory=_defaults,
        description="Named templates. The built-in validation, gpu-reset and reboot are "
                    "replaced by a template of the same name; others are added.")

    @field_validator("templates", mode="before")
    @classmethod
    def _over_defaults(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        builtin = _defaults()
        given = {name: ({"purpose": builtin[name].purpose, **t}
                        if name in builtin and isinstance(t, dict) and "purpose" not in t
                        else t)
                 for name, t in value.items()}
        return {**builtin, **given}

    @model_validator(mode="after")
    def _check(self) -> JobsSettings:
        if not _NAME.fullmatch(self.namespace):
            raise ValueError("namespace: must be a DNS label (lower-case letters, digits, '-')")
        problems = []
        for name, t in sorted(self.templates.items()):
            if not _NAME.fullmatch(name):
                problems.append(f"templates.{name}: a name must be a DNS label")
            if self.require_digest and not t.pinned:
                problems.append(f"templates.{name}.image: {t.image!r} is not pinned by digest "
                                "(name@sha256:<64 hex>) and jobs.require_digest is set")
        for kind, name in DEFAULT_TEMPLATE.items():
            if self.templates[name].purpose != kind:
                problems.append(f"templates.{name}.purpose: the built-in {name} template "
                                f"serves {kind}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def resolve(self, kind: str, name: str) -> JobTemplate:
        """The template a step asked for. Raises TemplateRefused (message says why)."""
        name = name or DEFAULT_TEMPLATE.get(kind, "")
        template = self.templates.get(name)
        if template is None:
            known = ", ".join(sorted(n for n, t in self.templates.items() if t.purpose == kind))
            raise TemplateRefused(f"no Job template {name[:80]!r} in the worker's configuration "
                                  f"(jobs.templates; for {kind}: {known or 'none'})")
        if template.purpose != kind:
            raise TemplateRefused(f"Job template {name!r} is for {template.purpose}, not {kind}")
        return template

    def longest_deadline(self) -> timedelta:
        return max(t.deadline for t in self.templates.values())


class TemplateRefused(ValueError):
    """A remediation named a Job template the worker does not have for that step."""
