"""In-memory object store with the API server's storage semantics.

One global, monotonically increasing resourceVersion; uid, creationTimestamp
and generation are assigned here; a stale resourceVersion on update is a 409
Conflict exactly like etcd's compare-and-swap failure surfaces in kube.

The whole simulator runs on one asyncio loop and every store call is
synchronous, so each call is atomic without locks.
"""

from __future__ import annotations

import asyncio
import builtins
import copy
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sim.cluster import clock, errors
from sim.cluster.resources import ResourceType

Obj = dict[str, Any]

# Kept per resource so that a watch can resume from a recent resourceVersion.
HISTORY = 2000


@dataclass
class WatchEvent:
    type: str  # ADDED | MODIFIED | DELETED
    obj: Obj
    rv: int


@dataclass
class _Watcher:
    rt: ResourceType
    queue: asyncio.Queue[WatchEvent] = field(default_factory=asyncio.Queue)


def meta(obj: Obj) -> dict[str, Any]:
    m = obj.setdefault("metadata", {})
    assert isinstance(m, dict)
    return m


class Store:
    def __init__(self) -> None:
        self._objects: dict[str, dict[tuple[str, str], Obj]] = {}
        self._rv = 100
        self._history: dict[str, deque[WatchEvent]] = {}
        self._watchers: list[_Watcher] = []

    # -- reads -----------------------------------------------------------------

    @property
    def resource_version(self) -> str:
        return str(self._rv)

    def get(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        obj = self._objects.get(rt.key, {}).get((namespace if rt.namespaced else "", name))
        if obj is None:
            raise errors.not_found(rt, name)
        return copy.deepcopy(obj)

    def find(self, rt: ResourceType, namespace: str, name: str) -> Obj | None:
        try:
            return self.get(rt, namespace, name)
        except errors.ApiError:
            return None

    def list(self, rt: ResourceType, namespace: str | None = None) -> list[Obj]:
        """Objects ordered by namespace then name, like etcd key order."""
        bucket = self._objects.get(rt.key, {})
        keys = sorted(k for k in bucket if namespace is None or k[0] == namespace)
        return [copy.deepcopy(bucket[k]) for k in keys]

    # -- writes ----------------------------------------------------------------

    def _bump(self) -> str:
        self._rv += 1
        return str(self._rv)

    def create(
        self, rt: ResourceType, obj: Obj, *, dry_run: bool = False, uid: str | None = None
    ) -> Obj:
        obj = copy.deepcopy(obj)
        m = meta(obj)
        ns = m.get("namespace", "") if rt.namespaced else ""
        if not m.get("name") and m.get("generateName"):
            m["name"] = m["generateName"] + uuid.uuid4().hex[:5]
        key = (ns, m["name"])
        bucket = self._objects.setdefault(rt.key, {})
        if key in bucket:
            raise errors.already_exists(rt, m["name"])
        obj["apiVersion"], obj["kind"] = rt.stored_api_version, rt.kind
        m["uid"] = uid or str(uuid.uuid4())
        m["creationTimestamp"] = clock.rfc3339()
        m.pop("deletionTimestamp", None)
        m.pop("deletionGracePeriodSeconds", None)
        m.pop("resourceVersion", None)
        if rt.tracks_generation:
            m["generation"] = 1
        else:
            m.pop("generation", None)
        if dry_run:
            return obj
        m["resourceVersion"] = self._bump()
        bucket[key] = obj
        self._emit(rt, "ADDED", obj)
        return copy.deepcopy(obj)

    def update(
        self,
        rt: ResourceType,
        obj: Obj,
        *,
        check_rv: bool = True,
        status_only: bool = False,
        dry_run: bool = False,
    ) -> Obj:
        """Replace an object. The caller has already merged what it wants kept.

        check_rv: a non-empty metadata.resourceVersion that is not the current
        one is a Conflict (optimistic concurrency); empty means unconditional.
        status_only: the status subresource, which only ever changes status.
        Otherwise the main resource, which never changes status when the
        resource has a status subresource.
        """
        new = copy.deepcopy(obj)
        m = meta(new)
        ns = m.get("namespace", "") if rt.namespaced else ""
        old = self._objects.get(rt.key, {}).get((ns, m.get("name", "")))
        if old is None:
            raise errors.not_found(rt, m.get("name", ""))
        om = old["metadata"]
        given_rv = m.get("resourceVersion")
        if check_rv and given_rv and given_rv != om["resourceVersion"]:
            raise errors.conflict(rt, om["name"])
        if m.get("uid") and m["uid"] != om["uid"]:
            raise errors.conflict(
                rt,
                om["name"],
                f"Precondition failed: UID in precondition: {m['uid']}, "
                f"UID in object meta: {om['uid']}",
            )
        if status_only:
            kept = copy.deepcopy(old)
            if "status" in new:
                kept["status"] = new["status"]
            new = kept
            m = new["metadata"]
        else:
            if rt.has_status:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
            # System-owned metadata cannot be changed by a client.
            for k in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ):
                if k in om:
                    m[k] = om[k]
                else:
                    m.pop(k, None)
            if rt.tracks_generation and new.get("spec") != old.get("spec"):
                m["generation"] = om.get("generation", 1) + 1
        new["apiVersion"], new["kind"] = rt.stored_api_version, rt.kind
        if _same_content(old, new):
            # A no-op write does not bump resourceVersion, like the real server.
            return copy.deepcopy(old)
        if dry_run:
            m["resourceVersion"] = om["resourceVersion"]
            return new
        m["resourceVersion"] = self._bump()
        self._objects[rt.key][(ns, m["name"])] = new
        self._emit(rt, "MODIFIED", new)
        return copy.deepcopy(new)

    def remove(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        """Drop an object from storage now (the end of any graceful deletion)."""
        bucket = self._objects.get(rt.key, {})
        key = (namespace if rt.namespaced else "", name)
        if key not in bucket:
            raise errors.not_found(rt, name)
        obj = bucket.pop(key)
        obj["metadata"]["resourceVersion"] = self._bump()
        self._emit(rt, "DELETED", obj)
        return copy.deepcopy(obj)

    def put_internal(self, rt: ResourceType, obj: Obj) -> Obj:
        """A controller's write: no precondition, status and spec both kept."""
        m = meta(obj)
        ns = m.get("namespace", "") if rt.namespaced else ""
        old = self._objects.get(rt.key, {}).get((ns, m["name"]))
        if old is None:
            raise errors.not_found(rt, m["name"])
        if _same_content(old, obj):
            return copy.deepcopy(old)
        new = copy.deepcopy(obj)
        if rt.tracks_generation and new.get("spec") != old.get("spec"):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        new["metadata"]["resourceVersion"] = self._bump()
        self._objects[rt.key][(ns, m["name"])] = new
        self._emit(rt, "MODIFIED", new)
        return copy.deepcopy(new)

    # -- watch -----------------------------------------------------------------

    def _emit(self, rt: ResourceType, kind: str, obj: Obj) -> None:
        event = WatchEvent(kind, copy.deepcopy(obj), int(obj["metadata"]["resourceVersion"]))
        self._history.setdefault(rt.key, deque(maxlen=HISTORY)).append(event)
        for w in self._watchers:
            if w.rt.key == rt.key:
                w.queue.put_nowait(event)

    def history_since(self, rt: ResourceType, rv: int) -> builtins.list[WatchEvent] | None:
        """Events after rv, or None when rv is older than what is kept (410 Gone)."""
        events = builtins.list(self._history.get(rt.key, ()))
        # resourceVersions are global, so only a full history can have lost events.
        if len(events) == HISTORY and rv < events[0].rv:
            return None
        return [e for e in events if e.rv > rv]

    def subscribe(self, rt: ResourceType) -> _Watcher:
        w = _Watcher(rt)
        self._watchers.append(w)
        return w

    def unsubscribe(self, w: _Watcher) -> None:
        if w in self._watchers:
            self._watchers.remove(w)


def _same_content(old: Obj, new: Obj) -> bool:
    """Equal apart from resourceVersion: such a write changes nothing."""
    a = copy.deepcopy(old)
    b = copy.deepcopy(new)
    a.get("metadata", {}).pop("resourceVersion", None)
    b.get("metadata", {}).pop("resourceVersion", None)
    return a == b


@dataclass
class WriteRecord:
    verb: str
    resource: str
    namespace: str
    name: str
    time: str
    code: int
    dry_run: bool
    summary: str

    def to_json(self) -> dict[str, Any]:
        return {
            "verb": self.verb,
            "resource": self.resource,
            "namespace": self.namespace,
            "name": self.name,
            "time": self.time,
            "code": self.code,
            "dryRun": self.dry_run,
            "summary": self.summary,
        }


class WriteLog:
    """Every mutating API request the server received, whatever its outcome.

    Controller writes are not requests and are not logged, so an empty log
    proves a client (e.g. the product in dry-run) mutated nothing.
    """

    def __init__(self) -> None:
        self._records: list[WriteRecord] = []

    def record(self, rec: WriteRecord) -> None:
        self._records.append(rec)

    def entries(self) -> list[WriteRecord]:
        return list(self._records)

    def clear(self) -> None:
        self._records.clear()
