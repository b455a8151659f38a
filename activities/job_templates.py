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
from importlib import metadata
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

JobKind = Literal["validate", "gpu-reset", "reboot"]

DEFAULT_TEMPLATE: dict[str, str] = {"validate": "validation", "gpu-reset": "gpu-reset",
                                    "reboot": "reboot"}
"""The template each step uses when the remediation names none (runs started before
templates existed, or settings that keep the defaults)."""

WORKER_ENV = ("NODE_NAME", "GPU_INDEX", "GPU_UUIDS", "DCGM_HOST_ENGINE", "NODE_IP")
"""Environment the worker sets on every node Job; a template cannot override it."""

_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
_IMAGE = re.compile(r"[^\s]{1,512}")


class JobTemplate(BaseModel):
    """One node Job: image, command and what it may touch on the host."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    purpose: JobKind = Field(description="The step it serves: validate, gpu-reset or reboot. "
                                         "A step refuses a template made for another one.")
    image: str = Field(description="Container image; by digest (name@sha256:...) where "
                                   "jobs.require_digest is set; @worker: the worker's own "
                                   "image (jobs.worker_image).")
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
        description="Extra environment of the container (NODE_NAME, GPU_INDEX, GPU_UUIDS, "
                    "DCGM_HOST_ENGINE and NODE_IP are set by the worker and cannot be "
                    "overridden).")
    output: Literal["exit-code", "dcgmi-json"] = Field(
        default="exit-code",
        description="How the result is read: the exit code alone, or (validation) the exit "
                    "code and the `dcgmi diag -j` JSON in the pod's log, parsed into which "
                    "test passed or failed on which GPU; output that cannot be read fails "
                    "the validation. A validation Job is told which host engine to use "
                    "(DCGM_HOST_ENGINE standalone, with NODE_IP, or embedded; for an "
                    "exit-code one also busy: dcgm-exporter embeds the node's engine); a "
                    "dcgmi-json Job is never created while another engine would run beside "
                    "its own.")

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", name):
                raise ValueError(f"{name[:40]!r} is not an environment variable name")
            if name in WORKER_ENV:
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
    # dcgmi is a client of nv-hostengine, and DCGM supports one host engine per GPU set (a
    # second beside a running one may deadlock). The worker says which to use when it
    # creates the Job (DCGM_HOST_ENGINE): the node's standalone engine (the GPU Operator's
    # dcgm operand, hostPort 5555 on the node's IP), or, with dcgm-exporter and its
    # embedded engine paused, one of the Job's own, as root (MIG and NVSwitch diagnostics
    # need it). Then the medium diagnostic (memory, PCIe; about 2 minutes) as JSON, on
    # the one GPU at GPU_INDEX where the worker sets it (a validation pinned to a GPU),
    # else on all of them.
    'case "${DCGM_HOST_ENGINE:-}" in '
    'standalone) exec dcgmi diag -r 2 -j --host "$NODE_IP" ${GPU_INDEX:+-i "$GPU_INDEX"} ;; '
    "embedded) nv-hostengine --pid /tmp/nv-hostengine.pid "
    '--log-filename /tmp/nv-hostengine.log && exec dcgmi diag -r 2 -j '
    '${GPU_INDEX:+-i "$GPU_INDEX"} ;; '
    "*) echo \"DCGM_HOST_ENGINE is ${DCGM_HOST_ENGINE:-unset}: no host engine chosen\"; "
    "exit 3 ;; esac")

REBOOT_COMMAND = (
    # systemd on the host reboots it; a failing `systemctl reboot` is the Job's failure,
    # never a reason to crash the kernel. Only a host without systemctl (Bottlerocket,
    # Talos) is rebooted through the kernel's sysrq.
    "if [ -x /host/usr/bin/systemctl ] || [ -x /host/bin/systemctl ]; then "
    "exec nsenter -t 1 -m -u -i -n -p -- systemctl reboot; fi; "
    "echo 'no systemctl on the host: rebooting through sysrq'; "
    "sync; echo b > /proc/sysrq-trigger")

RESET_COMMAND = r"""set -u
# nvidia-smi from the driver: the GPU Operator's driver root, else the host's own driver.
# The container asks the runtime for no GPU (NVIDIA_VISIBLE_DEVICES=void): it holds none.
root="/host${DRIVER_ROOT:-/run/nvidia/driver}"
[ -x "$root/usr/bin/nvidia-smi" ] || root=/host
smi() { chroot "$root" nvidia-smi "$@"; }
# The targets by UUID (GPU_UUIDS from the worker; else the GPU at GPU_INDEX; else every
# GPU of the node, as NVSwitch baseboards require).
q="--format=csv,noheader"
if [ -n "${GPU_UUIDS:-}" ]; then targets=$(echo "$GPU_UUIDS" | tr ',' ' ')
elif [ -n "${GPU_INDEX:-}" ]; then targets=$(smi -i "$GPU_INDEX" --query-gpu=uuid $q) || exit 6
else targets=$(smi --query-gpu=uuid $q) || exit 6; fi
[ -n "$targets" ] || { echo "No devices were found"; exit 6; }
# nvidia-persistenced holds a GPU with persistence mode on, and a reset is refused:
# off for exactly the targets, back on afterwards only where it was on.
was_on=""
rc=0
for u in $targets; do
  pm=$(smi -i "$u" --query-gpu=persistence_mode $q) \
    || { echo "No devices were found matching $u"; rc=6; break; }
  if [ "$pm" = "Enabled" ]; then smi -i "$u" -pm 0 >/dev/null || { rc=4; break; }
    was_on="$was_on $u"; fi
done
if [ "$rc" -ne 0 ]; then :
elif [ -n "${GPU_UUIDS:-}${GPU_INDEX:-}" ]; then
  for u in $targets; do smi -i "$u" --gpu-reset || rc=$?; done
else
  smi --gpu-reset || rc=$?
fi
if [ "$rc" -ne 0 ]; then
  echo "processes holding the GPUs (gpu_uuid, pid, process_name):"
  smi --query-compute-apps=gpu_uuid,pid,process_name $q
fi
for u in $was_on; do smi -i "$u" -pm 1 >/dev/null || rc=5; done
exit "$rc"
"""

WORKER_IMAGE = "@worker"
"""A template image that means the worker's own image (``jobs.worker_image``): one the
cluster already pulls, so an offline node needs no other registry."""


def _default_worker_image() -> str:
    try:
        version = metadata.version("gpu-remediate")
    except metadata.PackageNotFoundError:
        version = "0.1.0"
    return f"ghcr.io/gpu-remediate/gpu-remediate:{version}"


def _defaults() -> dict[str, JobTemplate]:
    return {
        # dcgmi diag on the node's one host engine (see VALIDATION_COMMAND): root, as the
        # image runs, for an engine of its own on MIG and NVSwitch nodes; not privileged.
        "validation": JobTemplate(
            purpose="validate", image="nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04",
            command=["/bin/sh", "-c", VALIDATION_COMMAND], deadline=timedelta(minutes=20),
            output="dcgmi-json"),
        # nvidia-smi --gpu-reset needs the device nodes of GPUs nothing holds: privileged,
        # the NVIDIA runtime to bring the driver's tools and devices in (the GPU Operator
        # installs RuntimeClass nvidia), and the operands turned off first (the workflow).
        # NVIDIA_VISIBLE_DEVICES=void: the runtime gives the container no GPU, so nothing
        # of its own holds one; nvidia-smi comes from the driver root under /host, so the
        # image needs only a shell and chroot: the worker's own, which the cluster already
        # pulls (pinned with it where require_digest is set).
        "gpu-reset": JobTemplate(
            purpose="gpu-reset", image=WORKER_IMAGE,
            command=["/bin/sh", "-c", RESET_COMMAND], deadline=timedelta(minutes=10),
            privileged=True, runtime_class_name="nvidia",
            env={"NVIDIA_VISIBLE_DEVICES": "void"}),
        # Reboot through the host's PID 1: nsenter into its namespaces and ask systemd;
        # where the host has no systemctl (Bottlerocket, Talos), the kernel's sysrq. From
        # the worker's own image: the cluster already pulls it.
        "reboot": JobTemplate(
            purpose="reboot", image=WORKER_IMAGE,
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
        description="Refuse templates whose image is not pinned by digest, the worker's "
                    "own among them: a re-pushed tag never changes what runs on a node. The "
                    "shipped Helm and kustomize configs set it, so an install names its "
                    "digests (docs/install.md) or the worker refuses to start.")
    worker_image: str = Field(
        default_factory=_default_worker_image, min_length=1, max_length=512,
        description="The worker's own image (set it to what the Deployment runs, by digest "
                    "where require_digest is set): templates whose image is @worker run "
                    "from it, the built-in reboot among them, so a node that can pull the "
                    "worker needs no other registry.")
    templates: dict[str, JobTemplate] = Field(
        default_factory=_defaults,
        description="Named templates. The built-in validation, gpu-reset and reboot are "
                    "replaced by a template of the same name; one that gives neither image "
                    "nor command changes only the fields it gives (runtime_class_name: "
                    "null on a cluster without the nvidia RuntimeClass); others are added.")

    @field_validator("templates", mode="before")
    @classmethod
    def _over_defaults(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        builtin = _defaults()
        given = {name: _over_builtin(builtin.get(name), t) for name, t in value.items()}
        return {**builtin, **given}

    @model_validator(mode="after")
    def _check(self) -> JobsSettings:
        if not _NAME.fullmatch(self.namespace):
            raise ValueError("namespace: must be a DNS label (lower-case letters, digits, '-')")
        problems = []
        if not _IMAGE.fullmatch(self.worker_image) or self.worker_image == WORKER_IMAGE:
            problems.append("worker_image: must be an image reference without blanks")
        elif self.require_digest and not _DIGEST.search(self.worker_image) and any(
                t.image == WORKER_IMAGE for t in self.templates.values()):
            problems.append(f"worker_image: {self.worker_image!r} is not pinned by digest "
                            "(name@sha256:<64 hex>) and jobs.require_digest is set (templates "
                            + ", ".join(sorted(n for n, t in self.templates.items()
                                               if t.image == WORKER_IMAGE))
                            + " run from it); set it to the image the Deployment runs, "
                            "by digest: " + _pin_hint(self.worker_image))
        for name, t in sorted(self.templates.items()):
            if not _NAME.fullmatch(name):
                problems.append(f"templates.{name}: a name must be a DNS label")
            if self.require_digest and not t.pinned and t.image != WORKER_IMAGE:
                problems.append(f"templates.{name}.image: {t.image!r} is not pinned by digest "
                                "(name@sha256:<64 hex>) and jobs.require_digest is set; "
                                + _pin_hint(t.image))
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
        if template.image == WORKER_IMAGE:
            return template.model_copy(update={"image": self.worker_image})
        return template

    def longest_deadline(self) -> timedelta:
        return max(t.deadline for t in self.templates.values())


def _over_builtin(builtin: JobTemplate | None, given: Any) -> Any:
    """A template given under a built-in's name: with its own image or command it replaces
    the built-in whole (nothing privileged is inherited by a command of someone else's);
    with neither, or with only the built-in's own image pinned by digest (what
    require_digest asks of an install), it is the built-in with the fields it gives
    changed."""
    if builtin is None or not isinstance(given, dict):
        return given
    image = given.get("image")
    same_image = isinstance(image, str) and _DIGEST.sub("", image) == builtin.image
    if "command" not in given and ("image" not in given or same_image):
        return {**builtin.model_dump(), **given}
    return given if "purpose" in given else {"purpose": builtin.purpose, **given}


def _pin_hint(image: str) -> str:
    """How to pin an image: its digest from the registry."""
    name = image.split("@", 1)[0]
    return f"pin it: {name}@$(crane digest {name})"


class TemplateRefused(ValueError):
    """A remediation named a Job template the worker does not have for that step."""
