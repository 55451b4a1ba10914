"""A measured result, applied: which InferenceTuning's measured flags an InferenceService
runs with, worked out from the namespace's InferenceTunings on every pass and never
stored, so a tuning deleted (or one whose in-place trial ends) drops out of the service's
arguments at its next pass, and the pods roll back.

The order (docs/measured-tuning-apply.md):

1. a tuning that targets the service (``spec.targetRef.name``) with ``status.inPlace``
   set: an in-place trial is running on the service's own pods, and its flags are the
   ones to measure;
2. else the tuning ``spec.tuning.measuredRef`` names;
3. else the most recent ``Succeeded`` tuning that targets the service with
   ``spec.autoApply: true``.

From 2 and 3 only ``status.winner.overrides``, and only when the winner is
``distinguishable`` from the incumbent and the tuning is not ``Stale``. The flags are laid
over the user's ``spec.tuning.overrides`` (the run varied them on purpose) in the service
as planned and rendered; the user's spec is never written (GitOps stays clean). Why a
result is not applied is said in ``status.measuredFrom`` and the ``Tuned`` condition
(reconcile/status.py). A trial child (labelled ``inference.vllm-operator.dev/tuning``)
never takes a measured result: it is one.

InferenceTunings are read as the plain objects the apiserver serves (their wire names:
``spec.targetRef.name``, ``spec.autoApply``, ``status.phase``, ``status.inPlace``,
``status.winner``, ``status.conditions``), so this module depends on nothing of the
tuning controller's but those names. Pure apart from :func:`list_tunings`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import ValidationError

from vllm_operator.constants import API_VERSION, KIND_INFERENCE_TUNING, LABEL_TUNING
from vllm_operator.k8s.api import ClusterAPI
from vllm_operator.models import InferenceService
from vllm_operator.models.base import Manifest
from vllm_operator.models.conditions import manifest_condition
from vllm_operator.models.inference_service import (
    EffectiveArgument,
    EffectiveTuning,
    MeasuredFrom,
    MeasuredReason,
    TuningSpec,
)

__all__ = [
    "APPLIED_REASONS",
    "MeasuredChoice",
    "credit_measured",
    "is_trial",
    "list_tunings",
    "measured_overrides",
    "with_measured",
]

# The reasons of a result whose flags are in the arguments.
APPLIED_REASONS: Final[tuple[MeasuredReason, ...]] = ("InPlaceTrial", "WinnerApplied")


@dataclass(frozen=True)
class MeasuredChoice:
    """The measured result a service's arguments come from, or the one asked for and why
    it is not applied. ``overrides``: the flags laid over spec.tuning.overrides (empty
    unless ``applied``), in the service's spelling ('true' for a bare flag)."""

    name: str
    trial: str | None
    applied: bool
    reason: MeasuredReason
    message: str
    overrides: Mapping[str, str] = field(default_factory=dict)

    def status(self) -> MeasuredFrom:
        """``status.measuredFrom``."""
        return MeasuredFrom(
            name=self.name,
            trial=self.trial,
            applied=self.applied,
            reason=self.reason,
            message=self.message[:1024],
        )


def is_trial(isvc: InferenceService) -> bool:
    """Whether ``isvc`` is a measured run's trial child: it never takes a result itself."""
    return LABEL_TUNING in isvc.metadata.labels


async def list_tunings(api: ClusterAPI, isvc: InferenceService) -> list[Manifest]:
    """The namespace's InferenceTunings (served from the watch store in the operator); none
    for a trial child, which reads none."""
    if is_trial(isvc):
        return []
    return await api.list(API_VERSION, KIND_INFERENCE_TUNING, isvc.metadata.namespace)


# --- reading a tuning as served ------------------------------------------------------------


def _dig(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _name(tuning: Manifest) -> str:
    return str(_dig(tuning, "metadata", "name") or "")


def _targets(tuning: Manifest, isvc: InferenceService) -> bool:
    return bool(_dig(tuning, "spec", "targetRef", "name") == isvc.metadata.name)


def _going(tuning: Manifest) -> bool:
    """Being deleted: its in-place trial and its result are over for the service now, not
    when a finalizer of the tuning's lets it go."""
    return bool(_dig(tuning, "metadata", "deletionTimestamp"))


def _created(tuning: Manifest) -> str:
    return str(_dig(tuning, "metadata", "creationTimestamp") or "")


def _finished(tuning: Manifest) -> str:
    return str(_dig(tuning, "status", "completionTime") or _created(tuning))


def _spelled(value: Any) -> str:
    """A flag's value in spec.tuning.overrides' spelling: a bare flag ('' in a trial's
    overrides) is 'true'; booleans 'true'/'false'."""
    if value is None or value == "":
        return "true"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _flags(raw: Any, where: str) -> tuple[dict[str, str], str | None]:
    """The overrides at ``where`` as the service spells them, or why they cannot be laid
    over spec.tuning.overrides (the field named): each flag is checked by spec.tuning's
    own rules (a vLLM argument name, not one the operator sets itself)."""
    if raw is None:
        return {}, None
    if not isinstance(raw, Mapping):
        return {}, f"{where} is not a map of vLLM flags to values"
    flags: dict[str, str] = {}
    for key in sorted(raw, key=str):
        value = _spelled(raw[key])
        try:
            TuningSpec(overrides={str(key): value})
        except ValidationError as err:
            why = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in err.errors())
            return {}, f"{where}.{key}: {why}"
        flags[str(key)] = value
    return flags, None


def _words(flags: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(flags.items())) or "no flags of its own"


# --- the choice ----------------------------------------------------------------------------


def measured_overrides(
    isvc: InferenceService, tunings: Sequence[Manifest]
) -> MeasuredChoice | None:
    """The measured result ``isvc`` takes from the namespace's ``tunings`` (in the order of
    the module's docstring), or the one asked for with why it is not applied; None when
    none is asked for (no in-place trial, no measuredRef, no autoApply tuning of it), and
    always for a trial child."""
    if is_trial(isvc):
        return None
    ns = isvc.metadata.namespace
    present = [
        t
        for t in tunings
        if not _going(t) and _dig(t, "metadata", "namespace") in (None, ns) and _name(t)
    ]
    mine = [t for t in present if _targets(t, isvc)]
    in_place = sorted(
        (t for t in mine if isinstance(_dig(t, "status", "inPlace"), Mapping)),
        key=lambda t: (_created(t), _name(t)),
    )
    if in_place:
        return _in_place(in_place[0])
    ref = isvc.spec.tuning.measured_ref
    if ref is not None:
        named = next((t for t in present if _name(t) == ref.name), None)
        if named is None:
            return MeasuredChoice(
                ref.name,
                None,
                False,
                "TuningNotFound",
                f"spec.tuning.measuredRef names InferenceTuning {ref.name}, which does not "
                f"exist in namespace {ns}; the arguments are the tuner's and "
                "spec.tuning.overrides'.",
            )
        if not _targets(named, isvc):
            other = _dig(named, "spec", "targetRef", "name")
            return MeasuredChoice(
                ref.name,
                None,
                False,
                "OtherTarget",
                f"spec.tuning.measuredRef names InferenceTuning {ref.name}, which measured "
                f"InferenceService {other} (its spec.targetRef.name), not this one: a result "
                "holds for the service, GPUs and workload it was measured on; not applied.",
            )
        return _result(named, "spec.tuning.measuredRef")
    auto = [t for t in mine if _dig(t, "spec", "autoApply") is True]
    done = [t for t in auto if _dig(t, "status", "phase") == "Succeeded"]
    if done:
        newest = max(done, key=lambda t: (_finished(t), _created(t), _name(t)))
        return _result(newest, "spec.autoApply")
    if auto:
        newest = max(auto, key=lambda t: (_created(t), _name(t)))
        return _result(newest, "spec.autoApply")
    return None


def _in_place(tuning: Manifest) -> MeasuredChoice:
    name = _name(tuning)
    trial = _dig(tuning, "status", "inPlace", "trial")
    trial = str(trial) if trial else None
    flags, invalid = _flags(
        _dig(tuning, "status", "inPlace", "overrides"), "status.inPlace.overrides"
    )
    if invalid is not None:
        return MeasuredChoice(
            name,
            trial,
            False,
            "InvalidOverride",
            f"InferenceTuning {name} runs trial {trial} in place, but its {invalid}; the "
            "trial's flags are not applied.",
        )
    return MeasuredChoice(
        name,
        trial,
        True,
        "InPlaceTrial",
        f"InferenceTuning {name} runs trial {trial} in place: its flags ({_words(flags)}) "
        "are laid over spec.tuning.overrides until the trial ends.",
        flags,
    )


def _result(tuning: Manifest, asked_by: str) -> MeasuredChoice:
    """The winner of ``tuning`` when it may be applied; otherwise why not."""
    name = _name(tuning)
    phase = _dig(tuning, "status", "phase") or "Pending"
    if phase == "Failed":
        ready = manifest_condition(tuning, "Ready") or {}
        why = ready.get("message") or ready.get("reason") or "no reason given"
        return MeasuredChoice(
            name,
            None,
            False,
            "TuningFailed",
            f"InferenceTuning {name} ({asked_by}) failed: {why}; nothing of it is applied.",
        )
    if phase != "Succeeded":
        return MeasuredChoice(
            name,
            None,
            False,
            "TuningNotFinished",
            f"InferenceTuning {name} ({asked_by}) is {phase}; its winner is applied once it "
            "has Succeeded.",
        )
    winner = _dig(tuning, "status", "winner")
    trial = _dig(winner, "trial")
    if not isinstance(winner, Mapping) or not trial:
        return MeasuredChoice(
            name,
            None,
            False,
            "NoWinner",
            f"InferenceTuning {name} ({asked_by}) succeeded without a winner (no trial met "
            "the SLO); nothing of it is applied.",
        )
    trial = str(trial)
    stale = manifest_condition(tuning, "Stale") or {}
    if stale.get("status") == "True":
        reason = stale.get("reason") or "Stale"
        said = f": {stale['message']}" if stale.get("message") else ""
        return MeasuredChoice(
            name,
            trial,
            False,
            "Stale",
            f"InferenceTuning {name}'s result is stale ({reason}{said}); its winner {trial} "
            "is not applied. Run the tuning again on the service as it is now.",
        )
    if winner.get("distinguishable") is not True:
        margin = winner.get("marginOverIncumbent")
        spread = _dig(tuning, "status", "spread")
        by = (
            f" (its margin over the incumbent, {margin:.1%}, is within the run-to-run spread "
            f"{spread:.1%})"
            if isinstance(margin, int | float) and isinstance(spread, int | float)
            else ""
        )
        return MeasuredChoice(
            name,
            trial,
            False,
            "NotDistinguishable",
            f"InferenceTuning {name}'s winner {trial} is not distinguishable from the "
            f"incumbent{by}; not applied.",
        )
    flags, invalid = _flags(winner.get("overrides"), "status.winner.overrides")
    if invalid is not None:
        return MeasuredChoice(
            name,
            trial,
            False,
            "InvalidOverride",
            f"InferenceTuning {name}'s {invalid}; its winner {trial} is not applied.",
        )
    margin = winner.get("marginOverIncumbent")
    more = (
        f", {margin:.1%} more goodput than the incumbent" if isinstance(margin, int | float) else ""
    )
    return MeasuredChoice(
        name,
        trial,
        True,
        "WinnerApplied",
        f"The arguments carry InferenceTuning {name}'s measured winner {trial} "
        f"({_words(flags)}{more}), applied by {asked_by}.",
        flags,
    )


# --- applying it ---------------------------------------------------------------------------


def with_measured(isvc: InferenceService, choice: MeasuredChoice | None) -> InferenceService:
    """``isvc`` as planned and rendered: the applied result's flags laid over its
    spec.tuning.overrides. A copy: the user's object is never changed."""
    if choice is None or not choice.applied or not choice.overrides:
        return isvc
    tuning = isvc.spec.tuning
    overrides = {**tuning.overrides, **choice.overrides}
    spec = isvc.spec.model_copy(
        update={"tuning": tuning.model_copy(update={"overrides": overrides})}
    )
    return isvc.model_copy(update={"spec": spec})


def credit_measured(
    tuning: EffectiveTuning, choice: MeasuredChoice | None, user: Mapping[str, str]
) -> EffectiveTuning:
    """The effective tuning with each argument the measured result set credited to it
    (source Measured, and the tuning and trial in the reason) rather than to
    spec.tuning.overrides; ``user``: the spec's own overrides, named where one was laid
    over."""
    if choice is None or not choice.applied or not choice.overrides:
        return tuning
    what = "in-place trial" if choice.reason == "InPlaceTrial" else "measured winner"

    def credited(arg: EffectiveArgument) -> EffectiveArgument:
        if arg.name not in choice.overrides or arg.source != "Override":
            return arg
        reason = f"{what} {choice.trial} of InferenceTuning {choice.name}"
        if arg.name in user and user[arg.name] != choice.overrides[arg.name]:
            reason += f" (spec.tuning.overrides says {user[arg.name]})"
        return arg.model_copy(update={"source": "Measured", "reason": reason})

    return tuning.model_copy(update={"arguments": [credited(a) for a in tuning.arguments]})
