"""docker-compose.yml: the Compose schema, structure, references, mounted files, pinned
images, ports."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema.validators import validator_for

from tests.deploy.conftest import DEPLOY, ROOT
from worker.config import load_settings

COMPOSE = ROOT / "docker-compose.yml"
SHARED_NETNS = "service:gpu-sim"
# The Compose Specification's schema, as `docker compose config` checks a file against it
# (tests/deploy/schemas/README.md says where it comes from); its hash guards the copy.
COMPOSE_SCHEMA = Path(__file__).resolve().parent / "schemas" / "compose-spec.json"
COMPOSE_SCHEMA_SHA256 = "d549057ebc2925f39f62799eab0db7b9e2c18b35b6c00595199116da3ed10e64"
# The Temporal UI's workflow actions offer "Send an Update" (how an operator approves,
# rejects or releases a node from the UI) from this release on: the UI's built assets in
# the Go module github.com/temporalio/ui-server/v2 have the action at v2.35.0, not at v2.31.2.
UI_WITH_SEND_UPDATE = (2, 35, 0)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return doc


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = compose["services"]
    return result


def test_the_whole_stack_is_there(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == {
        "postgresql",
        "temporal-schema",
        "temporal",
        "temporal-setup",
        "temporal-ui",
        "gpu-sim",
        "cluster-sim",
        "worker",
        "detector-start",
        "prometheus",
        "grafana",
    }


def test_dependencies_exist_and_are_acyclic(services: dict[str, dict[str, Any]]) -> None:
    graph: dict[str, set[str]] = {}
    for name, svc in services.items():
        deps = svc.get("depends_on", {})
        graph[name] = set(deps if isinstance(deps, list) else deps.keys())
        assert graph[name] <= set(services), f"{name} depends on {graph[name] - set(services)}"
        if isinstance(deps, dict):
            for dep, cond in deps.items():
                want = cond["condition"]
                assert want in (
                    "service_started",
                    "service_healthy",
                    "service_completed_successfully",
                ), (name, dep)
                if want == "service_healthy":
                    assert "healthcheck" in services[dep] or services[dep].get("build"), dep
                    assert not services[dep].get("healthcheck", {}).get("disable"), dep
        mode = svc.get("network_mode", "")
        if mode.startswith("service:"):
            graph[name].add(mode.split(":", 1)[1])
            assert mode.split(":", 1)[1] in services
    seen: set[str] = set()
    stack: set[str] = set()

    def visit(node: str) -> None:
        assert node not in stack, f"dependency cycle through {node}"
        if node in seen:
            return
        stack.add(node)
        for dep in graph[node]:
            visit(dep)
        stack.discard(node)
        seen.add(node)

    for node in graph:
        visit(node)


def test_every_mounted_file_exists(
    services: dict[str, dict[str, Any]], compose: dict[str, Any]
) -> None:
    named = set(compose.get("volumes", {}))
    for name, svc in services.items():
        for volume in svc.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (ROOT / source).is_file(), f"{name}: {source} does not exist"
            else:
                assert source in named, f"{name}: unknown volume {source}"


def test_images_are_pinned(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        image = svc["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest", f"{name}: {image} is not pinned by tag"
        if "build" in svc:
            assert svc["build"]["dockerfile"] == "Dockerfile"
            assert (ROOT / svc["build"]["context"] / "Dockerfile").is_file()


def test_published_ports(services: dict[str, dict[str, Any]]) -> None:
    published: dict[str, str] = {}
    for name, svc in services.items():
        for port in svc.get("ports", []):
            host_ip, host, container = port.split(":")
            assert host_ip == "127.0.0.1", f"{name}: {port} is reachable from the network"
            assert host not in published, f"host port {host} used twice"
            published[host] = f"{name}:{container}"
    assert published["8233"] == "temporal-ui:8080"
    assert published["7233"] == "temporal:7233"
    assert published["9090"] == "prometheus:9090"
    assert published["3000"] == "grafana:3000"
    assert published["9400"] == "gpu-sim:9400"
    # Services in gpu-sim's network namespace cannot publish ports themselves.
    for name, svc in services.items():
        if svc.get("network_mode") == SHARED_NETNS:
            assert "ports" not in svc, name


def test_simulators_and_worker_share_loopback(services: dict[str, dict[str, Any]]) -> None:
    cluster = services["cluster-sim"]["command"]
    # The cluster simulator refuses non-loopback hosts: so the worker must share its netns.
    assert cluster[cluster.index("--host") + 1] == "127.0.0.1"
    assert services["cluster-sim"]["network_mode"] == SHARED_NETNS
    assert services["worker"]["network_mode"] == SHARED_NETNS
    assert cluster[cluster.index("--kubeconfig-out") + 1] == "/shared/kubeconfig"
    assert cluster[cluster.index("--gpu-sim-url") + 1] == "http://127.0.0.1:9400"
    gpu = services["gpu-sim"]["command"]
    assert gpu[:3] == ["sim", "gpu", "serve"]
    assert gpu[gpu.index("--port") + 1] == "9400"


def test_worker_config_fits_the_stack(services: dict[str, dict[str, Any]]) -> None:
    worker = services["worker"]
    mounts = dict(v.split(":")[:2] for v in worker["volumes"])
    config_path = ROOT / next(
        src for src, dst in mounts.items() if dst == "/etc/gpu-remediate/config.yaml"
    )
    assert config_path == DEPLOY / "compose" / "config.yaml"
    settings = load_settings(config_path)
    assert settings.temporal.address == "temporal:7233"
    assert settings.exporter.mode == "template"
    assert settings.exporter.url_template.startswith("http://127.0.0.1:9400/")
    assert settings.kubernetes.kubeconfig == "/shared/kubeconfig"
    assert "shared" in mounts and mounts["shared"] == "/shared"
    assert worker["command"] == ["worker", "--config", "/etc/gpu-remediate/config.yaml"]
    start = services["detector-start"]
    assert start["command"] == ["detector", "start", "--config", "/etc/gpu-remediate/config.yaml"]
    assert start["depends_on"]["worker"]["condition"] == "service_healthy"
    assert start["restart"].startswith("on-failure")
    # Compose waits stop_grace_period before SIGKILL: longer than the worker's drain.
    grace = int(worker["stop_grace_period"].rstrip("s"))
    assert grace > settings.worker.graceful_shutdown_seconds


def test_search_attributes_are_registered_before_the_worker(
    services: dict[str, dict[str, Any]],
) -> None:
    setup = services["temporal-setup"]
    assert services["worker"]["depends_on"]["temporal-setup"]["condition"] == (
        "service_completed_successfully"
    )
    mounted = {Path(v.split(":")[0]).name for v in setup["volumes"]}
    assert "search-attributes.sh" in mounted
    script = (DEPLOY / "base" / "scripts" / "search-attributes.sh").read_text()
    assert "GpuNode RemediationState RemediationAction" in script
    assert services["temporal-ui"]["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"


def _docker_compose() -> list[str] | None:
    for argv in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(argv[0]) is None:
            continue
        probe = subprocess.run([*argv, "version"], capture_output=True, text=True, timeout=30)
        if probe.returncode == 0:
            return argv
    return None


def test_docker_compose_config_accepts_the_file() -> None:
    argv = _docker_compose()
    if argv is None:
        pytest.skip("neither the docker compose plugin nor docker-compose is installed")
    result = subprocess.run(
        [*argv, "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr


def compose_errors(doc: dict[str, Any]) -> list[str]:
    """What the Compose Specification's schema rejects in a compose file, by path."""
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    validator = validator_for(schema)(schema)
    return sorted(
        f"{'/'.join(str(p) for p in err.absolute_path) or '(top)'}: {err.message}"
        for err in validator.iter_errors(doc)
    )


def test_the_compose_schema_is_the_vendored_one() -> None:
    assert hashlib.sha256(COMPOSE_SCHEMA.read_bytes()).hexdigest() == COMPOSE_SCHEMA_SHA256


def test_compose_file_matches_the_compose_specification(compose: dict[str, Any]) -> None:
    errors = compose_errors(compose)
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (["services", "worker", "stop_grace_perod"], "45s", "services/worker"),
        (["services", "worker", "restart"], 5, "services/worker/restart"),
        (["services", "temporal", "ports"], "7233", "services/temporal/ports"),
        (
            ["services", "temporal-ui", "depends_on", "temporal", "condition"],
            "up",
            "services/temporal-ui/depends_on",
        ),
        (["volumes", "shared"], ["x"], "volumes/shared"),
        (["service"], {}, "(top)"),
    ],
)
def test_the_schema_check_catches_mistakes(
    compose: dict[str, Any], path: list[str], value: Any, named: str
) -> None:
    broken = copy.deepcopy(compose)
    node = broken
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    errors = compose_errors(broken)
    # The error names the broken value's place (schemas with alternatives report the
    # enclosing object, as docker compose does).
    assert any(e.startswith(f"{named}:") for e in errors), errors


def test_the_temporal_ui_can_send_updates(services: dict[str, dict[str, Any]]) -> None:
    repo, _, tag = services["temporal-ui"]["image"].rpartition(":")
    assert repo == "temporalio/ui"
    version = tuple(int(part) for part in tag.split("."))
    assert version >= UI_WITH_SEND_UPDATE, f"temporalio/ui:{tag} has no Send an Update"


def test_temporal_images_are_the_release_the_production_tier_runs(
        services: dict[str, dict[str, Any]]) -> None:
    """The production tier (tests/production) builds go.temporal.io/server at the version
    its go.mod pins and runs it with this file's configuration and scripts: the compose
    server, its schema job and every admin-tools image shipped (kustomize base, Helm
    values) are that release."""
    gomod = (ROOT / "tests" / "production" / "go.mod").read_text()
    pinned = next(line.split()[1] for line in gomod.splitlines()
                  if line.strip().startswith("go.temporal.io/server v"))
    release = pinned.removeprefix("v")
    for name in ("temporal", "temporal-schema", "temporal-setup"):
        assert services[name]["image"].rsplit(":", 1)[1] == release, name
    shipped = [DEPLOY / "base" / "search-attributes-job.yaml",
               DEPLOY / "base" / "detector-start-job.yaml",
               DEPLOY / "helm" / "gpu-remediate" / "values.yaml"]
    for path in shipped:
        tags = [line.split("temporalio/admin-tools:", 1)[1].split()[0]
                for line in path.read_text().splitlines() if "temporalio/admin-tools:" in line]
        assert tags == [release] * len(tags) and tags, f"{path}: {tags} != {release}"
