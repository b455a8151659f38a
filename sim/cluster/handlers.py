"""The REST verbs on stored resources, independent of HTTP plumbing.

Each function takes already-decoded inputs and returns (status code, body)
or raises ApiError, so the semantics (admission, validation, preconditions,
subresources) can be read in one place.
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from typing import Any

from sim.cluster import (
    admission,
    defaults,
    deletion,
    errors,
    eviction,
    patch,
    selectors,
    validation,
)
from sim.cluster import dra_schema as dra
from sim.cluster import resources as r
from sim.cluster.store import Obj, Store

PATCH_TYPES = {
    "application/strategic-merge-patch+json": "strategic",
    "application/merge-patch+json": "merge",
    "application/json-patch+json": "json",
}


@dataclass
class Target:
    rt: r.ResourceType
    namespace: str  # "" for cluster-scoped or all-namespaces
    name: str
    sub: str


def _check_namespace(store: Store, t: Target, obj: Obj) -> None:
    """NamespaceLifecycle admission plus the URL/body namespace agreement."""
    m = obj.setdefault("metadata", {})
    if not t.rt.namespaced:
        m.pop("namespace", None)
        return
    if m.get("namespace") and m["namespace"] != t.namespace:
        raise errors.bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    m["namespace"] = t.namespace
    ns = store.find(r.NAMESPACES, "", t.namespace)
    if ns is None:
        raise errors.not_found(r.NAMESPACES, t.namespace)
    if ns["metadata"].get("deletionTimestamp"):
        raise errors.forbidden(
            t.rt,
            m.get("name", ""),
            f"unable to create new content in namespace {t.namespace} because it is being "
            "terminated",
        )


def create(store: Store, t: Target, body: Any, dry_run: bool) -> tuple[int, Obj]:
    if t.sub == "eviction" and t.rt is r.PODS:
        if not isinstance(body, dict):
            raise errors.bad_request("Eviction body must be a JSON object")
        return 201, eviction.evict(store, t.namespace, t.name, body, dry_run)
    if t.name or t.sub:
        raise errors.method_not_allowed(t.rt)
    if not isinstance(body, dict):
        raise errors.bad_request("the body of the request must be a JSON object")
    if t.rt.read_only:
        raise errors.method_not_allowed(t.rt)
    _check_namespace(store, t, body)
    m = body["metadata"]
    if not m.get("name") and m.get("generateName"):
        m["name"] = m["generateName"] + uuid.uuid4().hex[:5]
    obj = defaults.on_create(t.rt, body)
    if t.rt is r.PODS and (refused := admission.pod_refusal(store, obj)) is not None:
        raise refused
    validation.validate(t.rt, obj)
    uid = str(uuid.uuid4())
    if t.rt is r.JOBS:
        obj["metadata"]["uid"] = uid
        defaults.job_selector(obj)
    return 201, store.create(t.rt, obj, dry_run=dry_run, uid=uid)


def get(store: Store, t: Target) -> Obj:
    if t.sub and t.sub != "status":
        raise errors.path_not_found()
    return store.get(t.rt, t.namespace, t.name)


def _encode_continue(offset: int, rv: str) -> str:
    return base64.urlsafe_b64encode(json.dumps({"o": offset, "rv": rv}).encode()).decode()


def _decode_continue(token: str) -> tuple[int, str]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(data["o"]), str(data["rv"])
    except (ValueError, KeyError, TypeError) as err:
        raise errors.bad_request(f"invalid continue token: {token}") from err


def filter_objects(
    rt: r.ResourceType, objs: list[Obj], label_selector: str, field_selector: str
) -> list[Obj]:
    lreqs = selectors.parse_label_selector(label_selector)
    freqs = selectors.parse_field_selector(field_selector, rt.plural)
    return [
        o
        for o in objs
        if selectors.matches_all(lreqs, (o.get("metadata") or {}).get("labels"))
        and all(f.matches(o) for f in freqs)
    ]


def list_(store: Store, t: Target, query: dict[str, str]) -> Obj:
    objs = store.list(t.rt, t.namespace if t.rt.namespaced and t.namespace else None)
    objs = filter_objects(
        t.rt, objs, query.get("labelSelector", ""), query.get("fieldSelector", "")
    )
    rv = store.resource_version
    offset = 0
    if query.get("continue"):
        offset, rv = _decode_continue(query["continue"])
    list_meta: dict[str, Any] = {"resourceVersion": rv}
    limit = int(query.get("limit") or 0)
    if limit > 0 and len(objs) > offset + limit:
        list_meta["continue"] = _encode_continue(offset + limit, rv)
        list_meta["remainingItemCount"] = len(objs) - offset - limit
        objs = objs[offset : offset + limit]
    else:
        objs = objs[offset:]
    for o in objs:
        # The real server leaves kind/apiVersion off list items; the list carries them.
        o.pop("kind", None)
        o.pop("apiVersion", None)
    return {
        "kind": t.rt.list_kind,
        "apiVersion": t.rt.api_version,
        "metadata": list_meta,
        "items": objs,
    }


def _check_identity(t: Target, obj: Obj) -> None:
    m = obj.get("metadata") or {}
    if m.get("name") != t.name:
        raise errors.bad_request(
            f"the name of the object ({m.get('name')}) does not match the name on the URL "
            f"({t.name})"
        )
    if t.rt.namespaced and m.get("namespace") not in (None, "", t.namespace):
        raise errors.bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )


def _write(store: Store, t: Target, old: Obj, new: Obj, dry_run: bool, check_rv: bool) -> Obj:
    if t.sub not in ("", "status"):
        raise errors.method_not_allowed(t.rt)
    if t.rt.read_only:
        raise errors.method_not_allowed(t.rt)
    new.setdefault("metadata", {})
    if t.rt.namespaced:
        new["metadata"]["namespace"] = t.namespace
    if t.sub != "status":
        merged = {**new, "status": old.get("status")} if t.rt.has_status else new
        for k in ("uid", "creationTimestamp", "generation", "deletionTimestamp"):
            if k in old["metadata"]:
                merged["metadata"].setdefault(k, old["metadata"][k])
        dra.on_update(t.rt, old, new)
        validation.validate_update(t.rt, old, merged)
    out = store.update(t.rt, new, check_rv=check_rv, status_only=t.sub == "status", dry_run=dry_run)
    if not dry_run:
        deletion.finish_if_released(store, t.rt, out)
    return out


def update(store: Store, t: Target, body: Any, dry_run: bool) -> Obj:
    if not isinstance(body, dict):
        raise errors.bad_request("the body of the request must be a JSON object")
    _check_identity(t, body)
    old = store.get(t.rt, t.namespace, t.name)
    return _write(store, t, old, body, dry_run, check_rv=True)


def patch_(store: Store, t: Target, content_type: str, body: Any, dry_run: bool) -> Obj:
    kind = PATCH_TYPES.get(content_type.split(";")[0].strip())
    if kind is None:
        raise errors.unsupported_media_type(content_type)
    old = store.get(t.rt, t.namespace, t.name)
    if kind == "strategic":
        new = patch.strategic_merge(t.rt.kind, old, body)
    elif kind == "merge":
        if not isinstance(body, dict):
            raise errors.bad_request("invalid JSON merge patch: must be an object")
        new = patch.merge_patch(old, body)
    else:
        new = patch.json_patch(old, body)
    if not isinstance(new, dict):
        raise errors.bad_request("the patch did not produce an object")
    _check_identity(t, new)
    # A resourceVersion in the patch body is a precondition; otherwise none applies.
    return _write(store, t, old, new, dry_run, check_rv=True)


def delete(store: Store, t: Target, options: dict[str, Any], dry_run: bool) -> dict[str, Any]:
    if t.sub:
        raise errors.method_not_allowed(t.rt)
    if t.rt.read_only:
        raise errors.method_not_allowed(t.rt)
    return deletion.delete(store, t.rt, t.namespace, t.name, options, dry_run=dry_run)


def delete_collection(
    store: Store, t: Target, query: dict[str, str], options: dict[str, Any], dry_run: bool
) -> Obj:
    listed = list_(store, t, {k: v for k, v in query.items() if k != "limit"})
    for item in listed["items"]:
        m = item["metadata"]
        deletion.delete(store, t.rt, m.get("namespace", ""), m["name"], options, dry_run=dry_run)
    return listed
