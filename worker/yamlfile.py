"""Configuration files as YAML: safe, libyaml when present, duplicate keys refused."""

from __future__ import annotations

from typing import Any

import yaml


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """libyaml's parser when present (the pure-Python one takes seconds to refuse a deeply
    nested file), and a key given twice in one mapping is an error: YAML would keep the last
    one silently, so the setting a person reads higher up would not be the one in force."""

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base class says so
                break
            seen[key] = line
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (line {first} and line {line}); "
                    "YAML keeps only the last: delete one", key_node.start_mark)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def load_yaml(text: str) -> Any:
    """Parse a configuration file's text (safe, duplicate keys refused)."""
    return yaml.load(text, Loader=_StrictLoader)
