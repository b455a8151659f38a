"""Label and field selectors: the query-string syntax and LabelSelector objects."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sim.cluster import errors

_KEY = r"[A-Za-z0-9./_-]+"
_SET_RE = re.compile(rf"^\s*(!?)\s*({_KEY})\s+(in|notin)\s*\(([^)]*)\)\s*$")
_EQ_RE = re.compile(rf"^\s*({_KEY})\s*(==|=|!=)\s*([A-Za-z0-9._-]*)\s*$")
_EXISTS_RE = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # in | notin | exists | !exists (= and == are `in`, != is `notin`)
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op == "in":
            return self.key in labels and labels[self.key] in self.values
        # notin and != also match objects without the label, as in Kubernetes.
        return self.key not in labels or labels[self.key] not in self.values


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside `( )` of a set expression."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p for p in parts if p.strip()]


def parse_label_selector(text: str) -> list[Requirement]:
    reqs: list[Requirement] = []
    for part in _split_top_level(text or ""):
        if m := _SET_RE.match(part):
            if m.group(1):
                raise errors.bad_request(f"unable to parse requirement: {part!r}")
            values = frozenset(v.strip() for v in m.group(4).split(",") if v.strip())
            reqs.append(Requirement(m.group(2), m.group(3), values))
        elif m := _EQ_RE.match(part):
            op = "notin" if m.group(2) == "!=" else "in"
            reqs.append(Requirement(m.group(1), op, frozenset([m.group(3)])))
        elif m := _EXISTS_RE.match(part):
            reqs.append(Requirement(m.group(2), "!exists" if m.group(1) else "exists"))
        else:
            raise errors.bad_request(
                f"unable to parse requirement: found '{part.strip()}', expected: "
                "'=', '!=', '==', 'in', notin'"
            )
    return reqs


def matches_all(reqs: list[Requirement], labels: dict[str, str] | None) -> bool:
    return all(r.matches(labels or {}) for r in reqs)


def from_label_selector(sel: dict[str, Any] | None) -> list[Requirement] | None:
    """A metav1.LabelSelector object; None (no selector) matches nothing."""
    if sel is None:
        return None
    reqs = [Requirement(k, "in", frozenset([v])) for k, v in (sel.get("matchLabels") or {}).items()]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}
    for expr in sel.get("matchExpressions") or []:
        reqs.append(
            Requirement(expr["key"], ops[expr["operator"]], frozenset(expr.get("values") or []))
        )
    return reqs


# -- field selectors ---------------------------------------------------------------

Getter = Callable[[dict[str, Any]], str]


def _path(*keys: str) -> Getter:
    def get(obj: dict[str, Any]) -> str:
        cur: Any = obj
        for k in keys:
            cur = cur.get(k) if isinstance(cur, dict) else None
        if isinstance(cur, bool):
            return "true" if cur else "false"
        return "" if cur is None else str(cur)

    return get


_COMMON: dict[str, Getter] = {
    "metadata.name": _path("metadata", "name"),
    "metadata.namespace": _path("metadata", "namespace"),
}
FIELDS: dict[str, dict[str, Getter]] = {
    "pods": {
        "spec.nodeName": _path("spec", "nodeName"),
        "spec.restartPolicy": _path("spec", "restartPolicy"),
        "spec.schedulerName": _path("spec", "schedulerName"),
        "spec.serviceAccountName": _path("spec", "serviceAccountName"),
        "status.phase": _path("status", "phase"),
        "status.podIP": _path("status", "podIP"),
        "status.nominatedNodeName": _path("status", "nominatedNodeName"),
    },
    "nodes": {"spec.unschedulable": _path("spec", "unschedulable")},
    "events": {
        "involvedObject.kind": _path("involvedObject", "kind"),
        "involvedObject.name": _path("involvedObject", "name"),
        "involvedObject.namespace": _path("involvedObject", "namespace"),
        "involvedObject.uid": _path("involvedObject", "uid"),
        "reason": _path("reason"),
        "type": _path("type"),
        "regarding.name": _path("regarding", "name"),
        "regarding.kind": _path("regarding", "kind"),
    },
    "jobs": {"status.successful": _path("status", "succeeded")},
    "resourceslices": {"spec.nodeName": _path("spec", "nodeName"),
                       "spec.driver": _path("spec", "driver")},
}


@dataclass(frozen=True)
class FieldRequirement:
    getter: Getter
    value: str
    negate: bool

    def matches(self, obj: dict[str, Any]) -> bool:
        return (self.getter(obj) == self.value) != self.negate


def parse_field_selector(text: str, plural: str) -> list[FieldRequirement]:
    known = {**_COMMON, **FIELDS.get(plural, {})}
    reqs: list[FieldRequirement] = []
    for part in (p for p in (text or "").split(",") if p.strip()):
        m = re.match(r"^\s*([A-Za-z0-9.]+)\s*(==|=|!=)\s*(.*?)\s*$", part)
        if not m:
            raise errors.bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        if m.group(1) not in known:
            raise errors.bad_request(f"field label not supported: {m.group(1)}")
        reqs.append(FieldRequirement(known[m.group(1)], m.group(3), m.group(2) == "!="))
    return reqs
