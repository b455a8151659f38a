"""GPUs a pod asks for, counted by the Kubernetes rule (activities/gpus.py)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from activities.gpus import pod_gpu_request


def _c(name: str, limit: str | None = None, request: str | None = None,
       restart: str | None = None) -> Any:
    res = client.V1ResourceRequirements(
        limits={"nvidia.com/gpu": limit} if limit else None,
        requests={"nvidia.com/gpu": request} if request else None)
    c = client.V1Container(name=name, resources=res)
    if restart:
        c.restart_policy = restart
    return c


def _pod(containers: list[Any], init: list[Any] | None = None) -> Any:
    return client.V1Pod(spec=client.V1PodSpec(containers=containers, init_containers=init))


@pytest.mark.parametrize(("containers", "init", "want"), [
    ([_c("a", "2"), _c("b", "3")], None, 5),  # app containers add up
    ([_c("a", "2")], [_c("i", "8")], 8),  # an init container asking more: its request
    ([_c("a", "4"), _c("b", "4")], [_c("i", "6")], 8),  # the app sum is larger
    ([_c("a", "2")], [_c("i1", "3"), _c("i2", "5")], 5),  # init containers run one by one
    ([_c("a", "2")], [_c("side", "1", restart="Always"), _c("i", "4")], 5),  # sidecar adds
    ([_c("a", request="1", limit="2")], None, 2),
    ([_c("a", "1e3")], [_c("i", "-1")], 0),  # not plain digits: 0, never "all there"
])
def test_gpu_request_by_the_kubernetes_rule(containers: list[Any], init: list[Any] | None,
                                            want: int) -> None:
    assert pod_gpu_request(_pod(containers, init)) == want
