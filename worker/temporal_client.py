"""Connecting to Temporal with the project's data converter, TLS and API key."""

from __future__ import annotations

from temporalio.client import Client, TLSConfig
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime

from worker.config import ConfigError, TemporalSettings


def tls_config(cfg: TemporalSettings) -> TLSConfig | bool:
    t = cfg.tls
    if not t.enabled:
        return bool(cfg.api_key)  # Temporal Cloud API keys require TLS
    return TLSConfig(
        server_root_ca_cert=t.server_ca.read_bytes() if t.server_ca else None,
        client_cert=t.client_cert.read_bytes() if t.client_cert else None,
        client_private_key=t.client_key.read_bytes() if t.client_key else None,
        domain=t.server_name,
    )


async def connect(cfg: TemporalSettings, *, runtime: Runtime | None = None) -> Client:
    problem = cfg.auth_problem()
    if problem:
        raise ConfigError(problem)
    return await Client.connect(
        cfg.address, namespace=cfg.namespace, data_converter=pydantic_data_converter,
        tls=tls_config(cfg), api_key=cfg.api_key, runtime=runtime,
    )
