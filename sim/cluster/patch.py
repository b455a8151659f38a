"""The three patch formats the official client sends.

strategic merge (`application/strategic-merge-patch+json`, the client's
default for a dict body), JSON merge patch (RFC 7386) and JSON patch
(RFC 6902). Errors are raised as the same Status the real server returns.
"""

from __future__ import annotations

import copy
from typing import Any

from sim.cluster import errors
from sim.cluster.merge_keys import Path, is_primitive_merge, merge_key

Json = Any


# -- RFC 7386 ----------------------------------------------------------------------


def merge_patch(target: Json, patch: Json) -> Json:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


# -- strategic merge ---------------------------------------------------------------

_DIRECTIVES = ("$patch", "$retainKeys")


def strategic_merge(kind: str, target: Json, patch: Json) -> Json:
    if not isinstance(patch, dict):
        raise errors.bad_request("invalid JSON document: a strategic merge patch must be an object")
    return _merge_map(kind, (), target if isinstance(target, dict) else {}, patch)


def _merge_map(kind: str, path: Path, target: dict[str, Any], patch: dict[str, Any]) -> Any:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: v for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    if directive not in (None, "merge"):
        raise errors.bad_request(f"Unknown patch type: {directive}")
    out = copy.deepcopy(target)
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key in _DIRECTIVES:
            continue
        if key.startswith("$setElementOrder/"):
            # Only ordering information; merged lists keep the server's order.
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if not isinstance(value, list):
                raise errors.bad_request(
                    "invalid patch: $deleteFromPrimitiveList must be followed by a list"
                )
            out[field] = [x for x in out.get(field) or [] if x not in value]
            continue
        if key.startswith("$"):
            raise errors.bad_request(f"unknown patch directive {key!r}")
        sub = (*path, key)
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            existing = out.get(key)
            merged = _merge_map(kind, sub, existing if isinstance(existing, dict) else {}, value)
            if merged is None:
                out.pop(key, None)
            else:
                out[key] = merged
        elif isinstance(value, list):
            out[key] = _merge_list(kind, sub, out.get(key), value)
        else:
            out[key] = copy.deepcopy(value)
    if retain is not None:
        if not isinstance(retain, list):
            raise errors.bad_request("invalid patch: $retainKeys must be a list")
        out = {k: v for k, v in out.items() if k in retain}
    return out


def _merge_list(kind: str, path: Path, target: Any, patch: list[Any]) -> list[Any]:
    current = list(target) if isinstance(target, list) else []
    if is_primitive_merge(path):
        return current + [x for x in patch if x not in current]
    key = merge_key(kind, path)
    if key is None:
        if any(isinstance(x, dict) and "$patch" in x for x in patch):
            raise errors.bad_request(
                f"$patch directive on a list without a merge key: {'.'.join(path)}"
            )
        return copy.deepcopy(patch)
    if any(isinstance(x, dict) and x.get("$patch") == "replace" for x in patch):
        return [copy.deepcopy(x) for x in patch if not (isinstance(x, dict) and "$patch" in x)]
    out = copy.deepcopy(current)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise errors.unprocessable(f"map: {item} does not contain declared merge key: {key}")
        idx = next(
            (i for i, x in enumerate(out) if isinstance(x, dict) and x.get(key) == item[key]), None
        )
        if item.get("$patch") == "delete":
            if idx is not None:
                out.pop(idx)
            continue
        if idx is None:
            out.append({k: v for k, v in item.items() if k != "$patch"})
        else:
            out[idx] = _merge_map(kind, path, out[idx], item)
    return out


# -- RFC 6902 ----------------------------------------------------------------------


def _tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise errors.bad_request(f"JSON pointer {pointer!r} must start with '/'")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _parent(doc: Json, pointer: str) -> tuple[Json, str]:
    toks = _tokens(pointer)
    if not toks:
        raise errors.unprocessable(f"cannot operate on the document root: {pointer!r}")
    cur = doc
    for t in toks[:-1]:
        cur = _step(cur, t, pointer)
    return cur, toks[-1]


def _step(cur: Json, tok: str, pointer: str) -> Json:
    if isinstance(cur, dict):
        if tok not in cur:
            raise errors.unprocessable(f"doc is missing path: {pointer}: missing value")
        return cur[tok]
    if isinstance(cur, list):
        try:
            return cur[int(tok)]
        except (ValueError, IndexError) as err:
            raise errors.unprocessable(f"doc is missing path: {pointer}: missing value") from err
    raise errors.unprocessable(f"doc is missing path: {pointer}: missing value")


def _get(doc: Json, pointer: str) -> Json:
    cur = doc
    for t in _tokens(pointer):
        cur = _step(cur, t, pointer)
    return cur


def _add(doc: Json, pointer: str, value: Json) -> None:
    parent, last = _parent(doc, pointer)
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
            return
        try:
            idx = int(last)
        except ValueError as err:
            raise errors.unprocessable(f"invalid array index {last!r} in {pointer}") from err
        if not 0 <= idx <= len(parent):
            raise errors.unprocessable(
                f"add operation does not apply: index out of range: {pointer}"
            )
        parent.insert(idx, value)
    else:
        raise errors.unprocessable(f"add operation does not apply: doc is missing path: {pointer}")


def _remove(doc: Json, pointer: str) -> Json:
    parent, last = _parent(doc, pointer)
    if isinstance(parent, dict):
        if last not in parent:
            raise errors.unprocessable(
                f'remove operation does not apply: doc is missing path: "{pointer}": missing value'
            )
        return parent.pop(last)
    if isinstance(parent, list):
        try:
            return parent.pop(int(last))
        except (ValueError, IndexError) as err:
            raise errors.unprocessable(
                f'remove operation does not apply: doc is missing path: "{pointer}": missing value'
            ) from err
    raise errors.unprocessable(f"remove operation does not apply: doc is missing path: {pointer}")


def json_patch(target: Json, ops: Json) -> Json:
    if not isinstance(ops, list):
        raise errors.bad_request(
            "json: cannot unmarshal object into Go value of type jsonpatch.Patch"
        )
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise errors.bad_request(f"invalid JSON patch operation: {op!r}")
        kind, pointer = op["op"], op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise errors.unprocessable(f"{kind} operation has no value: {pointer}")
        if kind == "add":
            _add(doc, pointer, copy.deepcopy(op["value"]))
        elif kind == "remove":
            _remove(doc, pointer)
        elif kind == "replace":
            _remove(doc, pointer)
            _add(doc, pointer, copy.deepcopy(op["value"]))
        elif kind in ("move", "copy"):
            if "from" not in op:
                raise errors.unprocessable(f"{kind} operation has no from: {pointer}")
            value = (
                _remove(doc, op["from"]) if kind == "move" else copy.deepcopy(_get(doc, op["from"]))
            )
            _add(doc, pointer, value)
        elif kind == "test":
            if _get(doc, pointer) != op["value"]:
                raise errors.unprocessable(f"testing value {pointer} failed: test failed")
        else:
            raise errors.bad_request(f"Unexpected kind: {kind}")
    return doc
