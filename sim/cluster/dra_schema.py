"""What the API server checks and fills in on ResourceSlice, ResourceClaim and
DeviceTaintRule: 422 Invalid with field causes, unknown selector fields dropped silently
(the default `fieldValidation=Warn`), `taint.timeAdded` set on create and renewed when the
effect changes. The controllers that act on these objects are in sim/cluster/dra.py.
"""

from __future__ import annotations

import re
from typing import Any

from sim.cluster import clock
from sim.cluster import resources as r
from sim.cluster.errors import FieldError
from sim.cluster.store import Obj

DEVICE_TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")
SCHEDULING_EFFECTS = ("NoSchedule", "NoExecute")
MAX_DEVICES_PER_SLICE = 128
MAX_RULE_CONDITIONS = 8

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SELECTOR_FIELDS = ("driver", "pool", "device")


def is_rule(rt: r.ResourceType) -> bool:
    return rt.key == r.DEVICETAINTRULES.key


def _qualified_name(value: Any) -> bool:
    if not isinstance(value, str) or not value:
        return False
    prefix, _, name = value.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return len(name) <= 63 and bool(_LABEL_NAME.match(name))


def _taint(t: Any, path: str) -> list[FieldError]:
    if not isinstance(t, dict):
        return [FieldError(path, "Required", "")]
    errs: list[FieldError] = []
    key = t.get("key")
    if not key:
        errs.append(FieldError(f"{path}.key", "Required", ""))
    elif not _qualified_name(key):
        errs.append(FieldError(
            f"{path}.key", "Invalid", "name part must consist of alphanumeric characters, '-', "
            "'_' or '.', and must start and end with an alphanumeric character", key))
    value = t.get("value") or ""
    if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
        errs.append(FieldError(
            f"{path}.value", "Invalid", "a valid label must be an empty string or consist of "
            "alphanumeric characters, '-', '_' or '.', and must start and end with an "
            "alphanumeric character", value))
    effect = t.get("effect") or ""
    if not effect:
        errs.append(FieldError(f"{path}.effect", "Required", ""))
    elif effect not in DEVICE_TAINT_EFFECTS:
        errs.append(FieldError(f"{path}.effect", "Unsupported",
                               'supported values: "NoExecute", "NoSchedule", "None"', effect))
    return errs


def _rule(obj: Obj) -> list[FieldError]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [FieldError("spec", "Required", "")]
    errs = _taint(spec.get("taint"), "spec.taint")
    sel = spec.get("deviceSelector")
    if sel is not None and not isinstance(sel, dict):
        errs.append(FieldError("spec.deviceSelector", "Invalid", "must be an object", sel))
        return errs
    sel = sel or {}
    driver, pool, device = sel.get("driver"), sel.get("pool"), sel.get("device")
    if driver is not None and (not isinstance(driver, str) or len(driver) > 63
                               or not _DNS_SUBDOMAIN.match(driver)):
        errs.append(FieldError("spec.deviceSelector.driver", "Invalid",
                               "a driver name must be a DNS subdomain of at most 63 characters",
                               driver))
    if pool is not None and (not isinstance(pool, str) or len(pool) > 253 or not all(
            _DNS_SUBDOMAIN.match(part) for part in pool.split("/"))):
        errs.append(FieldError("spec.deviceSelector.pool", "Invalid",
                               "a pool name must be one or more DNS subdomains separated by "
                               "slashes", pool))
    if device is not None and (not isinstance(device, str) or len(device) > 63
                               or not _DNS_LABEL.match(device)):
        errs.append(FieldError("spec.deviceSelector.device", "Invalid",
                               "a device name must be a DNS label", device))
    conds = (obj.get("status") or {}).get("conditions") or []
    if len(conds) > MAX_RULE_CONDITIONS:
        errs.append(FieldError("status.conditions", "TooMany",
                               f"must have at most {MAX_RULE_CONDITIONS} items", len(conds)))
    return errs


def _attribute(value: Any, path: str) -> list[FieldError]:
    kinds = [k for k in ("int", "bool", "string", "version") if k in (value or {})]
    if not isinstance(value, dict) or len(kinds) != 1:
        return [FieldError(path, "Invalid", "exactly one value must be specified", value)]
    v = value[kinds[0]]
    if kinds[0] == "string" and (not isinstance(v, str) or len(v) > 64):
        return [FieldError(f"{path}.string", "TooLong", "may not be more than 64 bytes", v)]
    return []


def _slice(obj: Obj) -> list[FieldError]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [FieldError("spec", "Required", "")]
    errs: list[FieldError] = []
    driver = spec.get("driver")
    if not driver:
        errs.append(FieldError("spec.driver", "Required", ""))
    elif not isinstance(driver, str) or len(driver) > 63 or not _DNS_SUBDOMAIN.match(driver):
        errs.append(FieldError("spec.driver", "Invalid", "a driver name must be a DNS "
                               "subdomain of at most 63 characters", driver))
    pool = spec.get("pool") or {}
    if not pool.get("name"):
        errs.append(FieldError("spec.pool.name", "Required", ""))
    if not isinstance(pool.get("resourceSliceCount"), int) or pool["resourceSliceCount"] < 1:
        errs.append(FieldError("spec.pool.resourceSliceCount", "Invalid",
                               "must be greater than zero", pool.get("resourceSliceCount")))
    if not isinstance(pool.get("generation", 0), int) or pool.get("generation", 0) < 0:
        errs.append(FieldError("spec.pool.generation", "Invalid",
                               "must be greater than or equal to zero", pool.get("generation")))
    placement = [k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
                 if spec.get(k)]
    if len(placement) != 1:
        errs.append(FieldError("spec", "Invalid", "exactly one of `nodeName`, `nodeSelector`, "
                               "`allNodes`, `perDeviceNodeSelection` is required", placement))
    devices = spec.get("devices") or []
    if len(devices) > MAX_DEVICES_PER_SLICE:
        errs.append(FieldError("spec.devices", "TooMany",
                               f"must have at most {MAX_DEVICES_PER_SLICE} items", len(devices)))
    seen: set[str] = set()
    for i, d in enumerate(devices):
        name = d.get("name") if isinstance(d, dict) else None
        path = f"spec.devices[{i}]"
        if not name:
            errs.append(FieldError(f"{path}.name", "Required", ""))
        elif not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL.match(name):
            errs.append(FieldError(f"{path}.name", "Invalid", "a device name must be a DNS "
                                   "label", name))
        elif name in seen:
            errs.append(FieldError(f"{path}.name", "Duplicate", "", name))
        seen.add(str(name))
        for key, value in ((d or {}).get("attributes") or {}).items():
            errs += _attribute(value, f"{path}.attributes[{key}]")
        for j, t in enumerate((d or {}).get("taints") or []):
            errs += _taint(t, f"{path}.taints[{j}]")
    return errs


def _claim(obj: Obj) -> list[FieldError]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [FieldError("spec", "Required", "")]
    errs: list[FieldError] = []
    seen: set[str] = set()
    for i, req in enumerate((spec.get("devices") or {}).get("requests") or []):
        path = f"spec.devices.requests[{i}]"
        name = req.get("name") if isinstance(req, dict) else None
        if not name:
            errs.append(FieldError(f"{path}.name", "Required", ""))
        elif not _DNS_LABEL.match(str(name)):
            errs.append(FieldError(f"{path}.name", "Invalid", "a request name must be a DNS "
                                   "label", name))
        elif name in seen:
            errs.append(FieldError(f"{path}.name", "Duplicate", "", name))
        seen.add(str(name))
        exactly, first = (req or {}).get("exactly"), (req or {}).get("firstAvailable")
        if bool(exactly) == bool(first):
            errs.append(FieldError(path, "Invalid",
                                   "exactly one of `exactly` or `firstAvailable` is required",
                                   "<request>"))
            continue
        if not exactly:
            continue  # firstAvailable: accepted, not allocated by the simulator (below)
        if not exactly.get("deviceClassName"):
            errs.append(FieldError(f"{path}.exactly.deviceClassName", "Required", ""))
        mode = exactly.get("allocationMode", "ExactCount")
        if mode not in ("ExactCount", "All"):
            errs.append(FieldError(f"{path}.exactly.allocationMode", "Unsupported",
                                   'supported values: "All", "ExactCount"', mode))
        count = exactly.get("count", 1)
        if mode == "ExactCount" and (not isinstance(count, int) or count < 1):
            errs.append(FieldError(f"{path}.exactly.count", "Invalid",
                                   "must be greater than zero", count))
        for j, tol in enumerate(exactly.get("tolerations") or []):
            op = tol.get("operator", "Equal")
            if op not in ("Equal", "Exists"):
                errs.append(FieldError(f"{path}.exactly.tolerations[{j}].operator",
                                       "Unsupported", 'supported values: "Equal", "Exists"', op))
            eff = tol.get("effect") or ""
            if eff and eff not in SCHEDULING_EFFECTS:
                errs.append(FieldError(f"{path}.exactly.tolerations[{j}].effect",
                                       "Unsupported", 'supported values: "NoExecute", '
                                       '"NoSchedule"', eff))
    return errs


def validate(rt: r.ResourceType, obj: Obj) -> list[FieldError]:
    if is_rule(rt):
        return _rule(obj)
    if rt is r.RESOURCESLICES:
        return _slice(obj)
    if rt is r.RESOURCECLAIMS:
        return _claim(obj)
    return []


def validate_update(rt: r.ResourceType, old: Obj, new: Obj) -> list[FieldError]:
    before, after = old.get("spec") or {}, new.get("spec") or {}
    if rt is r.RESOURCECLAIMS and before != after:
        return [FieldError("spec", "Invalid", "field is immutable", "<spec>")]
    if rt is r.RESOURCESLICES:
        errs = []
        for path, a, b in (("spec.driver", before.get("driver"), after.get("driver")),
                           ("spec.nodeName", before.get("nodeName"), after.get("nodeName")),
                           ("spec.pool.name", (before.get("pool") or {}).get("name"),
                            (after.get("pool") or {}).get("name"))):
            if a != b:
                errs.append(FieldError(path, "Invalid", "field is immutable", b))
        return errs
    return []


def on_create(rt: r.ResourceType, obj: Obj) -> None:
    if is_rule(rt):
        spec = obj.get("spec")
        if isinstance(spec, dict):
            _prune_selector(spec)
            taint = spec.get("taint")
            if isinstance(taint, dict) and not taint.get("timeAdded"):
                taint["timeAdded"] = clock.rfc3339()
        obj.pop("status", None)
    elif rt is r.RESOURCECLAIMS:
        for req in ((obj.get("spec") or {}).get("devices") or {}).get("requests") or []:
            exactly = req.get("exactly") if isinstance(req, dict) else None
            if isinstance(exactly, dict):
                exactly.setdefault("allocationMode", "ExactCount")
                if exactly["allocationMode"] == "ExactCount":
                    exactly.setdefault("count", 1)
                for tol in exactly.get("tolerations") or []:
                    tol.setdefault("operator", "Equal")
        obj.pop("status", None)


def on_update(rt: r.ResourceType, old: Obj, new: Obj) -> None:
    """`timeAdded` is renewed when the effect changes and the client kept the old time."""
    if not is_rule(rt):
        return
    spec = new.get("spec")
    if not isinstance(spec, dict):
        return
    _prune_selector(spec)
    before = (old.get("spec") or {}).get("taint") or {}
    taint = spec.get("taint")
    if not isinstance(taint, dict):
        return
    if not taint.get("timeAdded") or (taint.get("effect") != before.get("effect")
                                      and taint.get("timeAdded") == before.get("timeAdded")):
        taint["timeAdded"] = clock.rfc3339()


def _prune_selector(spec: dict[str, Any]) -> None:
    # v1beta2/v1 have no deviceClassName or CEL selectors (v1alpha3 had them); the server
    # drops unknown fields without an error, so such a rule selects more than was meant.
    sel = spec.get("deviceSelector")
    if isinstance(sel, dict):
        for k in [k for k in sel if k not in _SELECTOR_FIELDS]:
            del sel[k]


