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
    ttft_p99,
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
    return _meet_ttft(ask, g, ctx, choice)


def _choose_tp(ask: Ask, g: GpuChoices, ctx: Context) -> Choice | DoesNotFit:
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
        return Choice(c, fixed_source, f"set by {where}", _slower_than_one_gpu(ask, g, ctx, c))

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


def _replica(ask: Ask, g: GpuChoices, c: Candidate) -> Replica | None:
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


def _meet_ttft(ask: Ask, g: GpuChoices, ctx: Context, choice: Choice) -> Choice:
    """Raise --max-num-batched-tokens until the predicted TTFT P99 meets the objective."""
    target = ask.slo.ttft_p99_milliseconds
    if target is None:
        return choice
    c, arch, gpu = choice.candidate, ask.model.architecture, g.profile
    notes = list(choice.notes)

    def with_notes(**changes: object) -> Choice:
        return dataclasses.replace(choice, notes=tuple(notes), **changes)  # type: ignore[arg-type]

    prompt, p99 = ask.prompt, ask.prompt_p99
    if prompt is None or p99 is None:
        notes.append(
            f"TTFT P99 objective {target} ms not planned for: spec.workload declares no prompt "
            "lengths, and the p99 prompt is what sets it"
        )
        return with_notes()
    r = _replica(ask, g, c)
    if r is None:
        notes.append(
            f"TTFT P99 objective {target} ms not planned for: {gpu.name} has no dense tensor "
            "FLOP/s or bandwidth figure in the GPU catalog to time prefill by"
        )
        return with_notes()
    # The sequences decoding beside the prompt: the peak concurrency one replica sees when
    # declared, else a full batch (as many as max-num-seqs and the KV cache allow).
    seqs = min(g.seqs_target, max(1, c.kv_token_room(arch) // max(1, ctx.typical)))
    concurrency = min(seqs, ask.peak_per_replica) if ask.peak_per_replica else None
    decodes = max(0, (concurrency or seqs) - 1)
    output_mean = ask.output.mean if ask.output else max(1.0, ctx.typical - prompt.mean)
    model = {
        "prompt_p99": p99,
        "prompt_mean": prompt.mean,
        "output_mean": output_mean,
        "decodes": decodes,
        "context": ctx.typical,
        "concurrency": concurrency,
    }
    current = int(g.batched.value) if g.batched.value.isdigit() else 8192
    where = f"the p99 prompt ({p99:,} tokens)"
    help_ = (
        "what would help: shorter prompts (the p99 prompt sets it), fewer prompts per replica "
        "(more replicas, or a lower peak concurrency), or more GPUs per replica on NVLink "
        "(tensor parallelism splits the prefill compute)"
    )
    if g.batched.source == "Override" or ask.pins.enable_chunked_prefill is False:
        e = ttft_p99(r, batched_tokens=current, **model)  # type: ignore[arg-type]
        if e.seconds * 1000 > target:
            fixed = "set in overrides" if g.batched.source == "Override" else "chunked prefill off"
            notes.append(
                f"TTFT P99 objective {target} ms is predicted missed: ~{e.milliseconds:,.0f} ms "
                f"for {where} at max-num-batched-tokens {current:,} ({fixed}): "
                f"{_describe(e, decodes)}; {help_}"
            )
        return with_notes()

    need = max(1, min(ctx.typical, ctx.wanted))
    estimates = batched_tokens_for_ttft(r, target / 1000, start=current, **model)  # type: ignore[arg-type]
    first, last = estimates[0], estimates[-1]
    if first.seconds * 1000 <= target:
        return with_notes()
    if last.seconds * 1000 <= target:
        setting = Setting("max-num-batched-tokens", str(last.batched_tokens), "Tuner", "")
        c2 = candidate(ask, dataclasses.replace(g, batched=setting), c.tp, c.pp)
        if c2 is not None and fits(c2, arch, need):
            before = (
                f"~{first.milliseconds:,.0f} ms"
                if math.isfinite(first.seconds)
                else "a prefill queue that never drains"
            )
            reason = (
                f"TTFT P99 objective {target} ms: {where} takes {_describe(last, decodes)}; "
                f"{current:,} ({g.batched.reason}) would give {before}"
            )
            g2 = dataclasses.replace(g, batched=dataclasses.replace(setting, reason=reason))
            tpot = ask.slo.tpot_p99_milliseconds
            step = r.step_seconds(last.chunk_tokens, decodes=decodes, context=ctx.typical)
            if tpot is not None and step * 1000 > tpot:
                notes.append(
                    f"a step of {last.batched_tokens:,} tokens takes ~{step * 1000:,.0f} ms, "
                    f"above the TPOT P99 objective of {tpot} ms: the decodes beside a prefill "
                    "chunk wait for it; the two objectives conflict on this GPU set"
                )
            return with_notes(candidate=c2, gpu_choices=g2)
        notes.append(
            f"TTFT P99 objective {target} ms would need max-num-batched-tokens "
            f"{last.batched_tokens:,} (~{last.milliseconds:,.0f} ms for {where}), but its "
            f"activations leave the KV cache too small; at {current:,} it is "
            f"~{first.milliseconds:,.0f} ms; {help_}"
        )
        return with_notes()
    # Not even one step meets it: the budget stays (a larger one would only lengthen the
    # steps every running sequence waits for) and the note says why.
    why = (
        f"~{last.milliseconds:,.0f} ms predicted for {where} even at "
        f"max-num-batched-tokens {last.batched_tokens:,} ({_describe(last, decodes)})"
    )
    if last is not first:
        why += f"; ~{first.milliseconds:,.0f} ms at {current:,}, which stays"
    notes.append(
        f"TTFT P99 objective {target} ms cannot be met on {c.gpus_count} {gpu.name} per "
        f"replica: {why}; {help_}"
    )
    return with_notes()
