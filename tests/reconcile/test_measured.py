"""Which measured result a service takes (reconcile/measured.py), as a table over the
namespace's InferenceTunings as the apiserver serves them: the order (an in-place trial,
then spec.tuning.measuredRef, then the newest finished autoApply tuning) and every reason
a result is not applied."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.specs import BASE
from vllm_operator.constants import LABEL_TUNING
from vllm_operator.models import InferenceService
from vllm_operator.models.inference_service import EffectiveArgument, EffectiveTuning
from vllm_operator.reconcile.measured import (
    MeasuredChoice,
    credit_measured,
    measured_overrides,
    with_measured,
)

Manifest = dict[str, Any]


def tuning(
    name: str = "tune",
    *,
    target: str = "chat",
    phase: str | None = "Succeeded",
    auto: bool = False,
    winner: dict[str, Any] | None = None,
    stale: tuple[str, str] | None = None,
    in_place: dict[str, Any] | None = None,
    created: str = "2026-11-01T00:00:00Z",
    completed: str | None = None,
    namespace: str = "team-a",
    **extra: Any,
) -> Manifest:
    """An InferenceTuning as served, with the wire names of the design (section 2)."""
    status: Manifest = {}
    if phase is not None:
        status["phase"] = phase
    if winner is not None:
        status["winner"] = winner
    if in_place is not None:
        status["inPlace"] = in_place
    if completed is not None:
        status["completionTime"] = completed
    if stale is not None:
        status["conditions"] = [
            {"type": "Stale", "status": "True", "reason": stale[0], "message": stale[1]}
        ]
    status.update(extra.pop("status", {}))
    return {
        "apiVersion": "inference.vllm-operator.dev/v1alpha1",
        "kind": "InferenceTuning",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "creationTimestamp": created,
            **extra.pop("metadata", {}),
        },
        "spec": {"targetRef": {"name": target}, "autoApply": auto, **extra.pop("spec", {})},
        "status": status,
    }


WIN = {
    "trial": "seqs-8",
    "overrides": {"max-num-seqs": "8"},
    "goodputPerSecond": 3.1,
    "marginOverIncumbent": 0.42,
    "distinguishable": True,
}


def service(labels: dict[str, str] | None = None, **tuning_spec: Any) -> InferenceService:
    body = copy.deepcopy(BASE)
    body["spec"]["tuning"] = {"overrides": {"max-num-seqs": "64"}, **tuning_spec}
    if labels:
        body["metadata"]["labels"] = labels
    return InferenceService.model_validate(body)


REF = {"measuredRef": {"name": "tune"}}

# (service's spec.tuning, tunings, (name, trial, applied, reason) or None, words said)
CASES: list[tuple[str, dict[str, Any], list[Manifest], tuple[Any, ...] | None, str]] = [
    ("nothing asked for, no tuning: none", {}, [], None, ""),
    (
        "a finished tuning that nobody asked to apply: none",
        {},
        [tuning(winner=WIN)],
        None,
        "",
    ),
    (
        "an autoApply tuning that succeeded: its winner",
        {},
        [tuning(auto=True, winner=WIN)],
        ("tune", "seqs-8", True, "WinnerApplied"),
        "42.0% more goodput",
    ),
    (
        "measuredRef to a distinguishable winner: applied",
        REF,
        [tuning(winner=WIN)],
        ("tune", "seqs-8", True, "WinnerApplied"),
        "spec.tuning.measuredRef",
    ),
    (
        "measuredRef to a tuning that does not exist: not found",
        REF,
        [tuning("other", winner=WIN)],
        ("tune", None, False, "TuningNotFound"),
        "does not exist in namespace team-a",
    ),
    (
        "measuredRef to a tuning of another namespace: not found",
        REF,
        [tuning(winner=WIN, namespace="team-b")],
        ("tune", None, False, "TuningNotFound"),
        "does not exist",
    ),
    (
        "measuredRef to a tuning being deleted: not found",
        REF,
        [tuning(winner=WIN, metadata={"deletionTimestamp": "2026-11-02T00:00:00Z"})],
        ("tune", None, False, "TuningNotFound"),
        "does not exist",
    ),
    (
        "measuredRef to a tuning still running: not finished",
        REF,
        [tuning(phase="Running")],
        ("tune", None, False, "TuningNotFinished"),
        "is Running",
    ),
    (
        "measuredRef to a tuning with no status yet: not finished",
        REF,
        [tuning(phase=None)],
        ("tune", None, False, "TuningNotFinished"),
        "is Pending",
    ),
    (
        "measuredRef to a failed tuning: failed, with its Ready message",
        REF,
        [
            tuning(
                phase="Failed",
                status={
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "False",
                            "reason": "TargetNotFound",
                            "message": "spec.targetRef.name: no InferenceService chat",
                        }
                    ]
                },
            )
        ],
        ("tune", None, False, "TuningFailed"),
        "spec.targetRef.name: no InferenceService chat",
    ),
    (
        "measuredRef to a tuning that succeeded without a winner: none to apply",
        REF,
        [tuning()],
        ("tune", None, False, "NoWinner"),
        "without a winner",
    ),
    (
        "measuredRef to a stale result: not applied, with the Stale reason",
        REF,
        [tuning(winner=WIN, stale=("VLLMImageChanged", "vllm 0.31.0 then, 0.32.0 now"))],
        ("tune", "seqs-8", False, "Stale"),
        "VLLMImageChanged: vllm 0.31.0 then, 0.32.0 now",
    ),
    (
        "measuredRef to a winner within the spread: not distinguishable",
        REF,
        [
            tuning(
                winner={**WIN, "distinguishable": False, "marginOverIncumbent": 0.03},
                status={"spread": 0.05},
            )
        ],
        ("tune", "seqs-8", False, "NotDistinguishable"),
        "3.0%, is within the run-to-run spread 5.0%",
    ),
    (
        "a winner that does not say it is distinguishable: not applied",
        REF,
        [tuning(winner={k: v for k, v in WIN.items() if k != "distinguishable"})],
        ("tune", "seqs-8", False, "NotDistinguishable"),
        "not distinguishable",
    ),
    (
        "measuredRef to a tuning of another service: not applied",
        REF,
        [tuning(target="search", winner=WIN)],
        ("tune", None, False, "OtherTarget"),
        "measured InferenceService search",
    ),
    (
        "a winner flag the operator sets itself: invalid, the field named",
        REF,
        [tuning(winner={**WIN, "overrides": {"port": "9000"}})],
        ("tune", "seqs-8", False, "InvalidOverride"),
        "status.winner.overrides.port",
    ),
    (
        "a winner flag that is no argument name: invalid, the field named",
        REF,
        [tuning(winner={**WIN, "overrides": {"--Max_Seqs": "8"}})],
        ("tune", "seqs-8", False, "InvalidOverride"),
        "status.winner.overrides.--Max_Seqs",
    ),
    (
        "an in-place trial wins over measuredRef",
        REF,
        [
            tuning(winner=WIN),
            tuning(
                "probe",
                phase="Running",
                in_place={"trial": "eager", "overrides": {"enforce-eager": ""}},
            ),
        ],
        ("probe", "eager", True, "InPlaceTrial"),
        "enforce-eager=true",
    ),
    (
        "an in-place trial of a tuning being deleted is over",
        {},
        [
            tuning(
                phase="Running",
                in_place={"trial": "eager", "overrides": {"enforce-eager": "true"}},
                metadata={"deletionTimestamp": "2026-11-02T00:00:00Z"},
            )
        ],
        None,
        "",
    ),
    (
        "an in-place trial on another service is not this one's",
        {},
        [tuning(target="search", phase="Running", in_place={"trial": "x", "overrides": {}})],
        None,
        "",
    ),
    (
        "measuredRef wins over an autoApply tuning",
        REF,
        [
            tuning(winner=WIN),
            tuning("auto", auto=True, winner={**WIN, "trial": "eager"}),
        ],
        ("tune", "seqs-8", True, "WinnerApplied"),
        "",
    ),
    (
        "of two finished autoApply tunings, the one that finished last",
        {},
        [
            tuning(
                "late",
                auto=True,
                winner={**WIN, "trial": "late-win"},
                created="2026-10-01T00:00:00Z",
                completed="2026-11-20T00:00:00Z",
            ),
            tuning(
                "early",
                auto=True,
                winner=WIN,
                created="2026-11-01T00:00:00Z",
                completed="2026-11-10T00:00:00Z",
            ),
        ],
        ("late", "late-win", True, "WinnerApplied"),
        "",
    ),
    (
        "an autoApply tuning running keeps the finished one applied",
        {},
        [
            tuning("old", auto=True, winner=WIN, created="2026-10-01T00:00:00Z"),
            tuning("new", auto=True, phase="Running", created="2026-11-20T00:00:00Z"),
        ],
        ("old", "seqs-8", True, "WinnerApplied"),
        "",
    ),
    (
        "an autoApply tuning not finished yet: said so",
        {},
        [tuning(auto=True, phase="Running")],
        ("tune", None, False, "TuningNotFinished"),
        "spec.autoApply",
    ),
    (
        "the newest autoApply result stale: said, not an older one applied",
        {},
        [
            tuning(
                "new",
                auto=True,
                winner=WIN,
                stale=("ModelChanged", "revision abc then, def now"),
                completed="2026-11-20T00:00:00Z",
            ),
            tuning("old", auto=True, winner=WIN, completed="2026-11-10T00:00:00Z"),
        ],
        ("new", "seqs-8", False, "Stale"),
        "ModelChanged",
    ),
]


@pytest.mark.parametrize(
    ("spec", "tunings", "expected", "words"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_the_measured_result_a_service_takes(
    spec: dict[str, Any],
    tunings: list[Manifest],
    expected: tuple[Any, ...] | None,
    words: str,
) -> None:
    choice = measured_overrides(service(**spec), tunings)
    if expected is None:
        assert choice is None
        return
    assert choice is not None
    assert (choice.name, choice.trial, choice.applied, choice.reason) == expected
    assert words in choice.message
    assert bool(choice.overrides) == choice.applied
    status = choice.status()
    assert (status.name, status.applied, status.reason) == (expected[0], expected[2], expected[3])


def test_a_bare_flag_of_a_trial_is_spelled_as_the_service_spells_a_flag() -> None:
    choice = measured_overrides(
        service(),
        [tuning(phase="Running", in_place={"trial": "eager", "overrides": {"enforce-eager": ""}})],
    )
    assert choice is not None and dict(choice.overrides) == {"enforce-eager": "true"}


def test_a_trial_child_takes_no_measured_result_whatever_the_tunings_say() -> None:
    child = service({LABEL_TUNING: "tune"}, **REF)
    tunings = [
        tuning(winner=WIN, target="chat", auto=True),
        tuning("probe", phase="Running", in_place={"trial": "x", "overrides": {"a-b": "1"}}),
    ]
    assert measured_overrides(child, tunings) is None


def test_the_measured_flags_are_laid_over_the_users_in_a_copy() -> None:
    isvc = service()
    isvc.spec.tuning.overrides["enforce-eager"] = "false"
    before = isvc.model_dump()
    choice = measured_overrides(isvc, [tuning(auto=True, winner=WIN)])
    served = with_measured(isvc, choice)
    assert served.spec.tuning.overrides == {"max-num-seqs": "8", "enforce-eager": "false"}
    assert isvc.model_dump() == before, "the user's service is never changed"


def test_a_result_not_applied_leaves_the_service_as_it_is() -> None:
    isvc = service()
    choice = measured_overrides(isvc, [tuning(auto=True, winner={**WIN, "distinguishable": False})])
    assert choice is not None and not choice.applied
    assert with_measured(isvc, choice) is isvc


def test_the_measured_arguments_are_credited_to_the_tuning_and_trial() -> None:
    planned = EffectiveTuning(
        planned_by="Tuner",
        arguments=[
            EffectiveArgument(name="max-num-seqs", value="8", source="Override", reason="x"),
            EffectiveArgument(name="max-model-len", value="4096", source="Tuner", reason="y"),
        ],
    )
    choice = MeasuredChoice("tune", "seqs-8", True, "WinnerApplied", "", {"max-num-seqs": "8"})
    credited = credit_measured(planned, choice, {"max-num-seqs": "64"})
    seqs, length = credited.arguments
    assert seqs.source == "Measured"
    assert "seqs-8" in seqs.reason and "tune" in seqs.reason
    assert "spec.tuning.overrides says 64" in seqs.reason
    assert length == planned.arguments[1]
