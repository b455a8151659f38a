"""The one poll-with-deadline of the test suite: every tier waits for the world the same way.

A test waits on behaviour that takes real time (a simulator's controller, a worker
process, a Prometheus scrape) by polling a check until it returns something truthy.
``AssertionError`` from the check always propagates: it is the test failing, not the
world being slow. The exceptions named in ``transient`` (an API call refused while a
server starts) are kept and shown if the deadline passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


DEFAULT_TIMEOUT = 60.0
"""A deadline that holds on a loaded 2-core machine (a shared CI runner, a laptop building
something else): a poll that passes waits only as long as the world takes, so a generous
deadline costs nothing until a test fails, and a tight one fails healthy runs."""


def wait_for(check: Callable[[], T | None], timeout: float = DEFAULT_TIMEOUT,
             what: str = "the condition", *, every: float = 0.05,
             transient: tuple[type[Exception], ...] = (),
             context: Callable[[], str] | None = None) -> T:
    """Poll ``check`` every ``every`` seconds until it returns something truthy, and return
    that; after ``timeout`` seconds fail with ``what``, the last value or error, and
    ``context()`` (a log tail, say)."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    last_error: Exception | None = None
    while True:
        try:
            last = check()
            if last:
                return last
        except AssertionError:
            raise
        except transient as err:
            last_error = err
        if time.monotonic() >= deadline:
            seen = f"last error: {last_error!r}" if last_error else f"last value: {last!r}"
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what} ({seen})"
                                 + (f"\n{context()}" if context is not None else ""))
        time.sleep(every)
