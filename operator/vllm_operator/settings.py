"""The operator's settings: one class, read from the environment and validated at start.

Every field is described; ``vllm-operator run --help`` and the chart's values refer here.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from vllm_operator.constants import DEFAULT_SERVING_IMAGE


class OperatorSettings(BaseSettings):
    """Settings of ``vllm-operator run``, from VLLM_OPERATOR_* environment variables."""

    model_config = SettingsConfigDict(env_prefix="VLLM_OPERATOR_", extra="forbid")

    default_image: str = Field(
        default=DEFAULT_SERVING_IMAGE,
        description="Serving image for InferenceServices that name none: the vLLM release "
        "the tests run.",
    )
    warmup_image: str = Field(
        default="vllm-operator:0.1.0",
        description="Image of the warmup Jobs: this operator's own image (it has the "
        "vllm-operator command).",
    )
    namespaces: list[str] = Field(
        default_factory=list,
        description="Namespaces to watch (JSON list); empty watches the whole cluster.",
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
    workers: int = Field(default=4, ge=1, le=64, description="Reconciles running at once.")
    metrics_port: int = Field(
        default=8080, ge=0, le=65535, description="Prometheus metrics port; 0 turns it off."
    )
    health_port: int = Field(
        default=8081, ge=0, le=65535, description="Liveness endpoint port (/healthz); 0: off."
    )
    log_format: str = Field(
        default="plain", pattern="^(plain|json)$", description="Log lines: plain or json."
    )
