"""The Kubernetes client: one ApiClient per worker process, bounded calls, typed errors."""
from __future__ import annotations

import json
from typing import Any, NoReturn

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError

from workflows import errors

# (connect, read) seconds for every call: a hung API server must not hang an activity
# past its heartbeat timeout.
REQUEST_TIMEOUT = (5.0, 20.0)


def make_api_client(*, kubeconfig: str | None = None, context: str | None = None,
                    in_cluster: bool = False, pool_size: int = 64) -> client.ApiClient:
    """An ApiClient from in-cluster config or a kubeconfig file (KUBECONFIG by default).

    Its connection pool is as large as the worker's activity slots: urllib3's default
    of 10 made concurrent activities discard and re-open connections under load.
    """
    configuration = client.Configuration()
    if in_cluster:
        config.load_incluster_config(client_configuration=configuration)
    else:
        config.load_kube_config(config_file=kubeconfig, context=context,
                                client_configuration=configuration, persist_config=False)
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


def status_message(err: ApiException) -> str:
    """The ``message`` of a Kubernetes Status body, or the HTTP reason."""
    try:
        body = json.loads(err.body or "{}")
        return str(body.get("message") or err.reason or err.status)
    except (ValueError, TypeError):
        return str(err.reason or err.status)


def raise_typed(err: ApiException, what: str, *, node_itself: bool = False) -> NoReturn:
    """Map an ApiException to an ApplicationError Temporal can reason about (workflows/errors.py).
    ``node_itself``: the request was for the remediated Node object, so a 404 means the node is
    gone (``NodeGone``), not that some object is missing."""
    msg = f"{what}: {err.status} {status_message(err)}"
    if err.status == 404:
        raise ApplicationError(msg, type=errors.NODE_GONE if node_itself else errors.NOT_FOUND,
                               non_retryable=True) from err
    if err.status in (401, 403):
        # Missing RBAC does not fix itself by retrying fast; retry slowly so a fixed
        # ClusterRole resumes the remediation without operator action.
        raise ApplicationError(msg, type=errors.FORBIDDEN) from err
    if err.status == 422 or err.status == 400:
        raise ApplicationError(msg, type=errors.INVALID, non_retryable=True) from err
    raise ApplicationError(msg, type=f"Http{err.status}") from err


def is_status(err: BaseException, code: int) -> bool:
    return isinstance(err, ApiException) and err.status == code


def meta_dict(obj: Any, field: str) -> dict[str, str]:
    """Labels or annotations of a typed object as a plain dict (never None)."""
    value = getattr(obj.metadata, field, None)
    return dict(value or {})
