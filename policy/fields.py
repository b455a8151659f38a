"""Reading configuration strictly while decoding messages leniently.

Settings models travel inside workflow inputs, where an unknown field must be ignored (a
worker of the previous release decodes what a newer one wrote), so they are declared with
``extra="ignore"``. A configuration file is read by a person's hand, where an unknown key is
a typo: the loader refuses it by name with ``unknown_fields``.
"""

from __future__ import annotations

from typing import get_args, get_origin

from pydantic import BaseModel


def unknown_fields(model: type[BaseModel], data: object, prefix: str = "") -> list[str]:
    """Dotted names of the keys in ``data`` (parsed YAML) that ``model`` has no field for,
    looking into nested models (also optional ones): what the config loader refuses."""
    if not isinstance(data, dict):
        return []
    fields = model.model_fields
    names = {n: n for n in fields} | {f.alias: n for n, f in fields.items() if f.alias}
    out: list[str] = []
    for key, value in data.items():
        name = names.get(str(key))
        if name is None:
            out.append(f"{prefix}{key}")
            continue
        annotation = fields[name].annotation
        if get_origin(annotation) is list and isinstance(value, list):
            # A list of models (fault_domains): each item by its index.
            for sub in [m for arg in get_args(annotation) for m in _models_in(arg)]:
                for i, item in enumerate(value):
                    out += unknown_fields(sub, item, f"{prefix}{key}[{i}].")
            continue
        for sub in _models_in(annotation):
            out += unknown_fields(sub, value, f"{prefix}{key}.")
    return out


def _models_in(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if get_origin(annotation) in (dict, list):  # keyed by names we cannot check
        return []
    return [m for arg in get_args(annotation) for m in _models_in(arg)]
