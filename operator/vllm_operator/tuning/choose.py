"""Choosing the tensor-parallel size (:func:`choose_tp`), and the batch budget a TTFT
objective needs.

A size fixed by the spec or an override is checked (it must divide the heads and the MLP
width, the node must have the GPUs, the KV cache must hold a request); a fixed size over
PCIe that is predicted to decode slower than one GPU per replica gets a note with both
figures (boards without peer-to-peer: docs/field-notes.md, 1). Otherwise: the smallest GPU
count that holds the weights plus a KV cache for one typical request; then, only over
NVLink, the smallest that also holds the workload's KV demand or meets a TPOT objective.
Never more GPUs over PCIe than the weights need: extra GPUs become replicas.

A TTFT P99 objective (``spec.slo.ttftP99Milliseconds``) then sets
``--max-num-batched-tokens``: the smallest of vLLM's default and a few larger budgets, up to
the one that prefills the workload's p99 prompt in one step, whose predicted TTFT P99
(:func:`~vllm_operator.tuning.performance.ttft_p99`) meets it and whose activations still
leave the KV cache a request. When none does, the plan keeps the one-step budget (the best
it can do) and a note gives the predicted figure, the target and what would help.
``--max-num-seqs`` is not lowered for it: the sequences running beside a prompt are the
concurrency the workload brings, and a request with no free slot waits longer still.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from vllm_operator.tuning.args import Setting
from vllm_operator.tuning.candidate import (
    Candidate,
    GpuChoices,
    candidate,
    decode_estimate,
    fits,
    valid_tp,
)
from vllm_operator.tuning.memory import kv_bytes_per_token
from vllm_operator.tuning.performance import (
    Replica,
    TtftEstimate,
    batched_tokens_for_ttft,
    graph_tokens,
    ttft_p99,
)
from vllm_operator.tuning.request import Ask, Context
from vllm_operator.tuning.results import DoesNotFit, FitOption
from vllm_operator.tuning.units import gib
from vllm_operator.tuning.verdicts import does_not_fit

__all__ = ["Choice", "PrefillLoad", "choose_tp", "meet_ttft", "prefill_load", "sizes"]


@dataclasses.dataclass(frozen=True)
class Choice:
    candidate: Candidate
    source: Literal["Tuner", "Spec", "Override"]
    reason: str
    notes: tuple[str, ...] = ()
    # The GPU choices the candidate was built with, where the choice changed them (the
    # batch budget a TTFT objective needs); None: those the caller passed.
    gpu_choices: GpuChoices | None = None
    # A multi-node choice (tuning/multinode.py): the nodes of one instance, one pipeline
    # stage each, and why that many.
    nodes: int = 1
    pipeline_reason: str | None = None


def choose_tp(ask: Ask, g: GpuChoices, ctx: Context) -> Choice | DoesNotFit:
    choice = _choose_tp(ask, g, ctx)
    if isinstance(choice, DoesNotFit):
        return choice
    return meet_ttft(ask, g, ctx, choice)


@dataclasses.dataclass(frozen=True)
class Fixed:
    """A tensor-parallel size the spec (``spec.gpu.count``) or an override fixes."""

    tp: int
    source: Literal["Spec", "Override"]


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The tensor-parallel sizes this GPU set allows (candidates, smallest first) and those
    whose KV cache holds a typical request."""

    candidates: tuple[Candidate, ...]
    fitting: tuple[Candidate, ...]


@dataclasses.dataclass(frozen=True)
class Pick:
    """The size chosen so far, why, and the notes gathered on the way."""

    candidate: Candidate
    reason: str
    notes: tuple[str, ...] = ()


def _needed_tokens(ctx: Context) -> int:
    """Tokens the KV cache must hold at least: one typical request (within the context)."""
    return max(1, min(ctx.typical, ctx.wanted))


def fixed_size(ask: Ask) -> Fixed | None:
    """The size an override or the spec's GPU count fixes (over the pipeline stages)."""
    pp = ask.pins.pipeline_parallel_size or 1
    if ask.pins.tensor_parallel_size is not None:
        return Fixed(ask.pins.tensor_parallel_size, "Override")
    if isinstance(ask.gpu_count, int):
        return Fixed(max(1, ask.gpu_count // pp), "Spec")
    return None


def check_fixed(ask: Ask, g: GpuChoices, ctx: Context, fixed: Fixed) -> Choice | DoesNotFit:
    """A fixed size, checked: it divides the heads, the node has the GPUs, a request fits."""
    arch, gpu = ask.model.architecture, g.profile
    pp = ask.pins.pipeline_parallel_size or 1
    why = valid_tp(arch, g.fmt, fixed.tp)
    if why is not None:
        valid = [t for t in range(1, 17) if valid_tp(arch, g.fmt, t) is None]
        return DoesNotFit(
            "InvalidParallelism",
            f"tensor parallel {fixed.tp} is not possible for {ask.model.name}: {why}",
            (FitOption("MoreGPUs", f"a GPU count of {', '.join(map(str, valid))}"),),
            gpu=gpu,
            model=ask.model,
        )
    c = candidate(ask, g, fixed.tp, pp)
    if c is None:
        return DoesNotFit(
            "NotEnoughGPUs",
            f"{fixed.tp * pp} GPUs per replica asked for; {gpu.describe()} has {gpu.count}",
            gpu=gpu,
            model=ask.model,
        )
    if not fits(c, arch, _needed_tokens(ctx)):
        return does_not_fit(ask, g, ctx, c)
    where = "spec.gpu.count" if fixed.source == "Spec" else "spec.tuning.overrides"
    return Choice(c, fixed.source, f"set by {where}", _slower_than_one_gpu(ask, g, ctx, c))


def sizes(ask: Ask, g: GpuChoices, ctx: Context) -> Sizes:
    """Every valid size up to the GPU set's count, and those that hold a typical request."""
    arch, pp = ask.model.architecture, ask.pins.pipeline_parallel_size or 1
    valid = [t for t in range(1, g.profile.count // pp + 1) if valid_tp(arch, g.fmt, t) is None]
    candidates = tuple(c for t in valid if (c := candidate(ask, g, t, pp)) is not None)
    need = _needed_tokens(ctx)
    return Sizes(candidates, tuple(c for c in candidates if fits(c, arch, need)))


def nothing_fits(ask: Ask, g: GpuChoices, ctx: Context, found: Sizes) -> DoesNotFit:
    """The verdict when no size holds a typical request: the largest's, or too few GPUs."""
    if not found.candidates:
        pp = ask.pins.pipeline_parallel_size or 1
        return DoesNotFit(
            "NotEnoughGPUs",
            f"{pp} pipeline stages need more GPUs than {g.profile.describe()} has",
            gpu=g.profile,
            model=ask.model,
        )
    return does_not_fit(ask, g, ctx, found.candidates[-1])


def smallest(ask: Ask, g: GpuChoices, base: Candidate) -> Pick:
    """The smallest size that fits: why, and a note when it spans PCIe."""
    arch, gpu = ask.model.architecture, g.profile
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
    notes: tuple[str, ...] = ()
    if base.tp > 1 and base.link != "NVLink":
        notes = (
            f"tensor parallel {base.tp} runs over PCIe ({base.link}): every layer's all-reduce "
            "crosses it; a set sharing NVLink or a quantized model on fewer GPUs is faster",
        )
    return Pick(base, reason, notes)


def for_headroom(ask: Ask, g: GpuChoices, ctx: Context, found: Sizes, pick: Pick) -> Pick:
    """A larger size on NVLink when the smallest's KV cache cannot hold the workload's
    sequences; else a note that max-num-seqs is bounded by it."""
    arch, base = ask.model.architecture, pick.candidate
    demand = max(ctx.wanted, g.seqs_target * ctx.typical)
    if base.kv_token_room(arch) >= demand:
        return pick
    upgrade = next(
        (
            c
            for c in found.fitting
            if c.tp > base.tp and c.link == "NVLink" and c.kv_token_room(arch) >= demand
        ),
        None,
    )
    if upgrade is not None:
        reason = (
            f"{upgrade.tp} GPUs on NVLink: {base.tp} would hold the weights but only "
            f"{base.kv_token_room(arch):,} KV tokens of the {demand:,} the workload needs "
            f"({g.seqs_target} sequences x {ctx.typical:,} tokens); {upgrade.tp} holds "
            f"{upgrade.kv_token_room(arch):,}"
        )
        return Pick(upgrade, reason, pick.notes)
    why_not = (
        "more GPUs would be TP over PCIe, a loss; add replicas instead"
        if any(c.tp > base.tp for c in found.candidates)
        else "no larger tensor-parallel size is possible here"
    )
    note = (
        f"the KV cache holds {base.kv_token_room(arch):,} tokens, less than "
        f"{g.seqs_target} sequences x {ctx.typical:,} tokens = {demand:,}; "
        f"max-num-seqs is bounded by it ({why_not})"
    )
    return Pick(base, pick.reason, (*pick.notes, note))


def for_tpot(ask: Ask, g: GpuChoices, ctx: Context, found: Sizes, pick: Pick) -> Pick:
    """A larger size on NVLink when a TPOT objective is missed at the chosen one; else a
    note that none here meets it."""
    target, chosen = ask.slo.tpot_p99_milliseconds, pick.candidate
    if target is None:
        return pick
    estimate = decode_estimate(ask, g, chosen, ctx.typical)
    if estimate is None or estimate.step_seconds * 1000 <= target:
        return pick
    faster = next(
        (
            c
            for c in found.fitting
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
        return Pick(faster, reason, pick.notes)
    note = (
        f"TPOT P99 objective {target} ms is below the roofline estimate of "
        f"~{estimate.step_seconds * 1000:.1f} ms per token at batch 1 on this GPU "
        "set; no NVLink tensor-parallel size here meets it"
    )
    return Pick(chosen, pick.reason, (*pick.notes, note))


def _choose_tp(ask: Ask, g: GpuChoices, ctx: Context) -> Choice | DoesNotFit:
    fixed = fixed_size(ask)
    if fixed is not None:
        return check_fixed(ask, g, ctx, fixed)
    found = sizes(ask, g, ctx)
    if not found.fitting:
        return nothing_fits(ask, g, ctx, found)
    pick = smallest(ask, g, found.fitting[0])
    pick = for_headroom(ask, g, ctx, found, pick)
    pick = for_tpot(ask, g, ctx, found, pick)
    return Choice(pick.candidate, "Tuner", pick.reason, pick.notes)


def _slower_than_one_gpu(ask: Ask, g: GpuChoices, ctx: Context, c: Candidate) -> tuple[str, ...]:
    """A note when a fixed TP size over PCIe decodes slower than one GPU per replica would."""
    if c.tp <= 1 or c.link == "NVLink":
        return ()
    arch = ask.model.architecture
    one = candidate(ask, g, 1, c.pp)
    if one is None or not fits(one, arch, max(1, min(ctx.typical, ctx.wanted))):
        return ()
    fixed, single = (
        decode_estimate(ask, g, c, ctx.typical),
        decode_estimate(ask, g, one, ctx.typical),
    )
    if fixed is None or single is None or fixed.tokens_per_second >= single.tokens_per_second:
        return ()
    gpu = g.profile
    path = "PCIe peer-to-peer" if gpu.pcie_p2p else "host memory (no peer-to-peer)"
    per = fixed.communication_seconds / (2 * arch.num_layers)
    replicas = gpu.count // one.gpus_count
    return (
        f"tensor parallel {c.tp} over PCIe ({c.link}) is predicted to decode slower than one "
        f"GPU per replica: ~{fixed.tokens_per_second:.1f} vs ~{single.tokens_per_second:.1f} "
        f"tokens/s for one sequence of {ctx.typical:,} tokens ({2 * arch.num_layers} "
        f"all-reduces per token through {path}, ~{per * 1e6:.0f} us each); the model fits "
        f"one {gpu.name}, so {replicas} replicas of {one.gpus_count} GPU(s) each would serve more "
        "(docs/field-notes.md, 1: 3.2 tokens/s at TP 2 against 12 at TP 1)",
    )


def replica_model(
    ask: Ask, g: GpuChoices, c: Candidate, *, efficiency: float | None = None
) -> Replica | None:
    """The step model of one replica of candidate ``c``; None without the GPU's figures."""
    gpu = g.profile
    bandwidth, flops = gpu.bandwidth_bytes_per_second, gpu.flops_per_second
    if bandwidth is None or flops is None:
        return None
    arch = ask.model.architecture
    return Replica(
        arch=arch,
        weights_bytes=c.weights,
        kv_bytes_per_token_gpu=kv_bytes_per_token(
            arch, kv_dtype_bytes=c.kv_dtype_bytes, tensor_parallel=c.tp, pipeline_parallel=c.pp
        ),
        bandwidth_bytes_per_second=bandwidth,
        measured=gpu.bandwidth_measured,
        flops_per_second=flops,
        tensor_parallel=c.tp,
        link=c.link,
        peer_to_peer=gpu.pcie_p2p,
        activation_bytes=g.dtype_bytes,
        eager=g.eager.value == "true",
        graph_tokens=graph_tokens(g.seqs_target),
        efficiency=efficiency,
    )


def _describe(e: TtftEstimate, decodes: int) -> str:
    queue = (
        f" + ~{e.queue_seconds * 1000:,.0f} ms waiting behind other prompts (prefill busy "
        f"{e.load:.0%} of the time)"
        if e.load is not None and e.queue_seconds > 0
        else ""
    )
    return (
        f"{e.steps} step(s) of up to {e.chunk_tokens:,} prompt tokens beside {decodes} decodes, "
        f"~{e.prefill_seconds * 1000:,.0f} ms{queue}"
    )


@dataclasses.dataclass(frozen=True)
class PrefillLoad:
    """What a prompt's time to first token depends on besides the budget: the p99 and
    mean prompt, the mean output, the sequences decoding beside it, their context, and the
    declared concurrency (None: a full batch)."""

    prompt_p99: int
    prompt_mean: float
    output_mean: float
    decodes: int
    context: int
    concurrency: int | None


# The note's advice whenever the objective is missed.
_TTFT_HELP = (
    "what would help: shorter prompts (the p99 prompt sets it), fewer prompts per replica "
    "(more replicas, or a lower peak concurrency), or more GPUs per replica on NVLink "
    "(tensor parallelism splits the prefill compute)"
)


def prefill_load(ask: Ask, g: GpuChoices, ctx: Context, c: Candidate) -> PrefillLoad | None:
    """The load a prompt meets on candidate ``c``; None without declared prompt lengths."""
    prompt, p99 = ask.prompt, ask.prompt_p99
    if prompt is None or p99 is None:
        return None
    # The sequences decoding beside the prompt: the peak concurrency one replica sees when
    # declared, else a full batch (as many as max-num-seqs and the KV cache allow).
    seqs = min(
        g.seqs_target, max(1, c.kv_token_room(ask.model.architecture) // max(1, ctx.typical))
    )
    concurrency = min(seqs, ask.peak_per_replica) if ask.peak_per_replica else None
    return PrefillLoad(
        prompt_p99=p99,
        prompt_mean=prompt.mean,
        output_mean=ask.output.mean if ask.output else max(1.0, ctx.typical - prompt.mean),
        decodes=max(0, (concurrency or seqs) - 1),
        context=ctx.typical,
        concurrency=concurrency,
    )


def _current_budget(g: GpuChoices) -> int:
    return int(g.batched.value) if g.batched.value.isdigit() else 8192


def fixed_budget_notes(
    ask: Ask, g: GpuChoices, r: Replica, load: PrefillLoad, target: int
) -> tuple[str, ...]:
    """The budget cannot move (an override, or chunked prefill off): a note when the
    objective is predicted missed at it."""
    current = _current_budget(g)
    e = ttft_p99(
        r,
        prompt_p99=load.prompt_p99,
        prompt_mean=load.prompt_mean,
        output_mean=load.output_mean,
        batched_tokens=current,
        decodes=load.decodes,
        context=load.context,
        concurrency=load.concurrency,
    )
    if e.seconds * 1000 <= target:
        return ()
    fixed = "set in overrides" if g.batched.source == "Override" else "chunked prefill off"
    return (
        f"TTFT P99 objective {target} ms is predicted missed: ~{e.milliseconds:,.0f} ms "
        f"for the p99 prompt ({load.prompt_p99:,} tokens) at max-num-batched-tokens "
        f"{current:,} ({fixed}): {_describe(e, load.decodes)}; {_TTFT_HELP}",
    )


@dataclasses.dataclass(frozen=True)
class Budget:
    """The batch budget a TTFT objective led to: the candidate and GPU choices rebuilt
    with it (None: unchanged), and the notes it adds."""

    notes: tuple[str, ...] = ()
    candidate: Candidate | None = None
    gpu_choices: GpuChoices | None = None


def raise_budget(
    ask: Ask, g: GpuChoices, ctx: Context, c: Candidate, r: Replica, load: PrefillLoad, target: int
) -> Budget:
    """The smallest larger budget whose predicted TTFT P99 meets ``target`` and whose
    activations still leave the KV cache a request; else notes on why none is taken."""
    current = _current_budget(g)
    where = f"the p99 prompt ({load.prompt_p99:,} tokens)"
    estimates = batched_tokens_for_ttft(
        r,
        target / 1000,
        start=current,
        prompt_p99=load.prompt_p99,
        prompt_mean=load.prompt_mean,
        output_mean=load.output_mean,
        decodes=load.decodes,
        context=load.context,
        concurrency=load.concurrency,
    )
    first, last = estimates[0], estimates[-1]
    if first.seconds * 1000 <= target:
        return Budget()
    if last.seconds * 1000 > target:
        # Not even one step meets it: the budget stays (a larger one would only lengthen
        # the steps every running sequence waits for) and the note says why.
        why = (
            f"~{last.milliseconds:,.0f} ms predicted for {where} even at "
            f"max-num-batched-tokens {last.batched_tokens:,} ({_describe(last, load.decodes)})"
        )
        if last is not first:
            why += f"; ~{first.milliseconds:,.0f} ms at {current:,}, which stays"
        return Budget(
            (
                f"TTFT P99 objective {target} ms cannot be met on {c.gpus_count} "
                f"{g.profile.name} per replica: {why}; {_TTFT_HELP}",
            )
        )
    setting = Setting("max-num-batched-tokens", str(last.batched_tokens), "Tuner", "")
    c2 = candidate(ask, dataclasses.replace(g, batched=setting), c.tp, c.pp)
    if c2 is None or not fits(c2, ask.model.architecture, _needed_tokens(ctx)):
        return Budget(
            (
                f"TTFT P99 objective {target} ms would need max-num-batched-tokens "
                f"{last.batched_tokens:,} (~{last.milliseconds:,.0f} ms for {where}), but its "
                f"activations leave the KV cache too small; at {current:,} it is "
                f"~{first.milliseconds:,.0f} ms; {_TTFT_HELP}",
            )
        )
    before = (
        f"~{first.milliseconds:,.0f} ms"
        if math.isfinite(first.seconds)
        else "a prefill queue that never drains"
    )
    reason = (
        f"TTFT P99 objective {target} ms: {where} takes {_describe(last, load.decodes)}; "
        f"{current:,} ({g.batched.reason}) would give {before}"
    )
    g2 = dataclasses.replace(g, batched=dataclasses.replace(setting, reason=reason))
    return Budget(_tpot_conflict(ask, r, load, last), c2, g2)


def _tpot_conflict(ask: Ask, r: Replica, load: PrefillLoad, e: TtftEstimate) -> tuple[str, ...]:
    """A note when the raised budget's steps outlast the TPOT objective."""
    tpot = ask.slo.tpot_p99_milliseconds
    step = r.step_seconds(e.chunk_tokens, decodes=load.decodes, context=load.context)
    if tpot is None or step * 1000 <= tpot:
        return ()
    return (
        f"a step of {e.batched_tokens:,} tokens takes ~{step * 1000:,.0f} ms, "
        f"above the TPOT P99 objective of {tpot} ms: the decodes beside a prefill "
        "chunk wait for it; the two objectives conflict on this GPU set",
    )


def meet_ttft(ask: Ask, g: GpuChoices, ctx: Context, choice: Choice) -> Choice:
    """Raise --max-num-batched-tokens until the predicted TTFT P99 meets the objective."""
    target = ask.slo.ttft_p99_milliseconds
    if target is None:
        return choice
    c = choice.candidate
    load = prefill_load(ask, g, ctx, c)
    if load is None:
        note = (
            f"TTFT P99 objective {target} ms not planned for: spec.workload declares no prompt "
            "lengths, and the p99 prompt is what sets it"
        )
        return dataclasses.replace(choice, notes=(*choice.notes, note))
    r = replica_model(ask, g, c)
    if r is None:
        note = (
            f"TTFT P99 objective {target} ms not planned for: {g.profile.name} has no dense "
            "tensor FLOP/s or bandwidth figure in the GPU catalog to time prefill by"
        )
        return dataclasses.replace(choice, notes=(*choice.notes, note))
    if g.batched.source == "Override" or ask.pins.enable_chunked_prefill is False:
        notes = fixed_budget_notes(ask, g, r, load, target)
        return dataclasses.replace(choice, notes=(*choice.notes, *notes))
    budget = raise_budget(ask, g, ctx, c, r, load, target)
    if budget.candidate is None:
        return dataclasses.replace(choice, notes=(*choice.notes, *budget.notes))
    return dataclasses.replace(
        choice,
        notes=(*choice.notes, *budget.notes),
        candidate=budget.candidate,
        gpu_choices=budget.gpu_choices,
    )
