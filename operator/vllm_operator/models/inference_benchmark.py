"""InferenceBenchmark: realistic load against an InferenceService, and what it measured.

While a benchmark runs, its target cannot scale down: the operator clamps replicas, tells
the autoscaler not to scale down, and an admission policy refuses decreases.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final, Literal, Self

from pydantic import Field, model_validator

from vllm_operator.models.base import (
    ADAPTER_NAME_PATTERN,
    CONDITIONS_LIST,
    ApiModel,
    Condition,
    ConfigMapKeyReference,
    LocalObjectReference,
    ResourceQuantity,
    cel_rules,
)
from vllm_operator.models.inference_service import ObjectMeta
from vllm_operator.models.workload import SLO, LengthDistribution

# A level whose requests errored more than this (5 %) measured its failures, not the server.
DEFAULT_MAX_ERROR_FRACTION: Final = 0.05
# The reason of a benchmark that failed on spec.maxErrorFraction. The load Job names it in
# its termination message (``failure.reason``) and the phase Failed carries it.
REASON_TOO_MANY_REQUEST_ERRORS: Final = "TooManyRequestErrors"
# The share of a level's requests that must meet the SLO for the level to pass, unless a
# Search names another (search.targetAttainment).
DEFAULT_TARGET_ATTAINMENT: Final = 0.99

ArrivalProcess = Literal["Constant", "Poisson", "Gamma", "Pulse", "ClosedLoop", "Trace"]


class PulseSpec(ApiModel):
    """Bursts on top of Poisson arrivals: a share of each period's requests in its start."""

    fraction: float = Field(
        gt=0, lt=1, description="Share of each period's requests sent in the burst window."
    )
    window_seconds: float = Field(gt=0, le=3600, description="Length of the burst window.")
    period_seconds: float = Field(gt=0, le=86400, description="Length of one period.")

    model_config = cel_rules(
        {
            "rule": "self.windowSeconds < self.periodSeconds",
            "message": "windowSeconds must be shorter than periodSeconds",
            "fieldPath": ".windowSeconds",
        }
    )

    @model_validator(mode="after")
    def _window(self) -> Self:
        if self.window_seconds >= self.period_seconds:
            raise ValueError("windowSeconds must be shorter than periodSeconds")
        return self


class ArrivalSpec(ApiModel):
    """When requests are sent."""

    process: ArrivalProcess = Field(
        default="Poisson",
        description="Constant, Poisson, Gamma (burstiness), Pulse (bursts on Poisson), "
        "ClosedLoop (fixed concurrency) or Trace (timestamps from a ConfigMap).",
    )
    rate_per_second: float | None = Field(
        default=None, gt=0, le=100_000, description="Mean request rate (open-loop processes)."
    )
    burstiness: float | None = Field(
        default=None, gt=0, le=100, description="Gamma shape: 1 is Poisson, below 1 burstier."
    )
    pulse: PulseSpec | None = Field(default=None, description="Bursts, for Pulse.")
    concurrency: int | None = Field(
        default=None, ge=1, le=100_000, description="Requests in flight, for ClosedLoop."
    )
    trace: ConfigMapKeyReference | None = Field(
        default=None, description="JSONL trace of send offsets and lengths, for Trace."
    )

    model_config = cel_rules(
        {
            "rule": "!(self.process in ['Constant', 'Poisson', 'Gamma', 'Pulse']) "
            "|| has(self.ratePerSecond)",
            "message": "open-loop arrival processes need ratePerSecond",
            "fieldPath": ".ratePerSecond",
            "reason": "FieldValueRequired",
        },
        {
            "rule": "self.process != 'Gamma' || has(self.burstiness)",
            "message": "process Gamma needs burstiness",
            "fieldPath": ".burstiness",
            "reason": "FieldValueRequired",
        },
        {
            "rule": "self.process != 'Pulse' || has(self.pulse)",
            "message": "process Pulse needs pulse",
            "fieldPath": ".pulse",
            "reason": "FieldValueRequired",
        },
        {
            "rule": "self.process != 'ClosedLoop' || has(self.concurrency)",
            "message": "process ClosedLoop needs concurrency",
            "fieldPath": ".concurrency",
            "reason": "FieldValueRequired",
        },
        {
            "rule": "self.process != 'Trace' || has(self.trace)",
            "message": "process Trace needs trace",
            "fieldPath": ".trace",
            "reason": "FieldValueRequired",
        },
    )

    @model_validator(mode="after")
    def _complete(self) -> Self:
        p = self.process
        if p in ("Constant", "Poisson", "Gamma", "Pulse") and self.rate_per_second is None:
            raise ValueError("open-loop arrival processes need ratePerSecond")
        for proc, field, wire in (
            ("Gamma", "burstiness", "burstiness"),
            ("Pulse", "pulse", "pulse"),
            ("ClosedLoop", "concurrency", "concurrency"),
            ("Trace", "trace", "trace"),
        ):
            if p == proc and getattr(self, field) is None:
                raise ValueError(f"process {proc} needs {wire}")
        return self


class BenchmarkWorkload(ApiModel):
    """What to send: length distributions, or a dataset of prompts."""

    prompt_tokens: LengthDistribution | None = Field(
        default=None, description="Prompt lengths, in tokens."
    )
    output_tokens: LengthDistribution | None = Field(
        default=None, description="Output lengths, in tokens."
    )
    dataset: ConfigMapKeyReference | None = Field(
        default=None, description="JSONL prompts (and optional output lengths) from a ConfigMap."
    )

    model_config = cel_rules(
        {
            "rule": "has(self.dataset) != (has(self.promptTokens) && has(self.outputTokens))",
            "message": "set either dataset, or both promptTokens and outputTokens",
        }
    )

    @model_validator(mode="after")
    def _one(self) -> Self:
        dists = self.prompt_tokens is not None and self.output_tokens is not None
        if (self.dataset is not None) == dists:
            raise ValueError("set either dataset, or both promptTokens and outputTokens")
        return self


BenchmarkMode = Literal["Single", "Sweep", "Search"]


class SweepSpec(ApiModel):
    """Load levels to run one after another."""

    rates_per_second: list[float] = Field(
        default_factory=list, max_length=64, description="Request rates (open loop)."
    )
    concurrencies: list[int] = Field(
        default_factory=list, max_length=64, description="Concurrency levels (closed loop)."
    )


class SearchSpec(ApiModel):
    """Find the highest rate that meets the SLO."""

    min_rate_per_second: float = Field(gt=0, le=100_000, description="Lowest rate to try.")
    max_rate_per_second: float = Field(gt=0, le=100_000, description="Highest rate to try.")
    target_attainment: float = Field(
        default=DEFAULT_TARGET_ATTAINMENT,
        gt=0,
        le=1,
        description="Share of requests that must meet the SLO.",
    )
    max_probes: int = Field(default=8, ge=2, le=64, description="Most load levels to try.")

    model_config = cel_rules(
        {
            "rule": "self.minRatePerSecond < self.maxRatePerSecond",
            "message": "minRatePerSecond must be below maxRatePerSecond",
            "fieldPath": ".minRatePerSecond",
        }
    )

    @model_validator(mode="after")
    def _range(self) -> Self:
        if self.min_rate_per_second >= self.max_rate_per_second:
            raise ValueError("minRatePerSecond must be below maxRatePerSecond")
        return self


class EndpointSpec(ApiModel):
    """How to call the server."""

    api: Literal["Completions", "ChatCompletions"] = Field(
        default="ChatCompletions", description="Which OpenAI API to call."
    )
    stream: bool = Field(default=True, description="Stream responses (needed for TTFT, ITL).")


class NetworkFaultSpec(ApiModel):
    """Faults on the network between the load generator and the target, each way.

    Made without privileges: the load generator sends through a relay in its own process
    that holds every read back (vllm_operator/bench/netfault.py). The stream stays in order,
    as TCP keeps it: a lost read arrives one retransmission later and holds back what follows.
    """

    delay_milliseconds: float = Field(
        default=0, ge=0, le=60_000, description="Added latency each way (a TTFT grows by two)."
    )
    jitter_milliseconds: float = Field(
        default=0, ge=0, le=60_000, description="Uniform jitter of plus or minus this, each way."
    )
    loss: float = Field(
        default=0, ge=0, lt=1, description="Share of reads that are lost and sent again."
    )
    retransmit_milliseconds: float = Field(
        default=200,
        ge=0,
        le=60_000,
        description="What a lost read costs (default 200: Linux's minimum retransmission timeout).",
    )

    model_config = cel_rules(
        {
            "rule": "self.delayMilliseconds > 0.0 || self.jitterMilliseconds > 0.0 || "
            "self.loss > 0.0",
            "message": "set delayMilliseconds, jitterMilliseconds or loss",
            "reason": "FieldValueRequired",
        }
    )

    @model_validator(mode="after")
    def _some(self) -> Self:
        if not (self.delay_milliseconds or self.jitter_milliseconds or self.loss):
            raise ValueError("set delayMilliseconds, jitterMilliseconds or loss")
        return self


DEFAULT_RESTART_AFTER_SECONDS = 5.0


class RestartFaultSpec(ApiModel):
    """One of the target's Ready pods evicted during the run, as a node drain evicts it.

    The load Job evicts it itself (the Eviction API, so the target's PodDisruptionBudget
    applies), allowed by its Role to evict exactly the pods that were Ready when the
    benchmark started. The Deployment replaces the pod; the run measures the errors and the
    tail meanwhile. It is the last perturbation of the phase.
    """

    after_seconds: float = Field(
        default=DEFAULT_RESTART_AFTER_SECONDS,
        ge=0,
        le=86400,
        description="How long into the perturbed run the pod is evicted (default 5). Below "
        "durationSeconds when that is set.",
    )


DEFAULT_NEIGHBOUR_CPU_SHARE = 0.3


class NoisyNeighbourSpec(ApiModel):
    """A pod on the node of one of the target's pods that burns CPUs through the run.

    A Job of the operator image pinned to that node (``nodeName``), with one busy process
    per CPU it takes; BestEffort unless ``cpuRequest`` is set. It burns only while the load Job
    says so (a key of the results ConfigMap), and stops by itself when the load Job stops
    saying so (deleted, failed, or the operator down): see vllm_operator/bench/neighbour.py.
    """

    cpu_share: float = Field(
        default=DEFAULT_NEIGHBOUR_CPU_SHARE,
        gt=0,
        le=1,
        description="The share of the node's CPUs to burn (default 0.3), at least one CPU.",
    )
    cpu_request: ResourceQuantity | None = Field(
        default=None,
        description="CPU the neighbour requests, as another tenant's pod would: under "
        "contention the kubelet shares the CPU by requests, so a BestEffort neighbour (the "
        "default) takes little from pods that request CPU, and one with a request competes "
        "for its share. The node must have it free, or the kubelet refuses the pod and the "
        "perturbation says the neighbour did not burn.",
    )


class ChaosSpec(ApiModel):
    """A phase after the levels: the same load run plain, then under each perturbation."""

    rate_per_second: float | None = Field(
        default=None,
        gt=0,
        le=100_000,
        description="The load of the phase. Default: kneeFraction of the knee the levels found "
        "(else of the search's best rate, else of the highest rate that met the SLO).",
    )
    knee_fraction: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="The share of the knee to run at, when ratePerSecond is not set (default 0.8).",
    )
    network: NetworkFaultSpec | None = Field(
        default=None, description="Latency, jitter and loss between the client and the target."
    )
    noisy_neighbour: NoisyNeighbourSpec | None = Field(
        default=None,
        description="Burn a share of the CPUs of a target pod's node during the run.",
    )
    restart: RestartFaultSpec | None = Field(
        default=None,
        description="Evict one of the target's pods mid-run and measure the errors and the "
        "tail while it is replaced.",
    )

    model_config = cel_rules(
        {
            "rule": "!(has(self.ratePerSecond) && has(self.kneeFraction))",
            "message": "set ratePerSecond or kneeFraction, not both",
            "fieldPath": ".kneeFraction",
        },
        {
            "rule": "has(self.network) || has(self.noisyNeighbour) || has(self.restart)",
            "message": "chaos needs a perturbation: network, noisyNeighbour or restart",
            "fieldPath": ".network",
            "reason": "FieldValueRequired",
        },
    )

    @model_validator(mode="after")
    def _valid(self) -> Self:
        if self.rate_per_second is not None and self.knee_fraction is not None:
            raise ValueError("chaos: set ratePerSecond or kneeFraction, not both")
        if self.network is None and self.noisy_neighbour is None and self.restart is None:
            raise ValueError("chaos needs a perturbation: network, noisyNeighbour or restart")
        return self


class InferenceBenchmarkSpec(ApiModel):
    """Desired benchmark run."""

    target_ref: LocalObjectReference = Field(
        description="The InferenceService to benchmark (same namespace)."
    )
    adapter: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=ADAPTER_NAME_PATTERN,
        description="One of the target's LoRA adapters (spec.adapters[].name): every request "
        "gives its name as the model, so the adapter is what is measured. Default: the base "
        "model. The benchmark waits until the adapter is loaded on every Ready server.",
    )
    workload: BenchmarkWorkload = Field(description="What to send.")
    arrival: ArrivalSpec = Field(description="When to send requests.")
    duration_seconds: int | None = Field(
        default=None, ge=1, le=86400, description="How long each load level runs."
    )
    requests: int | None = Field(
        default=None, ge=1, le=10_000_000, description="How many requests each load level sends."
    )
    slo: SLO = Field(default_factory=SLO, description="Deadlines; a miss is a failure.")
    mode: BenchmarkMode = Field(default="Single", description="Single, Sweep or Search.")
    sweep: SweepSpec | None = Field(default=None, description="Load levels, for Sweep.")
    search: SearchSpec | None = Field(default=None, description="Search bounds, for Search.")
    endpoint: EndpointSpec = Field(default_factory=EndpointSpec, description="API and streaming.")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed for reproducible runs.")
    chaos: ChaosSpec | None = Field(
        default=None,
        description="After the levels, run one load plain and then under each perturbation, "
        "and compare (status.chaos). Off by default.",
    )
    max_error_fraction: float = Field(
        default=DEFAULT_MAX_ERROR_FRACTION,
        ge=0,
        le=1,
        description="The benchmark fails (phase Failed, reason TooManyRequestErrors) when, at "
        "any load level, more than this share of the requests got no answer for a reason "
        "other than a deadline (connection errors, HTTP errors, timeouts) or were never sent. "
        "Deadline misses count against the SLO, not here. 1 never fails.",
    )

    def target_attainment(self) -> float:
        """The share of a level's requests that must meet the SLO for the level to pass."""
        return (
            self.search.target_attainment
            if self.search is not None
            else (DEFAULT_TARGET_ATTAINMENT)
        )

    model_config = cel_rules(
        {
            "rule": "has(self.durationSeconds) || has(self.requests)",
            "message": "set durationSeconds or requests (or both)",
            "fieldPath": ".durationSeconds",
            "reason": "FieldValueRequired",
        },
        {
            "rule": "self.mode != 'Sweep' || (has(self.sweep) && "
            "(size(self.sweep.ratesPerSecond) > 0 || "
            "size(self.sweep.concurrencies) > 0))",
            "message": "mode Sweep needs sweep.ratesPerSecond or sweep.concurrencies",
            "fieldPath": ".sweep",
            "reason": "FieldValueRequired",
        },
        {
            "rule": "self.mode != 'Search' || has(self.search)",
            "message": "mode Search needs search",
            "fieldPath": ".search",
            "reason": "FieldValueRequired",
        },
        {
            "rule": "self.mode != 'Search' || has(self.slo.ttftP99Milliseconds) || "
            "has(self.slo.tpotP99Milliseconds) || has(self.slo.e2eP99Milliseconds)",
            "message": "mode Search needs at least one target in slo",
            "fieldPath": ".slo",
            "reason": "FieldValueRequired",
        },
        {
            "rule": "!has(self.chaos) || !has(self.chaos.restart) || "
            "!has(self.durationSeconds) || "
            "self.chaos.restart.afterSeconds < double(self.durationSeconds)",
            "message": "chaos.restart.afterSeconds must be below durationSeconds: the pod is "
            "evicted during the run",
            "fieldPath": ".chaos.restart.afterSeconds",
        },
        {
            "rule": "self == oldSelf",
            "message": "spec is immutable; create a new InferenceBenchmark",
        },
    )

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if self.duration_seconds is None and self.requests is None:
            raise ValueError("set durationSeconds or requests (or both)")
        if self.mode == "Sweep" and (
            self.sweep is None or not (self.sweep.rates_per_second or self.sweep.concurrencies)
        ):
            raise ValueError("mode Sweep needs sweep.ratesPerSecond or sweep.concurrencies")
        if self.mode == "Search":
            if self.search is None:
                raise ValueError("mode Search needs search")
            slo = self.slo
            if not (
                slo.ttft_p99_milliseconds or slo.tpot_p99_milliseconds or slo.e2e_p99_milliseconds
            ):
                raise ValueError("mode Search needs at least one target in slo")
        restart = self.chaos.restart if self.chaos is not None else None
        if (
            restart is not None
            and self.duration_seconds is not None
            and restart.after_seconds >= self.duration_seconds
        ):
            raise ValueError(
                "chaos.restart.afterSeconds must be below durationSeconds: the pod is evicted "
                "during the run"
            )
        return self


# --- status ------------------------------------------------------------------------------

BenchmarkPhase = Literal["Pending", "Running", "Succeeded", "Failed"]


class Percentiles(ApiModel):
    """Latency percentiles in milliseconds."""

    p50: float | None = Field(default=None, description="Median.")
    p90: float | None = Field(default=None, description="90th percentile.")
    p95: float | None = Field(default=None, description="95th percentile.")
    p99: float | None = Field(default=None, description="99th percentile.")
    p999: float | None = Field(default=None, description="99.9th percentile.")
    max: float | None = Field(default=None, description="Maximum.")


class LatencySet(ApiModel):
    """TTFT, TPOT, ITL and end-to-end latency."""

    ttft: Percentiles | None = Field(default=None, description="Time to first token.")
    tpot: Percentiles | None = Field(default=None, description="Time per output token.")
    itl: Percentiles | None = Field(default=None, description="Inter-token latency.")
    e2e: Percentiles | None = Field(default=None, description="End-to-end latency.")


class BucketResult(ApiModel):
    """Results for one prompt-length bucket."""

    min_prompt_tokens: int = Field(description="Bucket lower bound.")
    max_prompt_tokens: int = Field(description="Bucket upper bound.")
    requests: int = Field(description="Requests in the bucket.")
    ttft_p99_milliseconds: float | None = Field(default=None, description="TTFT P99.")
    e2e_p99_milliseconds: float | None = Field(default=None, description="E2E P99.")


class LevelResult(ApiModel):
    """Results at one load level."""

    rate_per_second: float | None = Field(default=None, description="Offered rate.")
    concurrency: int | None = Field(default=None, description="Offered concurrency.")
    requests: int = Field(default=0, description="Requests scheduled.")
    succeeded: int = Field(default=0, description="Requests that met every deadline.")
    failed: int = Field(default=0, description="Requests that errored or missed a deadline.")
    errors_by_kind: dict[str, int] = Field(
        default_factory=dict,
        description="Requests that failed, by kind: TTFTDeadlineMissed, TPOTDeadlineMissed, "
        "E2EDeadlineMissed (the SLO's deadline passed and the client gave up on the request), "
        "Timeout (the request timeout, without an SLO), ConnectError (no connection), "
        "ConnectionLost (the connection closed mid-request), StreamError (the server sent an "
        "error event mid-stream), ProtocolError (a stream that could not be parsed), NoUsage "
        "(the stream ended without its usage chunk, so no token count), Unfinished (still "
        "running when the level's drain time ran out), HTTPnnn (the server answered status "
        "nnn: HTTP429, HTTP503, ...), ClientError (anything else the client raised).",
    )
    requests_per_second: float | None = Field(default=None, description="Achieved rate.")
    output_tokens_per_second: float | None = Field(default=None, description="Output rate.")
    goodput_per_second: float | None = Field(default=None, description="Rate meeting the SLO.")
    slo_attainment: float | None = Field(default=None, description="Share meeting the SLO.")
    from_send: LatencySet | None = Field(
        default=None, description="Latency measured from the actual send time."
    )
    from_scheduled: LatencySet | None = Field(
        default=None, description="Latency measured from the scheduled send time."
    )
    schedule_lag_p99_milliseconds: float | None = Field(
        default=None, description="Client's own lag behind the schedule, P99."
    )
    schedule_lag_p999_milliseconds: float | None = Field(
        default=None, description="Client's own lag behind the schedule, P99.9."
    )
    unsent: int | None = Field(default=None, description="Requests scheduled but never sent.")
    errored: int | None = Field(
        default=None,
        description="Requests that got no answer for a reason other than a deadline, or were "
        "never sent.",
    )
    connections_opened: int | None = Field(
        default=None, description="Connections the client opened to the server."
    )
    client_saturated: bool | None = Field(
        default=None, description="True when the client, not the server, limited the load."
    )
    slo_verdict: Literal["Met", "Missed", "ClientLimited"] | None = Field(
        default=None,
        description="How the level counts toward the SLO: Met, Missed, or ClientLimited (the "
        "load client's lag or shortfall could have decided it, so it counts neither way; a "
        "client that only lagged, at a level that met the SLO from the schedule or missed it "
        "even from the send, does not decide it).",
    )
    buckets: list[BucketResult] = Field(
        default_factory=list, description="Breakdown by prompt-length bucket."
    )


class ChaosResult(ApiModel):
    """One perturbation of the chaos phase against the plain run at the same load."""

    perturbation: str = Field(description="What was done, in words.")
    rate_per_second: float = Field(description="The load of both runs.")
    baseline: LevelResult = Field(description="The same load, unperturbed, in the same run.")
    perturbed: LevelResult = Field(description="The load under the perturbation.")
    verdict: str = Field(description="What changed: P99s, SLO attainment, errors.")


class InferenceBenchmarkStatus(ApiModel):
    """What the benchmark measured."""

    observed_generation: int | None = Field(default=None, description="Generation observed.")
    phase: BenchmarkPhase | None = Field(default=None, description="Lifecycle phase.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Running, Failed.",
        json_schema_extra=CONDITIONS_LIST,
    )
    start_time: datetime | None = Field(default=None, description="When load started.")
    completion_time: datetime | None = Field(default=None, description="When it ended.")
    levels: list[LevelResult] = Field(default_factory=list, description="Per load level.")
    headline: LevelResult | None = Field(
        default=None, description="The highest level that met the SLO (or the only level)."
    )
    knee_rate_per_second: float | None = Field(
        default=None, description="Load at which P99 latency starts to climb 3x faster."
    )
    results_config_map: str | None = Field(
        default=None, description="ConfigMap holding the full per-request data."
    )
    chaos: list[ChaosResult] = Field(
        default_factory=list, description="The chaos phase, one entry per perturbation."
    )
    chaos_note: str | None = Field(
        default=None, description="Why the chaos phase asked for did not run."
    )


class InferenceBenchmark(ApiModel):
    """A benchmark of an InferenceService under realistic load."""

    api_version: Literal["inference.vllm-operator.dev/v1alpha1"] = Field(
        default="inference.vllm-operator.dev/v1alpha1"
    )
    kind: Literal["InferenceBenchmark"] = Field(default="InferenceBenchmark")
    metadata: ObjectMeta
    spec: InferenceBenchmarkSpec
    status: InferenceBenchmarkStatus | None = None
