"""``read_limits``: the ceiling of the detector's settings, read from the worker's own
configuration file, so that no Temporal client can supply it.

The detector asks for it when a reconfigure arrives and at each run start; the answer is
whatever the file (a ConfigMap under review) says now, each unset limit the value the file
runs with. The reading itself is the worker's (``worker/service/wiring.py`` hands it in):
this layer does not parse configuration files.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from temporalio import activity
from temporalio.exceptions import ApplicationError

from workflows import errors
from workflows.limits import LimitsSettings

log = logging.getLogger(__name__)


class LimitsActivities:
    def __init__(self, read: Callable[[], LimitsSettings]) -> None:
        self._read = read

    @activity.defn
    def read_limits(self) -> LimitsSettings:
        """The worker's limits now. A file that no longer loads fails the call, never
        retried: a reconfigure must not be judged against limits nobody can read."""
        try:
            return self._read()
        except Exception as err:  # the file's problem, whatever the loader raised
            log.error("limits: cannot read the worker's configuration: %s", err)
            raise ApplicationError(
                f"the worker's configuration cannot be read, so its limits are unknown: "
                f"{err}", type=errors.INVALID, non_retryable=True) from err
