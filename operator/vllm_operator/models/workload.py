"""Traffic descriptions shared by InferenceService (what it will see) and InferenceBenchmark
(what to send): token-length distributions and latency objectives.

One type serves both so that a service's declared workload can be benchmarked as is.
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from vllm_operator.models.base import ApiModel, cel_rules

MAX_TOKENS = 10_000_000

DistributionType = Literal["Fixed", "Uniform", "Normal", "LogNormal", "Buckets"]


class LengthBucket(ApiModel):
    """A range of lengths drawn uniformly, chosen with a relative weight."""

    min: int = Field(ge=1, le=MAX_TOKENS, description="Smallest length in the bucket, in tokens.")
    max: int = Field(ge=1, le=MAX_TOKENS, description="Largest length in the bucket, in tokens.")
    weight: float = Field(
        gt=0,
        le=1_000_000,
        description="Relative weight of the bucket; weights need not add up to 100.",
    )

    model_config = cel_rules({"rule": "self.min <= self.max", "message": "min must not exceed max"})

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.min > self.max:
            raise ValueError("min must not exceed max")
        return self


_DISTRIBUTION_RULES: list[dict[str, str]] = [
    {
        "rule": "self.type != 'Fixed' || has(self.value)",
        "message": "type Fixed needs value",
        "fieldPath": ".value",
        "reason": "FieldValueRequired",
    },
    {
        "rule": "self.type != 'Uniform' || (has(self.min) && has(self.max))",
        "message": "type Uniform needs min and max",
        "fieldPath": ".min",
        "reason": "FieldValueRequired",
    },
    {
        "rule": "self.type != 'Normal' || (has(self.mean) && has(self.stddev))",
        "message": "type Normal needs mean and stddev",
        "fieldPath": ".mean",
        "reason": "FieldValueRequired",
    },
    {
        "rule": "self.type != 'LogNormal' || (has(self.median) && has(self.sigma))",
        "message": "type LogNormal needs median and sigma",
        "fieldPath": ".median",
        "reason": "FieldValueRequired",
    },
    {
        "rule": "self.type != 'Buckets' || (has(self.buckets) && size(self.buckets) > 0)",
        "message": "type Buckets needs at least one bucket",
        "fieldPath": ".buckets",
        "reason": "FieldValueRequired",
    },
    {
        "rule": "!has(self.min) || !has(self.max) || self.min <= self.max",
        "message": "min must not exceed max",
        "fieldPath": ".min",
    },
]


class LengthDistribution(ApiModel):
    """A distribution of token counts (prompt or output lengths).

    Fixed uses value; Uniform draws from [min, max]; Normal uses mean and stddev; LogNormal
    uses median and sigma (the shape); Buckets picks a bucket by weight, then a length
    uniformly inside it. For Normal and LogNormal, min and max clamp the draws when set.
    """

    type: DistributionType = Field(description="Shape of the distribution.")
    value: int | None = Field(default=None, ge=1, le=MAX_TOKENS, description="Length for Fixed.")
    min: int | None = Field(
        default=None, ge=1, le=MAX_TOKENS, description="Lower bound (Uniform), or clamp."
    )
    max: int | None = Field(
        default=None, ge=1, le=MAX_TOKENS, description="Upper bound (Uniform), or clamp."
    )
    mean: int | None = Field(default=None, ge=1, le=MAX_TOKENS, description="Mean for Normal.")
    stddev: int | None = Field(
        default=None, ge=0, le=MAX_TOKENS, description="Standard deviation for Normal."
    )
    median: int | None = Field(
        default=None, ge=1, le=MAX_TOKENS, description="Median for LogNormal."
    )
    sigma: float | None = Field(
        default=None, gt=0, le=10, description="Shape (sigma of the log) for LogNormal."
    )
    buckets: list[LengthBucket] | None = Field(
        default=None, max_length=64, description="Weighted buckets for Buckets."
    )

    model_config = cel_rules(*_DISTRIBUTION_RULES)

    @model_validator(mode="after")
    def _complete(self) -> Self:
        needs: dict[str, tuple[str, ...]] = {
            "Fixed": ("value",),
            "Uniform": ("min", "max"),
            "Normal": ("mean", "stddev"),
            "LogNormal": ("median", "sigma"),
            "Buckets": ("buckets",),
        }
        missing = [f for f in needs[self.type] if getattr(self, f) in (None, [])]
        if missing:
            raise ValueError(f"type {self.type} needs {' and '.join(missing)}")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError("min must not exceed max")
        return self


class Workload(ApiModel):
    """The traffic a service is expected to see."""

    prompt_tokens: LengthDistribution | None = Field(
        default=None, description="Distribution of prompt lengths, in tokens."
    )
    output_tokens: LengthDistribution | None = Field(
        default=None, description="Distribution of output lengths, in tokens."
    )
    peak_concurrency: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Most requests in flight at once across all replicas at peak.",
    )


class SLO(ApiModel):
    """Latency objectives. In a benchmark, a request that misses one has failed."""

    ttft_p99_milliseconds: int | None = Field(
        default=None, ge=1, le=3_600_000, description="Time to first token, 99th percentile."
    )
    tpot_p99_milliseconds: int | None = Field(
        default=None, ge=1, le=600_000, description="Time per output token, 99th percentile."
    )
    e2e_p99_milliseconds: int | None = Field(
        default=None, ge=1, le=3_600_000, description="End-to-end latency, 99th percentile."
    )
