"""The plan, spelled for the vLLM release deployed.

Before planning, every ``spec.tuning.overrides`` entry is checked against that release's
arguments (:func:`release_problem`): one that is not an argument of it, or whose value it
does not take, refuses the plan with a reason naming the field, so it never reaches a pod.
After planning, each argument the tuner proposed that the release lacks, or whose value it
does not take, is left out with a note (:func:`for_release`): the tuner's catalogue of
arguments is the newest release's, and an older one must not be handed a flag it rejects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from vllm_operator.releases.arguments import (
    Arguments,
    arguments_for,
    override_problems,
    value_problem,
)
from vllm_operator.releases.version import DeployedVersion
from vllm_operator.tuning.args import Setting
from vllm_operator.tuning.results import DoesNotFit, Plan, SpecOnly, TuningResult


def release_problem(
    overrides: Mapping[str, str],
    deployed: DeployedVersion,
    *,
    where: str = "spec.tuning.overrides.{name}",
) -> tuple[Arguments | None, DoesNotFit | None]:
    """The release's arguments, or why nothing can be planned for it."""
    release = arguments_for(deployed.version)
    if release.arguments is None:
        return None, DoesNotFit("UnsupportedVllmVersion", release.note or "")
    problems = override_problems(overrides, release.arguments, where=where)
    if problems:
        return release.arguments, DoesNotFit("InvalidOverride", "; ".join(problems))
    return release.arguments, None


def spell(arguments: Sequence[Setting], release: Arguments) -> tuple[list[Setting], list[str]]:
    """``arguments`` without those ``release`` would reject, and a note for each one left
    out. Overrides were checked before planning and stay as they are. A ``false`` for a
    switch that cannot be negated is left out silently: not passing it means the same."""
    kept: list[Setting] = []
    notes: list[str] = []
    for setting in arguments:
        if setting.source == "Override":
            kept.append(setting)
            continue
        flag = release.get(setting.name)
        if flag is None:
            notes.append(
                f"--{setting.name} {setting.value} is not an argument of vLLM "
                f"{release.release}; not passed ({setting.reason})"
            )
            continue
        if setting.value == "false" and not flag.takes_value and not flag.negatable:
            continue
        why = value_problem(flag, setting.value, release.release)
        if why is not None:
            notes.append(f"--{setting.name} {setting.value} not passed: {why}")
            continue
        kept.append(setting)
    return kept, notes


def for_release(
    result: TuningResult, release: Arguments, deployed: DeployedVersion, note: str | None
) -> TuningResult:
    """``result`` with its arguments spelled for ``release`` and the version recorded."""
    if isinstance(result, DoesNotFit):
        return result
    arguments, notes = spell(result.arguments, release)
    version_notes = [n for n in (deployed.note, note) if n]
    if isinstance(result, Plan):
        return dataclasses.replace(
            result,
            arguments=tuple(arguments),
            notes=(*version_notes, *result.notes, *notes),
            vllm_version=str(deployed.version),
        )
    assert isinstance(result, SpecOnly)
    return dataclasses.replace(
        result,
        arguments=tuple(arguments),
        notes=(*version_notes, *notes),
        vllm_version=str(deployed.version),
    )
