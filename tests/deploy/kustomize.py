"""A small kustomize renderer for the tests: exactly the features deploy/ uses.

Supported kustomization fields: ``resources`` (files and directories), ``components``
(directories of a ``kind: Component`` kustomization: their resources, and their ``patches``
applied to the resources of the kustomization using them), ``patches`` (``path`` only: a
strategic-merge patch, lists of named items merged by name), ``labels``
(``pairs`` on metadata only), ``configMapGenerator`` (``files``, ``literals``,
``behavior`` create/replace) with kustomize's name-suffix hash and the rewriting of
ConfigMap references in pod specs, ``images`` (``name`` with ``newName`` and/or ``newTag``,
in containers and initContainers). Anything else is an error, so a kustomization that
grows a feature fails the tests here instead of being rendered wrongly. When kubectl is
installed, tests/deploy/test_kustomize.py checks this renderer against
``kubectl kustomize``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SUPPORTED_FIELDS = {"apiVersion", "kind", "resources", "components", "labels",
                    "configMapGenerator", "patches", "images"}
IMAGE_FIELDS = {"name", "newName", "newTag"}
GENERATOR_FIELDS = {"name", "namespace", "behavior", "files", "literals"}
HASH_LETTERS = str.maketrans({"0": "g", "1": "h", "3": "k", "a": "m", "e": "t"})


class KustomizeError(Exception):
    pass


def name_hash(data: dict[str, str]) -> str:
    """kustomize's ConfigMap name suffix (api/hasher): the first 40 bits of the SHA-256
    of Go's JSON of {kind, name, data}, with vowel-like hex digits swapped. kustomize v5
    looks the name up with a path it never finds, so the name hashed is empty."""
    encoded = json.dumps(
        {"data": data, "kind": "ConfigMap", "name": ""},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    # Go's encoding/json escapes these three for HTML safety.
    encoded = encoded.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return hashlib.sha256(encoded.encode()).hexdigest()[:10].translate(HASH_LETTERS)


@dataclass
class Generated:
    name: str
    namespace: str
    data: dict[str, str]
    labels: dict[str, str] = field(default_factory=dict)

    def manifest(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": f"{self.name}-{name_hash(self.data)}",
            "namespace": self.namespace,
        }
        if self.labels:
            meta["labels"] = dict(self.labels)
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": dict(self.data)}


@dataclass
class Build:
    resources: list[dict[str, Any]] = field(default_factory=list)
    generated: list[Generated] = field(default_factory=list)


def _load_kustomization(directory: Path) -> dict[str, Any]:
    path = directory / "kustomization.yaml"
    if not path.is_file():
        raise KustomizeError(f"{directory}: no kustomization.yaml")
    doc = yaml.safe_load(path.read_text()) or {}
    unknown = set(doc) - SUPPORTED_FIELDS
    if unknown:
        raise KustomizeError(f"{path}: fields this renderer does not support: {sorted(unknown)}")
    return doc


def _generator_data(directory: Path, spec: dict[str, Any]) -> dict[str, str]:
    data: dict[str, str] = {}
    for entry in spec.get("files", []):
        key, _, rel = entry.partition("=") if "=" in entry else ("", "", entry)
        path = directory / rel
        data[key or path.name] = path.read_text()
    for literal in spec.get("literals", []):
        key, sep, value = literal.partition("=")
        if not sep:
            raise KustomizeError(f"{directory}: literal {literal!r} has no '='")
        data[key] = value
    return data


def _add_labels(build: Build, labels: list[dict[str, Any]], where: Path) -> None:
    for entry in labels:
        if entry.get("includeSelectors") or entry.get("includeTemplates"):
            raise KustomizeError(f"{where}: labels with selectors or templates are not supported")
        pairs = entry.get("pairs", {})
        for res in build.resources:
            res.setdefault("metadata", {}).setdefault("labels", {}).update(pairs)
        for gen in build.generated:
            gen.labels.update(pairs)


def _build(directory: Path) -> Build:
    doc = _load_kustomization(directory)
    build = Build()
    for entry in doc.get("resources", []):
        target = (directory / entry).resolve()
        if target.is_dir():
            sub = _build(target)
            build.resources += sub.resources
            build.generated += sub.generated
        else:
            build.resources += [d for d in yaml.safe_load_all(target.read_text()) if d]
    for entry in doc.get("components", []):
        # A Component (kind: Component) adds its resources to the kustomization using it,
        # and its patches apply to everything that kustomization has.
        component = (directory / entry).resolve()
        sub = _build(component)
        build.resources += sub.resources
        build.generated += sub.generated
        _patch(build, component, _load_kustomization(component).get("patches", []))
    if doc.get("kind") != "Component":
        _patch(build, directory, doc.get("patches", []))
    for spec in doc.get("configMapGenerator", []):
        unknown = set(spec) - GENERATOR_FIELDS
        if unknown:
            raise KustomizeError(f"{directory}: generator fields not supported: {sorted(unknown)}")
        name, namespace = spec["name"], spec.get("namespace", "default")
        behavior = spec.get("behavior", "create")
        data = _generator_data(directory, spec)
        existing = [g for g in build.generated if (g.name, g.namespace) == (name, namespace)]
        if behavior == "create":
            if existing:
                raise KustomizeError(f"{directory}: ConfigMap {namespace}/{name} generated twice")
            build.generated.append(Generated(name, namespace, data))
        elif behavior == "replace":
            if not existing:
                raise KustomizeError(f"{directory}: nothing to replace for {namespace}/{name}")
            existing[0].data = data
        else:
            raise KustomizeError(f"{directory}: generator behavior {behavior!r} not supported")
    _add_labels(build, doc.get("labels", []), directory)
    for entry in doc.get("images", []):
        unknown = set(entry) - IMAGE_FIELDS
        if unknown:
            raise KustomizeError(f"{directory}: image fields not supported: {sorted(unknown)}")
        for res in build.resources:
            _set_image(res, entry)
    return build


def _patch(build: Build, directory: Path, patches: list[dict[str, Any]]) -> None:
    for entry in patches:
        if set(entry) != {"path"}:
            raise KustomizeError(f"{directory}: only patches with a path are supported")
        patch = yaml.safe_load((directory / entry["path"]).read_text())
        meta = patch.get("metadata", {})
        targets = [r for r in build.resources if r.get("kind") == patch.get("kind")
                   and r.get("metadata", {}).get("name") == meta.get("name")
                   and r.get("metadata", {}).get("namespace") == meta.get("namespace")]
        if len(targets) != 1:
            raise KustomizeError(f"{directory}: patch {entry['path']} matches "
                                 f"{len(targets)} resources")
        _merge(targets[0], patch)


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    """Strategic merge as the patches here need it: maps recursively, lists whose items
    all have a name by name (new ones first, as kustomize orders them), anything else
    replaced."""
    for k, v in patch.items():
        old = into.get(k)
        if isinstance(v, dict) and isinstance(old, dict):
            _merge(old, v)
        elif isinstance(v, list) and isinstance(old, list) and _named(v) and _named(old):
            by_name = {item["name"]: item for item in old}
            added = []
            for item in v:
                if item["name"] in by_name:
                    _merge(by_name[item["name"]], item)
                else:
                    added.append(item)
            old[:0] = added  # kustomize puts a patch's new items first
        else:
            into[k] = v


def _named(items: list[Any]) -> bool:
    return all(isinstance(i, dict) and "name" in i for i in items)


def _set_image(node: Any, entry: dict[str, str]) -> None:
    """kustomize's ``images``: a container image named ``name`` (with any tag) gets
    ``newName`` and ``newTag``."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                for c in value:
                    image = str(c.get("image", ""))
                    name, _, tag = image.partition(":")
                    if name == entry["name"]:
                        c["image"] = f"{entry.get('newName', name)}:{entry.get('newTag', tag)}"
            else:
                _set_image(value, entry)
    elif isinstance(node, list):
        for item in node:
            _set_image(item, entry)


def _rewrite_refs(node: Any, names: dict[str, str]) -> None:
    """Point ConfigMap references (volumes, env, envFrom, projections) at hashed names."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("configMap", "configMapKeyRef", "configMapRef") and isinstance(value, dict):
                ref = value.get("name")
                if ref in names:
                    value["name"] = names[ref]
            _rewrite_refs(value, names)
    elif isinstance(node, list):
        for item in node:
            _rewrite_refs(item, names)


def render(directory: Path) -> list[dict[str, Any]]:
    """Every object a kustomization produces, as plain dicts."""
    build = _build(directory)
    objects = [*build.resources, *(g.manifest() for g in build.generated)]
    for obj in build.resources:
        namespace = obj.get("metadata", {}).get("namespace")
        names = {
            g.name: g.manifest()["metadata"]["name"]
            for g in build.generated
            if g.namespace == namespace
        }
        _rewrite_refs(obj.get("spec"), names)
    return objects


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj.get("metadata", {})
    return obj["kind"], meta.get("namespace", ""), meta["name"]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """One object by kind and name (generated ConfigMaps by their unhashed name)."""
    found = [
        o
        for o in objects
        if o["kind"] == kind
        and (
            o["metadata"]["name"] == name
            or (kind == "ConfigMap" and o["metadata"]["name"].rsplit("-", 1)[0] == name)
        )
    ]
    if len(found) != 1:
        raise KeyError(f"{kind}/{name}: found {len(found)}")
    return found[0]
