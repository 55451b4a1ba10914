"""Candidates for a measured tuning run: variants of a plan, each with the tuner's
predicted goodput, ordered best first.

A measured run (kind InferenceTuning) starts from the service's plan (the incumbent) and
measures a few variants of it. :func:`candidate_space` proposes them, and only where each
is a real choice for the plan's shape:

- ``tp<N>``: tensor parallelism over the same GPUs instead of one replica per GPU (or the
  reverse), the service's GPUs kept: over PCIe this is the question of TP 2 against one
  GPU per replica (docs/field-notes.md, 1);
- ``eager`` / ``graphs``: CUDA graphs against ``--enforce-eager`` (eager pays the launches
  graphs save at small batch; tuning/performance.py states the figure);
- ``seqs-256`` / ``seqs-<N>``: ``--max-num-seqs`` at vLLM's GPU default (256) against 1.5x
  the peak one replica sees (at the declared peak both admit every request; they differ in
  bursts beyond it and in the memory the graphs take);
- ``batched-<N>``: half and twice the batch budget;
- ``no-chunked``: chunked prefill off (each prompt in one step);
- ``kv-fp8``: an FP8 KV cache, on GPUs with FP8 (compute capability 8.9 and up).

Each candidate's goodput (requests/s meeting the service's SLO, whole service) comes from
:func:`vllm_operator.tuning.slo.goodput` on the variant rebuilt with the planner's own
steps. A variant that does not fit (its weights and KV cache, or its GPUs) is returned with
``fits=False`` after the others, so the run records it as skipped. Nothing is predictable
for a verdict, an unplanned model, a multi-node group or a GPU without catalog figures:
then the space is empty.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Final

from vllm_operator.tuning import slo
from vllm_operator.tuning.args import read_overrides
from vllm_operator.tuning.candidate import candidate, fits, gpu_choices, valid_tp
from vllm_operator.tuning.choose import Choice, meet_ttft
from vllm_operator.tuning.plan import PlanInputs
from vllm_operator.tuning.request import Ask
from vllm_operator.tuning.results import Plan, TuningResult

__all__ = ["VLLM_DEFAULT_SEQS", "TrialCandidate", "candidate_space", "predicted_goodput"]

# vLLM's --max-num-seqs on GPUs for the API server.
VLLM_DEFAULT_SEQS: Final = 256
_BOOLEAN_FLAGS: Final = ("enforce-eager", "enable-chunked-prefill", "enable-prefix-caching")


@dataclasses.dataclass(frozen=True)
class TrialCandidate:
    name: str  # DNS-label, <= 20 chars, e.g. "seqs-8", "eager", "tp2"
    overrides: dict[str, str]  # vLLM flag (no leading --) -> value; "" for a bare flag
    predicted_goodput_per_second: float | None  # requests/s meeting the SLO, whole service
    why: str  # one sentence: what this candidate tests
    fits: bool = True  # False: pruned (does not fit), with why saying so


@dataclasses.dataclass(frozen=True)
class _Outcome:
    """A variant predicted: its goodput (None: not predictable) or why it does not fit."""

    goodput: float | None
    does_not_fit: str | None = None


def _inputs(result: TuningResult) -> tuple[Plan, PlanInputs] | None:
    if not isinstance(result, Plan) or result.nodes > 1 or result.pipeline_parallel_size > 1:
        return None
    inputs = result.inputs
    if not isinstance(inputs, PlanInputs):
        return None
    return result, inputs


def _flags(overrides: Mapping[str, str]) -> dict[str, str]:
    """Overrides as the planner reads them: a bare boolean flag ("") is true."""
    return {k: ("true" if v == "" and k in _BOOLEAN_FLAGS else v) for k, v in overrides.items()}


def _predict(plan: Plan, inputs: PlanInputs, overrides: Mapping[str, str]) -> _Outcome:
    ask, ctx = inputs.ask, inputs.context
    merged = {**ask.overrides, **_flags(overrides)}
    pins = read_overrides(merged)
    arch = ask.model.architecture
    tp = pins.tensor_parallel_size or plan.tensor_parallel_size
    # The GPUs the variant may use: the service's, or the two a TP 2 trial needs.
    service_gpus = max(plan.gpus_per_replica * _replicas(plan, ask), tp)
    if (why := valid_tp(arch, ask.fmt, tp)) is not None:
        return _Outcome(None, f"tensor-parallel-size {tp}: {why}")
    if tp > plan.gpu.count:
        return _Outcome(
            None, f"tensor-parallel-size {tp} needs more GPUs than {plan.gpu.describe()}"
        )
    replicas = max(1, service_gpus // tp)
    peak = ask.peak
    variant = dataclasses.replace(
        ask,
        pins=pins,
        overrides=merged,
        replicas=replicas,
        peak_per_replica=math.ceil(peak / replicas) if peak else ask.peak_per_replica,
    )
    g = gpu_choices(variant, plan.gpu)
    c = candidate(variant, g, tp, 1)
    if c is None:
        return _Outcome(None, f"{tp} GPUs are not available as one group")
    if not fits(c, arch, max(1, min(ctx.typical, ctx.wanted))):
        return _Outcome(None, "its weights and activations leave no KV cache for a request")
    choice = meet_ttft(variant, g, ctx, Choice(c, "Tuner", ""))
    g = choice.gpu_choices or g
    rate = slo.goodput(
        variant,
        g,
        ctx,
        choice.candidate,
        slo.Targets.of(ask.slo),
        measured=inputs.measured if not overrides else None,
    )
    return _Outcome(None if rate is None else round(rate * replicas, 3))


def _replicas(plan: Plan, ask: Ask) -> int:
    return plan.slo.replicas if plan.slo is not None else max(1, ask.replicas)


def predicted_goodput(result: TuningResult, overrides: dict[str, str]) -> float | None:
    """The tuner's goodput for the plan with these overrides (None: not predictable)."""
    found = _inputs(result)
    if found is None:
        return None
    return _predict(*found, overrides).goodput


def _proposals(plan: Plan, ask: Ask) -> list[tuple[str, dict[str, str], str]]:
    """(name, overrides, why) for every variant that is a real choice for this plan."""
    found: list[tuple[str, dict[str, str], str]] = []
    tp, gpu = plan.tensor_parallel_size, plan.gpu
    pair = gpu.best_group(2) if gpu.count >= 2 else None
    link = "NVLink" if pair is not None and pair[1] == "NVLink" else f"PCIe ({pair and pair[1]})"
    gpus = max(plan.gpus_per_replica * _replicas(plan, ask), 2)
    if ask.pins.tensor_parallel_size is None:
        if tp == 1 and gpu.count >= 2:
            found.append(
                (
                    "tp2",
                    {"tensor-parallel-size": "2"},
                    f"tensor parallel 2 over {link} against one GPU per replica: "
                    f"{gpus // 2} replica(s) of 2 GPUs on {gpus} GPUs",
                )
            )
        elif tp > 1:
            found.append(
                (
                    "tp1",
                    {"tensor-parallel-size": "1"},
                    f"one GPU per replica against tensor parallel {tp}: {gpus} replicas of "
                    f"1 GPU on the same {gpus} GPUs",
                )
            )
    eager = plan.argument("enforce-eager")
    if eager is not None and eager.source != "Override":
        if eager.value == "true":
            found.append(("graphs", {"enforce-eager": "false"}, "CUDA graphs against eager mode"))
        else:
            found.append(
                ("eager", {"enforce-eager": "true"}, "eager mode against CUDA graphs, at the peak")
            )
    seqs = plan.argument("max-num-seqs")
    if seqs is not None and seqs.source != "Override" and seqs.value.isdigit():
        current = int(seqs.value)
        if current != VLLM_DEFAULT_SEQS:
            found.append(
                (
                    f"seqs-{VLLM_DEFAULT_SEQS}",
                    {"max-num-seqs": str(VLLM_DEFAULT_SEQS)},
                    f"vLLM's default max-num-seqs {VLLM_DEFAULT_SEQS} against {current}",
                )
            )
        per = plan.slo and math.ceil(plan.slo.peak_concurrency / plan.slo.replicas)
        share = per or ask.peak_per_replica
        if share and math.ceil(1.5 * share) != current:
            target = math.ceil(1.5 * share)
            found.append(
                (
                    f"seqs-{target}",
                    {"max-num-seqs": str(target)},
                    f"max-num-seqs at 1.5x the peak one replica sees ({share}) against {current}",
                )
            )
    batched = plan.argument("max-num-batched-tokens")
    if batched is not None and batched.source != "Override" and batched.value.isdigit():
        current = int(batched.value)
        for value in (current // 2, current * 2):
            if value >= 256:
                found.append(
                    (
                        f"batched-{value}",
                        {"max-num-batched-tokens": str(value)},
                        f"a batch budget of {value:,} tokens against {current:,}",
                    )
                )
    if ask.pins.enable_chunked_prefill is None:
        found.append(
            (
                "no-chunked",
                {"enable-chunked-prefill": "false"},
                "each prompt prefilled in one step against chunks beside the decodes",
            )
        )
    cc = gpu.compute_capability
    if ask.pins.kv_cache_dtype is None and cc is not None and cc >= (8, 9):
        found.append(
            (
                "kv-fp8",
                {"kv-cache-dtype": "fp8"},
                "an FP8 KV cache (twice the tokens, half the reads) against the model's dtype",
            )
        )
    return found


def candidate_space(result: TuningResult, *, max_candidates: int = 8) -> list[TrialCandidate]:
    """Candidates around a plan, ordered by predicted goodput, best first; those that
    cannot fit are returned with fits=False at the end (the run records them as skipped)."""
    found = _inputs(result)
    if found is None:
        return []
    plan, inputs = found
    if predicted_goodput(plan, {}) is None:
        return []
    kept: list[TrialCandidate] = []
    pruned: list[TrialCandidate] = []
    for name, overrides, why in _proposals(plan, inputs.ask):
        outcome = _predict(plan, inputs, overrides)
        if outcome.does_not_fit is not None:
            pruned.append(
                TrialCandidate(
                    name, overrides, None, f"{why}: does not fit, {outcome.does_not_fit}", False
                )
            )
        else:
            kept.append(TrialCandidate(name, overrides, outcome.goodput, why))
    kept.sort(key=lambda t: -(t.predicted_goodput_per_second or 0.0))
    return [*kept[:max_candidates], *pruned]
