"""RemediationWorkflow is one class mixed from its step families (workflows/steps/): Temporal
finds every handler the mixins define, every step one family calls in another is defined
once at run time, no family shadows another's method unseen, and the map in
docs/architecture.md says where each step is."""

from __future__ import annotations

import ast
import inspect
import re
import sys
from pathlib import Path

from temporalio import workflow

from workflows.remediation import RemediationWorkflow
from workflows.steps import base
from workflows.steps.base import RemediationBase
from workflows.steps.operator_orders import OperatorOrders

FAMILIES = [c for c in RemediationWorkflow.__mro__ if c not in (RemediationWorkflow, object)]
ORDERS = {"approve", "reject", "quarantine", "release", "repaired"}


def test_temporal_collects_the_handlers_of_every_family() -> None:
    defn = workflow._Definition.must_from_class(RemediationWorkflow)
    assert defn.run_fn is RemediationWorkflow.run
    assert set(defn.signals) == ORDERS | {"slot_granted", None}  # None: the dynamic one
    assert set(defn.updates) == ORDERS | {"note_abort"}
    assert set(defn.queries) == {"view_state"}
    # Each order's update is checked by its validator, as a signal of its name is.
    assert all(defn.updates[name].validator is not None for name in ORDERS)
    assert defn.signals["approve"].fn is OperatorOrders.approve_signal


def test_every_declared_cross_family_step_is_defined_once() -> None:
    """A step declared on RemediationBase for mypy (under TYPE_CHECKING) exists only in its
    family's mixin: drop the mixin from the class and this fails, where mypy would not."""
    tree = ast.parse(Path(base.__file__).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef)
               and n.name == "RemediationBase")
    guarded = next(n for n in cls.body if isinstance(n, ast.If))
    declared = {f.name for f in guarded.body
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assert len(declared) >= 10
    for name in sorted(declared):
        assert name not in vars(RemediationBase), name  # only declared, never defined there
        owners = [c.__name__ for c in (RemediationWorkflow, *FAMILIES) if name in vars(c)]
        assert len(owners) == 1, (name, owners)


def test_no_family_shadows_another() -> None:
    seen: dict[str, str] = {}
    clash = []
    for cls in (RemediationWorkflow, *FAMILIES):
        for name, member in vars(cls).items():
            if name.startswith("__") or not (inspect.isfunction(member)
                                             or hasattr(member, "_defn")):
                continue
            if name in seen:
                clash.append(f"{name}: {seen[name]} and {cls.__name__}")
            seen[name] = cls.__name__
    assert clash == []
    assert len(FAMILIES) == 9  # eight step families and their base


def test_the_architecture_map_names_each_family_and_its_steps() -> None:
    """docs/architecture.md maps each step module to its mixin and the steps in it: every
    module and mixin is there, and every step the map names is where it says."""
    doc = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| `(\w+)\.py` \| `(\w+)` \| (.*) \|$", doc, flags=re.M)
    steps = Path(base.__file__).parent
    assert {m for m, _, _ in rows} == {p.stem for p in steps.glob("*.py")} - {"__init__"}
    mixins = {c.__name__: c for c in FAMILIES}
    for module, mixin, text in rows:
        cls = mixins[mixin]
        assert cls.__module__ == f"workflows.steps.{module}", (mixin, module)
        for name in re.findall(r"`(_[a-z]\w*|node_job_name|NodeGone)`", text):
            where = vars(cls) if name.startswith("_") else vars(sys.modules[cls.__module__])
            assert name in where, f"docs/architecture.md: {name} is not in {module}.py"
