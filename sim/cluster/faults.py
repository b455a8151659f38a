"""API fault injection for reliability tests.

Rules match a request's verb and resource (`pods/eviction` for a
subresource) and fire with a probability from a seeded RNG, so a failing
test replays the same sequence of faults.
"""

from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sim.cluster import errors

Verb = Literal[
    "get", "list", "watch", "create", "update", "patch", "delete", "deletecollection", "*"
]


class FaultRule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    verb: Verb = "*"
    resource: str = "*"
    namespace: str | None = None
    name: str | None = None
    rate: float = Field(default=1.0, ge=0, le=1)
    # 403: an RBAC refusal, as the authorizer words it for the worker's ServiceAccount.
    status: Literal[403, 409, 429, 500, 503, 504] | None = 500
    retry_after: int = Field(default=1, ge=0)
    delay_seconds: float = Field(default=0, ge=0)
    drop: bool = False
    # Stop after this many hits; None means for as long as the rules are set.
    times: int | None = Field(default=None, ge=1)

    def matches(self, verb: str, resource: str, namespace: str, name: str) -> bool:
        return (
            self.verb in ("*", verb)
            and self.resource in ("*", resource)
            and self.namespace in (None, namespace)
            and self.name in (None, name)
        )


class FaultConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rules: list[FaultRule] = Field(default_factory=list)
    seed: int = 1


class Fault(BaseModel):
    """What to do to one request."""

    delay_seconds: float = 0
    drop: bool = False
    error: dict[str, Any] | None = None
    code: int = 0
    headers: dict[str, str] = Field(default_factory=dict)


class FaultInjector:
    def __init__(self) -> None:
        self._config = FaultConfig()
        self._rng = random.Random(1)
        self._hits: list[int] = []
        self.injected = 0

    def configure(self, config: FaultConfig) -> None:
        self._config = config
        self._rng = random.Random(config.seed)
        self._hits = [0] * len(config.rules)

    def clear(self) -> None:
        self.configure(FaultConfig())

    def describe(self) -> dict[str, Any]:
        return {**self._config.model_dump(), "injected": self.injected}

    def decide(
        self, verb: str, resource: str, plural: str, group: str, namespace: str, name: str
    ) -> Fault | None:
        for i, rule in enumerate(self._config.rules):
            if not rule.matches(verb, resource, namespace, name):
                continue
            if rule.times is not None and self._hits[i] >= rule.times:
                continue
            if self._rng.random() >= rule.rate:
                continue
            self._hits[i] += 1
            self.injected += 1
            return _fault_for(rule, plural, group, name)
        return None


_VERB_WORDS = {"*": "create"}


def _fault_for(rule: FaultRule, plural: str, group: str, name: str) -> Fault:
    fault = Fault(delay_seconds=rule.delay_seconds, drop=rule.drop)
    if rule.drop or rule.status is None:
        return fault
    qualified = plural if not group else f"{plural}.{group}"
    if rule.status == 409:
        err = errors.ApiError(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {qualified} "{name}": {errors.CONFLICT_MODIFIED}',
            {"name": name, **({"group": group} if group else {}), "kind": plural},
        )
    elif rule.status == 403:
        scope = "at the cluster scope" if not rule.namespace else \
            f'in the namespace "{rule.namespace}"'
        named = f' "{name}"' if name else ""
        err = errors.ApiError(
            403, "Forbidden",
            f'{qualified}{named} is forbidden: '
            'User "system:serviceaccount:gpu-remediate:gpu-remediate" cannot '
            f'{_VERB_WORDS.get(rule.verb, rule.verb)} resource "{plural}" in API group '
            f'"{group}" {scope}',
            {"name": name, **({"group": group} if group else {}), "kind": plural})
    elif rule.status == 429:
        err = errors.too_many_requests(
            "Too many requests, please try again later.", rule.retry_after
        )
    elif rule.status == 500:
        err = errors.internal("injected fault")
    elif rule.status == 503:
        err = errors.service_unavailable()
    else:
        err = errors.ApiError(
            504,
            "Timeout",
            "Timeout: request did not complete within the "
            "requested timeout - context deadline exceeded",
        )
    fault.error, fault.code = err.body(), err.code
    if rule.status in (429, 503) and rule.retry_after:
        fault.headers["Retry-After"] = str(rule.retry_after)
    return fault
