"""Validation producing 422 Invalid with field causes, like kube's validators.

Only the rules a client of this simulator can plausibly trip are checked:
names, label syntax, pod containers, taint effects, Job restart policy, PDB
budgets, and pod spec immutability.
"""

from __future__ import annotations

import re
from typing import Any

from sim.cluster import dra_schema as dra
from sim.cluster import errors
from sim.cluster import resources as r
from sim.cluster.errors import FieldError
from sim.cluster.store import Obj

_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _metadata(obj: Obj) -> list[FieldError]:
    m = obj.get("metadata") or {}
    errs: list[FieldError] = []
    name = m.get("name") or ""
    if not name:
        errs.append(FieldError("metadata.name", "Required", "name or generateName is required"))
    elif len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
        errs.append(FieldError("metadata.name", "Invalid", _SUBDOMAIN_MSG, name))
    for k, v in (m.get("labels") or {}).items():
        prefix, _, short = k.rpartition("/")
        if (
            not short
            or len(short) > 63
            or not _LABEL_NAME.match(short)
            or (prefix and not _DNS1123_SUBDOMAIN.match(prefix))
        ):
            errs.append(
                FieldError(
                    "metadata.labels",
                    "Invalid",
                    "name part must consist of alphanumeric characters, '-', '_' or '.'",
                    k,
                )
            )
        if not isinstance(v, str) or len(v) > 63 or not _LABEL_VALUE.match(v):
            errs.append(
                FieldError(
                    "metadata.labels",
                    "Invalid",
                    "a valid label must be an empty "
                    "string or consist of alphanumeric characters, '-', '_' or "
                    "'.', and must start and end with an alphanumeric character",
                    v,
                )
            )
    for k, v in (m.get("annotations") or {}).items():
        if not isinstance(v, str):
            errs.append(FieldError(f"metadata.annotations[{k}]", "Invalid", "must be a string", v))
    return errs


def _containers(spec: dict[str, Any], path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    containers = spec.get("containers") or []
    if not containers:
        errs.append(
            FieldError(f"{path}.containers", "Required", "must have at least one container")
        )
    seen: set[str] = set()
    for i, c in enumerate(containers):
        if not c.get("name"):
            errs.append(FieldError(f"{path}.containers[{i}].name", "Required", ""))
        elif c["name"] in seen:
            errs.append(FieldError(f"{path}.containers[{i}].name", "Duplicate", "", c["name"]))
        seen.add(c.get("name", ""))
        if not c.get("image"):
            errs.append(FieldError(f"{path}.containers[{i}].image", "Required", ""))
    return errs


def _taints(spec: dict[str, Any]) -> list[FieldError]:
    errs: list[FieldError] = []
    seen: set[tuple[str, str]] = set()
    for i, t in enumerate(spec.get("taints") or []):
        if not t.get("key"):
            errs.append(FieldError(f"spec.taints[{i}].key", "Required", ""))
        effect = t.get("effect", "")
        if effect not in TAINT_EFFECTS:
            errs.append(
                FieldError(
                    f"spec.taints[{i}].effect",
                    "Unsupported" if effect else "Required",
                    'supported values: "NoSchedule", "PreferNoSchedule", "NoExecute"'
                    if effect
                    else "",
                    effect,
                )
            )
        pair = (t.get("key", ""), effect)
        if pair in seen:
            errs.append(
                FieldError(
                    f"spec.taints[{i}]",
                    "Duplicate",
                    "taints must be unique by key and effect pair",
                    t,
                )
            )
        seen.add(pair)
    return errs


def _pdb(spec: dict[str, Any]) -> list[FieldError]:
    min_a, max_u = spec.get("minAvailable"), spec.get("maxUnavailable")
    errs: list[FieldError] = []
    if min_a is not None and max_u is not None:
        errs.append(
            FieldError(
                "spec", "Invalid", "minAvailable and maxUnavailable cannot be both set", spec
            )
        )
    for name, value in (("minAvailable", min_a), ("maxUnavailable", max_u)):
        if value is None:
            continue
        if isinstance(value, str):
            if not re.fullmatch(r"\d+%", value) or int(value[:-1]) > 100:
                errs.append(
                    FieldError(
                        f"spec.{name}",
                        "Invalid",
                        "must be an integer or percentage (e.g '5%')",
                        value,
                    )
                )
        elif not isinstance(value, int) or value < 0:
            errs.append(
                FieldError(f"spec.{name}", "Invalid", "must be greater than or equal to 0", value)
            )
    return errs


_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
    "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)


def _runtime_class(obj: Obj) -> list[FieldError]:
    """ValidateRuntimeClass: the handler is a DNS label (an empty one too is Invalid)."""
    handler = obj.get("handler")
    text = handler if isinstance(handler, str) else ""
    errs = []
    if len(text) > 63:
        errs.append(FieldError("handler", "Invalid", "must be no more than 63 characters",
                               text))
    if not _DNS1123_LABEL.match(text):
        errs.append(FieldError("handler", "Invalid", _LABEL_MSG, text))
    return errs


_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
CONFIGMAP_MAX_BYTES = 1024 * 1024


def _configmap(obj: Obj) -> list[FieldError]:
    """ValidateConfigMap: keys are config keys, data and binaryData do not share one, and
    all of it together is at most 1 MiB."""
    errs: list[FieldError] = []
    data, binary = obj.get("data") or {}, obj.get("binaryData") or {}
    size = 0
    for field, values in (("data", data), ("binaryData", binary)):
        for key, value in values.items():
            if len(key) > 253 or not _CONFIG_KEY.match(key):
                errs.append(FieldError(
                    f"{field}[{key}]", "Invalid", "a valid config key must consist of "
                    "alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or "
                    "'KEY_NAME',  or 'key-name', regex used for validation is "
                    "'[-._a-zA-Z0-9]+')", key))
            if field == "binaryData" and key in data:
                errs.append(FieldError(f"binaryData[{key}]", "Invalid",
                                       "duplicate of key present in data", key))
            size += len(key) + len(str(value).encode())
    if size > CONFIGMAP_MAX_BYTES:
        errs.append(FieldError("", "TooLong", f"must have at most {CONFIGMAP_MAX_BYTES} bytes",
                               ""))
    return errs


def validate(rt: r.ResourceType, obj: Obj) -> None:
    errs = _metadata(obj)
    spec = obj.get("spec") or {}
    if rt is r.PODS:
        errs += _containers(spec, "spec")
    elif rt is r.NODES:
        errs += _taints(spec)
    elif rt is r.JOBS:
        tspec = (spec.get("template") or {}).get("spec") or {}
        errs += _containers(tspec, "spec.template.spec")
        policy = tspec.get("restartPolicy")
        if policy not in ("OnFailure", "Never"):
            errs.append(
                FieldError(
                    "spec.template.spec.restartPolicy",
                    "Unsupported",
                    'supported values: "OnFailure", "Never"',
                    policy,
                )
            )
    elif rt is r.PDBS:
        errs += _pdb(spec)
    elif rt is r.CONFIGMAPS:
        errs += _configmap(obj)
    elif rt is r.RUNTIMECLASSES:
        errs += _runtime_class(obj)
    elif rt.group == r.RESOURCESLICES.group:
        errs += dra.validate(rt, obj)
    if errs:
        raise errors.invalid(rt, (obj.get("metadata") or {}).get("name", ""), errs)


def _mutable_pod_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A pod spec minus the fields an update may change."""
    out = dict(spec)
    out.pop("activeDeadlineSeconds", None)
    out.pop("tolerations", None)
    out.pop("schedulingGates", None)
    out["containers"] = [
        {k: v for k, v in c.items() if k != "image"} for c in spec.get("containers") or []
    ]
    return out


def validate_update(rt: r.ResourceType, old: Obj, new: Obj) -> None:
    validate(rt, new)
    if rt.group == r.RESOURCESLICES.group and (errs := dra.validate_update(rt, old, new)):
        raise errors.invalid(rt, old["metadata"]["name"], errs)
    if rt is r.PODS:
        before, after = old.get("spec") or {}, new.get("spec") or {}
        if _mutable_pod_spec(before) != _mutable_pod_spec(after):
            raise errors.invalid(
                rt,
                old["metadata"]["name"],
                [
                    FieldError(
                        "spec",
                        "Forbidden",
                        "pod updates may not change fields other than `spec.containers[*].image`,"
                        "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,"
                        "`spec.tolerations` (only additions to existing tolerations),"
                        "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was "
                        "previously negative)",
                    )
                ],
            )
    if rt is r.RUNTIMECLASSES and old.get("handler") != new.get("handler"):
        raise errors.invalid(rt, old["metadata"]["name"], [
            FieldError("handler", "Invalid", "field is immutable", new.get("handler"))])
    if rt is r.JOBS and (old.get("spec") or {}).get("template") != (new.get("spec") or {}).get(
        "template"
    ):
        raise errors.invalid(
            rt,
            old["metadata"]["name"],
            [FieldError("spec.template", "Invalid", "field is immutable", "<template>")],
        )
