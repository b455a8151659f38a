"""Service configuration: one YAML file, overridable by GPU_REMEDIATE_* environment variables.

Every section forbids unknown fields, so a typo fails at start with the field's
dotted name instead of silently running on defaults.
"""

from __future__ import annotations

import os
import re
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from activities.exporter_settings import ExporterSettings
from activities.job_templates import JobsSettings, TemplateRefused
from policy.config import PolicySettings
from policy.fields import unknown_fields
from worker.yamlfile import load_yaml
from workflows.ids import TASK_QUEUE, observe_task_queue
from workflows.limits import LimitsSettings, violations
from workflows.settings import (
    POOL_LABEL,
    DetectorSettings,
    LedgerSettings,
    RemediationSettings,
    node_writable_label,
)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TlsSettings(_Section):
    enabled: bool = False
    client_cert: Path | None = Field(default=None, description="PEM client certificate (mTLS).")
    client_key: Path | None = None
    server_ca: Path | None = Field(default=None, description="PEM CA that signed the server.")
    server_name: str | None = None

    @model_validator(mode="after")
    def _pair(self) -> TlsSettings:
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("client_cert and client_key go together")
        return self


class TemporalSettings(_Section):
    address: str = "localhost:7233"
    namespace: str = "default"
    task_queue: str = TASK_QUEUE
    tls: TlsSettings = Field(default_factory=TlsSettings)
    api_key: str | None = Field(default=None, description="Temporal Cloud API key (prefer env).",
                                repr=False)
    api_key_file: Path | None = Field(
        default=None,
        description="A file holding the API key or JWT (a mounted Secret's key), read at "
                    "connect and again every api_key_refresh, so a rotated Secret takes "
                    "effect without a restart. A missing file is no key (the Secret is "
                    "optional when mTLS is used instead).")
    api_key_refresh: float = Field(
        default=60.0, gt=0, le=3600,
        description="Seconds between reads of api_key_file (the kubelet refreshes a mounted "
                    "Secret within about a minute).")
    require_auth: bool = Field(
        default=False,
        description="Refuse to connect without a client certificate (mTLS) or an API key. "
                    "Whoever can reach the Temporal namespace can start, approve and abort "
                    "remediations; the shipped deploy configuration sets this.")
    ui_url: str | None = Field(
        default=None, pattern=r"^https?://[^\s/]+(/\S*)?$",
        description="Temporal UI base URL for the links the CLI prints (status NODE). Unset: "
                    "the dev server's (frontend port + 1000) for a local address, else none.")


    @model_validator(mode="after")
    def _one_key(self) -> TemporalSettings:
        if self.api_key and self.api_key_file is not None:
            raise ValueError("api_key and api_key_file: set one (the file, to rotate it)")
        return self

    def current_api_key(self) -> str | None:
        """The API key now: from api_key_file when set (None while it is absent or
        empty), else api_key."""
        if self.api_key_file is None:
            return self.api_key or None
        try:
            key = self.api_key_file.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"temporal.api_key_file: cannot read {self.api_key_file}: "
                              f"{err}") from err
        if any(c.isspace() or not c.isprintable() for c in key):
            raise ConfigError(f"temporal.api_key_file: {self.api_key_file} holds more than "
                              "one token (white space or control characters inside)")
        return key or None

    def auth_problem(self) -> str:
        """Why a connection would not authenticate this worker, or "" (require_auth)."""
        if not self.require_auth or self.current_api_key() or (
                self.tls.enabled and self.tls.client_cert):
            return ""
        where = (f"temporal.api_key_file {self.api_key_file} is absent or empty"
                 if self.api_key_file is not None else
                 "no API key (temporal.api_key_file or GPU_REMEDIATE_TEMPORAL__API_KEY)")
        return ("temporal.require_auth is set, but there is no client certificate "
                f"(temporal.tls.enabled with client_cert and client_key: mTLS) and {where}; "
                "see docs/install.md, 'Connect to Temporal'")


_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_LABEL_KEY = (r"(?:[a-z0-9]([-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
              r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?"
_REQUIREMENT = (rf"\s*(?:!\s*{_LABEL_KEY}|{_LABEL_KEY}\s*(?:==|=|!=)\s*{_LABEL_VALUE}"
                rf"|{_LABEL_KEY}\s+(?:in|notin)\s*\(\s*{_LABEL_VALUE}(?:\s*,\s*{_LABEL_VALUE})*"
                rf"\s*\)|{_LABEL_KEY})\s*")
_SELECTOR = re.compile(rf"^{_REQUIREMENT}(?:,{_REQUIREMENT})*$")


class KubernetesSettings(_Section):
    kubeconfig: str | None = Field(default=None, description="Path; KUBECONFIG when unset.")
    context: str | None = None
    in_cluster: bool = False
    event_namespace: str = Field(
        default="default", pattern=f"^{_DNS_LABEL}$",
        description="Namespace of the Events recorded on nodes (the original tool's "
                    "-event-namespace). `kubectl describe node` shows them from any namespace.")
    record_namespace: str | None = Field(
        default=None, pattern=f"^{_DNS_LABEL}$",
        description="Namespace of the node records, one ConfigMap per node that a kubelet "
                    "cannot write (activities/record.py). null: jobs.namespace, which exists "
                    "wherever the worker runs; RBAC grants ConfigMaps only there.")
    node_selector: str = Field(
        default="",
        description="Label selector of the GPU nodes to manage, e.g. "
                    "'nvidia.com/gpu.present=true' (the original tool's -node-selector). Empty: "
                    "every node with nvidia.com/gpu capacity. Nodes in remediation are always "
                    "kept, selected or not.")

    @field_validator("node_selector")
    @classmethod
    def _selector(cls, value: str) -> str:
        # The API server would refuse a bad selector on every tick; refuse it at start.
        if value.strip() and not _SELECTOR.match(value):
            raise ValueError(f"not a Kubernetes label selector: {value!r}")
        return value.strip()


class WorkerSettings(_Section):
    metrics_port: int = Field(default=9464, ge=0, le=65535,
                              description="Prometheus metrics of the service; 0 disables.")
    sdk_metrics_port: int = Field(default=9465, ge=0, le=65535,
                                  description="Temporal SDK metrics; 0 disables.")
    health_port: int = Field(default=8080, ge=0, le=65535,
                             description="/healthz and /readyz; 0 disables.")
    bind: str = "0.0.0.0"
    max_concurrent_activities: int = Field(default=64, ge=1)
    graceful_shutdown_seconds: float = Field(default=30, ge=0)
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    deployment_name: str | None = Field(
        default=None, min_length=1, max_length=200,
        description="Worker Deployment Versioning: the deployment this worker belongs to "
                    "(null: unversioned). Remediations auto-upgrade to the current version; "
                    "the detector is pinned and moves at its next continue-as-new. "
                    "docs/install.md has the upgrade procedure.")
    build_id: str = Field(
        default="", max_length=255,
        description="This worker's version within the deployment; default "
                    "GPU_REMEDIATE_BUILD_ID, else the installed package's version.")

    def deployment_build_id(self) -> str:
        from worker.version import versions

        return (self.build_id or os.environ.get("GPU_REMEDIATE_BUILD_ID", "")
                or versions()["gpu-remediate"])


class NodeReportSettings(_Section):
    """The endpoint nodes' watchers (``gpu-remediate watch``) report faults to: HTTPS, each
    report authenticated by a TokenReview of the watcher's ServiceAccount token and accepted
    only for the node that token is bound to (docs/operations.md, "The node watcher")."""

    enabled: bool = False
    bind: str = "0.0.0.0"
    port: int = Field(default=8443, ge=1, le=65535)
    tls_cert: Path | None = Field(default=None, description="PEM server certificate.")
    tls_key: Path | None = Field(default=None, description="PEM private key of tls_cert.")
    audience: str = Field(
        default="gpu-remediate", min_length=1, max_length=253,
        description="The audience the watcher's projected token must carry.")
    service_accounts: list[str] = Field(
        default_factory=lambda: [
            "system:serviceaccount:gpu-remediate-watch:gpu-remediate-watch"],
        description="Who may report (TokenReview user names): the watcher's ServiceAccount. "
                    "Any pod's token names its node; only the watcher's speaks for it.")
    max_body_bytes: int = Field(default=4096, ge=256, le=1 << 20)
    per_node_per_second: float = Field(
        default=1.0, gt=0, le=100,
        description="Accepted reports per node per second (a token bucket), beyond burst.")
    per_node_burst: int = Field(default=5, ge=1, le=1000)
    review_cache_seconds: float = Field(
        default=30.0, ge=0, le=300,
        description="How long a TokenReview's answer is reused for the same token (never "
                    "past the token's expiry); 0 reviews every report.")

    @model_validator(mode="after")
    def _tls(self) -> NodeReportSettings:
        if self.enabled and (self.tls_cert is None or self.tls_key is None):
            raise ValueError("reports.enabled needs reports.tls_cert and reports.tls_key "
                             "(the endpoint serves HTTPS only)")
        return self


_FILE_DATA: ContextVar[dict[str, Any] | None] = ContextVar("config_file_data", default=None)


class _FileSource(PydanticBaseSettingsSource):
    """The YAML file's sections, at the lowest priority: environment variables override
    them, explicit overrides (command-line options) override both."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return (_FILE_DATA.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_FILE_DATA.get() or {})


class Settings(BaseSettings):
    """The whole configuration. Nested env overrides use '__':
    GPU_REMEDIATE_TEMPORAL__ADDRESS=temporal:7233."""

    model_config = SettingsConfigDict(env_prefix="GPU_REMEDIATE_", env_nested_delimiter="__",
                                      extra="forbid")

    temporal: TemporalSettings = Field(default_factory=TemporalSettings)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    exporter: ExporterSettings = Field(default_factory=ExporterSettings)
    detector: DetectorSettings = Field(default_factory=DetectorSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    remediation: RemediationSettings = Field(default_factory=RemediationSettings)
    ledger: LedgerSettings = Field(default_factory=LedgerSettings)
    jobs: JobsSettings = Field(default_factory=JobsSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    limits: dict[str, Any] | None = Field(
        default=None,
        description="How far a Temporal client (`detector reconfigure`, an update, a signal) "
                    "may loosen the detector's settings: workflows/limits.py LimitsSettings. "
                    "Each unset limit is the value this file runs with, so by default a "
                    "client can only tighten.")

    _limits: LimitsSettings | None = PrivateAttr(default=None)
    _source: Path | None = PrivateAttr(default=None)
    _overrides: dict[str, Any] = PrivateAttr(default_factory=dict)
    reports: NodeReportSettings = Field(default_factory=NodeReportSettings)

    @field_validator("policy", mode="before")
    @classmethod
    def _policy_as_configured(cls, v: Any) -> Any:
        # A workflow input may still carry the old "reset" (it must decode); a config may not.
        if isinstance(v, dict) and str(v.get("unknown_xid_action", "")).lower() == "reset":
            raise ValueError("unknown_xid_action: must be alert or quarantine, not 'reset' "
                             "(nobody knows yet what an unknown XID needs)")
        return v

    @model_validator(mode="before")
    @classmethod
    def _no_nested_policy(cls, data: Any) -> Any:
        remediation = data.get("remediation") if isinstance(data, dict) else None
        if isinstance(remediation, dict):
            moved = {"job_namespace": "jobs.namespace",
                     **{k: f"jobs.templates.{v}" for k, v in
                        (("validation", "validation"), ("gpu_reset", "gpu-reset"),
                         ("reboot", "reboot"))}}
            for key, where in moved.items():
                if key in remediation:
                    raise ValueError(
                        f"remediation.{key}: moved to {where} (what a Job runs is the "
                        "worker's configuration; a remediation names a template in "
                        "remediation.job_templates)")
        detector = data.get("detector") if isinstance(data, dict) else None
        if isinstance(detector, dict):
            for key in ("policy", "remediation", "ledger"):
                if key in detector:
                    raise ValueError(f"detector.{key}: set it at the top level as '{key}:'")
        # The detector, policy and remediation models ignore unknown fields when a workflow
        # decodes them (another release may have written them); in a config they are typos.
        unknown = unknown_fields(cls, data)
        if unknown:
            raise ValueError("; ".join(f"{name}: unknown field" for name in unknown))
        return data

    @model_validator(mode="after")
    def _templates_exist(self) -> Settings:
        problems = []
        for kind, field in (("validate", "validation"), ("gpu-reset", "gpu_reset"),
                            ("reboot", "reboot")):
            name = getattr(self.remediation.job_templates, field)
            try:
                self.jobs.resolve(kind, name)
            except TemplateRefused as err:
                problems.append(f"remediation.job_templates.{field}: {err}")
        longest = self.jobs.longest_deadline()
        if self.remediation.job_timeout <= longest:
            problems.append(f"remediation.job_timeout: must be longer than the longest Job "
                            f"template deadline ({longest})")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _trust_and_heartbeats(self) -> Settings:
        from activities.drain import min_heartbeat_timeout

        problems = []
        label = self.detector.pool_label
        if label and node_writable_label(label) and not self.detector.trust_node_writable_labels:
            problems.append(
                f"detector.pool_label: {label!r} can be written by a node's own kubelet (a "
                "node moving itself between pools lets one admit past its limit); use a label "
                f"under node-restriction.kubernetes.io/, e.g. {POOL_LABEL}, or set "
                "detector.trust_node_writable_labels: true")
        problems += _fault_domain_problems(self.detector)
        problems += _pool_gpu_problems(self.detector)
        if self.remediation.heartbeat_timeout < min_heartbeat_timeout():
            problems.append(
                f"remediation.heartbeat_timeout: at least {min_heartbeat_timeout()}: a drain "
                "heartbeats after every API call, and each call needs that long inside it")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def record_namespace(self) -> str:
        """Where the node records live (kubernetes.record_namespace)."""
        return self.kubernetes.record_namespace or self.jobs.namespace

    @model_validator(mode="after")
    def _inside_limits(self) -> Settings:
        # The file is the ceiling of every reconfigure; a file whose own settings are past
        # its limits is a contradiction the reviewer must see, not a ceiling to guess at.
        running = self.detector_settings()
        limits = LimitsSettings.resolve(running, self.limits)
        over = violations(running, limits)
        if over:
            raise ValueError(
                "limits: tighter than the settings this configuration runs with: "
                + "; ".join(f"{config_field(v.field)} = {v.requested} but "
                            f"limits.{v.limit_field} = {v.limit}" for v in over)
                + " (raise the limit or tighten the setting)")
        self._limits = limits
        return self

    def limits_settings(self) -> LimitsSettings:
        """The ceiling of the detector's settings: the ``limits:`` section, each unset
        limit the value this configuration runs with."""
        if self._limits is None:
            self._limits = LimitsSettings.resolve(self.detector_settings(), self.limits)
        return self._limits

    @property
    def source(self) -> Path | None:
        """The file this configuration was read from (None: defaults and environment)."""
        return self._source

    def reload(self) -> Settings:
        """The configuration as its file (and the environment) say now, with the same
        command-line overrides; without a file, this one."""
        return self if self._source is None else load_settings(self._source, **self._overrides)

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _FileSource(settings_cls))

    def detector_settings(self) -> DetectorSettings:
        """What the detector workflow runs with: its section plus policy and remediation."""
        return self.detector.model_copy(update={
            "policy": self.policy, "remediation": self.remediation, "ledger": self.ledger,
            "observe_task_queue": (self.detector.observe_task_queue
                                   or observe_task_queue(self.temporal.task_queue))})


class ConfigError(Exception):
    """Bad configuration; the message names the file and every bad field."""


def load_settings(path: Path | None = None, **overrides: Any) -> Settings:
    data: dict[str, Any] = {}
    source = "configuration"
    if path is not None:
        source = str(path)
        try:
            loaded = load_yaml(path.read_text(encoding="utf-8")) or {}
        except OSError as err:
            raise ConfigError(f"{path}: cannot read: {err.strerror}") from err
        except UnicodeDecodeError as err:
            raise ConfigError(f"{path}: not UTF-8 text (a binary file?): {err.reason} at byte "
                              f"{err.start}") from err
        except RecursionError as err:
            raise ConfigError(f"{path}: nested too deeply") from err
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from err
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
        data = loaded
    token = _FILE_DATA.set(data)
    try:
        settings = Settings(**nest({k: v for k, v in overrides.items() if v is not None}))
        settings._source = path
        settings._overrides = dict(overrides)
        return settings
    except ValidationError as err:
        raise ConfigError(f"{source}: " + format_errors(err)) from err
    except ValueError as err:
        raise ConfigError(f"{source}: {err}") from err
    finally:
        _FILE_DATA.reset(token)


def config_field(dotted: str) -> str:
    """Where a field of the detector's settings is set in the configuration file: policy
    remediation and ledger are sections of their own, the rest is under ``detector``."""
    head = dotted.split(".")[0]
    return dotted if head in ("policy", "remediation", "ledger") else f"detector.{dotted}"


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """{"a.b": 1} -> {"a": {"b": 1}}: dotted overrides as config sections."""
    out: dict[str, Any] = {}
    for dotted, value in flat.items():
        cursor = out
        *parents, leaf = dotted.split(".")
        for p in parents:
            cursor = cursor.setdefault(p, {})
        cursor[leaf] = value
    return out


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Deep merge: sections merge, values in ``b`` win."""
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def format_errors(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = "unknown field" if e["type"] == "extra_forbidden" else e["msg"]
        if not loc and e["type"] == "value_error" and "error" in e.get("ctx", {}):
            # A check of the whole file names its own fields.
            parts.append(str(e["ctx"]["error"]))
            continue
        parts.append(f"{loc or '(top level)'}: {msg}")
    return "; ".join(parts)


def _pool_gpu_problems(d: DetectorSettings) -> list[str]:
    """Pool GPU budgets without a pool label (no pools: they would limit nothing), and a
    pool's GPU budget larger than the fleet's where both are counts."""
    if not d.pool_max_unavailable_gpus:
        return []
    if not d.pool_label:
        return ["detector.pool_max_unavailable_gpus: needs detector.pool_label (without it "
                "there are no pools, and these budgets would limit nothing)"]
    return [f"detector.pool_max_unavailable_gpus.{pool}: {mine} is larger than the fleet's "
            f"detector.max_unavailable_gpus: {d.max_unavailable_gpus} (a pool is part of the "
            "fleet)" for pool, mine in sorted(d.pool_max_unavailable_gpus.items())
            if _larger(mine, d.max_unavailable_gpus)]


def _fault_domain_problems(d: DetectorSettings) -> list[str]:
    """A domain label a kubelet can write (same rule as the pool label), and a domain budget
    larger than the fleet's (it could never be used, and says the levels were misread)."""
    problems = []
    for i, fd in enumerate(d.fault_domains):
        where = f"detector.fault_domains[{i}]"
        if node_writable_label(fd.label) and not d.trust_node_writable_labels:
            problems.append(
                f"{where}.label: {fd.label!r} can be written by a node's own kubelet (a node "
                "moving itself between domains lets one admit past its budget); use a label "
                "under node-restriction.kubernetes.io/ or set "
                "detector.trust_node_writable_labels: true")
        pairs = (("max_unavailable", fd.max_unavailable, "detector.max_unavailable",
                  d.max_unavailable),
                 ("max_unavailable_gpus", fd.max_unavailable_gpus,
                  "detector.max_unavailable_gpus", d.max_unavailable_gpus))
        for name, mine, fleet_name, fleet in pairs:
            if _larger(mine, fleet):
                problems.append(
                    f"{where}.{name}: {mine} is larger than the fleet's {fleet_name}: "
                    f"{fleet} (a domain is part of the fleet)")
    return problems


def _larger(domain: int | str | None, fleet: int | str | None) -> bool:
    """Whether a domain budget is larger than the fleet's, where that holds for every fleet
    size: two counts. A percent of a domain and a percent of the fleet (or a count beside a
    percent) depend on the sizes; the smaller level decides at admission either way."""
    if domain is None or fleet is None:
        return False
    if isinstance(domain, int) and isinstance(fleet, int):
        return domain > fleet
    return False
