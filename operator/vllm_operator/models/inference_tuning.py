"""InferenceTuning: a measured tuning run of an InferenceService.

The tuner predicts; an InferenceTuning measures. It takes the target service, a set of
candidate vLLM argument overrides (the user's, or the tuner's candidate space), and runs
each as a trial measured by an InferenceBenchmark in Search mode (the highest rate that
meets the SLO: the goodput), within a budget of trials, wall time and GPU-minutes. Its
status keeps every trial, the winner with its margin over the service's current plan
(the incumbent) and over vLLM's own defaults, and the run-to-run spread measured by the
incumbent again at the end. It never changes the target's spec: a result is applied only
when the InferenceService asks for it (docs/measured-tuning.md).

Strategies: ``Beside`` runs each trial as a child InferenceService of one replica next to
the target; ``InPlace`` has the target's own pods take each trial in turn (through
``status.inPlace``, which the InferenceService reconcile renders), holding the target's
scale-down lock through the run.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Final, Literal, Self

from pydantic import Field, model_validator

from vllm_operator.models.base import (
    CONDITIONS_LIST,
    ApiModel,
    Condition,
    LocalObjectReference,
    cel_rules,
    map_list,
)
from vllm_operator.models.inference_benchmark import (
    ArrivalSpec,
    BenchmarkWorkload,
    EndpointSpec,
    Percentiles,
    SearchSpec,
)
from vllm_operator.models.inference_service import OVERRIDE_KEY_PATTERN, ObjectMeta
from vllm_operator.models.workload import SLO

# The trials the run names itself; a candidate may not take these names.
TRIAL_INCUMBENT: Final = "incumbent"
TRIAL_DEFAULTS: Final = "defaults"
TRIAL_INCUMBENT_AGAIN: Final = "incumbent-again"
RESERVED_TRIAL_NAMES: Final = (TRIAL_INCUMBENT, TRIAL_DEFAULTS, TRIAL_INCUMBENT_AGAIN)
# A trial's name is part of its children's names (``<tuning>-<trial>``), which name a
# Deployment and a Service: 50 characters at most (an InferenceService's own limit), so a
# tuning's name is at most 50 - 1 - 20 characters.
MAX_TRIAL_NAME: Final = 20
MAX_TUNING_NAME: Final = 29
TRIAL_NAME_PATTERN: Final = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# The vLLM arguments the operator sets itself; no candidate may override them.
RESERVED_FLAGS: Final = ("model", "host", "port", "served-model-name")
DEFAULT_MAX_TRIALS: Final = 4

TuningStrategy = Literal["Beside", "InPlace"]
TuningPhase = Literal["Pending", "Running", "Succeeded", "Failed"]
TrialRole = Literal["Incumbent", "Defaults", "Candidate", "IncumbentAgain"]
TrialState = Literal[
    "Pending", "Starting", "Measuring", "Succeeded", "StoppedEarly", "Failed", "Skipped"
]
OverrideKey = Annotated[str, Field(pattern=OVERRIDE_KEY_PATTERN, max_length=128)]


class TuningBudget(ApiModel):
    """What the run may spend; every measured trial counts (the incumbent's, the defaults'
    and the incumbent's again included). Trials the budget leaves out are recorded as
    Skipped with the reason."""

    max_trials: int = Field(
        default=DEFAULT_MAX_TRIALS,
        ge=1,
        le=64,
        description="Most trials measured (default 4). With remeasureIncumbent, the last "
        "one is the incumbent again.",
    )
    max_duration_seconds: int | None = Field(
        default=None,
        ge=1,
        le=7 * 86400,
        description="Most wall time for the whole run, from its start; a trial running when "
        "it runs out is stopped.",
    )
    max_gpu_minutes: float | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        description="Most GPU-minutes for the whole run: each trial costs the GPUs of its "
        "plan times its wall time (from its start to its end).",
    )


class TuningCandidate(ApiModel):
    """One set of vLLM arguments to measure, laid over the target's spec.tuning.overrides."""

    name: str = Field(
        min_length=1,
        max_length=MAX_TRIAL_NAME,
        pattern=TRIAL_NAME_PATTERN,
        description="The trial's name (a DNS label of at most 20 characters; not incumbent, "
        "defaults or incumbent-again): its child objects are <tuning>-<name>.",
    )
    overrides: dict[OverrideKey, str] = Field(
        min_length=1,
        max_length=64,
        description="vLLM arguments by name without dashes, as spec.tuning.overrides takes "
        "them ('true' or 'false' toggle a flag). Each is checked against the arguments of "
        "the target's vLLM release before anything starts.",
    )

    model_config = cel_rules(
        {
            "rule": "self.overrides.all(k, k.matches('^[a-z][a-z0-9-]*$'))",
            "message": "override keys are vLLM argument names without dashes",
            "fieldPath": ".overrides",
        },
        {
            "rule": "!(self.name in ['incumbent', 'defaults', 'incumbent-again'])",
            "message": "a candidate's name may not be incumbent, defaults or incumbent-again "
            "(the run's own trials)",
            "fieldPath": ".name",
        },
        {
            "rule": "!(['model', 'host', 'port', 'served-model-name'].exists(k, "
            "k in self.overrides))",
            "message": "model, host, port and served-model-name are set by the operator "
            "and cannot be overridden",
            "fieldPath": ".overrides",
        },
    )

    @model_validator(mode="after")
    def _valid(self) -> Self:
        if self.name in RESERVED_TRIAL_NAMES:
            raise ValueError(
                "a candidate's name may not be incumbent, defaults or incumbent-again (the "
                "run's own trials)"
            )
        if set(RESERVED_FLAGS) & set(self.overrides):
            raise ValueError(
                "model, host, port and served-model-name are set by the operator and cannot "
                "be overridden"
            )
        return self


class TuningMeasure(ApiModel):
    """How each trial is measured: an InferenceBenchmark in Search mode with these fields."""

    workload: BenchmarkWorkload | None = Field(
        default=None,
        description="What to send. Default: the target's spec.workload (its prompt and "
        "output length distributions); a target without both leaves the run with nothing "
        "to send (NoWorkload).",
    )
    slo: SLO | None = Field(
        default=None,
        description="The deadlines (a miss is a failure). Default: the target's spec.slo; at "
        "least one target is needed (NoSLO).",
    )
    search: SearchSpec = Field(
        description="The search for the highest rate that meets the SLO (the goodput). A "
        "candidate's search starts at the incumbent's goodput, so one that misses the SLO "
        "there stops at once (StoppedEarly)."
    )
    arrival: ArrivalSpec | None = Field(
        default=None,
        description="When requests are sent. Default: Poisson (a search sets each level's "
        "rate itself; closed-loop arrivals are searched as Poisson).",
    )
    duration_seconds: int | None = Field(
        default=None, ge=1, le=86400, description="How long each load level runs."
    )
    requests: int | None = Field(
        default=None, ge=1, le=10_000_000, description="How many requests each load level sends."
    )
    endpoint: EndpointSpec = Field(default_factory=EndpointSpec, description="API and streaming.")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed for reproducible runs.")
    max_error_fraction: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="The trials' benchmarks' spec.maxErrorFraction. Default 1: requests that "
        "get no answer (or that the load client could not send) count against the SLO at "
        "their level, so the search's goodput stops below the rate where they start, and "
        "the trial reports them (errors). Lower fails the whole trial when a level's share "
        "of them exceeds it (the InferenceBenchmark's own default is 0.05).",
    )

    model_config = cel_rules(
        {
            "rule": "has(self.durationSeconds) || has(self.requests)",
            "message": "set durationSeconds or requests (or both)",
            "fieldPath": ".durationSeconds",
            "reason": "FieldValueRequired",
        }
    )

    @model_validator(mode="after")
    def _level(self) -> Self:
        if self.duration_seconds is None and self.requests is None:
            raise ValueError("set durationSeconds or requests (or both)")
        return self


class InferenceTuningSpec(ApiModel):
    """A measured tuning run."""

    target_ref: LocalObjectReference = Field(
        description="The InferenceService to tune (same namespace)."
    )
    strategy: TuningStrategy = Field(
        default="Beside",
        description="Beside: each trial is a child InferenceService of one replica beside "
        "the target (needs spare GPUs of the same shape). InPlace: the target's own pods take "
        "each trial in turn (never while another benchmark runs on it; its scale-down lock "
        "held through the run).",
    )
    budget: TuningBudget = Field(default_factory=TuningBudget, description="What it may spend.")
    candidates: list[TuningCandidate] = Field(
        default_factory=list,
        max_length=32,
        description="The candidates to measure, in order of preference. Empty: the tuner's "
        "candidate space around the target's plan, ordered by predicted goodput.",
        json_schema_extra=map_list("name"),
    )
    include_defaults: bool = Field(
        default=True,
        description="Measure vLLM's own defaults too (the trial defaults: the operator's tuned "
        "performance flags set back to vLLM's defaults).",
    )
    remeasure_incumbent: bool = Field(
        default=True,
        description="Measure the incumbent again at the end (the trial incumbent-again): "
        "status.spread is the relative difference of its two goodputs, and a winner whose "
        "margin over the incumbent is within it is not distinguishable (and never applied).",
    )
    measure: TuningMeasure = Field(description="How each trial is measured.")
    auto_apply: bool = Field(
        default=False,
        description="Let the target take the winner's arguments (when distinguishable and "
        "not stale) without naming this tuning in spec.tuning.measuredRef. The target's spec "
        "is never written.",
    )

    model_config = cel_rules(
        {
            "rule": "self == oldSelf",
            "message": "spec is immutable; create a new InferenceTuning",
        },
    )

    @model_validator(mode="after")
    def _unique(self) -> Self:
        names = [c.name for c in self.candidates]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"candidates: names given more than once: {', '.join(twice)}")
        return self


# --- status ------------------------------------------------------------------------------


class TuningFingerprint(ApiModel):
    """What the target was when the run started; a later difference makes it Stale."""

    image: str | None = Field(default=None, description="The vLLM serving image.")
    model: str | None = Field(default=None, description="The model (repository or path).")
    model_revision: str | None = Field(default=None, description="The model's revision.")
    gpu_product: str | None = Field(default=None, description="GPU product of its pods' node.")
    gpu_count: int | None = Field(default=None, description="GPUs per replica.")
    interconnect: str | None = Field(default=None, description="GPU interconnect class.")
    power_limit_watts: float | None = Field(
        default=None, description="The GPUs' enforced power limit."
    )
    workload_hash: str | None = Field(
        default=None, description="A digest of the workload and SLO measured against."
    )


class TrialStatus(ApiModel):
    """One trial: what ran, what it measured, and why it stopped."""

    name: str = Field(description="The trial's name.")
    role: TrialRole = Field(description="Incumbent, Defaults, Candidate or IncumbentAgain.")
    overrides: dict[str, str] = Field(
        default_factory=dict, description="What the trial lays over the target's overrides."
    )
    arguments: list[str] = Field(
        default_factory=list, description="The vLLM command line the trial ran."
    )
    predicted_goodput_per_second: float | None = Field(
        default=None, description="The tuner's goodput for it (requests/s meeting the SLO)."
    )
    measured_goodput_per_second: float | None = Field(
        default=None, description="The highest rate at which the SLO held (the search's answer)."
    )
    ttft: Percentiles | None = Field(default=None, description="TTFT at that rate.")
    tpot: Percentiles | None = Field(default=None, description="TPOT at that rate.")
    slo_attainment: float | None = Field(default=None, description="Share meeting the SLO.")
    errors: int | None = Field(default=None, description="Requests that errored at that rate.")
    state: TrialState = Field(default="Pending", description="Where the trial stands.")
    reason: str | None = Field(default=None, description="Why it is in its state, in words.")
    benchmark: str | None = Field(default=None, description="Its InferenceBenchmark.")
    start_time: datetime | None = Field(default=None, description="When it started.")
    completion_time: datetime | None = Field(default=None, description="When it ended.")
    gpu_seconds: float | None = Field(default=None, description="GPUs of its plan x wall time.")


class TuningWinner(ApiModel):
    """The trial with the most goodput, and how far ahead it is."""

    trial: str = Field(description="The winning trial's name.")
    overrides: dict[str, str] = Field(
        default_factory=dict, description="Its overrides (over the target's own)."
    )
    goodput_per_second: float = Field(description="Its measured goodput.")
    margin_over_incumbent: float | None = Field(
        default=None, description="Its goodput over the incumbent's, as a fraction (0.25: 25 %)."
    )
    margin_over_defaults: float | None = Field(
        default=None, description="Its goodput over vLLM's defaults', as a fraction."
    )
    distinguishable: bool = Field(
        default=False,
        description="Its margin over the incumbent is larger than the run-to-run spread: only "
        "then is it applied.",
    )


class InPlaceTrial(ApiModel):
    """The trial the target's own pods run now (strategy InPlace)."""

    trial: str = Field(description="The trial's name.")
    overrides: dict[str, str] = Field(
        default_factory=dict, description="Laid over the target's spec.tuning.overrides."
    )


class InferenceTuningStatus(ApiModel):
    """Where the run stands, and every trial it measured."""

    observed_generation: int | None = Field(default=None, description="Generation observed.")
    phase: TuningPhase | None = Field(default=None, description="Lifecycle phase.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Reconciling, Stalled, Running, Stale.",
        json_schema_extra=CONDITIONS_LIST,
    )
    start_time: datetime | None = Field(default=None, description="When the first trial started.")
    completion_time: datetime | None = Field(default=None, description="When the run ended.")
    elapsed_seconds: float | None = Field(default=None, description="Wall time so far.")
    gpu_seconds: float | None = Field(default=None, description="GPU time of its trials so far.")
    fingerprint: TuningFingerprint | None = Field(
        default=None, description="What the target was when the run started."
    )
    trials: list[TrialStatus] = Field(default_factory=list, description="Every trial, in order.")
    winner: TuningWinner | None = Field(default=None, description="The trial with most goodput.")
    spread: float | None = Field(
        default=None,
        description="Relative difference of the incumbent's two measurements (run-to-run noise).",
    )
    in_place: InPlaceTrial | None = Field(
        default=None, description="The trial the target's pods run (InPlace, while it runs)."
    )


class InferenceTuning(ApiModel):
    """A measured tuning run of an InferenceService."""

    api_version: Literal["inference.vllm-operator.dev/v1alpha1"] = Field(
        default="inference.vllm-operator.dev/v1alpha1"
    )
    kind: Literal["InferenceTuning"] = Field(default="InferenceTuning")
    metadata: ObjectMeta
    spec: InferenceTuningSpec
    status: InferenceTuningStatus | None = None

    @model_validator(mode="after")
    def _name(self) -> Self:
        name = self.metadata.name
        if len(name) > MAX_TUNING_NAME or not name[:1].isalpha():
            raise ValueError(
                f"metadata.name must be a DNS-1035 label of at most {MAX_TUNING_NAME} "
                "characters (its trials' InferenceServices are <name>-<trial>)"
            )
        return self
