"""``read_limits`` answers from the worker's own configuration file as it is now: a client
supplies nothing, and a file that no longer loads fails the call instead of guessing."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from activities.limits import LimitsActivities
from worker.config import load_settings
from worker.service.wiring import limits_reader
from workflows import errors


def test_read_limits_follows_the_file_and_fails_closed_when_it_breaks(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("detector:\n  max_unavailable: 1\n")
    activity = LimitsActivities(limits_reader(load_settings(path)))
    assert activity.read_limits().max_unavailable == 1

    # A ConfigMap edited under the running pod: the next call sees it.
    path.write_text("detector:\n  max_unavailable: 1\nlimits:\n  max_unavailable: 3\n")
    assert activity.read_limits().max_unavailable == 3

    path.write_text("detector: [broken\n")
    with pytest.raises(ApplicationError) as err:
        activity.read_limits()
    assert err.value.type == errors.INVALID and err.value.non_retryable
    assert "not valid YAML" in str(err.value)


def test_read_limits_keeps_the_command_line_overrides(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("limits:\n  breaker_max_flagged_nodes: 90\n")
    settings = load_settings(path, **{"detector.max_unavailable": "1"})
    limits = LimitsActivities(limits_reader(settings)).read_limits()
    assert (limits.max_unavailable, limits.breaker_max_flagged_nodes) == (1, 90)
