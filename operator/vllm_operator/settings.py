"""The operator's settings: one class, read from the environment and validated at start.

Every field is described; ``vllm-operator run --help`` and the chart's values refer here.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from vllm_operator import __version__
from vllm_operator.constants import DEFAULT_SERVING_IMAGE
from vllm_operator.models.quantity import parse_quantity

# A resource name as Kubernetes spells one (cpu, memory, ephemeral-storage, vendor/name).
_RESOURCE_NAME = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[a-zA-Z0-9]([-_.a-zA-Z0-9]*[a-zA-Z0-9])?$"


class JobResources(BaseModel):
    """Requests and limits of the container of a Job the operator creates."""

    model_config = ConfigDict(extra="forbid")

    requests: dict[str, str] = Field(default_factory=dict, description="Resource requests.")
    limits: dict[str, str] = Field(default_factory=dict, description="Resource limits.")

    @model_validator(mode="after")
    def _valid(self) -> JobResources:
        for part in ("requests", "limits"):
            for name, value in getattr(self, part).items():
                if not re.match(_RESOURCE_NAME, name):
                    raise ValueError(f"{part}: {name!r} is not a resource name")
                try:
                    parse_quantity(value)
                except ValueError as exc:
                    raise ValueError(f"{part}.{name}: {exc}") from None
        for name, request in self.requests.items():
            limit = self.limits.get(name)
            if limit is not None and parse_quantity(request) > parse_quantity(limit):
                raise ValueError(
                    f"requests.{name} ({request}) is more than limits.{name} ({limit})"
                )
        return self

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {}
        if self.requests:
            wire["requests"] = dict(self.requests)
        if self.limits:
            wire["limits"] = dict(self.limits)
        return wire


# Small: a warmup Job sends a few dozen requests and waits for them.
DEFAULT_WARMUP_RESOURCES = JobResources(
    requests={"cpu": "100m", "memory": "128Mi"}, limits={"memory": "512Mi"}
)
# A whole core: the load generator's own timing must not be starved of CPU.
DEFAULT_LOAD_RESOURCES = JobResources(
    requests={"cpu": "1", "memory": "512Mi"}, limits={"memory": "2Gi"}
)


# The ModelCache download Job: mostly waiting on the network and the disk.
DEFAULT_DOWNLOAD_RESOURCES = JobResources(
    requests={"cpu": "250m", "memory": "256Mi"}, limits={"memory": "1Gi"}
)


class OperatorSettings(BaseSettings):
    """Settings of ``vllm-operator run``, from VLLM_OPERATOR_* environment variables."""

    model_config = SettingsConfigDict(env_prefix="VLLM_OPERATOR_", extra="forbid")

    default_image: str = Field(
        default=DEFAULT_SERVING_IMAGE,
        description="Serving image for InferenceServices that name none: the vLLM release "
        "the tests run.",
    )
    warmup_image: str = Field(
        default=f"vllm-operator:{__version__}",
        description="Image of the warmup Jobs: this operator's own image (it has the "
        "vllm-operator command).",
    )
    warmup_resources: JobResources = Field(
        default=DEFAULT_WARMUP_RESOURCES,
        description="Requests and limits of the warmup Jobs' container (JSON: "
        '{"requests": {...}, "limits": {...}}).',
    )
    load_resources: JobResources = Field(
        default=DEFAULT_LOAD_RESOURCES,
        description="Requests and limits of the InferenceBenchmark load Jobs' container "
        "(JSON, as warmup_resources). Less CPU than the load needs distorts the measurement.",
    )
    download_resources: JobResources = Field(
        default=DEFAULT_DOWNLOAD_RESOURCES,
        description="Requests and limits of the ModelCache download Jobs' container (JSON, "
        "as warmup_resources).",
    )
    namespaces: list[str] = Field(
        default_factory=list,
        description="Namespaces to watch (JSON list); empty watches the whole cluster.",
    )
    own_namespace: str = Field(
        default="vllm-operator",
        min_length=1,
        description="The operator's own namespace (the chart sets it from the pod's): where "
        "the measurements ConfigMap (vllm-operator-measurements) is kept.",
    )
    kubeconfig: str | None = Field(
        default=None, description="Kubeconfig file; unset uses KUBECONFIG or in-cluster."
    )
    resync_seconds: float = Field(
        default=120.0,
        gt=0,
        description="Every InferenceService is reconciled at least this often, catching drift "
        "and conditions that no watch event announces (a Secret created later).",
    )
    max_retry_seconds: float = Field(
        default=300.0, gt=0, description="Longest back-off after a transient error."
    )
    workers: int = Field(default=16, ge=1, le=64, description="Reconciles running at once.")
    request_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        description="Longest wait for one API request, connecting included (at most 5 s of "
        "it), ours and Kopf's: a silent connection then fails the request, which is retried "
        "as transient, instead of holding a reconcile for ever. Watches are bounded apart: "
        "the apiserver ends each after 300 s, the client after 330 s, and one silent for 70 s "
        "is reconnected.",
    )
    liveness_seconds: float = Field(
        default=300.0,
        gt=0,
        description="/healthz fails once work has waited this long (a key due or being "
        "reconciled, or the resync overdue) and no reconcile or resync completed in that "
        "time, so the kubelet restarts a stuck operator. An idle operator stays healthy.",
    )
    metrics_port: int = Field(
        default=8080, ge=0, le=65535, description="Prometheus metrics port; 0 turns it off."
    )
    health_port: int = Field(
        default=8081, ge=0, le=65535, description="Liveness endpoint port (/healthz); 0: off."
    )
    log_format: str = Field(
        default="plain", pattern="^(plain|json)$", description="Log lines: plain or json."
    )
    log_level: str = Field(
        default="info",
        pattern="^(debug|info|warning)$",
        description="The operator's own log level: debug adds a line per reconcile pass.",
    )
