"""Choosing the tensor-parallel size (:func:`choose_tp`).

A size fixed by the spec or an override is checked (it must divide the heads and the MLP
width, the node must have the GPUs, the KV cache must hold a request). Otherwise: the
smallest GPU count that holds the weights plus a KV cache for one typical request; then,
only over NVLink, the smallest that also holds the workload's KV demand or meets a TPOT
objective. Never more GPUs over PCIe than the weights need: extra GPUs become replicas.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from vllm_operator.tuning.candidate import (
    Candidate,
    GpuChoices,
    candidate,
    decode_estimate,
    fits,
    valid_tp,
)
from vllm_operator.tuning.request import Ask, Context
from vllm_operator.tuning.results import DoesNotFit, FitOption
from vllm_operator.tuning.units import gib
from vllm_operator.tuning.verdicts import does_not_fit

__all__ = ["Choice", "choose_tp"]


@dataclasses.dataclass(frozen=True)
class Choice:
    candidate: Candidate
    source: Literal["Tuner", "Spec", "Override"]
    reason: str
    notes: tuple[str, ...] = ()


def choose_tp(ask: Ask, g: GpuChoices, ctx: Context) -> Choice | DoesNotFit:
    arch = ask.model.architecture
    gpu = g.profile
    pp = ask.pins.pipeline_parallel_size or 1
    fixed: int | None = None
    fixed_source: Literal["Spec", "Override"] = "Spec"
    if ask.pins.tensor_parallel_size is not None:
        fixed, fixed_source = ask.pins.tensor_parallel_size, "Override"
    elif isinstance(ask.gpu_count, int):
        fixed = max(1, ask.gpu_count // pp)
    need = max(1, min(ctx.typical, ctx.wanted))

    if fixed is not None:
        why = valid_tp(arch, g.fmt, fixed)
        if why is not None:
            valid = [t for t in range(1, 17) if valid_tp(arch, g.fmt, t) is None]
            return DoesNotFit(
                "InvalidParallelism",
                f"tensor parallel {fixed} is not possible for {ask.model.name}: {why}",
                (FitOption("MoreGPUs", f"a GPU count of {', '.join(map(str, valid))}"),),
                gpu=gpu,
                model=ask.model,
            )
        c = candidate(ask, g, fixed, pp)
        if c is None:
            return DoesNotFit(
                "NotEnoughGPUs",
                f"{fixed * pp} GPUs per replica asked for; {gpu.describe()} has {gpu.count}",
                gpu=gpu,
                model=ask.model,
            )
        if not fits(c, arch, need):
            return does_not_fit(ask, g, ctx, c)
        where = "spec.gpu.count" if fixed_source == "Spec" else "spec.tuning.overrides"
        return Choice(c, fixed_source, f"set by {where}")

    valid = [t for t in range(1, gpu.count // pp + 1) if valid_tp(arch, g.fmt, t) is None]
    candidates = [c for t in valid if (c := candidate(ask, g, t, pp)) is not None]
    fitting = [c for c in candidates if fits(c, arch, need)]
    if not fitting:
        largest = candidates[-1] if candidates else None
        if largest is None:
            return DoesNotFit(
                "NotEnoughGPUs",
                f"{pp} pipeline stages need more GPUs than {gpu.describe()} has",
                gpu=gpu,
                model=ask.model,
            )
        return does_not_fit(ask, g, ctx, largest)
    base = fitting[0]
    demand = max(ctx.wanted, g.seqs_target * ctx.typical)

    def comfortable(c: Candidate) -> bool:
        return c.kv_token_room(arch) >= demand

    if base.tp == 1:
        reason = (
            f"the weights ({gib(base.weights)}) and the KV cache fit one "
            f"{gpu.name}: one GPU per replica, no all-reduce on any step"
        )
    else:
        reason = (
            f"the weights ({gib(base.weights)}) need {base.tp} GPUs of "
            f"{gib(gpu.memory_bytes)}; {base.tp} is the smallest count that fits and divides "
            f"the {arch.num_attention_heads} heads"
        )
    notes: list[str] = []
    if base.tp > 1 and base.link != "NVLink":
        notes.append(
            f"tensor parallel {base.tp} runs over PCIe ({base.link}): every layer's all-reduce "
            "crosses it; a set sharing NVLink or a quantized model on fewer GPUs is faster"
        )
    chosen = base
    if not comfortable(base):
        upgrade = next(
            (c for c in fitting if c.tp > base.tp and c.link == "NVLink" and comfortable(c)),
            None,
        )
        if upgrade is not None:
            chosen = upgrade
            reason = (
                f"{upgrade.tp} GPUs on NVLink: {base.tp} would hold the weights but only "
                f"{base.kv_token_room(arch):,} KV tokens of the {demand:,} the workload needs "
                f"({g.seqs_target} sequences x {ctx.typical:,} tokens); {upgrade.tp} holds "
                f"{upgrade.kv_token_room(arch):,}"
            )
        else:
            why_not = (
                "more GPUs would be TP over PCIe, a loss; add replicas instead"
                if any(c.tp > base.tp for c in candidates)
                else "no larger tensor-parallel size is possible here"
            )
            notes.append(
                f"the KV cache holds {base.kv_token_room(arch):,} tokens, less than "
                f"{g.seqs_target} sequences x {ctx.typical:,} tokens = {demand:,}; "
                f"max-num-seqs is bounded by it ({why_not})"
            )
    target = ask.slo.tpot_p99_milliseconds
    if target is not None:
        estimate = decode_estimate(ask, g, chosen, ctx.typical)
        if estimate is not None and estimate.step_seconds * 1000 > target:
            faster = next(
                (
                    c
                    for c in fitting
                    if c.tp > chosen.tp
                    and c.link == "NVLink"
                    and (e := decode_estimate(ask, g, c, ctx.typical)) is not None
                    and e.step_seconds * 1000 <= target
                ),
                None,
            )
            if faster is not None:
                reason = (
                    f"{faster.tp} GPUs on NVLink to meet the TPOT P99 objective of {target} ms: "
                    f"{chosen.tp} would need ~{estimate.step_seconds * 1000:.1f} ms per token"
                )
                chosen = faster
            else:
                notes.append(
                    f"TPOT P99 objective {target} ms is below the roofline estimate of "
                    f"~{estimate.step_seconds * 1000:.1f} ms per token at batch 1 on this GPU "
                    "set; no NVLink tensor-parallel size here meets it"
                )
    return Choice(chosen, "Tuner", reason, tuple(notes))
