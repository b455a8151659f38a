"""Server-side printing: the meta.k8s.io/v1 Table a real API server returns to kubectl.

`kubectl get` asks for ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` and prints
the columns the server sends; without them it shows only NAME and AGE. The columns here are
those of the API server's own printers (pkg/printers/internalversion) for the resources a
newcomer looks at (nodes, pods, Jobs, Events), and NAME and AGE for the rest. The server
prints every column (``-o wide`` ones too, priority 1) and kubectl hides those it was not
asked for.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sim.cluster import clock

Obj = dict[str, Any]
Column = tuple[str, str, int, str]  # name, type, priority (1: -o wide only), description


def wants_table(accept: str) -> bool:
    """The first acceptable type is a v1 Table (kubectl's order: v1, v1beta1, JSON)."""
    for part in accept.split(","):
        params = {k.strip(): v.strip() for k, _, v in
                  (p.partition("=") for p in part.split(";")[1:])}
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io" and \
                params.get("v") == "v1":
            return True
    return False


def age(created: str | None, now: float | None = None) -> str:
    """kubectl's duration.HumanDuration of the time since ``created``."""
    if not created:
        return "<unknown>"
    try:
        then = datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return "<invalid>"
    s = max(0, int((now if now is not None else clock.now()) - then))
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if d < 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    return f"{d}d" if d < 365 * 2 else f"{d // 365}y"


def _node(o: Obj) -> list[Any]:
    st, spec, meta = o.get("status") or {}, o.get("spec") or {}, o.get("metadata") or {}
    ready = next((c.get("status") for c in st.get("conditions") or []
                  if c.get("type") == "Ready"), None)
    status = {"True": "Ready", "False": "NotReady"}.get(str(ready), "Unknown")
    if spec.get("unschedulable"):
        status += ",SchedulingDisabled"
    roles = sorted(k.split("/", 1)[1] for k in meta.get("labels") or {}
                   if k.startswith("node-role.kubernetes.io/") and "/" in k)
    info = st.get("nodeInfo") or {}
    addresses = {a.get("type"): a.get("address") for a in st.get("addresses") or []}
    return [status, ",".join(roles) or "<none>", age(meta.get("creationTimestamp")),
            info.get("kubeletVersion", ""), addresses.get("InternalIP", "<none>"),
            addresses.get("ExternalIP", "<none>"), info.get("osImage", "<unknown>"),
            info.get("kernelVersion", "<unknown>"), info.get("containerRuntimeVersion", "")]


def _pod(o: Obj) -> list[Any]:
    st, spec, meta = o.get("status") or {}, o.get("spec") or {}, o.get("metadata") or {}
    statuses = st.get("containerStatuses") or []
    total = len(spec.get("containers") or [])
    ready = sum(1 for c in statuses if c.get("ready"))
    restarts = sum(int(c.get("restartCount") or 0) for c in statuses)
    reason = st.get("reason") or st.get("phase") or "Pending"
    for c in statuses:
        state = c.get("state") or {}
        waiting, term = state.get("waiting"), state.get("terminated")
        if waiting and waiting.get("reason"):
            reason = waiting["reason"]
        elif term and (term.get("reason") or term.get("exitCode") is not None):
            reason = term.get("reason") or f"ExitCode:{term.get('exitCode')}"
    if meta.get("deletionTimestamp"):
        reason = "Terminating"
    return [f"{ready}/{total}", reason, str(restarts), age(meta.get("creationTimestamp")),
            st.get("podIP") or "<none>", spec.get("nodeName") or "<none>"]


def _job(o: Obj) -> list[Any]:
    st, spec, meta = o.get("status") or {}, o.get("spec") or {}, o.get("metadata") or {}
    conditions = {c.get("type"): c.get("status") for c in st.get("conditions") or []}
    status = ("Complete" if conditions.get("Complete") == "True" else
              "Failed" if conditions.get("Failed") == "True" else "Running")
    done = int(st.get("succeeded") or 0)
    started, finished = st.get("startTime"), st.get("completionTime")
    took = ""
    if started:
        try:
            end = (datetime.fromisoformat(finished.replace("Z", "+00:00")).timestamp()
                   if finished else clock.now())
            took = age(started, end)
        except ValueError:
            took = ""
    return [status, f"{done}/{spec.get('completions', 1)}", took,
            age(meta.get("creationTimestamp"))]


def _event(o: Obj) -> list[Any]:
    """printEvent: the core/v1 shape, or events.k8s.io/v1's (regarding, note, series)."""
    meta = o.get("metadata") or {}
    involved = o.get("involvedObject") or o.get("regarding") or {}
    first = (age(o.get("firstTimestamp")) if o.get("firstTimestamp")
             else age(o.get("eventTime") or o.get("deprecatedFirstTimestamp")))
    last = age(o.get("lastTimestamp") or o.get("deprecatedLastTimestamp")) if (
        o.get("lastTimestamp") or o.get("deprecatedLastTimestamp")) else first
    count = int(o.get("count") or o.get("deprecatedCount") or 0)
    series = o.get("series")
    if series:
        last = age(series.get("lastObservedTime"))
        count = int(series.get("count") or 0)
    elif count == 0:
        count = 1
    kind = str(involved.get("kind") or "").lower()
    target = f"{kind}/{involved['name']}" if involved.get("name") else kind
    source = o.get("source") or o.get("deprecatedSource") or {}
    component = source.get("component") or o.get("reportingController") or \
        o.get("reportingComponent") or ""
    instance = source.get("host") or o.get("reportingInstance") or ""
    return [last, o.get("type", ""), o.get("reason", ""), target,
            involved.get("fieldPath", ""), f"{component}, {instance}" if instance else component,
            str(o.get("message") or o.get("note") or "").strip(), first, count,
            meta.get("name", "")]


EVENT_COLUMNS: list[Column] = [
    ("Last Seen", "string", 0, "The time at which the most recent occurrence of this event "
                               "was recorded."),
    ("Type", "string", 0, "Type of this event (Normal, Warning), new types could be added in "
                          "the future"),
    ("Reason", "string", 0, "This should be a short, machine understandable string that gives "
                            "the reason for the transition into the object's current status."),
    ("Object", "string", 0, "The object that this event is about."),
    ("Subobject", "string", 1, "If referring to a piece of an object instead of an entire "
                               "object, this string should contain a valid JSON/Go-field "
                               "access statement."),
    ("Source", "string", 1, "The component reporting this event. Should be a short machine "
                            "understandable string."),
    ("Message", "string", 0, "A human-readable description of the status of this operation."),
    ("First Seen", "string", 1, "The time at which the event was first recorded."),
    ("Count", "string", 1, "The number of times this event has occurred."),
    ("Name", "string", 1, "Name must be unique within a namespace."),
]
"""The Event printer names its own columns: NAME last and only with -o wide."""

WHOLE_ROW = {"events": (EVENT_COLUMNS, _event)}
"""Printers whose columns include the name where the real printer puts it."""


PRINTERS: dict[str, tuple[list[Column], Any]] = {
    "nodes": ([("Status", "string", 0, "The status of the node"),
               ("Roles", "string", 0, "The roles of the node"),
               ("Age", "string", 0, "CreationTimestamp"),
               ("Version", "string", 0, "Kubelet Version reported by the node."),
               ("Internal-IP", "string", 1, "List of internal IPs for the node."),
               ("External-IP", "string", 1, "List of external IPs for the node."),
               ("OS-Image", "string", 1, "OS image reported by the node."),
               ("Kernel-Version", "string", 1, "Kernel version reported by the node."),
               ("Container-Runtime", "string", 1, "Container runtime reported by the node.")],
              _node),
    "pods": ([("Ready", "string", 0, "The aggregate readiness state of this pod"),
              ("Status", "string", 0, "The aggregate status of the containers in this pod."),
              ("Restarts", "string", 0, "The number of times the containers were restarted."),
              ("Age", "string", 0, "CreationTimestamp"),
              ("IP", "string", 1, "IP address assigned to pod"),
              ("Node", "string", 1, "Name of the node assigned to the pod")], _pod),
    "jobs": ([("Status", "string", 0, "Status of the job."),
              ("Completions", "string", 0, "The completion status of the job."),
              ("Duration", "string", 0, "Time required to complete the job."),
              ("Age", "string", 0, "CreationTimestamp")], _job),
}


def table(plural: str, body: Obj) -> Obj:
    """``body`` (one object or a list) as a Table, each row with its object's metadata."""
    items = body.get("items") if "items" in body else [body]
    name: Column = ("Name", "string", 0, "Name must be unique within a namespace.")
    if plural in WHOLE_ROW:
        all_columns, row_cells = WHOLE_ROW[plural]
    else:
        columns, cells = PRINTERS.get(plural, ([("Age", "string", 0, "CreationTimestamp")],
                                               lambda o: [age((o.get("metadata") or {})
                                                              .get("creationTimestamp"))]))
        all_columns = [name, *columns]

        def row_cells(o: Obj) -> list[Any]:
            return [(o.get("metadata") or {}).get("name", ""), *cells(o)]
    rows = []
    for o in items or []:
        meta = o.get("metadata") or {}
        rows.append({
            "cells": row_cells(o),
            "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                       "metadata": meta},
        })
    return {
        "kind": "Table", "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": (body.get("metadata") or {}).get("resourceVersion", "")},
        "columnDefinitions": [
            {"name": n, "type": t, "format": "name" if n == "Name" else "",
             "description": d, "priority": p} for n, t, p, d in all_columns],
        "rows": rows,
    }
