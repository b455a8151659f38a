"""Streaming `?watch=true`: newline-delimited JSON watch events.

Honours resourceVersion (resume after it, 410 Expired when too old; none or
"0" starts with synthetic ADDED events for what exists), label/field selectors
(an object leaving the selection is reported DELETED, entering it ADDED, as
the watch cache does) and timeoutSeconds.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web

from sim.cluster import errors
from sim.cluster import resources as r
from sim.cluster.handlers import Target, filter_objects
from sim.cluster.store import Obj, Store, WatchEvent

DEFAULT_TIMEOUT = 1800.0


def as_version(obj: Obj, rt: r.ResourceType) -> Obj:
    """An object as the version the client asked for (DeviceTaintRule is served as v1 and
    v1beta2 from one stored object, whose schemas agree)."""
    if isinstance(obj, dict) and obj.get("kind") == rt.kind:
        obj["apiVersion"] = rt.api_version
    return obj


def _line(kind: str, obj: Obj) -> bytes:
    return (json.dumps({"type": kind, "object": obj}) + "\n").encode()


async def serve_watch(
    request: web.Request, store: Store, t: Target, query: dict[str, str]
) -> web.StreamResponse:
    label_sel, field_sel = query.get("labelSelector", ""), query.get("fieldSelector", "")
    filter_objects(t.rt, [], label_sel, field_sel)  # reject bad selectors before streaming

    def selected(obj: Obj) -> bool:
        if t.rt.namespaced and t.namespace and obj["metadata"].get("namespace") != t.namespace:
            return False
        if t.name and obj["metadata"].get("name") != t.name:
            return False
        return bool(filter_objects(t.rt, [obj], label_sel, field_sel))

    watcher = store.subscribe(t.rt)
    resp = web.StreamResponse(
        headers={"Content-Type": "application/json", "Cache-Control": "no-cache, private"}
    )
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    deadline = time.monotonic() + float(query.get("timeoutSeconds") or DEFAULT_TIMEOUT)
    visible: set[str] = set()
    last_rv = 0
    try:
        rv_param = query.get("resourceVersion", "")
        backlog: list[tuple[str, Obj]] = []
        if rv_param in ("", "0"):
            for obj in store.list(t.rt):
                if selected(obj):
                    backlog.append(("ADDED", obj))
            last_rv = int(store.resource_version)
        else:
            since = store.history_since(t.rt, int(rv_param))
            if since is None:
                err = errors.gone(
                    f"too old resource version: {rv_param} ({store.resource_version})"
                )
                await resp.write(_line("ERROR", err.body()))
                return resp
            visible |= _visible_at(store, t, int(rv_param), since, selected)
            last_rv = int(rv_param)
            for ev in since:
                backlog.extend(_translate(ev, selected, visible))
                last_rv = max(last_rv, ev.rv)
        for kind, obj in backlog:
            if kind == "ADDED":
                visible.add(obj["metadata"]["uid"])
            await resp.write(_line(kind, as_version(obj, t.rt)))
        while (left := deadline - time.monotonic()) > 0:
            try:
                ev = await asyncio.wait_for(watcher.queue.get(), timeout=left)
            except TimeoutError:
                break
            if ev.rv <= last_rv:
                continue
            last_rv = ev.rv
            for kind, obj in _translate(ev, selected, visible):
                await resp.write(_line(kind, as_version(obj, t.rt)))
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        store.unsubscribe(watcher)
    return resp


def _translate(ev: WatchEvent, selected: Any, visible: set[str]) -> list[tuple[str, Obj]]:
    uid = ev.obj["metadata"]["uid"]
    was = uid in visible
    now = ev.type != "DELETED" and selected(ev.obj)
    if ev.type == "DELETED":
        if was:
            visible.discard(uid)
            return [("DELETED", ev.obj)]
        return []
    if now and not was:
        visible.add(uid)
        return [("ADDED", ev.obj)]
    if now:
        return [("MODIFIED", ev.obj)]
    if was:
        visible.discard(uid)
        return [("DELETED", ev.obj)]
    return []


def _visible_at(
    store: Store, t: Target, rv: int, since: list[WatchEvent], selected: Any
) -> set[str]:
    """uids that existed and matched the selection as of resourceVersion rv."""
    added_later = {ev.obj["metadata"]["uid"] for ev in since if ev.type == "ADDED"}
    before = store.history_since(t.rt, 0) or []
    state: dict[str, Obj] = {}
    gone: set[str] = set()
    for ev in before:
        if ev.rv <= rv:
            state[ev.obj["metadata"]["uid"]] = ev.obj
            if ev.type == "DELETED":
                gone.add(ev.obj["metadata"]["uid"])
    for obj in store.list(t.rt):
        state.setdefault(obj["metadata"]["uid"], obj)
    for ev in since:
        state.setdefault(ev.obj["metadata"]["uid"], ev.obj)
    return {
        uid for uid, obj in state.items()
        if uid not in added_later and uid not in gone and selected(obj)
    }
