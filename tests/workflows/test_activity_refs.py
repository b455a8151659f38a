"""The activity references the workflows call (workflows/activity_refs.py) are the
activities the worker registers: same names, same parameter and result types, same kind
(sync or async); every registered activity has one; no workflow names an activity by a
string; and the fake cluster registers its activities under the same names."""

from __future__ import annotations

import ast
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes.client import ApiClient
from temporalio import activity
from temporalio.client import Client

import worker.service.wiring
from tests.workflows.fakes import FakeCluster
from worker.config import Settings
from workflows import activity_refs

WORKFLOWS = Path(activity_refs.__file__).resolve().parent
# Temporal's calls that take an activity: its first argument must be a reference.
ACTIVITY_CALLS = {"execute_activity", "start_activity", "execute_local_activity",
                  "start_local_activity"}


def _by_name(fns: list[Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    found: dict[str, Callable[..., Any]] = {}
    for fn in fns:
        defn = activity._Definition.from_callable(fn)
        assert defn is not None and defn.name, f"{fn!r} is not an activity"
        assert defn.name not in found, f"two activities named {defn.name}"
        found[defn.name] = fn
    return found


def references() -> dict[str, Callable[..., Any]]:
    return _by_name([fn for fn in vars(activity_refs).values()
                     if callable(fn) and activity._Definition.from_callable(fn) is not None])


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> dict[str, Callable[..., Any]]:
    """What `gpu-remediate worker` registers, built without a cluster or a Temporal server
    (no activity runs here)."""
    monkeypatch.setattr(worker.service.wiring, "kube_client", lambda _settings: ApiClient())
    monkeypatch.setattr(worker.service.wiring, "set_event_namespace", lambda _namespace: None)
    return _by_name(worker.service.wiring.worker_activities(Settings(), cast(Client, object())))


def signature(fn: Callable[..., Any]) -> tuple[list[Any], Any, bool]:
    """Parameter types in order (the wire passes them by position), result type, async."""
    hints = typing.get_type_hints(fn)
    params = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
    return ([hints.get(p.name, inspect.Parameter.empty) for p in params],
            hints.get("return", inspect.Parameter.empty),
            inspect.iscoroutinefunction(fn))


def test_there_are_references() -> None:
    assert len(references()) >= 20


@pytest.mark.parametrize("name", sorted(references()))
def test_a_reference_is_the_registered_activity(
        name: str, registered: dict[str, Callable[..., Any]]) -> None:
    assert name in registered, f"the worker registers no activity named {name}"
    ref, real = signature(references()[name]), signature(registered[name])
    assert ref[0] == real[0], f"{name}: parameters {ref[0]} here, {real[0]} registered"
    assert ref[1] == real[1], f"{name}: returns {ref[1]} here, {real[1]} registered"
    assert ref[2] == real[2], f"{name}: {'async' if real[2] else 'sync'} when registered"


def test_every_registered_activity_has_a_reference(
        registered: dict[str, Callable[..., Any]]) -> None:
    # Every activity the worker registers is there for a workflow to call.
    assert sorted(set(registered) - set(references())) == []


def test_workflows_name_no_activity_by_a_string() -> None:
    named: list[str] = []
    for path in sorted(WORKFLOWS.rglob("*.py")):  # the step modules too
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else \
                func.id if isinstance(func, ast.Name) else ""
            first = node.args[0]
            if called in ACTIVITY_CALLS and isinstance(first, ast.Constant) \
                    and isinstance(first.value, str):
                named.append(f"{path.relative_to(WORKFLOWS)}:{node.lineno} {first.value}")
    assert named == []


def test_the_fake_cluster_registers_under_the_real_names() -> None:
    fakes = _by_name(FakeCluster().activities())
    assert sorted(set(fakes) - set(references())) == []
