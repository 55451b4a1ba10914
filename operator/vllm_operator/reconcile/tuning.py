"""The one reconcile of an InferenceTuning: measure the target's incumbent arguments,
the candidates and vLLM's defaults one trial after another, each with an InferenceBenchmark
in Search mode, and report the winner (docs/measured-tuning.md).

Phases: Pending (the input is not usable yet: the target is missing or not Ready, it has
no workload or SLO to measure against, another benchmark runs on it for an InPlace run)
→ Running (the trials, one at a time) → Succeeded (every trial ended; the winner, its
margins and the spread are in status) or Failed (a candidate override the target's vLLM
release does not take, the target gone mid-run, or no trial measured anything).
Nothing starts before every input is checked: a refusal changes nothing but the status.

Trials are laid out in status.trials when the run starts (incumbent, candidates by
predicted goodput, defaults, incumbent-again; those beyond spec.budget.maxTrials, and the
tuner's candidates that cannot fit, are Skipped at once) and then advance one by one:
Pending → Starting (strategy Beside: the trial's own InferenceService, until Ready;
InPlace: status.inPlace, until the target's pods run it) → Measuring (the trial's
InferenceBenchmark) → Succeeded, StoppedEarly (a candidate that missed the SLO at the
incumbent's goodput, or the budget ran out) or Failed. The reconcile is level-based: a
restarted operator reads where the run stands from status.trials and finds the trial's
children by name.

What the run creates is owned by the tuning (controller references): deleting the tuning
removes the trial InferenceServices, the benchmarks and an InPlace run's lock Job by
garbage collection, and status.inPlace goes with the object.

One pass is :func:`observe` (every read) → the pure :func:`next_step` → :func:`apply_step`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from pydantic import ValidationError

from vllm_operator.constants import (
    API_VERSION,
    KIND_GPU_NODE,
    KIND_INFERENCE_BENCHMARK,
    KIND_INFERENCE_SERVICE,
    LABEL_SERVICE,
    LABEL_TUNING,
    NODE_LABEL_GPU_INTERCONNECT,
    NODE_LABEL_GPU_PRODUCT,
)
from vllm_operator.k8s.api import ApiError, ClusterAPI
from vllm_operator.k8s.measurements import record_measurements
from vllm_operator.models import (
    GPUNodeStatus,
    InferenceBenchmark,
    InferenceService,
    InferenceTuning,
    InferenceTuningStatus,
    lengths,
)
from vllm_operator.models.base import Condition, Manifest
from vllm_operator.models.conditions import condition, find, pod_condition
from vllm_operator.models.inference_benchmark import (
    BenchmarkWorkload,
    LevelResult,
    SearchSpec,
)
from vllm_operator.models.inference_tuning import (
    TRIAL_DEFAULTS,
    TRIAL_INCUMBENT,
    TRIAL_INCUMBENT_AGAIN,
    InPlaceTrial,
    TrialStatus,
    TuningFingerprint,
    TuningWinner,
)
from vllm_operator.models.workload import SLO, Workload
from vllm_operator.reconcile.last_benchmark import TERMINAL
from vllm_operator.reconcile.lock import list_lock_jobs, lock_holder
from vllm_operator.reconcile.phases import phase_conditions, phase_event, write_phase_status
from vllm_operator.reconcile.placement import deployed_version_of, plan_result
from vllm_operator.reconcile.steps import Event, Ref, apply_all, delete_all
from vllm_operator.releases.arguments import (
    Arguments,
    arguments_for,
    command_values,
    release_flags,
)
from vllm_operator.render.deployment import CONTAINER, vllm_args
from vllm_operator.render.trials import (
    build_lock_job,
    build_trial_benchmark,
    build_trial_service,
    lock_job_name,
    trial_object_name,
)
from vllm_operator.settings import OperatorSettings
from vllm_operator.tuning import TuningResult
from vllm_operator.tuning.measurements import (
    LatencyPercentiles,
    MeasuredBy,
    Measurement,
    WorkloadSummary,
)
from vllm_operator.tuning.release import release_problem
from vllm_operator.tuning.trials import candidate_space, predicted_goodput

log = logging.getLogger(__name__)

REASON_TARGET_NOT_FOUND: Final = "TargetNotFound"
REASON_TARGET_NOT_READY: Final = "TargetNotReady"
REASON_INVALID_OVERRIDE: Final = "InvalidOverride"
REASON_NO_WORKLOAD: Final = "NoWorkload"
REASON_NO_SLO: Final = "NoSLO"
REASON_BENCHMARK_RUNNING: Final = "BenchmarkRunning"
REASON_UNSUPPORTED_VERSION: Final = "UnsupportedVllmVersion"
# Stale: what changed in the target since the run started, in this order.
STALE_REASONS: Final = (
    ("VLLMImageChanged", ("image",)),
    ("ModelChanged", ("model", "model_revision")),
    ("GPUChanged", ("gpu_product", "gpu_count")),
    ("InterconnectChanged", ("interconnect",)),
    ("PowerLimitChanged", ("power_limit_watts",)),
    ("WorkloadChanged", ("workload_hash",)),
)
# A pending or running tuning is looked at again this soon (its children's events come
# sooner); a finished one at the resync, for Stale.
REQUEUE_SECONDS: Final = 10.0
# A trial whose InferenceService (Beside) or rollout (InPlace) is not Ready this long
# after the trial started has failed.
TRIAL_START_SECONDS: Final = 1800
# The operator's performance flags that the trial ``defaults`` sets back to vLLM's
# defaults (where vLLM has one it can be given: a flag whose default vLLM decides at start
# cannot be unset by an override and keeps the plan's value, which the trial says).
PERFORMANCE_FLAGS: Final = (
    "max-num-seqs",
    "max-num-batched-tokens",
    "enable-chunked-prefill",
    "enable-prefix-caching",
    "enforce-eager",
    "gpu-memory-utilization",
    "kv-cache-dtype",
    "block-size",
)
ACTIVE: Final = ("Starting", "Measuring")
ENDED: Final = ("Succeeded", "StoppedEarly", "Failed", "Skipped")


# --- observe ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    """Everything one pass reads for a tuning. A finished tuning reads only what Stale and
    the clean-up of a leftover child need."""

    target: InferenceService | None = None
    # The target's status.measuredFrom as served (the InferenceService reconcile's report
    # of which measured result its pods run): the InPlace handshake.
    measured_from: Mapping[str, Any] | None = None
    # The target's Deployment (InPlace: whether its pods run the trial's arguments).
    target_deployment: Manifest | None = None
    # The target's pods, and the Nodes and GPUNodes (the fingerprint's GPU facts).
    target_pods: list[Manifest] = field(default_factory=list)
    nodes: list[Manifest] = field(default_factory=list)
    gpu_nodes: list[Manifest] = field(default_factory=list)
    # The tuning's trial InferenceServices and InferenceBenchmarks (by the tuning label),
    # by name.
    services: Mapping[str, InferenceService] = field(default_factory=dict)
    benchmarks: Mapping[str, InferenceBenchmark] = field(default_factory=dict)
    # Names of the next trial's children that exist without the tuning's label: someone
    # else's objects, never applied over.
    taken: frozenset[str] = frozenset()
    # Jobs holding (or having held) a scale-down lock on the target, anyone's (InPlace).
    lock_jobs: list[Manifest] = field(default_factory=list)
    # The tuner's answer for the target (read when the trials are laid out).
    plan: TuningResult | None = None


def _parse_all(items: list[Manifest], model: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for item in items:
        try:
            found[item["metadata"]["name"]] = model.model_validate(item)
        except ValidationError:
            continue
    return found


async def observe(
    api: ClusterAPI,
    tuning: InferenceTuning,
    *,
    settings: OperatorSettings,
    nodes: list[Manifest] | None = None,
    gpu_nodes: list[Manifest] | None = None,
) -> Observed:
    """Every read of a pass: the target, the trial children, and (InPlace) the target's
    Deployment and lock Jobs; the Nodes and GPUNodes from the runtime's caches when given."""
    old = tuning.status or InferenceTuningStatus()
    ns = tuning.metadata.namespace or ""
    selector = f"{LABEL_TUNING}={tuning.metadata.name}"
    body = await api.get(API_VERSION, KIND_INFERENCE_SERVICE, tuning.spec.target_ref.name, ns)
    target: InferenceService | None = None
    measured_from = None
    if body is not None:
        measured_from = (body.get("status") or {}).get("measuredFrom")
        try:
            target = InferenceService.model_validate(body)
        except ValidationError as err:
            log.warning(
                "The target of InferenceTuning %s/%s does not validate.", ns,
                tuning.metadata.name, extra={"error": str(err)},
            )  # fmt: skip
    services = _parse_all(
        await api.list(API_VERSION, KIND_INFERENCE_SERVICE, ns, label_selector=selector),
        InferenceService,
    )
    terminal = old.phase in TERMINAL
    benchmarks = (
        {}
        if terminal
        else _parse_all(
            await api.list(API_VERSION, KIND_INFERENCE_BENCHMARK, ns, label_selector=selector),
            InferenceBenchmark,
        )
    )
    in_place = tuning.spec.strategy == "InPlace"
    deployment, lock_jobs = None, []
    if target is not None and in_place:
        lock_jobs = await list_lock_jobs(api, target)
        if not terminal:
            deployment = await api.get("apps/v1", "Deployment", target.metadata.name, ns)
    pods: list[Manifest] = []
    if target is not None:
        pods = await api.list(
            "v1", "Pod", ns, label_selector=f"{LABEL_SERVICE}={target.metadata.name}"
        )
        if nodes is None or gpu_nodes is None:
            nodes = await api.list("v1", "Node")
            gpu_nodes = await api.list(API_VERSION, KIND_GPU_NODE)
    taken: set[str] = set()
    # The trial that runs or starts next (the incumbent, the first laid out, before any).
    upcoming = _upcoming(old) if old.trials else TrialStatus(name=TRIAL_INCUMBENT, role="Incumbent")
    if not terminal and upcoming is not None:
        child = trial_object_name(tuning, upcoming.name)
        for kind in (KIND_INFERENCE_SERVICE, KIND_INFERENCE_BENCHMARK):
            mine = services if kind == KIND_INFERENCE_SERVICE else benchmarks
            if kind == KIND_INFERENCE_SERVICE and in_place:
                continue
            if child not in mine and await api.get(API_VERSION, kind, child, ns) is not None:
                taken.add(child)
    plan = None
    if target is not None and not old.trials and not terminal:
        plan = plan_result(
            target, nodes or [], gpu_nodes or [], default_image=settings.default_image
        )
    return Observed(
        target=target,
        measured_from=measured_from if isinstance(measured_from, Mapping) else None,
        target_deployment=deployment,
        target_pods=pods,
        nodes=nodes or [],
        gpu_nodes=gpu_nodes or [],
        services=services,
        benchmarks=benchmarks,
        taken=frozenset(taken),
        lock_jobs=lock_jobs,
        plan=plan,
    )


def _upcoming(status: InferenceTuningStatus) -> TrialStatus | None:
    """The trial running now, else the next to start."""
    active = next((t for t in status.trials if t.state in ACTIVE), None)
    return active or next((t for t in status.trials if t.state == "Pending"), None)


# --- decide: the inputs -------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """What one pass does: ``phase`` is what the reconcile returns; ``requeue`` when to
    look again."""

    phase: str
    status: InferenceTuningStatus | None = None
    apply: tuple[Manifest, ...] = ()
    delete: tuple[Ref, ...] = ()
    events: tuple[Event, ...] = ()
    requeue: float | None = None


@dataclass(frozen=True)
class Refusal:
    """Why the run does not start: Pending (retried) or Failed (the spec must change)."""

    phase: str
    reason: str
    message: str


def effective_workload(
    tuning: InferenceTuning, target: InferenceService
) -> BenchmarkWorkload | None:
    """spec.measure.workload, else the target's prompt and output length distributions."""
    if tuning.spec.measure.workload is not None:
        return tuning.spec.measure.workload
    declared = target.spec.workload
    if declared.prompt_tokens is None or declared.output_tokens is None:
        return None
    return BenchmarkWorkload(
        prompt_tokens=declared.prompt_tokens, output_tokens=declared.output_tokens
    )


def effective_slo(tuning: InferenceTuning, target: InferenceService) -> SLO:
    """spec.measure.slo, else the target's spec.slo."""
    return tuning.spec.measure.slo if tuning.spec.measure.slo is not None else target.spec.slo


def _has_target(slo: SLO) -> bool:
    return bool(slo.ttft_p99_milliseconds or slo.tpot_p99_milliseconds or slo.e2e_p99_milliseconds)


def _release(target: InferenceService, settings: OperatorSettings) -> Arguments | None:
    version = deployed_version_of(target, default_image=settings.default_image).version
    return arguments_for(version).arguments


def override_problem(
    tuning: InferenceTuning, target: InferenceService, settings: OperatorSettings
) -> Refusal | None:
    """The first candidate whose overrides the target's vLLM release does not take, named
    by its field (spec.candidates[i].overrides.<flag>): checked as the InferenceService
    checks its own spec.tuning.overrides (tuning/release.py)."""
    deployed = deployed_version_of(target, default_image=settings.default_image)
    problems: list[str] = []
    for i, candidate in enumerate(tuning.spec.candidates):
        _, refused = release_problem(
            candidate.overrides, deployed, where=f"spec.candidates[{i}].overrides.{{name}}"
        )
        if refused is not None:
            if refused.reason != REASON_INVALID_OVERRIDE:
                return Refusal("Failed", refused.reason, refused.message)
            problems.append(refused.message)
    if problems:
        return Refusal(
            "Failed",
            REASON_INVALID_OVERRIDE,
            "; ".join(problems) + ". Nothing was started; create a new InferenceTuning with "
            "overrides the target's vLLM takes.",
        )
    return None


def foreign_lock(tuning: InferenceTuning, jobs: list[Manifest]) -> str | None:
    """The benchmark (or Job) other than this tuning's own lock that holds the target's
    scale-down lock: an InPlace run waits for it."""
    own = lock_job_name(tuning)
    return lock_holder([j for j in jobs if j["metadata"].get("name") != own])


def refusal(
    tuning: InferenceTuning, observed: Observed, settings: OperatorSettings
) -> Refusal | None:
    """Why the run cannot start now, each naming the field; None when it can."""
    ns = tuning.metadata.namespace or ""
    target = observed.target
    name = tuning.spec.target_ref.name
    if target is None:
        return Refusal(
            "Pending",
            REASON_TARGET_NOT_FOUND,
            f"InferenceService {name} (spec.targetRef.name) does not exist in namespace {ns}; "
            "nothing was started.",
        )
    invalid = override_problem(tuning, target, settings)
    if invalid is not None:
        return invalid
    if effective_workload(tuning, target) is None:
        return Refusal(
            "Pending",
            REASON_NO_WORKLOAD,
            "spec.measure.workload is not set and InferenceService "
            f"{name} declares no spec.workload.promptTokens and outputTokens: a trial has "
            "nothing to send. Nothing was started.",
        )
    if not _has_target(effective_slo(tuning, target)):
        return Refusal(
            "Pending",
            REASON_NO_SLO,
            f"spec.measure.slo is not set and InferenceService {name} declares no spec.slo "
            "target: a search needs one (ttftP99Milliseconds, tpotP99Milliseconds or "
            "e2eP99Milliseconds). Nothing was started.",
        )
    ready = find(target.status.conditions if target.status else [], "Ready")
    if ready is None or ready.status != "True":
        why = f" ({ready.reason}: {ready.message})" if ready is not None and ready.message else ""
        return Refusal(
            "Pending",
            REASON_TARGET_NOT_READY,
            f"InferenceService {name} is not Ready{why}; the run starts once it is. Nothing "
            "was started.",
        )
    if tuning.spec.strategy == "InPlace":
        holder = foreign_lock(tuning, observed.lock_jobs)
        if holder is not None:
            return Refusal(
                "Pending",
                REASON_BENCHMARK_RUNNING,
                f"InferenceBenchmark {holder} runs on InferenceService {name}; an InPlace run "
                "starts once it ends. Nothing was changed.",
            )
    return None


# --- decide: the trials -------------------------------------------------------------------


def defaults_overrides(
    target: InferenceService, release: Arguments | None
) -> tuple[dict[str, str], list[str]]:
    """The trial ``defaults``: each performance flag the operator's plan set (source
    Tuner) back to vLLM's default, and the flags it cannot set back (vLLM decides their
    default at start, which no override can ask for)."""
    tuning = target.status.tuning if target.status else None
    planned = [a for a in (tuning.arguments if tuning else []) if a.source == "Tuner"]
    overrides: dict[str, str] = {}
    kept: list[str] = []
    for arg in planned:
        if arg.name not in PERFORMANCE_FLAGS or arg.name in target.spec.tuning.overrides:
            continue
        flag = release.get(arg.name) if release is not None else None
        if flag is None or flag.default is None:
            kept.append(arg.name)
        elif flag.default != arg.value:
            overrides[arg.name] = flag.default
    return overrides, kept


def layout(
    tuning: InferenceTuning,
    target: InferenceService,
    plan: TuningResult | None,
    release: Arguments | None,
) -> list[TrialStatus]:
    """Every trial of the run, in the order they run: the incumbent, the candidates by
    predicted goodput (best first; the spec's order among equals), vLLM's defaults, the
    incumbent again; those beyond spec.budget.maxTrials and the tuner's candidates that
    cannot fit are Skipped with the reason."""
    spec = tuning.spec

    def predict(overrides: Mapping[str, str]) -> float | None:
        return predicted_goodput(plan, dict(overrides)) if plan is not None else None

    trials = [
        TrialStatus(
            name=TRIAL_INCUMBENT, role="Incumbent", predicted_goodput_per_second=predict({})
        )
    ]
    pruned: list[TrialStatus] = []
    candidates: list[TrialStatus] = []
    if spec.candidates:
        for c in spec.candidates:
            candidates.append(
                TrialStatus(
                    name=c.name,
                    role="Candidate",
                    overrides=dict(c.overrides),
                    predicted_goodput_per_second=predict(c.overrides),
                )
            )
    elif plan is not None:
        for found in candidate_space(plan):
            trial = TrialStatus(
                name=found.name,
                role="Candidate",
                overrides=dict(found.overrides),
                predicted_goodput_per_second=found.predicted_goodput_per_second,
                reason=found.why,
            )
            if found.name in (TRIAL_INCUMBENT, TRIAL_DEFAULTS, TRIAL_INCUMBENT_AGAIN):
                continue
            if not found.fits:
                pruned.append(trial.model_copy(update={"state": "Skipped"}))
            else:
                candidates.append(trial)
    # Best predicted first; unpredicted ones after, in their given order.
    candidates.sort(
        key=lambda t: (
            -t.predicted_goodput_per_second
            if t.predicted_goodput_per_second is not None
            else float("inf")
        )
    )
    trials += candidates
    if spec.include_defaults:
        overrides, kept = defaults_overrides(target, release)
        note = (
            f"vLLM decides {', '.join(kept)} itself at start, which no override can ask for: "
            "they keep the plan's values."
            if kept
            else None
        )
        trials.append(
            TrialStatus(
                name=TRIAL_DEFAULTS,
                role="Defaults",
                overrides=overrides,
                predicted_goodput_per_second=predict(overrides),
                reason=note,
            )
        )
    slots = spec.budget.max_trials
    again = spec.remeasure_incumbent and slots >= 2
    measured = slots - 1 if again else slots
    why = f"not measured: spec.budget.maxTrials is {slots}"
    laid = [
        t if i < measured else t.model_copy(update={"state": "Skipped", "reason": why})
        for i, t in enumerate(trials)
    ]
    if spec.remeasure_incumbent:
        last = TrialStatus(name=TRIAL_INCUMBENT_AGAIN, role="IncumbentAgain")
        if not again:
            last = last.model_copy(update={"state": "Skipped", "reason": why})
        laid.append(last)
    return laid + pruned


def level_passed(level: LevelResult, attainment: float) -> bool:
    """A level that met the SLO: its verdict, or (before levels had one) its attainment
    with a client that kept up."""
    if level.slo_verdict is not None:
        return level.slo_verdict == "Met"
    return not level.client_saturated and (level.slo_attainment or 0.0) >= attainment


def best_level(levels: Sequence[LevelResult], attainment: float) -> LevelResult | None:
    """The level of the highest rate that met the SLO below every rate that missed it (a
    search's answer, as bench/search.py takes it: a failure wins over a pass above it).
    A rate measured twice counts by its last level, as the search recorded it: the search
    measures a level the load client decided once more (bench.run.search_levels), and a
    first try the client decided is no miss when the second met the SLO."""
    last = {lv.rate_per_second: lv for lv in levels if lv.rate_per_second is not None}
    failed = [rate for rate, lv in last.items() if not level_passed(lv, attainment)]
    lowest_failure = min(failed) if failed else None
    passed = [
        lv
        for rate, lv in last.items()
        if level_passed(lv, attainment) and (lowest_failure is None or rate < lowest_failure)
    ]
    return max(passed, key=lambda lv: lv.rate_per_second or 0.0) if passed else None


def _errors(level: LevelResult) -> int:
    if level.errored is not None:
        return level.errored
    return sum(level.errors_by_kind.values())


def _figures(level: LevelResult) -> dict[str, Any]:
    latency = level.from_scheduled
    return {
        "ttft": latency.ttft if latency else None,
        "tpot": latency.tpot if latency else None,
        "slo_attainment": level.slo_attainment,
        "errors": _errors(level),
    }


def _rate(value: float) -> str:
    return f"{value:.3g}"


def read_benchmark(
    trial: TrialStatus, bench: InferenceBenchmark, *, early_stop_at: float | None
) -> TrialStatus | None:
    """The trial as its finished benchmark leaves it (None while it runs). ``early_stop_at``:
    the rate the search started at when that is the incumbent's goodput (a candidate): a
    miss there stops the trial early."""
    st = bench.status
    if st is None or st.phase not in TERMINAL:
        return None
    attainment = bench.spec.target_attainment()
    if st.phase == "Failed":
        ready = find(st.conditions, "Ready")
        why = f"{ready.reason}: {ready.message}" if ready is not None else "it failed"
        return trial.model_copy(
            update={"state": "Failed", "reason": f"InferenceBenchmark {bench.metadata.name}: {why}"}
        )
    levels = st.levels or ([st.headline] if st.headline else [])
    best = best_level(levels, attainment)
    # The levels in status keep their P99s only (the Job's 4 KiB report); the headline,
    # the same level when the search agrees, keeps every percentile.
    if (
        best is not None
        and st.headline is not None
        and st.headline.rate_per_second == best.rate_per_second
    ):
        best = st.headline
    if best is not None:
        assert best.rate_per_second is not None
        return trial.model_copy(
            update={
                "state": "Succeeded",
                "measured_goodput_per_second": best.rate_per_second,
                "reason": f"the SLO held up to {_rate(best.rate_per_second)} req/s "
                f"({len(levels)} levels searched)",
                **_figures(best),
            }
        )
    rated = [lv for lv in levels if lv.rate_per_second is not None]
    # The search's first rate, as its last measurement there left it: a level the load
    # client decided is measured again at the same rate (bench.run.search_levels).
    first = (
        [lv for lv in rated if lv.rate_per_second == rated[0].rate_per_second][-1]
        if rated
        else None
    )
    figures = _figures(first) if first is not None else {}
    if first is None:
        return trial.model_copy(
            update={"state": "Failed", "reason": "its benchmark measured no level"}
        )
    assert first.rate_per_second is not None
    if first.slo_verdict == "ClientLimited":
        return trial.model_copy(
            update={
                "state": "Failed",
                "reason": f"the load client could not keep to {_rate(first.rate_per_second)} "
                "req/s, so the level counts neither way; give the load Job more CPU",
                **figures,
            }
        )
    if early_stop_at is not None:
        return trial.model_copy(
            update={
                "state": "StoppedEarly",
                "reason": f"missed the SLO at {_rate(first.rate_per_second)} req/s, a load the "
                "incumbent met",
                **figures,
            }
        )
    return trial.model_copy(
        update={
            "state": "Succeeded",
            "measured_goodput_per_second": None,
            "reason": f"no rate from {_rate(first.rate_per_second)} req/s up met the SLO",
            **figures,
        }
    )


def trial_search(
    tuning: InferenceTuning, trial: TrialStatus, trials: Sequence[TrialStatus]
) -> tuple[SearchSpec, float | None]:
    """The search of a trial, and the rate it starts at when that is the incumbent's
    goodput (a candidate's: a miss there is an early stop)."""
    search = tuning.spec.measure.search
    if trial.role != "Candidate":
        return search, None
    incumbent = next((t for t in trials if t.role == "Incumbent"), None)
    goodput = incumbent.measured_goodput_per_second if incumbent is not None else None
    if goodput is None or goodput <= 0:
        return search, None
    # A search needs room above its start: at the top of the range, just below it.
    low = round(min(goodput, search.max_rate_per_second * 0.99), 6)
    return search.model_copy(update={"min_rate_per_second": low}), low


# A winner must beat the incumbent by more than the run-to-run spread to be applied. The
# spread is the incumbent's two measurements' difference; below MIN_SPREAD it is counted
# as MIN_SPREAD (two searches that land on the same probed rate say little about the
# noise between them), and without a second measurement (remeasureIncumbent: false) the
# margin must exceed UNMEASURED_SPREAD.
MIN_SPREAD: Final = 0.05
UNMEASURED_SPREAD: Final = 0.10


@dataclass(frozen=True)
class Outcome:
    winner: TuningWinner | None
    spread: float | None
    summary: str


def outcome(trials: Sequence[TrialStatus]) -> Outcome:
    """The winner (most measured goodput; the earlier trial among equals, so the incumbent
    keeps a tie), its margins, the spread of the incumbent's two measurements, and whether
    the winner's margin over the incumbent is beyond that spread."""
    by_role = {t.role: t for t in trials if t.role != "Candidate"}
    incumbent = by_role.get("Incumbent")
    defaults = by_role.get("Defaults")
    again = by_role.get("IncumbentAgain")

    def goodput(t: TrialStatus | None) -> float | None:
        return t.measured_goodput_per_second if t is not None and t.state == "Succeeded" else None

    g_inc, g_def, g_again = goodput(incumbent), goodput(defaults), goodput(again)
    spread = abs(g_again - g_inc) / g_inc if g_inc and g_again is not None else None
    ranked = [
        t
        for t in trials
        if t.role != "IncumbentAgain" and t.state == "Succeeded" and goodput(t) is not None
    ]
    if not ranked:
        return Outcome(None, spread, "no trial met the SLO at any rate searched")
    best = ranked[0]
    for t in ranked[1:]:
        if (goodput(t) or 0.0) > (goodput(best) or 0.0):
            best = t
    g = goodput(best)
    assert g is not None
    over_inc = g / g_inc - 1 if g_inc else None
    over_def = g / g_def - 1 if g_def else None
    if best.role == "Incumbent":
        distinguishable, verdict = False, "the incumbent holds: no trial beat it"
    elif over_inc is None:
        distinguishable, verdict = False, "the incumbent met the SLO at no rate searched"
    elif spread is None:
        distinguishable = over_inc > UNMEASURED_SPREAD
        verdict = (
            f"{over_inc:+.1%} over the incumbent, with no run-to-run spread measured "
            f"(remeasureIncumbent), so against {UNMEASURED_SPREAD:.0%}: "
            + ("distinguishable" if distinguishable else "not distinguishable")
        )
    else:
        floor = max(spread, MIN_SPREAD)
        distinguishable = over_inc > floor
        verdict = (
            f"{over_inc:+.1%} over the incumbent, spread {spread:.1%}"
            + (f" (counted as {MIN_SPREAD:.0%})" if spread < MIN_SPREAD else "")
            + (
                ": distinguishable"
                if distinguishable
                else ": within the spread, not distinguishable"
            )
        )
    winner = TuningWinner(
        trial=best.name,
        overrides=dict(best.overrides),
        goodput_per_second=g,
        margin_over_incumbent=None if over_inc is None else round(over_inc, 4),
        margin_over_defaults=None if over_def is None else round(over_def, 4),
        distinguishable=distinguishable,
    )
    return Outcome(
        winner, None if spread is None else round(spread, 4), f"winner {best.name}: {verdict}"
    )


# --- decide: the fingerprint --------------------------------------------------------------


def _node_of(pods: Sequence[Manifest]) -> str | None:
    ready = sorted(
        (p for p in pods if p.get("spec", {}).get("nodeName") and pod_condition(p, "Ready")),
        key=lambda p: str(p["metadata"]["name"]),
    )
    return str(ready[0]["spec"]["nodeName"]) if ready else None


def workload_hash(
    workload: BenchmarkWorkload | None, slo: SLO, declared: Workload | None = None
) -> str:
    """A short digest of the workload and SLO a run measures against, and of the traffic
    the service declares (spec.workload: its lengths and peak): a result measured for a
    service that now expects other traffic is stale even when the run's own workload was
    given in full."""
    text = json.dumps(
        {
            "workload": workload.to_wire() if workload else None,
            "slo": slo.to_wire(),
            "declared": declared.to_wire() if declared is not None else None,
        },
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprint(
    tuning: InferenceTuning, target: InferenceService, observed: Observed, default_image: str
) -> TuningFingerprint:
    """What the target is now: its image, model and revision, the GPU product, count,
    interconnect and power limit where its pods run (the node's GPUNode status, else its
    labels), and the digest of the workload and SLO measured against."""
    hf = target.spec.model.source.hugging_face
    source = target.spec.model.source
    model = (
        hf.repo
        if hf is not None
        else (source.pvc.claim_name + ":" + source.pvc.path)
        if source.pvc is not None
        else source.image.path
        if source.image is not None
        else (source.cache.name if source.cache is not None else None)
    )
    tuned = target.status.tuning if target.status else None
    product = interconnect = None
    power: float | None = None
    node = _node_of(observed.target_pods)
    if node is not None:
        labels = next(
            (
                n["metadata"].get("labels") or {}
                for n in observed.nodes
                if n["metadata"]["name"] == node
            ),
            {},
        )
        product = labels.get(NODE_LABEL_GPU_PRODUCT)
        interconnect = labels.get(NODE_LABEL_GPU_INTERCONNECT)
        gpu_node = next((g for g in observed.gpu_nodes if g["metadata"]["name"] == node), None)
        if gpu_node is not None:
            try:
                status = GPUNodeStatus.model_validate(gpu_node.get("status") or {})
            except ValidationError:
                status = None
            if status is not None and status.gpus:
                product = status.gpus[0].product
                limits = [g.power.current for g in status.gpus if g.power and g.power.current]
                power = min(limits) if limits else None
            if status is not None and status.interconnect:
                interconnect = status.interconnect
    if interconnect is None and tuned is not None and tuned.pod is not None:
        interconnect = tuned.pod.interconnect
    return TuningFingerprint(
        image=target.spec.image or default_image,
        model=model,
        model_revision=hf.revision if hf is not None else None,
        gpu_product=product,
        gpu_count=tuned.gpus_per_replica if tuned is not None else None,
        interconnect=interconnect.lower() if interconnect else None,
        power_limit_watts=power,
        workload_hash=workload_hash(
            effective_workload(tuning, target), effective_slo(tuning, target), target.spec.workload
        ),
    )


def stale_reasons(then: TuningFingerprint, now: TuningFingerprint) -> list[tuple[str, str]]:
    """(reason, what changed) for each fact that differs; a fact unknown on either side is
    not compared."""
    found: list[tuple[str, str]] = []
    for reason, names in STALE_REASONS:
        changes = []
        for name in names:
            a, b = getattr(then, name), getattr(now, name)
            if a is not None and b is not None and a != b:
                changes.append(f"{name} {a} -> {b}" if name != "workload_hash" else "the "
                               "workload or SLO measured against")  # fmt: skip
        if changes:
            found.append((reason, ", ".join(changes)))
    return found


def _stale_condition(
    status: InferenceTuningStatus,
    tuning: InferenceTuning,
    observed: Observed,
    settings: OperatorSettings,
    now: datetime,
    previous: list[Condition],
) -> Condition | None:
    then = status.fingerprint
    gen = tuning.metadata.generation
    if then is None:
        return None
    if observed.target is None:
        return condition(
            "Stale", "Unknown", REASON_TARGET_NOT_FOUND,
            f"InferenceService {tuning.spec.target_ref.name} does not exist.",
            now=now, generation=gen, previous=previous,
        )  # fmt: skip
    current = fingerprint(tuning, observed.target, observed, settings.default_image)
    changed = stale_reasons(then, current)
    if not changed:
        return condition(
            "Stale", False, "Current", "The target is as it was when the run started.",
            now=now, generation=gen, previous=previous,
        )  # fmt: skip
    message = "; ".join(f"{r}: {what}" for r, what in changed)
    return condition(
        "Stale", True, changed[0][0],
        f"The target changed since the run started ({message}): measure again.",
        now=now, generation=gen, previous=previous,
    )  # fmt: skip


# --- decide: the pass ---------------------------------------------------------------------


@dataclass
class _Pass:
    """What a pass decides, gathered as it goes."""

    trials: list[TrialStatus]
    apply: list[Manifest] = field(default_factory=list)
    delete: list[Ref] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    in_place: InPlaceTrial | None = None
    waiting: tuple[str, str] | None = None


def _gpus(target: InferenceService, child: InferenceService | None, in_place: bool) -> int:
    """GPUs a trial holds: its plan's per replica (Beside: one replica), or the target's
    whole set (InPlace)."""
    source = child if child is not None and child.status and child.status.tuning else target
    tuned = source.status.tuning if source.status else None
    per_replica = tuned.gpus_per_replica if tuned and tuned.gpus_per_replica else None
    if per_replica is None:
        count = target.spec.gpu.count
        per_replica = count if isinstance(count, int) else 1
    return per_replica * (max(1, target.spec.replicas) if in_place else 1)


def _seconds(start: datetime | None, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds()) if start is not None else 0.0


def _budget_out(
    tuning: InferenceTuning,
    trials: Sequence[TrialStatus],
    start: datetime | None,
    now: datetime,
    live_gpu_seconds: float,
) -> str | None:
    """Which of the time and GPU budgets has run out, in words; None while both hold."""
    budget = tuning.spec.budget
    if (
        budget.max_duration_seconds is not None
        and _seconds(start, now) >= budget.max_duration_seconds
    ):
        return f"spec.budget.maxDurationSeconds ({budget.max_duration_seconds}) ran out"
    spent = sum(t.gpu_seconds or 0.0 for t in trials) + live_gpu_seconds
    if budget.max_gpu_minutes is not None and spent >= budget.max_gpu_minutes * 60:
        return f"spec.budget.maxGpuMinutes ({budget.max_gpu_minutes:g}) ran out"
    return None


def _child_refs(tuning: InferenceTuning, trial: str) -> list[Ref]:
    """A Beside trial's InferenceService, deleted when the trial ends (its benchmark stays,
    a record owned by the tuning)."""
    name = trial_object_name(tuning, trial)
    return [Ref(API_VERSION, KIND_INFERENCE_SERVICE, name, tuning.metadata.namespace)]


def _ended(trial: TrialStatus, now: datetime, gpus: int) -> TrialStatus:
    return trial.model_copy(
        update={
            "completion_time": now,
            "gpu_seconds": round(gpus * _seconds(trial.start_time, now), 1),
        }
    )


def _trial_event(trial: TrialStatus) -> Event:
    return Event(
        f"Trial{trial.state}",
        f"Trial {trial.name}: {trial.reason or trial.state}",
        warning=trial.state == "Failed",
    )


def _deployment_runs(deployment: Manifest | None, flags: Sequence[str]) -> bool:
    """Whether every pod of the Deployment runs the template whose vLLM container's
    arguments contain ``flags`` (in order), and all are ready."""
    if deployment is None:
        return False
    meta, status = deployment["metadata"], deployment.get("status") or {}
    if int(status.get("observedGeneration", 0)) < int(meta.get("generation", 0)):
        return False
    want = int((deployment.get("spec") or {}).get("replicas", 1))
    counts = [int(status.get(k, 0)) for k in ("updatedReplicas", "replicas", "readyReplicas")]
    if want < 1 or any(c != want for c in counts):
        return False
    return all(
        _contains(_container_args(deployment), flags[i : i + 2]) for i in _flag_starts(flags)
    )


def _container_args(deployment: Manifest) -> list[str]:
    pod = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    for container in pod.get("containers") or []:
        if container.get("name") == CONTAINER:
            return [str(a) for a in container.get("args") or []]
    return []


def _flag_starts(flags: Sequence[str]) -> list[int]:
    return [i for i, f in enumerate(flags) if f.startswith("--")]


def _contains(args: Sequence[str], part: Sequence[str]) -> bool:
    """``part`` (a flag, with its value when it has one) in ``args``."""
    flag = part[0]
    value = part[1] if len(part) > 1 and not part[1].startswith("--") else None
    for i, a in enumerate(args):
        if a == flag and (value is None or (i + 1 < len(args) and args[i + 1] == value)):
            return True
    return False


def _in_place_ready(tuning: InferenceTuning, observed: Observed, trial: TrialStatus) -> bool:
    """The target's pods run the trial: its reconcile says it renders this trial
    (status.measuredFrom), its Deployment's pods all run a template with the trial's
    flags and are ready, and the target is Ready."""
    target = observed.target
    if target is None:
        return False
    mf = observed.measured_from or {}
    if mf.get("name") != tuning.metadata.name or mf.get("trial") != trial.name:
        return False
    ready = find(target.status.conditions if target.status else [], "Ready")
    if ready is None or ready.status != "True":
        return False
    version = target.status.tuning.vllm_version if target.status and target.status.tuning else None
    flags = release_flags([_Arg(k, v) for k, v in sorted(trial.overrides.items())], version)
    return _deployment_runs(observed.target_deployment, flags)


@dataclass(frozen=True)
class _Arg:
    name: str
    value: str


def _child_ready(child: InferenceService) -> bool:
    st = child.status
    if st is None or st.observed_generation != child.metadata.generation:
        return False
    ready = find(st.conditions, "Ready")
    return ready is not None and ready.status == "True"


def _child_stalled(child: InferenceService) -> str | None:
    stalled = find(child.status.conditions if child.status else [], "Stalled")
    if stalled is not None and stalled.status == "True":
        return f"{stalled.reason}: {stalled.message}"
    return None


def _start_timed_out(trial: TrialStatus, now: datetime) -> bool:
    return _seconds(trial.start_time, now) >= TRIAL_START_SECONDS


def _advance(
    tuning: InferenceTuning, observed: Observed, now: datetime, p: _Pass, index: int
) -> None:
    """Move the trial at ``index`` (Starting or Measuring) as far as the observation
    allows."""
    target = observed.target
    assert target is not None
    trial = p.trials[index]
    in_place = tuning.spec.strategy == "InPlace"
    name = trial_object_name(tuning, trial.name)
    child = observed.services.get(name)
    gpus = _gpus(target, child, in_place)

    def end(state: str, reason: str, *, ours: bool = True, **fields: Any) -> None:
        ended = _ended(
            trial.model_copy(update={"state": state, "reason": reason, **fields}), now, gpus
        )
        p.trials[index] = ended
        p.events.append(_trial_event(ended))
        if ours and not in_place:
            p.delete.extend(_child_refs(tuning, trial.name))

    if name in observed.taken:
        end(
            "Failed",
            f"an InferenceService or InferenceBenchmark named {name} exists and is not this "
            f"tuning's (no label {LABEL_TUNING}={tuning.metadata.name}); not applied over",
            ours=False,
        )
        return
    if trial.state == "Starting":
        if in_place:
            p.in_place = InPlaceTrial(trial=trial.name, overrides=dict(trial.overrides))
            ready = _in_place_ready(tuning, observed, trial)
            waiting = f"waiting for InferenceService {target.metadata.name}'s pods to run it"
        else:
            p.apply.append(build_trial_service(tuning, target, trial.name, trial.overrides))
            stalled = _child_stalled(child) if child is not None else None
            if stalled is not None:
                end("Failed", f"InferenceService {name} is stalled: {stalled}")
                return
            ready = child is not None and _child_ready(child)
            waiting = f"waiting for InferenceService {name} to be Ready"
        if not ready:
            if _start_timed_out(trial, now):
                end("Failed", f"not Ready within {TRIAL_START_SECONDS} s of its start ({waiting})")
                return
            p.trials[index] = trial.model_copy(update={"reason": waiting})
            return
        runner = target if in_place else child
        assert runner is not None
        arguments = (
            _container_args(observed.target_deployment or {})
            if in_place
            else vllm_args(runner, runner.status.tuning)  # type: ignore[union-attr,arg-type]
        )
        trial = trial.model_copy(
            update={
                "state": "Measuring",
                "arguments": arguments,
                "reason": f"InferenceBenchmark {name} is measuring",
            }
        )
        p.trials[index] = trial
    # Measuring.
    if in_place:
        p.in_place = InPlaceTrial(trial=trial.name, overrides=dict(trial.overrides))
    elif child is None:
        p.apply.append(build_trial_service(tuning, target, trial.name, trial.overrides))
    bench = observed.benchmarks.get(name)
    search, early = trial_search(tuning, trial, p.trials)
    if bench is None:
        workload = effective_workload(tuning, target)
        assert workload is not None  # refused before the run started otherwise
        p.apply.append(
            build_trial_benchmark(
                tuning,
                trial.name,
                target=target.metadata.name if in_place else name,
                workload=workload,
                slo=effective_slo(tuning, target),
                search=search,
            )
        )
        return
    done = read_benchmark(trial, bench, early_stop_at=early)
    if done is None:
        return
    ended = _ended(done, now, gpus)
    p.trials[index] = ended
    p.events.append(_trial_event(ended))
    if not in_place:
        p.delete.extend(_child_refs(tuning, trial.name))


def _finish_trials(p: _Pass, reason: str, now: datetime, gpus: int) -> None:
    """The budget ran out: the running trial stops, the pending ones are skipped."""
    for i, t in enumerate(p.trials):
        if t.state in ACTIVE:
            p.trials[i] = _ended(
                t.model_copy(update={"state": "StoppedEarly", "reason": f"stopped: {reason}"}),
                now,
                gpus,
            )
            p.events.append(_trial_event(p.trials[i]))
        elif t.state == "Pending":
            p.trials[i] = t.model_copy(
                update={"state": "Skipped", "reason": f"not measured: {reason}"}
            )


def _conditions(
    tuning: InferenceTuning,
    phase: str,
    reason: str,
    message: str,
    *,
    running: tuple[bool, str, str],
    stale: Condition | None,
    now: datetime,
) -> list[Condition]:
    old = tuning.status.conditions if tuning.status else []
    gen = tuning.metadata.generation
    done, failed = phase == "Succeeded", phase == "Failed"
    conds = phase_conditions(
        reason, message, ready=done, reconciling=not (done or failed), stalled=failed,
        now=now, generation=gen, previous=old,
    )  # fmt: skip
    conds.append(
        condition(
            "Running", running[0], running[1], running[2], now=now, generation=gen, previous=old
        )
    )
    if stale is not None:
        conds.append(stale)
    return conds


def _refused_step(tuning: InferenceTuning, refused: Refusal, now: datetime) -> Step:
    old = tuning.status or InferenceTuningStatus()
    status = old.model_copy(
        update={
            "observed_generation": tuning.metadata.generation,
            "phase": refused.phase,
            "completion_time": now if refused.phase == "Failed" else None,
            "conditions": _conditions(
                tuning, refused.phase, refused.reason, refused.message,
                running=(False, refused.reason, "Nothing is running."), stale=None, now=now,
            ),
        }
    )  # fmt: skip
    return _step(tuning, status, requeue=REQUEUE_SECONDS if refused.phase == "Pending" else None)


def _step(
    tuning: InferenceTuning,
    status: InferenceTuningStatus,
    *,
    apply: Sequence[Manifest] = (),
    delete: Sequence[Ref] = (),
    events: Sequence[Event] = (),
    requeue: float | None = None,
) -> Step:
    event = phase_event(tuning.status, status)
    assert status.phase is not None
    return Step(
        status.phase,
        status,
        tuple(apply),
        tuple(delete),
        tuple(events) + ((event,) if event else ()),
        requeue,
    )


def _terminal_step(
    tuning: InferenceTuning, observed: Observed, now: datetime, settings: OperatorSettings
) -> Step:
    """A finished run: a record. Only Stale moves; a trial InferenceService or a lock Job
    left behind (the operator stopped between its end and their deletion) goes."""
    old = tuning.status
    assert old is not None and old.phase is not None
    stale = _stale_condition(old, tuning, observed, settings, now, old.conditions)
    conditions = [c for c in old.conditions if c.type != "Stale"] + ([stale] if stale else [])
    status = old.model_copy(update={"conditions": conditions})
    delete = _leftovers(tuning, observed)
    return Step(old.phase, status, (), tuple(delete), (), settings.resync_seconds)


def next_step(
    tuning: InferenceTuning, observed: Observed, now: datetime, *, settings: OperatorSettings
) -> Step:
    """The pass's step, pure: Pending until every input is usable, then the trials one at
    a time, then the winner (Succeeded) or Failed."""
    old = tuning.status or InferenceTuningStatus()
    if old.phase in TERMINAL:
        return _terminal_step(tuning, observed, now, settings)
    in_place = tuning.spec.strategy == "InPlace"
    target = observed.target
    status = old
    if not old.trials:
        refused = refusal(tuning, observed, settings)
        if refused is not None:
            return _refused_step(tuning, refused, now)
        assert target is not None
        status = old.model_copy(
            update={
                "trials": layout(tuning, target, observed.plan, _release(target, settings)),
                "fingerprint": fingerprint(tuning, target, observed, settings.default_image),
                "start_time": now,
            }
        )
    p = _Pass(list(status.trials), in_place=status.in_place)
    if target is None:
        # The target went mid-run: nothing is left to measure against.
        name = tuning.spec.target_ref.name
        _finish_trials(p, f"InferenceService {name} was deleted", now, 1)
        p.delete += _leftovers(tuning, observed)
        failure = Refusal(
            "Failed", REASON_TARGET_NOT_FOUND,
            f"InferenceService {name} (spec.targetRef.name) was deleted during the run.",
        )  # fmt: skip
        return _running_or_done(tuning, observed, now, settings, status, p, failure=failure)
    own_lock = any(j["metadata"].get("name") == lock_job_name(tuning) for j in observed.lock_jobs)
    if in_place and not own_lock:
        p.apply.append(
            build_lock_job(tuning, target=target.metadata.name, image=settings.warmup_image)
        )
    active = next((i for i, t in enumerate(p.trials) if t.state in ACTIVE), None)
    live, gpus = 0.0, _gpus(target, None, in_place)
    if active is not None:
        child = observed.services.get(trial_object_name(tuning, p.trials[active].name))
        gpus = _gpus(target, child, in_place)
        live = gpus * _seconds(p.trials[active].start_time, now)
    out = _budget_out(tuning, p.trials, status.start_time, now, live)
    if out is not None:
        if active is not None:
            # A search stopped midway measured nothing whole: its benchmark goes too.
            name = trial_object_name(tuning, p.trials[active].name)
            p.delete.append(
                Ref(API_VERSION, KIND_INFERENCE_BENCHMARK, name, tuning.metadata.namespace)
            )
            if not in_place:
                p.delete += _child_refs(tuning, p.trials[active].name)
        _finish_trials(p, out, now, gpus)
        return _running_or_done(tuning, observed, now, settings, status, p)
    index = active
    if index is None:
        index = next((i for i, t in enumerate(p.trials) if t.state == "Pending"), None)
        holder = foreign_lock(tuning, observed.lock_jobs) if in_place else None
        if index is not None and holder is not None:
            p.waiting = (
                REASON_BENCHMARK_RUNNING,
                f"InferenceBenchmark {holder} runs on InferenceService {target.metadata.name}; "
                f"trial {p.trials[index].name} starts once it ends.",
            )
            index = None
        elif index is not None:
            p.trials[index] = p.trials[index].model_copy(
                update={
                    "state": "Starting",
                    "start_time": now,
                    "benchmark": trial_object_name(tuning, p.trials[index].name),
                }
            )
    if index is not None:
        # One trial at a time: a trial that ends here lets the next one start in the next
        # pass, once the deletion of its InferenceService is under way.
        _advance(tuning, observed, now, p, index)
    return _running_or_done(tuning, observed, now, settings, status, p)


def _leftovers(tuning: InferenceTuning, observed: Observed) -> list[Ref]:
    """Trial InferenceServices still there, and the tuning's own lock Job."""
    ns = tuning.metadata.namespace
    refs = [Ref(API_VERSION, KIND_INFERENCE_SERVICE, n, ns) for n in sorted(observed.services)]
    own = lock_job_name(tuning)
    if any(j["metadata"].get("name") == own for j in observed.lock_jobs):
        refs.append(Ref("batch/v1", "Job", own, ns))
    return refs


def _running_or_done(
    tuning: InferenceTuning,
    observed: Observed,
    now: datetime,
    settings: OperatorSettings,
    status: InferenceTuningStatus,
    p: _Pass,
    *,
    failure: Refusal | None = None,
) -> Step:
    """The status after the pass: Running with the trial under way, or, once every trial
    ended (or ``failure``), the outcome."""
    ns = tuning.metadata.namespace
    gen = tuning.metadata.generation
    old_conditions = tuning.status.conditions if tuning.status else []
    stale_base = status.model_copy(update={"trials": p.trials})
    stale = _stale_condition(stale_base, tuning, observed, settings, now, old_conditions)
    spent = round(sum(t.gpu_seconds or 0.0 for t in p.trials), 1)
    elapsed = round(_seconds(status.start_time, now), 1)
    if failure is not None or all(t.state in ENDED for t in p.trials):
        result = outcome(p.trials)
        measured = any(t.state in ("Succeeded", "StoppedEarly") for t in p.trials)
        ended_well = measured and failure is None
        phase = ("Failed", "Succeeded")[ended_well]
        done = sum(1 for t in p.trials if t.state != "Skipped")
        if failure is not None:
            reason, message = failure.reason, failure.message
        elif measured:
            reason = "Completed"
            message = f"{done} of {len(p.trials)} trials measured; {result.summary}."
        else:
            reason = "NoTrialMeasured"
            message = "No trial measured anything (see status.trials[].reason)."
        final = status.model_copy(
            update={
                "observed_generation": gen,
                "phase": phase,
                "trials": p.trials,
                "winner": result.winner,
                "spread": result.spread,
                "in_place": None,
                "completion_time": now,
                "elapsed_seconds": elapsed,
                "gpu_seconds": spent,
                "conditions": _conditions(
                    tuning, phase, reason, message,
                    running=(False, reason, "The run has ended."), stale=stale, now=now,
                ),
            }
        )  # fmt: skip
        delete = list(p.delete)
        lock = Ref("batch/v1", "Job", lock_job_name(tuning), ns)
        if tuning.spec.strategy == "InPlace" and lock not in delete:
            delete.append(lock)
        # The run is over: no lock to take any more.
        applied = [m for m in p.apply if m["kind"] != "Job"]
        return _step(
            tuning, final, apply=applied, delete=delete, events=p.events,
            requeue=settings.resync_seconds,
        )  # fmt: skip
    current = next((t for t in p.trials if t.state in ACTIVE), None)
    position = (
        f"Trial {current.name} ({p.trials.index(current) + 1} of {len(p.trials)}): "
        f"{current.reason or current.state}."
        if current is not None
        else "Between trials."
    )
    reason, message = p.waiting or ("Running", position)
    changed = p.trials != list(status.trials) or status.phase != "Running"
    running = status.model_copy(
        update={
            "observed_generation": gen,
            "phase": "Running",
            "trials": p.trials,
            "in_place": p.in_place,
            "elapsed_seconds": elapsed if changed else status.elapsed_seconds,
            "gpu_seconds": spent,
            "conditions": _conditions(
                tuning, "Running", reason, message,
                running=(True, reason, message), stale=stale, now=now,
            ),
        }
    )  # fmt: skip
    return _step(
        tuning, running, apply=p.apply, delete=p.delete, events=p.events,
        requeue=REQUEUE_SECONDS if current is not None or p.waiting else 1.0,
    )  # fmt: skip


# --- apply --------------------------------------------------------------------------------


async def apply_step(api: ClusterAPI, body: Manifest, tuning: InferenceTuning, step: Step) -> None:
    """The step's objects, its deletions, then its status (only when it changed) with its
    events."""
    await apply_all(api, step.apply)
    await delete_all(api, step.delete)
    if step.status is not None:
        await write_phase_status(api, body, tuning.status, step.status, step.events)


async def reconcile_inference_tuning(
    api: ClusterAPI,
    body: Manifest,
    *,
    settings: OperatorSettings,
    nodes: list[Manifest] | None = None,
    gpu_nodes: list[Manifest] | None = None,
    now: datetime | None = None,
) -> Step:
    """Advance one InferenceTuning; returns the step it took (its phase and when to look
    again)."""
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    try:
        tuning = InferenceTuning.model_validate(body)
    except ValidationError as err:
        log.warning("InferenceTuning is invalid.", extra={"error": str(err)})
        return Step("Failed")
    observed = await observe(api, tuning, settings=settings, nodes=nodes, gpu_nodes=gpu_nodes)
    step = next_step(tuning, observed, now, settings=settings)
    await apply_step(api, body, tuning, step)
    finished = step.status is not None and step.status.phase == "Succeeded"
    if finished and (tuning.status is None or tuning.status.phase != "Succeeded"):
        assert step.status is not None
        await _record(api, settings, tuning, step.status, observed.target)
    return step


async def _record(
    api: ClusterAPI,
    settings: OperatorSettings,
    tuning: InferenceTuning,
    status: InferenceTuningStatus,
    target: InferenceService | None,
) -> None:
    """The run's measured trials into the measurements ConfigMap, once, as it succeeds
    (k8s/measurements.py; later plans of the same shape read them). A failed write is
    logged and not retried: the figures stay in the tuning's status."""
    if target is None:
        return
    records = measurement_records(tuning, status, target)
    if not records:
        return
    try:
        keys = await record_measurements(api, settings.own_namespace, records)
    except ApiError as err:
        log.warning(
            "Measurements not recorded.",
            extra={"tuning": tuning.metadata.name, "error": str(err)[:300]},
        )
        return
    log.info("Measurements recorded.", extra={"tuning": tuning.metadata.name, "keys": keys})


def measurement_records(
    tuning: InferenceTuning, status: InferenceTuningStatus, target: InferenceService
) -> list[Measurement]:
    """One record per trial that measured a goodput, of the shape the run's fingerprint
    holds (none without a model or a GPU product to file it under)."""
    fp = status.fingerprint
    if fp is None or not fp.model or not fp.gpu_product:
        return []
    workload = effective_workload(tuning, target)
    if workload is None or workload.prompt_tokens is None or workload.output_tokens is None:
        return []
    summary = WorkloadSummary(
        prompt_tokens_mean=lengths.mean(workload.prompt_tokens),
        output_tokens_mean=lengths.mean(workload.output_tokens),
        peak_concurrency=target.spec.workload.peak_concurrency,
    )
    slo = effective_slo(tuning, target)
    in_place = tuning.spec.strategy == "InPlace"
    records = []
    for trial in status.trials:
        goodput, ttft, tpot = trial.measured_goodput_per_second, trial.ttft, trial.tpot
        if trial.state != "Succeeded" or not goodput or not fp.image:
            continue
        if ttft is None or tpot is None or None in (ttft.p50, ttft.p99, tpot.p50, tpot.p99):
            continue
        assert ttft.p50 is not None and ttft.p99 is not None
        assert tpot.p50 is not None and tpot.p99 is not None
        when = trial.completion_time or status.completion_time
        if when is None:
            continue
        records.append(
            Measurement(
                model=target.spec.model.name or fp.model,
                model_revision=fp.model_revision,
                image=fp.image,
                gpu_product=fp.gpu_product,
                gpu_count=fp.gpu_count or 1,
                # InPlace measures the service's own replicas; Beside, one trial replica.
                replicas=max(1, target.spec.replicas) if in_place else 1,
                interconnect=fp.interconnect,
                arguments=command_values(trial.arguments),
                goodput_per_second=goodput,
                ttft=LatencyPercentiles(p50=ttft.p50, p99=ttft.p99),
                tpot=LatencyPercentiles(p50=tpot.p50, p99=tpot.p99),
                slo_attainment=trial.slo_attainment or 0.0,
                slo=slo,
                workload=summary,
                predicted_goodput_per_second=trial.predicted_goodput_per_second,
                measured_at=when,
                tuning=MeasuredBy(
                    namespace=tuning.metadata.namespace or "",
                    name=tuning.metadata.name,
                    trial=trial.name,
                ),
            )
        )
    return records
