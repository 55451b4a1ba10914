"""The result of warming up one vLLM server: what was sent, what it cost, and the verdict.

A warmup runs as a Job per pod. The operator reads its verdict from the container's
termination message, which Kubernetes caps at 4096 bytes, so the report has a compact form
(:meth:`WarmupReport.termination_message`) that always fits, and a full form printed on
stdout for people and logs.
"""

from __future__ import annotations

import json
import logging
from enum import StrEnum
from pathlib import Path
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

logger = logging.getLogger(__name__)

# Kubernetes truncates a container's termination message at 4 KiB.
TERMINATION_MESSAGE_LIMIT: Final = 4096
DEFAULT_TERMINATION_LOG: Final = "/dev/termination-log"


class Outcome(StrEnum):
    """Why a warmup ended; also the condition reason the operator surfaces."""

    SUCCEEDED = "Succeeded"
    # /health never answered 200 within the budget.
    NEVER_HEALTHY = "NeverHealthy"
    # More requests failed (HTTP errors, broken streams, refused connections) than allowed.
    SERVER_ERRORS = "ServerErrors"
    # Warm TTFT above the limit, or the budget ran out while a request still waited.
    TOO_SLOW = "TooSlow"
    # Every request answered, but TTFT was still changing when the budget ran out.
    NOT_SETTLED = "NotSettled"


class Api(StrEnum):
    COMPLETIONS = "completions"
    CHAT = "chat"


class RequestResult(BaseModel):
    """One request the warmup sent."""

    model_config = ConfigDict(frozen=True)

    phase: str = Field(description="probe, sweep or settle")
    api: Api
    stream: bool
    concurrency: int = Field(description="requests in flight together, this one included")
    target_prompt_tokens: int
    prompt_tokens: int | None = Field(default=None, description="from the server's usage")
    output_tokens: int | None = Field(default=None, description="from the server's usage")
    ttft_s: float | None = Field(default=None, description="streaming requests only")
    latency_s: float
    status_code: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class Failure(BaseModel):
    """A failed request, as reported (the body is cut short)."""

    model_config = ConfigDict(frozen=True)

    phase: str
    status_code: int | None
    error: str


class WarmupReport(BaseModel):
    """Everything a warmup learned; ``outcome`` is the verdict."""

    outcome: Outcome
    message: str = Field(description="one sentence a user can read in a pod condition")
    endpoint: str
    model: str | None = None
    cold_ttft_s: float | None = Field(default=None, description="TTFT of the first request")
    warm_ttft_s: float | None = Field(
        default=None, description="median TTFT of the last settle window"
    )
    settled: bool = False
    requests_sent: int = 0
    requests_failed: int = 0
    health_wait_s: float | None = Field(default=None, description="until /health answered")
    duration_s: float = Field(description="from start to verdict, health wait included")
    budget_s: float
    failures: list[Failure] = Field(default_factory=list, description="the first few")
    requests: list[RequestResult] = Field(default_factory=list)
    adapters_loaded: list[str] = Field(
        default_factory=list, description="LoRA adapters loaded before the warmup"
    )
    adapter_failures: dict[str, str] = Field(
        default_factory=dict, description="adapters that did not load, with the server's words"
    )

    @property
    def succeeded(self) -> bool:
        return self.outcome is Outcome.SUCCEEDED

    def summary(self) -> dict[str, object]:
        """The report without the per-request list."""
        return self.model_dump(mode="json", exclude={"requests"})

    def termination_message(self) -> str:
        """Compact JSON that fits Kubernetes' termination-message limit."""
        data = self.summary()
        text = json.dumps(data, separators=(",", ":"))
        while len(text.encode()) > TERMINATION_MESSAGE_LIMIT and data["failures"]:
            failures = data["failures"]
            assert isinstance(failures, list)
            data["failures"] = failures[:-1]
            text = json.dumps(data, separators=(",", ":"))
        if len(text.encode()) > TERMINATION_MESSAGE_LIMIT and data.get("adapter_failures"):
            # The operator's own pass reads each server's adapters: only the names matter.
            failed = data["adapter_failures"]
            assert isinstance(failed, dict)
            data["adapter_failures"] = dict.fromkeys(failed, "")
            text = json.dumps(data, separators=(",", ":"))
        if len(text.encode()) > TERMINATION_MESSAGE_LIMIT:
            data["message"] = str(data["message"])[:512]
            data["adapters_loaded"] = []
            text = json.dumps(data, separators=(",", ":"))
        return text


def write_termination_message(report: WarmupReport, path: str | Path | None) -> bool:
    """Write the compact report where Kubernetes reads it; never raise.

    Outside a pod the path usually does not exist or is not writable; the warmup's verdict
    must not depend on that.
    """
    if path is None or str(path) == "":
        return False
    try:
        Path(path).write_text(report.termination_message())
    except OSError as exc:
        logger.warning("Could not write termination message to %s: %s", path, exc)
        return False
    return True
