"""Wall-clock time in the formats Kubernetes serializes.

All simulated durations are plain seconds of wall clock; tests shorten them
through options rather than faking time, so the server and the client agree.
"""

from __future__ import annotations

from datetime import UTC, datetime


def now() -> float:
    return datetime.now(UTC).timestamp()


def rfc3339(ts: float | None = None) -> str:
    """metav1.Time: second precision, `Z` suffix."""
    moment = datetime.fromtimestamp(now() if ts is None else ts, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def micro(ts: float | None = None) -> str:
    """metav1.MicroTime, used by leases and events.k8s.io eventTime."""
    moment = datetime.fromtimestamp(now() if ts is None else ts, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
