"""The InferenceTuning's decision (``next_step``), with no fake API: an observation in,
the step out (status, objects to apply and delete, events). The search order, the early
stop, the three budgets, the winner with its margins and spread, Stale, every bad input,
a resume after a restart, and an InPlace run's refusal and handshake."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.specs import BASE, lock_job
from vllm_operator.constants import LABEL_TRIAL, LABEL_TUNING
from vllm_operator.models import InferenceBenchmark, InferenceService, InferenceTuning
from vllm_operator.models.base import Manifest
from vllm_operator.models.conditions import find
from vllm_operator.models.inference_tuning import TrialStatus
from vllm_operator.reconcile import tuning as tuning_reconcile
from vllm_operator.reconcile.steps import Ref
from vllm_operator.reconcile.tuning import Observed, Step, next_step, outcome
from vllm_operator.render.trials import build_lock_job, build_trial_benchmark, build_trial_service
from vllm_operator.settings import OperatorSettings
from vllm_operator.tuning.trials import TrialCandidate

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
START = NOW - timedelta(minutes=10)
SETTINGS = OperatorSettings()
API = "inference.vllm-operator.dev/v1alpha1"
NS = "team-a"

TUNING: dict[str, Any] = {
    "apiVersion": API,
    "kind": "InferenceTuning",
    "metadata": {"name": "fast", "namespace": NS, "uid": "t-1", "generation": 1},
    "spec": {
        "targetRef": {"name": "chat"},
        "candidates": [
            {"name": "seqs-8", "overrides": {"max-num-seqs": "8"}},
            {"name": "eager", "overrides": {"enforce-eager": "true"}},
        ],
        "measure": {
            "search": {"minRatePerSecond": 0.5, "maxRatePerSecond": 16},
            "durationSeconds": 30,
        },
    },
}


def _tuning(
    spec: dict[str, Any] | None = None, status: dict[str, Any] | None = None
) -> InferenceTuning:
    body = copy.deepcopy(TUNING)
    body["spec"].update(spec or {})
    if status is not None:
        body["status"] = status
    return InferenceTuning.model_validate(body)


def _ready(status: bool = True, reason: str = "AllReplicasReady") -> dict[str, Any]:
    return {
        "type": "Ready",
        "status": "True" if status else "False",
        "reason": reason,
        "message": "",
        "lastTransitionTime": "2026-12-07T11:00:00Z",
    }


def _target_body(*, ready: bool = True, image: str | None = None, **spec: Any) -> Manifest:
    body = copy.deepcopy(BASE)
    body["spec"].update(
        {
            "workload": {
                "promptTokens": {"type": "Fixed", "value": 128},
                "outputTokens": {"type": "Fixed", "value": 64},
            },
            "slo": {"ttftP99Milliseconds": 500},
            "tuning": {"overrides": {"max-model-len": "4096"}},
        }
    )
    if image is not None:
        body["spec"]["image"] = image
    body["spec"].update(spec)
    body["status"] = {
        "observedGeneration": 3,
        "conditions": [_ready(ready)],
        "tuning": {
            "plannedBy": "Tuner",
            "vllmVersion": "0.32.0",
            "gpusPerReplica": 1,
            "arguments": [
                {"name": "max-model-len", "value": "4096", "source": "Override", "reason": "x"},
                {"name": "max-num-seqs", "value": "256", "source": "Tuner", "reason": "x"},
                {"name": "enforce-eager", "value": "true", "source": "Tuner", "reason": "x"},
                {
                    "name": "gpu-memory-utilization",
                    "value": "0.92",
                    "source": "Tuner",
                    "reason": "x",
                },
            ],
        },
    }
    return body


def _target(**kwargs: Any) -> InferenceService:
    return InferenceService.model_validate(_target_body(**kwargs))


TARGET = _target()


def _child(
    tuning: InferenceTuning,
    trial: str,
    overrides: dict[str, str],
    *,
    ready: bool = True,
    stalled: bool = False,
) -> InferenceService:
    body = build_trial_service(tuning, TARGET, trial, overrides)
    body["metadata"]["generation"] = 1
    conditions = [_ready(ready)]
    if stalled:
        conditions.append(
            {
                "type": "Stalled",
                "status": "True",
                "reason": "WeightsDoNotFit",
                "message": "no GPU holds it",
                "lastTransitionTime": "2026-12-07T11:00:00Z",
            }
        )
    body["status"] = {
        "observedGeneration": 1,
        "conditions": conditions,
        "tuning": {
            "plannedBy": "Tuner",
            "vllmVersion": "0.32.0",
            "gpusPerReplica": 2,
            "arguments": [
                {"name": k, "value": v, "source": "Override", "reason": "x"}
                for k, v in sorted(body["spec"]["tuning"]["overrides"].items())
            ],
        },
    }
    return InferenceService.model_validate(body)


def _level(rate: float, verdict: str, **extra: Any) -> dict[str, Any]:
    return {
        "ratePerSecond": rate,
        "requests": 100,
        "succeeded": 99 if verdict == "Met" else 60,
        "failed": 1 if verdict == "Met" else 40,
        "sloAttainment": 0.995 if verdict == "Met" else 0.6,
        "sloVerdict": verdict,
        "errored": 1,
        "fromScheduled": {
            "ttft": {"p50": 80.0, "p99": 300.0 + rate, "p999": 450.0 + rate},
            "tpot": {"p50": 10.0, "p99": 20.0, "p999": 31.0},
        },
        **extra,
    }


def _bench(
    tuning: InferenceTuning,
    trial: str,
    phase: str | None,
    levels: list[dict[str, Any]],
    *,
    target: str | None = None,
    low: float = 0.5,
) -> InferenceBenchmark:
    measure = tuning.spec.measure
    body = build_trial_benchmark(
        tuning,
        trial,
        target=target or f"fast-{trial}",
        workload=tuning_reconcile.effective_workload(tuning, TARGET),  # type: ignore[arg-type]
        slo=tuning_reconcile.effective_slo(tuning, TARGET),
        search=measure.search.model_copy(update={"min_rate_per_second": low}),
    )
    if phase is not None:
        status: dict[str, Any] = {"phase": phase, "levels": levels}
        if phase == "Failed":
            status["conditions"] = [
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "LoadFailed",
                    "message": "Job fast-x-load failed: boom",
                    "lastTransitionTime": "2026-12-07T11:00:00Z",
                }
            ]
        body["status"] = status
    return InferenceBenchmark.model_validate(body)


def _trial(name: str, role: str, state: str = "Pending", **fields: Any) -> dict[str, Any]:
    return {"name": name, "role": role, "state": state, **fields}


def _running(trials: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"phase": "Running", "startTime": START.isoformat(), "trials": trials, **extra}


LAID_OUT = [
    _trial("incumbent", "Incumbent"),
    _trial("seqs-8", "Candidate", overrides={"max-num-seqs": "8"}),
    _trial("eager", "Candidate", overrides={"enforce-eager": "true"}),
    _trial("defaults", "Defaults", overrides={"max-num-seqs": "8"}),
    _trial("incumbent-again", "IncumbentAgain"),
]


def _step(tuning: InferenceTuning, observed: Observed, now: datetime = NOW) -> Step:
    return next_step(tuning, observed, now, settings=SETTINGS)


def _trials(step: Step) -> dict[str, TrialStatus]:
    assert step.status is not None
    return {t.name: t for t in step.status.trials}


def _reason(step: Step, type_: str = "Ready") -> str:
    assert step.status is not None
    cond = find(step.status.conditions, type_)
    assert cond is not None
    return f"{cond.status}/{cond.reason}: {cond.message}"


def _applied(step: Step) -> list[str]:
    return [f"{m['kind']}/{m['metadata']['name']}" for m in step.apply]


# --- the search order ------------------------------------------------------------------------


def test_the_run_lays_out_incumbent_candidates_by_prediction_defaults_then_incumbent_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tuner's candidates, best predicted first; one that cannot fit is Skipped with the
    tuner's reason, at the end."""
    space = [
        TrialCandidate("seqs-64", {"max-num-seqs": "64"}, 3.0, "fewer sequences"),
        TrialCandidate("tp2", {"tensor-parallel-size": "2"}, 9.0, "two GPUs", fits=False),
        TrialCandidate("eager", {"enforce-eager": "true"}, 5.0, "no CUDA graphs"),
        TrialCandidate("chunked", {"enable-chunked-prefill": "true"}, None, "chunked prefill"),
    ]
    monkeypatch.setattr(tuning_reconcile, "candidate_space", lambda plan: space)
    tuning = _tuning({"candidates": [], "budget": {"maxTrials": 8}})
    step = _step(tuning, Observed(target=TARGET, plan=object()))  # type: ignore[arg-type]
    trials = step.status.trials if step.status else []
    assert [t.name for t in trials] == [
        "incumbent",
        "eager",
        "seqs-64",
        "chunked",
        "defaults",
        "incumbent-again",
        "tp2",
    ]
    assert [t.state for t in trials] == ["Starting"] + ["Pending"] * 5 + ["Skipped"]
    assert trials[-1].reason == "two GPUs"
    assert trials[1].predicted_goodput_per_second == 5.0


def test_the_spec_candidates_keep_their_order_without_predictions() -> None:
    step = _step(_tuning(), Observed(target=TARGET))
    assert [t.name for t in _trials(step).values()] == [
        "incumbent",
        "seqs-8",
        "eager",
        "defaults",
        "incumbent-again",
    ]


def test_the_defaults_trial_sets_the_plans_flags_back_to_vllms_defaults() -> None:
    """enforce-eager and gpu-memory-utilization have defaults vLLM takes as a value;
    max-num-seqs is decided by vLLM at start, which no override can ask for: said so.
    The user's own override (max-model-len) stays."""
    tuning = _tuning({"budget": {"maxTrials": 8}})
    defaults = _trials(_step(tuning, Observed(target=TARGET)))["defaults"]
    assert defaults.overrides == {"enforce-eager": "false"}
    assert defaults.reason is not None and "max-num-seqs" in defaults.reason


# --- Beside: a trial's children ---------------------------------------------------------------


def test_the_first_pass_starts_the_incumbent_beside_the_target() -> None:
    step = _step(_tuning(), Observed(target=TARGET))
    assert step.phase == "Running"
    assert _applied(step) == ["InferenceService/fast-incumbent"]
    child = step.apply[0]
    assert child["spec"]["replicas"] == 1
    assert child["spec"]["autoscaling"]["enabled"] is False
    assert child["spec"]["tuning"]["overrides"] == {"max-model-len": "4096"}
    assert child["metadata"]["labels"][LABEL_TUNING] == "fast"
    assert child["metadata"]["labels"][LABEL_TRIAL] == "incumbent"
    owner = child["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "InferenceTuning",
        "fast",
        "t-1",
        True,
    )
    assert step.status is not None and step.status.start_time == NOW
    assert step.status.fingerprint is not None
    assert step.status.fingerprint.model == "Qwen/Qwen2.5-0.5B-Instruct"


def test_a_candidates_child_lays_its_overrides_over_the_targets() -> None:
    tuning = _tuning(
        status=_running(
            [
                _trial("incumbent", "Incumbent", "Succeeded", measuredGoodputPerSecond=4.0),
                _trial("seqs-8", "Candidate", overrides={"max-num-seqs": "8"}),
            ]
        )
    )
    step = _step(tuning, Observed(target=TARGET))
    assert step.apply[0]["spec"]["tuning"]["overrides"] == {
        "max-model-len": "4096",
        "max-num-seqs": "8",
    }


def test_a_ready_child_gets_its_benchmark_and_the_trial_records_its_arguments() -> None:
    tuning = _tuning(
        status=_running([_trial("incumbent", "Incumbent", "Starting", startTime=START.isoformat())])
    )
    child = _child(tuning, "incumbent", {})
    step = _step(tuning, Observed(target=TARGET, services={"fast-incumbent": child}))
    assert _applied(step) == [
        "InferenceService/fast-incumbent",
        "InferenceBenchmark/fast-incumbent",
    ]
    bench = step.apply[1]["spec"]
    assert bench["mode"] == "Search"
    assert bench["targetRef"] == {"name": "fast-incumbent"}
    assert bench["search"]["minRatePerSecond"] == 0.5
    assert bench["slo"] == {"ttftP99Milliseconds": 500}  # the target's
    assert bench["workload"]["promptTokens"] == {"type": "Fixed", "value": 128}
    trial = _trials(step)["incumbent"]
    assert trial.state == "Measuring"
    assert "--max-model-len" in trial.arguments and "4096" in trial.arguments


def test_a_child_not_ready_yet_keeps_the_trial_starting() -> None:
    tuning = _tuning(
        status=_running([_trial("incumbent", "Incumbent", "Starting", startTime=START.isoformat())])
    )
    child = _child(tuning, "incumbent", {}, ready=False)
    step = _step(tuning, Observed(target=TARGET, services={"fast-incumbent": child}))
    assert _applied(step) == ["InferenceService/fast-incumbent"]
    assert _trials(step)["incumbent"].state == "Starting"
    assert step.requeue is not None


def test_a_stalled_child_fails_its_trial_and_goes() -> None:
    tuning = _tuning(
        status=_running([_trial("incumbent", "Incumbent", "Starting", startTime=START.isoformat())])
    )
    child = _child(tuning, "incumbent", {}, ready=False, stalled=True)
    step = _step(tuning, Observed(target=TARGET, services={"fast-incumbent": child}))
    trial = _trials(step)["incumbent"]
    assert trial.state == "Failed"
    assert trial.reason and "WeightsDoNotFit" in trial.reason
    assert Ref(API, "InferenceService", "fast-incumbent", NS) in step.delete


def test_a_name_someone_else_holds_is_never_applied_over() -> None:
    tuning = _tuning(status=_running([_trial("incumbent", "Incumbent")]))
    step = _step(tuning, Observed(target=TARGET, taken=frozenset({"fast-incumbent"})))
    assert not [a for a in _applied(step) if a.endswith("fast-incumbent")]
    assert step.delete == ()  # someone else's: never deleted either
    trial = _trials(step)["incumbent"]
    assert trial.state == "Failed" and trial.reason and "not this tuning's" in trial.reason


def test_a_finished_benchmark_records_the_trial_and_removes_its_service() -> None:
    tuning = _tuning(
        status=_running(
            [
                _trial("incumbent", "Incumbent", "Measuring", startTime=START.isoformat()),
                _trial("seqs-8", "Candidate", overrides={"max-num-seqs": "8"}),
            ]
        )
    )
    child = _child(tuning, "incumbent", {})
    bench = _bench(
        tuning,
        "incumbent",
        "Succeeded",
        [_level(1.0, "Met"), _level(2.0, "Met"), _level(4.0, "Missed"), _level(3.0, "Met")],
    )
    step = _step(
        tuning,
        Observed(
            target=TARGET,
            services={"fast-incumbent": child},
            benchmarks={"fast-incumbent": bench},
        ),
    )
    trial = _trials(step)["incumbent"]
    assert trial.state == "Succeeded"
    assert trial.measured_goodput_per_second == 3.0
    assert trial.ttft is not None and trial.ttft.p999 == 453.0 and trial.ttft.p99 == 303.0
    assert trial.tpot is not None and trial.tpot.p999 == 31.0
    assert (trial.slo_attainment, trial.errors) == (0.995, 1)
    # Two GPUs (the child's plan) for ten minutes.
    assert trial.gpu_seconds == 1200.0 and trial.completion_time == NOW
    assert step.delete == (Ref(API, "InferenceService", "fast-incumbent", NS),)
    assert [e.reason for e in step.events] == ["TrialSucceeded"]
    assert _trials(step)["seqs-8"].state == "Pending"  # the next pass starts it
    assert step.requeue is not None and step.requeue <= 1


def test_a_noisy_pass_above_a_miss_does_not_count() -> None:
    """As the search takes it: a failure wins over a pass above it."""
    tuning = _tuning(
        status=_running(
            [_trial("incumbent", "Incumbent", "Measuring", startTime=START.isoformat())]
        )
    )
    bench = _bench(
        tuning,
        "incumbent",
        "Succeeded",
        [_level(1.0, "Met"), _level(2.0, "Missed"), _level(4.0, "Met")],
    )
    step = _step(
        tuning,
        Observed(
            target=TARGET,
            benchmarks={"fast-incumbent": bench},
            services={"fast-incumbent": _child(tuning, "incumbent", {})},
        ),
    )
    assert _trials(step)["incumbent"].measured_goodput_per_second == 1.0


def test_a_failed_benchmark_fails_its_trial_with_the_benchmarks_words() -> None:
    tuning = _tuning(
        status=_running(
            [_trial("incumbent", "Incumbent", "Measuring", startTime=START.isoformat())]
        )
    )
    bench = _bench(tuning, "incumbent", "Failed", [])
    step = _step(
        tuning,
        Observed(
            target=TARGET,
            benchmarks={"fast-incumbent": bench},
            services={"fast-incumbent": _child(tuning, "incumbent", {})},
        ),
    )
    trial = _trials(step)["incumbent"]
    assert trial.state == "Failed" and trial.reason and "boom" in trial.reason
    assert step.phase == "Failed"  # nothing else to measure: no trial measured anything
    assert _reason(step).startswith("False/NoTrialMeasured")


# --- early stop -----------------------------------------------------------------------------


def _after_incumbent(state: str = "Starting", goodput: float | None = 4.0) -> InferenceTuning:
    return _tuning(
        status=_running(
            [
                _trial("incumbent", "Incumbent", "Succeeded", measuredGoodputPerSecond=goodput),
                _trial(
                    "seqs-8",
                    "Candidate",
                    state,
                    overrides={"max-num-seqs": "8"},
                    startTime=START.isoformat(),
                ),
                _trial("defaults", "Defaults", "Pending"),
            ]
        )
    )


def test_a_candidates_search_starts_at_the_incumbents_goodput() -> None:
    tuning = _after_incumbent()
    child = _child(tuning, "seqs-8", {"max-num-seqs": "8"})
    step = _step(tuning, Observed(target=TARGET, services={"fast-seqs-8": child}))
    bench = next(m for m in step.apply if m["kind"] == "InferenceBenchmark")
    assert bench["spec"]["search"]["minRatePerSecond"] == 4.0
    assert bench["spec"]["search"]["maxRatePerSecond"] == 16


def test_the_defaults_search_spans_the_whole_range() -> None:
    tuning = _tuning(
        status=_running(
            [
                _trial("incumbent", "Incumbent", "Succeeded", measuredGoodputPerSecond=4.0),
                _trial("defaults", "Defaults", "Starting", startTime=START.isoformat()),
            ]
        )
    )
    child = _child(tuning, "defaults", {})
    step = _step(tuning, Observed(target=TARGET, services={"fast-defaults": child}))
    bench = next(m for m in step.apply if m["kind"] == "InferenceBenchmark")
    assert bench["spec"]["search"]["minRatePerSecond"] == 0.5


def test_a_candidate_that_misses_the_slo_at_the_incumbents_goodput_stops_early() -> None:
    tuning = _after_incumbent("Measuring")
    bench = _bench(tuning, "seqs-8", "Succeeded", [_level(4.0, "Missed")], low=4.0)
    step = _step(
        tuning,
        Observed(
            target=TARGET,
            benchmarks={"fast-seqs-8": bench},
            services={"fast-seqs-8": _child(tuning, "seqs-8", {})},
        ),
    )
    trial = _trials(step)["seqs-8"]
    assert trial.state == "StoppedEarly"
    assert trial.reason == "missed the SLO at 4 req/s, a load the incumbent met"
    assert trial.measured_goodput_per_second is None
    assert trial.ttft is not None and trial.ttft.p99 == 304.0
    assert [e.reason for e in step.events] == ["TrialStoppedEarly"]


def test_a_candidate_searched_from_the_bottom_is_no_early_stop() -> None:
    """Without the incumbent's goodput (it met the SLO nowhere), a miss at the lowest rate
    is a measurement of nothing, not an early stop."""
    tuning = _after_incumbent("Measuring", goodput=None)
    bench = _bench(tuning, "seqs-8", "Succeeded", [_level(0.5, "Missed")])
    step = _step(
        tuning,
        Observed(
            target=TARGET,
            benchmarks={"fast-seqs-8": bench},
            services={"fast-seqs-8": _child(tuning, "seqs-8", {})},
        ),
    )
    trial = _trials(step)["seqs-8"]
    assert trial.state == "Succeeded" and trial.measured_goodput_per_second is None


# --- budget ---------------------------------------------------------------------------------


def test_max_trials_skips_what_it_leaves_out_and_keeps_the_incumbent_again_last() -> None:
    step = _step(_tuning({"budget": {"maxTrials": 3}}), Observed(target=TARGET))
    states = {n: (t.state, t.reason) for n, t in _trials(step).items()}
    assert states["incumbent"][0] == "Starting"
    assert states["seqs-8"][0] == "Pending"
    assert states["eager"] == ("Skipped", "not measured: spec.budget.maxTrials is 3")
    assert states["defaults"] == ("Skipped", "not measured: spec.budget.maxTrials is 3")
    assert states["incumbent-again"][0] == "Pending"


def test_one_trial_measures_the_incumbent_alone() -> None:
    step = _step(_tuning({"budget": {"maxTrials": 1}}), Observed(target=TARGET))
    assert [t.state for t in _trials(step).values()] == ["Starting"] + ["Skipped"] * 4


def test_the_wall_time_budget_stops_the_running_trial_and_skips_the_rest() -> None:
    tuning = _tuning(
        {"budget": {"maxDurationSeconds": 600}},
        status=_running(
            [
                _trial(
                    "incumbent",
                    "Incumbent",
                    "Succeeded",
                    measuredGoodputPerSecond=4.0,
                    gpuSeconds=120.0,
                ),
                _trial(
                    "seqs-8",
                    "Candidate",
                    "Measuring",
                    overrides={"max-num-seqs": "8"},
                    startTime=(NOW - timedelta(minutes=2)).isoformat(),
                ),
                _trial("eager", "Candidate", overrides={"enforce-eager": "true"}),
            ]
        ),
    )
    child = _child(tuning, "seqs-8", {"max-num-seqs": "8"})
    step = _step(tuning, Observed(target=TARGET, services={"fast-seqs-8": child}))
    trials = _trials(step)
    assert trials["seqs-8"].state == "StoppedEarly"
    assert trials["seqs-8"].reason == "stopped: spec.budget.maxDurationSeconds (600) ran out"
    assert trials["eager"].state == "Skipped"
    assert trials["eager"].reason == "not measured: spec.budget.maxDurationSeconds (600) ran out"
    assert Ref(API, "InferenceService", "fast-seqs-8", NS) in step.delete
    assert Ref(API, "InferenceBenchmark", "fast-seqs-8", NS) in step.delete
    assert step.phase == "Succeeded"
    assert step.status is not None and step.status.winner is not None
    assert step.status.winner.trial == "incumbent"


def test_the_wall_time_budget_holds_until_it_runs_out() -> None:
    tuning = _tuning(
        {"budget": {"maxDurationSeconds": 601}},
        status=_running(
            [_trial("incumbent", "Incumbent", "Starting", startTime=START.isoformat())]
        ),
    )
    step = _step(tuning, Observed(target=TARGET))
    assert _trials(step)["incumbent"].state == "Starting"


def test_the_gpu_minutes_budget_counts_ended_trials_and_the_running_one() -> None:
    """20 GPU-minutes: 15 spent, and the running trial's two GPUs for 3 minutes make 21."""
    status = _running(
        [
            _trial(
                "incumbent",
                "Incumbent",
                "Succeeded",
                measuredGoodputPerSecond=4.0,
                gpuSeconds=900.0,
            ),
            _trial(
                "seqs-8",
                "Candidate",
                "Measuring",
                overrides={"max-num-seqs": "8"},
                startTime=(NOW - timedelta(minutes=3)).isoformat(),
            ),
            _trial("eager", "Candidate", overrides={"enforce-eager": "true"}),
        ]
    )
    tuning = _tuning({"budget": {"maxGpuMinutes": 20}}, status=status)
    child = _child(tuning, "seqs-8", {"max-num-seqs": "8"})
    step = _step(tuning, Observed(target=TARGET, services={"fast-seqs-8": child}))
    trials = _trials(step)
    assert trials["seqs-8"].state == "StoppedEarly"
    assert trials["seqs-8"].gpu_seconds == 360.0
    assert trials["eager"].reason == "not measured: spec.budget.maxGpuMinutes (20) ran out"
    # With 22 GPU-minutes the same run goes on.
    roomy = _tuning({"budget": {"maxGpuMinutes": 22}}, status=status)
    step = _step(roomy, Observed(target=TARGET, services={"fast-seqs-8": child}))
    assert _trials(step)["seqs-8"].state == "Measuring"


# --- winner, margins, spread ----------------------------------------------------------------


def _measured(**goodputs: float | None) -> list[TrialStatus]:
    roles = {"incumbent": "Incumbent", "defaults": "Defaults", "incumbent-again": "IncumbentAgain"}
    return [
        TrialStatus(
            name=name.replace("_", "-"),
            role=roles.get(name.replace("_", "-"), "Candidate"),
            state="Succeeded",
            measured_goodput_per_second=g,
            overrides={} if name in ("incumbent", "incumbent_again") else {"x": name},
        )
        for name, g in goodputs.items()
    ]


@pytest.mark.parametrize(
    ("goodputs", "winner", "over_incumbent", "over_defaults", "spread", "distinguishable"),
    [
        (
            {"incumbent": 2.0, "a": 3.0, "defaults": 1.5, "incumbent_again": 2.1},
            "a",
            0.5,
            1.0,
            0.05,
            True,
        ),
        (
            {"incumbent": 2.0, "a": 2.1, "defaults": 1.5, "incumbent_again": 2.4},
            "a",
            0.05,
            0.4,
            0.2,
            False,
        ),
        (
            {"incumbent": 2.0, "a": 1.0, "defaults": 2.0, "incumbent_again": 2.0},
            "incumbent",
            0.0,
            0.0,
            0.0,
            False,
        ),
        ({"incumbent": 2.0, "a": 3.0, "defaults": 1.5}, "a", 0.5, 1.0, None, True),
        ({"incumbent": 2.0, "a": 2.1, "defaults": 1.5}, "a", 0.05, 0.4, None, False),
        (
            {"incumbent": 2.0, "a": 2.08, "defaults": 1.5, "incumbent_again": 2.0},
            "a",
            0.04,
            0.3867,
            0.0,
            False,
        ),
        (
            {"incumbent": None, "a": 3.0, "defaults": 1.5, "incumbent_again": 2.0},
            "a",
            None,
            1.0,
            None,
            False,
        ),
    ],
    ids=[
        "a winner beyond the spread is distinguishable",
        "a winner within the spread is not",
        "the incumbent keeps a tie and is never applied",
        "without the incumbent measured again a margin above 10 % counts",
        "without the incumbent measured again a margin of 5 % does not",
        "a spread below 5 % counts as 5 %",
        "an incumbent that met the SLO nowhere gives no margin",
    ],
)
def test_the_outcome(
    goodputs: dict[str, float | None],
    winner: str,
    over_incumbent: float | None,
    over_defaults: float | None,
    spread: float | None,
    distinguishable: bool,
) -> None:
    result = outcome(_measured(**goodputs))
    assert result.winner is not None
    assert result.winner.trial == winner
    assert result.winner.margin_over_incumbent == over_incumbent
    assert result.winner.margin_over_defaults == over_defaults
    assert result.spread == spread
    assert result.winner.distinguishable is distinguishable


def test_the_last_trial_ends_the_run_with_the_winner() -> None:
    trials = [
        _trial(
            "incumbent", "Incumbent", "Succeeded", measuredGoodputPerSecond=2.0, gpuSeconds=60.0
        ),
        _trial(
            "seqs-8",
            "Candidate",
            "Succeeded",
            overrides={"max-num-seqs": "8"},
            measuredGoodputPerSecond=3.0,
            gpuSeconds=60.0,
        ),
        _trial("eager", "Candidate", "StoppedEarly", overrides={"enforce-eager": "true"}),
        _trial("defaults", "Defaults", "Succeeded", measuredGoodputPerSecond=1.0),
        _trial("incumbent-again", "IncumbentAgain", "Measuring", startTime=START.isoformat()),
    ]
    tuning = _tuning(status=_running(trials))
    bench = _bench(tuning, "incumbent-again", "Succeeded", [_level(1.0, "Met"), _level(2.2, "Met")])
    child = _child(tuning, "incumbent-again", {})
    step = _step(
        tuning,
        Observed(
            target=TARGET,
            benchmarks={"fast-incumbent-again": bench},
            services={"fast-incumbent-again": child},
        ),
    )
    assert step.phase == "Succeeded"
    assert step.status is not None
    winner = step.status.winner
    assert winner is not None
    assert (winner.trial, winner.overrides, winner.goodput_per_second) == (
        "seqs-8",
        {"max-num-seqs": "8"},
        3.0,
    )
    assert (winner.margin_over_incumbent, winner.margin_over_defaults) == (0.5, 2.0)
    assert step.status.spread == 0.1 and winner.distinguishable
    assert step.status.completion_time == NOW
    assert step.status.gpu_seconds == 1320.0
    assert _reason(step).startswith("True/Completed: 5 of 5 trials measured; winner seqs-8")
    assert _reason(step, "Running").startswith("False/")
    assert "Phase Succeeded" in step.events[-1].message


# --- bad input -------------------------------------------------------------------------------


def _refused(step: Step, phase: str, reason: str) -> str:
    """The step of a refusal: the phase and reason, nothing applied or deleted."""
    assert step.phase == phase
    assert (step.apply, step.delete) == ((), ())
    assert step.status is not None and step.status.trials == []
    text = _reason(step)
    assert text.startswith(f"False/{reason}: "), text
    return text


def test_a_missing_target_names_the_field_and_starts_nothing() -> None:
    text = _refused(_step(_tuning(), Observed()), "Pending", "TargetNotFound")
    assert "InferenceService chat (spec.targetRef.name) does not exist in namespace team-a" in text


def test_a_target_not_ready_is_waited_for() -> None:
    step = _step(_tuning(), Observed(target=_target(ready=False)))
    _refused(step, "Pending", "TargetNotReady")
    assert step.requeue is not None


def test_an_override_the_targets_vllm_does_not_take_names_the_candidate_field() -> None:
    tuning = _tuning(
        {
            "candidates": [
                {"name": "seqs-8", "overrides": {"max-num-seqs": "8"}},
                {"name": "typo", "overrides": {"max-num-seqz": "8"}},
            ]
        }
    )
    text = _refused(_step(tuning, Observed(target=TARGET)), "Failed", "InvalidOverride")
    assert "spec.candidates[1].overrides.max-num-seqz" in text
    assert "did you mean max-num-seqs" in text


def test_an_override_value_vllm_refuses_names_the_candidate_field() -> None:
    tuning = _tuning(
        {"candidates": [{"name": "util", "overrides": {"gpu-memory-utilization": "2"}}]}
    )
    text = _refused(_step(tuning, Observed(target=TARGET)), "Failed", "InvalidOverride")
    assert "spec.candidates[0].overrides.gpu-memory-utilization" in text


def test_no_workload_names_the_field() -> None:
    target = _target(workload={})
    text = _refused(_step(_tuning(), Observed(target=target)), "Pending", "NoWorkload")
    assert "spec.measure.workload" in text


def test_the_tunings_own_workload_needs_none_from_the_target() -> None:
    workload = {
        "promptTokens": {"type": "Fixed", "value": 32},
        "outputTokens": {"type": "Fixed", "value": 8},
    }
    tuning = _tuning({"measure": {**TUNING["spec"]["measure"], "workload": workload}})
    step = _step(tuning, Observed(target=_target(workload={})))
    assert step.phase == "Running"


def test_no_slo_target_names_the_field() -> None:
    text = _refused(_step(_tuning(), Observed(target=_target(slo={}))), "Pending", "NoSLO")
    assert "spec.measure.slo" in text


# --- resume after a restart ------------------------------------------------------------------


def test_a_restarted_operator_picks_up_a_measuring_trial_from_its_children() -> None:
    """status says Measuring, the child and its benchmark exist and run: nothing is created
    again, nothing is lost, and the status written is the one stored."""
    trials = [
        _trial(
            "incumbent",
            "Incumbent",
            "Measuring",
            startTime=START.isoformat(),
            benchmark="fast-incumbent",
            reason="InferenceBenchmark fast-incumbent is measuring",
        ),
        _trial("seqs-8", "Candidate", overrides={"max-num-seqs": "8"}),
    ]
    tuning = _tuning(status=_running(trials))
    first = _step(tuning, Observed(target=TARGET))  # to learn the status a pass writes
    assert first.status is not None
    tuning = tuning.model_copy(update={"status": first.status})
    bench = _bench(tuning, "incumbent", "Running", [])
    step = _step(
        tuning,
        Observed(
            target=TARGET,
            services={"fast-incumbent": _child(tuning, "incumbent", {})},
            benchmarks={"fast-incumbent": bench},
        ),
    )
    assert step.apply == () and step.delete == () and step.events == ()
    assert step.status == tuning.status


def test_a_measuring_trial_whose_benchmark_never_got_made_gets_it() -> None:
    tuning = _tuning(
        status=_running(
            [_trial("incumbent", "Incumbent", "Measuring", startTime=START.isoformat())]
        )
    )
    step = _step(
        tuning,
        Observed(target=TARGET, services={"fast-incumbent": _child(tuning, "incumbent", {})}),
    )
    assert _applied(step) == ["InferenceBenchmark/fast-incumbent"]


def test_the_target_deleted_mid_run_fails_it_and_removes_the_trial() -> None:
    tuning = _tuning(
        status=_running(
            [
                _trial("incumbent", "Incumbent", "Measuring", startTime=START.isoformat()),
                _trial("seqs-8", "Candidate", overrides={"max-num-seqs": "8"}),
            ]
        )
    )
    step = _step(tuning, Observed(services={"fast-incumbent": _child(tuning, "incumbent", {})}))
    assert step.phase == "Failed"
    assert _reason(step).startswith("False/TargetNotFound")
    assert Ref(API, "InferenceService", "fast-incumbent", NS) in step.delete
    assert [t.state for t in _trials(step).values()] == ["StoppedEarly", "Skipped"]


# --- Stale -----------------------------------------------------------------------------------


def _done(fingerprint: dict[str, Any]) -> InferenceTuning:
    return _tuning(
        status={
            "phase": "Succeeded",
            "startTime": START.isoformat(),
            "completionTime": NOW.isoformat(),
            "trials": [_trial("incumbent", "Incumbent", "Succeeded", measuredGoodputPerSecond=2.0)],
            "fingerprint": fingerprint,
        }
    )


def _fingerprint(target: InferenceService, observed: Observed | None = None) -> dict[str, Any]:
    found = tuning_reconcile.fingerprint(
        _tuning(), target, observed or Observed(target=target), SETTINGS.default_image
    )
    return found.to_wire()


NODE = {"metadata": {"name": "n1", "labels": {}}}
POD = {
    "metadata": {"name": "chat-0"},
    "spec": {"nodeName": "n1"},
    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
}


def _gpu_node(watts: float, product: str = "NVIDIA H100 80GB HBM3") -> Manifest:
    return {
        "metadata": {"name": "n1"},
        "status": {
            "interconnect": "NVLink",
            "gpus": [
                {"index": 0, "uuid": "GPU-1", "product": product, "power": {"current": watts}}
            ],
        },
    }


def _on_gpu(
    target: InferenceService, watts: float, product: str = "NVIDIA H100 80GB HBM3"
) -> Observed:
    return Observed(
        target=target, target_pods=[POD], nodes=[NODE], gpu_nodes=[_gpu_node(watts, product)]
    )


@pytest.mark.parametrize(
    ("now", "reason"),
    [
        (Observed(target=_target(image="vllm/vllm-openai:v0.33.0")), "VLLMImageChanged"),
        (
            Observed(
                target=_target(
                    model={
                        "source": {
                            "huggingFace": {
                                "repo": "Qwen/Qwen2.5-0.5B-Instruct",
                                "revision": "abc123",
                            }
                        }
                    }
                )
            ),
            "ModelChanged",
        ),
        (Observed(target=_target(slo={"ttftP99Milliseconds": 200})), "WorkloadChanged"),
        (
            Observed(
                target=_target(
                    workload={
                        "promptTokens": {"type": "Fixed", "value": 128},
                        "outputTokens": {"type": "Fixed", "value": 64},
                        "peakConcurrency": 99,
                    }
                )
            ),
            "WorkloadChanged",
        ),
        (_on_gpu(TARGET, 300.0), "PowerLimitChanged"),
        (_on_gpu(TARGET, 700.0, "NVIDIA H200"), "GPUChanged"),
    ],
    ids=[
        "a new image",
        "a new model revision",
        "a new SLO",
        "a new declared peak, the lengths measured the same",
        "a lower power limit",
        "another GPU",
    ],
)
def test_a_finished_run_turns_stale_when_the_target_changes(now: Observed, reason: str) -> None:
    tuning = _done(_fingerprint(TARGET, _on_gpu(TARGET, 700.0)))
    step = _step(tuning, now)
    assert step.phase == "Succeeded"
    assert _reason(step, "Stale").startswith(f"True/{reason}: ")
    assert step.apply == ()


def test_a_finished_run_of_an_unchanged_target_is_current_and_a_record() -> None:
    tuning = _done(_fingerprint(TARGET, _on_gpu(TARGET, 700.0)))
    step = _step(tuning, _on_gpu(TARGET, 700.0))
    assert _reason(step, "Stale").startswith("False/Current")
    assert step.status is not None and step.status.trials == tuning.status.trials  # type: ignore[union-attr]
    again = _step(tuning.model_copy(update={"status": step.status}), _on_gpu(TARGET, 700.0))
    assert again.status == step.status


def test_a_finished_run_removes_a_trial_service_left_behind() -> None:
    tuning = _done(_fingerprint(TARGET))
    step = _step(
        tuning, Observed(target=TARGET, services={"fast-eager": _child(tuning, "eager", {})})
    )
    assert step.delete == (Ref(API, "InferenceService", "fast-eager", NS),)


# --- InPlace ---------------------------------------------------------------------------------

IN_PLACE = {"strategy": "InPlace"}


def test_an_in_place_run_never_starts_while_another_benchmark_runs_on_the_target() -> None:
    step = _step(_tuning(IN_PLACE), Observed(target=TARGET, lock_jobs=[lock_job("chat", "load")]))
    text = _refused(step, "Pending", "BenchmarkRunning")
    assert "InferenceBenchmark load runs on InferenceService chat" in text
    assert step.status is not None and step.status.in_place is None


def test_a_finished_benchmarks_lock_job_does_not_hold_it_back() -> None:
    done = lock_job("chat", "load")
    done["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    step = _step(_tuning(IN_PLACE), Observed(target=TARGET, lock_jobs=[done]))
    assert step.phase == "Running"


def test_an_in_place_run_holds_the_lock_and_asks_the_target_for_the_trial() -> None:
    step = _step(_tuning(IN_PLACE), Observed(target=TARGET))
    assert _applied(step) == ["Job/fast-lock"]
    lock = step.apply[0]
    assert lock["spec"]["suspend"] is True
    labels = lock["metadata"]["labels"]
    assert labels["inference.vllm-operator.dev/scale-down-lock"] == "true"
    assert labels["inference.vllm-operator.dev/lock-target"] == "chat"
    assert step.status is not None
    assert step.status.in_place is not None and step.status.in_place.trial == "incumbent"
    assert "waiting for InferenceService chat's pods" in (_trials(step)["incumbent"].reason or "")


def _deployment(args: list[str], *, rolled: bool = True) -> Manifest:
    return {
        "metadata": {"name": "chat", "generation": 4},
        "spec": {
            "replicas": 2,
            "template": {"spec": {"containers": [{"name": "vllm", "args": args}]}},
        },
        "status": {
            "observedGeneration": 4,
            "replicas": 2 if rolled else 3,
            "updatedReplicas": 2 if rolled else 1,
            "readyReplicas": 2,
        },
    }


def _in_place_starting() -> InferenceTuning:
    status = _running(
        [
            _trial("incumbent", "Incumbent", "Succeeded", measuredGoodputPerSecond=4.0),
            _trial(
                "seqs-8",
                "Candidate",
                "Starting",
                overrides={"max-num-seqs": "8"},
                startTime=START.isoformat(),
            ),
        ],
        inPlace={"trial": "seqs-8", "overrides": {"max-num-seqs": "8"}},
    )
    return _tuning(IN_PLACE, status=status)


LOCK = build_lock_job(_tuning(IN_PLACE), target="chat", image="img")
ARGS = ["Qwen/Qwen2.5-0.5B-Instruct", "--max-num-seqs", "8", "--max-model-len", "4096"]


@pytest.mark.parametrize(
    ("observed", "measures"),
    [
        (
            Observed(
                target=TARGET,
                lock_jobs=[LOCK],
                target_deployment=_deployment(ARGS),
                measured_from={"name": "fast", "trial": "seqs-8", "applied": True},
            ),
            True,
        ),
        (
            Observed(
                target=TARGET,
                lock_jobs=[LOCK],
                target_deployment=_deployment(ARGS),
                measured_from={"name": "fast", "trial": "incumbent", "applied": True},
            ),
            False,
        ),
        (
            Observed(
                target=TARGET,
                lock_jobs=[LOCK],
                target_deployment=_deployment(ARGS, rolled=False),
                measured_from={"name": "fast", "trial": "seqs-8", "applied": True},
            ),
            False,
        ),
        (
            Observed(
                target=TARGET,
                lock_jobs=[LOCK],
                target_deployment=_deployment(["--max-num-seqs", "256"]),
                measured_from={"name": "fast", "trial": "seqs-8", "applied": True},
            ),
            False,
        ),
        (
            Observed(
                target=_target(ready=False),
                lock_jobs=[LOCK],
                target_deployment=_deployment(ARGS),
                measured_from={"name": "fast", "trial": "seqs-8", "applied": True},
            ),
            False,
        ),
    ],
    ids=[
        "the target's pods run the trial: measured",
        "the target still renders the last trial: waits",
        "old pods still run: waits",
        "the template lacks the trial's flag: waits",
        "the target is not Ready: waits",
    ],
)
def test_an_in_place_trial_is_measured_once_the_targets_pods_run_it(
    observed: Observed, measures: bool
) -> None:
    step = _step(_in_place_starting(), observed)
    assert step.status is not None and step.status.in_place is not None
    assert step.status.in_place.trial == "seqs-8"
    benches = [m for m in step.apply if m["kind"] == "InferenceBenchmark"]
    if measures:
        assert [b["spec"]["targetRef"]["name"] for b in benches] == ["chat"]
        assert benches[0]["spec"]["search"]["minRatePerSecond"] == 4.0
        assert _trials(step)["seqs-8"].arguments == ARGS
    else:
        assert benches == []
        assert _trials(step)["seqs-8"].state == "Starting"
    assert not [m for m in step.apply if m["kind"] == "InferenceService"]


def test_an_in_place_run_waits_between_trials_for_another_benchmark() -> None:
    status = _running(
        [
            _trial("incumbent", "Incumbent", "Succeeded", measuredGoodputPerSecond=4.0),
            _trial("seqs-8", "Candidate", overrides={"max-num-seqs": "8"}),
        ],
        inPlace={"trial": "incumbent", "overrides": {}},
    )
    step = _step(
        _tuning(IN_PLACE, status=status),
        Observed(target=TARGET, lock_jobs=[LOCK, lock_job("chat", "load")]),
    )
    assert _trials(step)["seqs-8"].state == "Pending"
    assert _reason(step, "Running").startswith("True/BenchmarkRunning")


def test_the_end_of_an_in_place_run_clears_the_trial_and_releases_the_lock() -> None:
    status = _running(
        [
            _trial("incumbent", "Incumbent", "Succeeded", measuredGoodputPerSecond=4.0),
            _trial(
                "seqs-8",
                "Candidate",
                "Measuring",
                overrides={"max-num-seqs": "8"},
                startTime=START.isoformat(),
            ),
        ],
        inPlace={"trial": "seqs-8", "overrides": {"max-num-seqs": "8"}},
    )
    tuning = _tuning(IN_PLACE, status=status)
    bench = _bench(
        tuning,
        "seqs-8",
        "Succeeded",
        [_level(4.0, "Met"), _level(6.0, "Met")],
        target="chat",
        low=4.0,
    )
    step = _step(
        tuning, Observed(target=TARGET, lock_jobs=[LOCK], benchmarks={"fast-seqs-8": bench})
    )
    assert step.phase == "Succeeded"
    assert step.status is not None and step.status.in_place is None
    assert Ref("batch/v1", "Job", "fast-lock", NS) in step.delete
    assert not [r for r in step.delete if r.kind == "InferenceService"]  # the target stays


def test_a_trial_takes_every_percentile_from_the_headline_of_the_same_level() -> None:
    """The load Job's report keeps only the levels' P99s (4 KiB); the headline, the best
    level, keeps them all: the trial's TTFT P50 and P99.9 come from there."""
    tuning = _tuning()
    compact = {"fromScheduled": {"ttft": {"p99": 310.0}, "tpot": {"p99": 20.0}}}
    levels = [
        {**_level(1.0, "Met"), **compact},
        {**_level(2.0, "Met"), **compact},
        {**_level(4.0, "Missed"), **compact},
    ]
    bench = _bench(tuning, "incumbent", "Succeeded", levels)
    assert bench.status is not None
    bench.status.headline = InferenceBenchmark.model_validate(
        {**bench.to_wire(), "status": {"phase": "Succeeded", "headline": _level(2.0, "Met")}}
    ).status.headline  # type: ignore[union-attr]
    trial = TrialStatus(name="incumbent", role="Incumbent", state="Measuring")
    read = tuning_reconcile.read_benchmark(trial, bench, early_stop_at=None)
    assert read is not None and read.measured_goodput_per_second == 2.0
    assert read.ttft is not None
    assert (read.ttft.p50, read.ttft.p99, read.ttft.p999) == (80.0, 302.0, 452.0)
    # A headline of another level is not taken for this one.
    bench.status.headline.rate_per_second = 1.0  # type: ignore[union-attr]
    read = tuning_reconcile.read_benchmark(trial, bench, early_stop_at=None)
    assert read is not None and read.ttft is not None
    assert (read.ttft.p50, read.ttft.p99) == (None, 310.0)


@pytest.mark.parametrize(
    ("again", "state", "words"),
    [
        pytest.param("Met", "Succeeded", "held up to 12 req/s", id="then met: the search goes on"),
        pytest.param("Missed", "StoppedEarly", "missed the SLO at 6", id="then missed: early stop"),
        pytest.param("ClientLimited", "Failed", "load client could not keep to 6", id="twice"),
    ],
)
def test_a_first_rate_the_client_decided_counts_as_its_second_measurement(
    again: str, state: str, words: str
) -> None:
    """The search measures a level the load client decided once more at the same rate
    (bench.run.search_levels): the first rate's verdict is the second measurement's."""
    tuning = _tuning()
    levels = [_level(6.0, "ClientLimited"), _level(6.0, again)]
    if again == "Met":
        levels += [_level(12.0, "Met"), _level(24.0, "Missed")]
    bench = _bench(tuning, "seqs-8", "Succeeded", levels)
    trial = TrialStatus(name="seqs-8", role="Candidate", state="Measuring")
    read = tuning_reconcile.read_benchmark(trial, bench, early_stop_at=6.0)
    assert read is not None and read.state == state and words in (read.reason or ""), read
    if again == "Met":
        assert read.measured_goodput_per_second == 12.0, read
