"""The Temporal server authorizes: its default JWT claim mapper and default authorizer, the
signing key served as JWKS over loopback, TLS on the frontend, three tokens (worker,
operator, viewer) as docs/security.md's role table gives them.

Role x API, each against the real server: no token and a viewer cannot act; an operator
sends the documented operator signals and updates but cannot poll a task queue (the tier's
server, tests/production/server, lets only a token with the worker role take tasks); the
worker (its token from ``temporal.api_key_file``) polls and runs remediations; a token that
expired, names another namespace or was signed by an unknown key is refused, and the CLI
says which. The server
stamps the authenticated subject as the principal of the history events a call writes,
and the CLI records that same subject as the operator."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from temporalio.api.enums.v1 import EventType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import PollWorkflowTaskQueueRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from sim.gpu.client import GpuSimClient
from tests.e2e.conftest import make_stack
from tests.e2e.kit import detector_view, result, wait_for, workflow_status
from tests.production.auth import Auth
from tests.production.topology import DYNAMIC_CONFIG, ProductionStack, free_small_port
from worker.config import TemporalSettings, TlsSettings
from worker.stack.local import free_port
from worker.temporal_client import connect
from workflows.detector import DetectorWorkflow
from workflows.ids import DETECTOR_WORKFLOW_ID

pytestmark = [pytest.mark.production, pytest.mark.e2e]

HERE = Path(__file__).parent
REPO = HERE.parent.parent
OPERATOR = "alice@example.com"


@pytest.fixture(scope="module")
def authz(temporal_server: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[ProductionStack, Auth]]:
    tmp = tmp_path_factory.mktemp("authz")
    auth = Auth(tmp / "auth")
    auth.write_tls()
    worker_token = auth.write_token("worker", auth.worker())
    dynamic = tmp / "dynamicconfig.yaml"
    dynamic.write_text(DYNAMIC_CONFIG.read_text() + "\n# Stamp the authenticated subject on "
                       "history events.\nfrontend.enablePrincipalPropagation:\n"
                       "  - value: true\n")
    with auth.serving() as jwks:
        stack = make_stack(
            tmp / "stack", str(HERE / "production.yaml"), kind=ProductionStack,
            **{"temporal.tls.enabled": True, "temporal.tls.server_ca": str(auth.ca_file),
               "temporal.api_key_file": str(worker_token), "temporal.require_auth": True,
               "detector.max_unavailable": 1, "detector.observe_timeout": "PT10S",
               "detector.breaker_max_flagged_percent": 100})
        stack.server = temporal_server
        stack.replicas = 1
        stack.server_extra_env = {
            "TEMPORAL_AUTH_AUTHORIZER": "default", "TEMPORAL_AUTH_CLAIM_MAPPER": "default",
            "TEMPORAL_JWT_KEY_SOURCE1": jwks,
            "TEMPORAL_TLS_FRONTEND_CERT": str(auth.cert_file),
            "TEMPORAL_TLS_FRONTEND_KEY": str(auth.key_file),
            # The server's own worker service reaches history through the internal
            # frontend, which the authorizer does not guard (it takes no outside calls).
            "USE_INTERNAL_FRONTEND": "1",
            "INTERNAL_FRONTEND_GRPC_PORT": str(free_port()),
            "INTERNAL_FRONTEND_HTTP_PORT": str(free_port()),
            "INTERNAL_FRONTEND_MEMBERSHIP_PORT": str(free_small_port()),
            "DYNAMIC_CONFIG_FILE_PATH": str(dynamic),
        }
        stack.server_services = ["frontend", "internal-frontend", "history", "matching",
                                 "worker"]
        stack.setup_extra_env = {"TEMPORAL_API_KEY": auth.admin(),
                                 "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(auth.ca_file)}
        stack.client_temporal = settings(stack, auth, auth.operator(OPERATOR))
        with stack:
            yield stack, auth


def settings(stack: ProductionStack, auth: Auth, token: str | None) -> TemporalSettings:
    return TemporalSettings(address=stack.temporal_address, api_key=token,
                            tls=TlsSettings(enabled=True, server_ca=auth.ca_file))


async def client(stack: ProductionStack, auth: Auth, token: str | None) -> Client:
    return await connect(settings(stack, auth, token))


def denied(err: pytest.ExceptionInfo[RPCError]) -> bool:
    return err.value.status == RPCStatusCode.PERMISSION_DENIED


async def _can(call: Any) -> bool:
    """True when the server allowed the call; False when its authorizer refused it."""
    try:
        await call
    except RPCError as e:
        if e.status in (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNAUTHENTICATED):
            return False
        raise
    except Exception as e:  # the SDK wraps some refusals (start, signal, update)
        cause = e.__cause__ or getattr(e, "cause", None)
        if isinstance(cause, RPCError) and cause.status in (
                RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNAUTHENTICATED):
            return False
        if isinstance(e, RPCError):
            raise
        return True  # allowed, and refused by the workflow (a validator) or absent
    return True


async def _abilities(c: Client, task_queue: str) -> dict[str, bool]:
    detector = c.get_workflow_handle(DETECTOR_WORKFLOW_ID)
    stray = f"authz-probe-{uuid.uuid4().hex[:8]}"

    async def listed() -> None:
        async for _ in c.list_workflows(f"WorkflowId = '{DETECTOR_WORKFLOW_ID}'"):
            break

    async def poll() -> None:
        # A poll on a queue of its own: allowed, it waits and ends empty; refused, at once.
        await c.workflow_service.poll_workflow_task_queue(PollWorkflowTaskQueueRequest(
            namespace=c.namespace, task_queue=TaskQueue(name=f"{task_queue}-probe"),
            identity="authz-probe"), timeout=timedelta(seconds=3))

    async def poll_allowed() -> None:
        try:
            await poll()
        except RPCError as e:
            if e.status != RPCStatusCode.DEADLINE_EXCEEDED:
                raise

    return {
        "list": await _can(listed()),
        "describe": await _can(detector.describe()),
        "query": await _can(detector.query(DetectorWorkflow.effective_settings)),
        # Payloads the detector refuses (no reason): reaching it is all that is asked.
        "signal": await _can(detector.signal("pause", {"operator": "probe", "reason": ""})),
        "update": await _can(detector.execute_update(
            "pause", {"operator": "probe", "reason": ""})),
        "start": await _can(c.start_workflow(
            "RemediationWorkflow", {"node": "gpu-node-01"}, id=stray,
            task_queue=f"{task_queue}-probe")),
        "terminate": await _can(c.get_workflow_handle(stray).terminate("probe")),
        "poll": await _can(poll_allowed()),
    }


def test_role_by_api_on_the_real_server(authz: tuple[ProductionStack, Auth]) -> None:
    stack, auth = authz
    wait_for(stack, "the detector", lambda: detector_view(stack) is not None, timeout=120)
    task_queue = TemporalSettings().task_queue

    async def table() -> dict[str, dict[str, bool]]:
        out = {}
        for who, token in (("nobody", None), ("viewer", auth.viewer()),
                           ("operator", auth.operator(OPERATOR)), ("worker", auth.worker())):
            c = await client(stack, auth, token)
            out[who] = await _abilities(c, task_queue)
        return out

    got = asyncio.run(table())
    print(json.dumps(got, indent=1))
    reads = {"list", "describe", "query"}
    acts = {"signal", "update", "start", "terminate", "poll"}
    assert not any(got["nobody"].values()), got["nobody"]
    assert all(got["viewer"][k] for k in reads) and not any(got["viewer"][k] for k in acts)
    # An operator acts on workflows but takes no task of a worker's: the tier's server
    # (tests/production/server) lets only the worker role poll.
    assert all(v for k, v in got["operator"].items() if k != "poll"), got["operator"]
    assert not got["operator"]["poll"], got["operator"]
    assert all(got["worker"].values()), got["worker"]
    # The viewer's and nobody's refusals left no trace: the detector never saw a signal.
    assert not detector_view(stack).paused


def test_the_worker_token_runs_a_remediation(authz: tuple[ProductionStack, Auth]) -> None:
    stack, _ = authz
    node = "gpu-node-03"
    GpuSimClient(stack.gpu_url).inject_fault(node, 0, "xid", 79)
    wait_for(stack, f"a remediation of {node}", lambda: workflow_status(stack, node),
             timeout=120)
    assert result(stack, node, timeout=240).outcome == "healthy"


def _cli(stack: ProductionStack, auth: Auth, token: str, *args: str
         ) -> subprocess.CompletedProcess[str]:
    cfg = yaml.safe_load(stack.worker_config.read_text())
    path = auth.write_token(f"cli-{uuid.uuid4().hex[:6]}", token)
    cfg["temporal"]["api_key_file"] = str(path)
    config = stack.data_dir / f"cli-{path.stem}.yaml"
    config.write_text(yaml.safe_dump(cfg))
    return subprocess.run([sys.executable, "-m", "worker", *args, "--config", str(config)],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "COLUMNS": "200"})


@pytest.mark.parametrize(("which", "says"), [
    ("expired", "the Temporal token expired at"),
    ("other-namespace", "grants no role in namespace default"),
    ("unknown-key", "does not know the key that signed it"),
    ("viewer-acts", "grants read in namespace default; this call needs write"),
])
def test_a_refused_token_is_named(authz: tuple[ProductionStack, Auth], which: str,
                                  says: str) -> None:
    stack, auth = authz
    token = {"expired": auth.token(OPERATOR, "default:write",
                                   expires_in=timedelta(seconds=-60)),
             "other-namespace": auth.token(OPERATOR, "prod:write"),
             "unknown-key": auth.token(OPERATOR, "default:write", key=auth.stranger),
             "viewer-acts": auth.viewer()}[which]
    args = (("detector", "pause", "-r", "refused") if which == "viewer-acts"
            else ("status",))
    run = _cli(stack, auth, token, *args)
    assert run.returncode == 1, run.stdout + run.stderr
    assert says in run.stdout + run.stderr
    assert "Traceback" not in run.stderr


def test_history_names_the_authenticated_operator(authz: tuple[ProductionStack, Auth]
                                                   ) -> None:
    """The operator the CLI records is the token's subject, and the server stamps that
    subject on the history event the command wrote: the two tie."""
    stack, auth = authz
    run = _cli(stack, auth, auth.operator(OPERATOR), "detector", "pause", "-r",
               "authorization tier: pause", "-o", "json")
    assert run.returncode == 0, run.stdout + run.stderr
    assert detector_view(stack).paused

    async def history() -> tuple[list[str], list[str]]:
        c = await client(stack, auth, auth.operator(OPERATOR))
        await c.get_workflow_handle(DETECTOR_WORKFLOW_ID).signal(
            "resume", {"operator": OPERATOR, "reason": "authorization tier: resume"})
        principals, operators = [], []
        async for event in c.get_workflow_handle(DETECTOR_WORKFLOW_ID).fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                principals.append(f"{event.principal.type}:{event.principal.name}")
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
                request = event.workflow_execution_update_accepted_event_attributes \
                    .accepted_request
                if request.input.name == "pause":
                    operators.append(json.loads(request.input.args.payloads[0].data)["operator"])
        return principals, operators

    principals, operators = asyncio.run(history())
    # The CLI recorded the token's subject (not the login name) ...
    assert operators and operators[-1] == OPERATOR, operators
    # ... and the server stamped the same subject on the signal it authorized.
    assert principals and principals[-1] == f"jwt:{OPERATOR}", principals
    wait_for(stack, "the detector resumed", lambda: not detector_view(stack).paused,
             timeout=60)
