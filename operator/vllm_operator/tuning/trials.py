"""The tuner's candidates for a measured tuning run (InferenceTuning, docs/measured-tuning.md).

A placeholder with the shared design's names and signatures (issue 37, section 1): the
candidate space is being written on its own branch, whose version replaces this one. Until
then the run measures the candidates its spec names (spec.candidates), the incumbent and
vLLM's defaults, and has nothing predicted.
"""

from __future__ import annotations

import dataclasses

from vllm_operator.tuning.results import TuningResult


@dataclasses.dataclass(frozen=True)
class TrialCandidate:
    """One candidate of the space: its name (a DNS label of at most 20 characters), the
    vLLM flags it sets (no leading dashes; "" for a bare flag), the tuner's goodput for it
    (requests/s meeting the SLO, whole service), what it tests, and whether it fits."""

    name: str
    overrides: dict[str, str]
    predicted_goodput_per_second: float | None
    why: str
    fits: bool = True


def candidate_space(result: TuningResult, *, max_candidates: int = 8) -> list[TrialCandidate]:
    """Candidates around a plan, ordered by predicted goodput, best first; those that
    cannot fit are returned with fits=False at the end (the run records them as skipped)."""
    return []


def predicted_goodput(result: TuningResult, overrides: dict[str, str]) -> float | None:
    """The tuner's goodput for the plan with these overrides (None: not predictable)."""
    return None
