"""Connecting to Temporal with the project's data converter, TLS and API key.

An API key (Temporal Cloud's, or a JWT for a self-hosted server with its authorizer) read
from ``temporal.api_key_file`` is read again every ``api_key_refresh`` seconds for as long
as the client's event loop runs, and the client sends the new one from its next call on:
rotating the Secret needs no restart.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from temporalio.client import Client, TLSConfig
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime

from worker.config import ConfigError, TemporalSettings

log = logging.getLogger(__name__)

# The refresh tasks, held so that the event loop does not lose them.
_refreshers: set[asyncio.Task[None]] = set()


class _KeyHolder(Protocol):
    api_key: str | None


def tls_config(cfg: TemporalSettings, api_key: str | None = None) -> TLSConfig | bool:
    t = cfg.tls
    if not t.enabled:
        return bool(api_key or cfg.api_key)  # Temporal Cloud API keys require TLS
    return TLSConfig(
        server_root_ca_cert=t.server_ca.read_bytes() if t.server_ca else None,
        client_cert=t.client_cert.read_bytes() if t.client_cert else None,
        client_private_key=t.client_key.read_bytes() if t.client_key else None,
        domain=t.server_name,
    )


def refresh_api_key(client: _KeyHolder, cfg: TemporalSettings) -> bool:
    """Give ``client`` the key ``api_key_file`` holds now; True when it changed. A file
    that went missing or unreadable keeps the last key (a Secret being replaced), logged."""
    try:
        key = cfg.current_api_key()
    except ConfigError as err:
        log.warning("%s; keeping the current key", err)
        return False
    if key is None or key == client.api_key:
        if key is None:
            log.warning("temporal.api_key_file %s is absent or empty; keeping the current key",
                        cfg.api_key_file)
        return False
    client.api_key = key
    log.info("Temporal API key rotated (read from %s)", cfg.api_key_file)
    return True


async def _keep_refreshing(client: _KeyHolder, cfg: TemporalSettings) -> None:
    while True:
        await asyncio.sleep(cfg.api_key_refresh)
        refresh_api_key(client, cfg)


async def connect(cfg: TemporalSettings, *, runtime: Runtime | None = None) -> Client:
    problem = cfg.auth_problem()
    if problem:
        raise ConfigError(problem)
    api_key = cfg.current_api_key()
    client = await Client.connect(
        cfg.address, namespace=cfg.namespace, data_converter=pydantic_data_converter,
        tls=tls_config(cfg, api_key), api_key=api_key, runtime=runtime,
    )
    if cfg.api_key_file is not None:
        task = asyncio.get_running_loop().create_task(_keep_refreshing(client, cfg))
        _refreshers.add(task)
        task.add_done_callback(_refreshers.discard)
    return client
