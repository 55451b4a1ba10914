"""Verdicts: why a model does not fit a GPU set, and what would.

:func:`does_not_fit` turns a candidate that does not hold the weights, or whose KV cache
cannot hold one request, into a :class:`~vllm_operator.tuning.results.DoesNotFit`
(``WeightsDoNotFit`` or ``ContextDoesNotFit``) with :func:`fit_options`: a quantized
variant, more GPUs of the kind, a larger GPU, a shorter context, an FP8 KV cache. Never an
exception, never a plan that will OOM.
"""

from __future__ import annotations

import dataclasses

from vllm_operator.tuning.candidate import Candidate, GpuChoices, candidate, fits, valid_tp
from vllm_operator.tuning.gpus import CATALOG, profile_from_product
from vllm_operator.tuning.quantization import WeightFormat
from vllm_operator.tuning.request import Ask, Context
from vllm_operator.tuning.results import DoesNotFit, FitOption, FitReason
from vllm_operator.tuning.units import gib

__all__ = ["does_not_fit", "fit_options"]


def _min_tp_that_fits(
    ask: Ask, g: GpuChoices, need: int, *, max_gpus: int = 16
) -> tuple[int, Candidate] | None:
    """The smallest TP at which the model would fit on GPUs of this product (any count)."""
    arch = ask.model.architecture
    pp = ask.pins.pipeline_parallel_size or 1
    wide = dataclasses.replace(
        g,
        profile=profile_from_product(
            g.profile.product,
            max_gpus,
            interconnect="nvlink",
            memory_mib=g.profile.memory_bytes // 1024**2,
        ),
    )
    for tp in range(1, max_gpus // pp + 1):
        if valid_tp(arch, g.fmt, tp) is not None:
            continue
        c = candidate(ask, wide, tp, pp)
        if c is not None and fits(c, arch, need):
            return tp, c
    return None


def fit_options(ask: Ask, g: GpuChoices, ctx: Context, c: Candidate) -> list[FitOption]:
    arch = ask.model.architecture
    need = max(1, min(ctx.typical, ctx.wanted))
    options: list[FitOption] = []
    weights_fit = c.memory.budget - c.memory.weights - c.memory.activations > 0
    # A quantized variant.
    if not g.fmt.quantized or (g.fmt.bits or 16) > 4:
        for fmt, label in (
            (WeightFormat("AWQ", 4, 128, origin="option"), "a 4-bit AWQ or GPTQ variant"),
            (WeightFormat("FP8", 8, origin="option"), "an FP8 variant (or --quantization fp8)"),
        ):
            if fmt.method == "FP8" and (
                g.fmt.quantized or (g.profile.compute_capability or (0, 0)) < (8, 0)
            ):
                continue
            alt = dataclasses.replace(g, fmt=fmt)
            found = _min_tp_that_fits(ask, alt, need)
            if found is not None:
                tp, cand = found
                where = "one GPU" if tp == 1 else f"{tp} GPUs"
                options.append(
                    FitOption(
                        "Quantize",
                        f"{label} ({gib(cand.weights)} of weights) on {where} of this kind",
                    )
                )
    # More GPUs of this kind.
    found = _min_tp_that_fits(ask, g, need)
    if found is not None and found[0] > c.tp:
        tp, cand = found
        here = "" if tp <= g.profile.count else f"; this node has {g.profile.count}"
        nvlink = g.profile.model is not None and g.profile.model.nvlink
        link = "sharing NVLink" if nvlink else "on one node (all-reduce over PCIe)"
        options.append(
            FitOption(
                "MoreGPUs",
                f"{tp} x {g.profile.name} with tensor parallel {tp}, {link} "
                f"({gib(cand.weights / tp)} of weights each){here}",
            )
        )
    # A larger GPU.
    for model in sorted(CATALOG, key=lambda m: m.memory_mib):
        if model.memory_bytes <= g.profile.memory_bytes:
            continue
        bigger = dataclasses.replace(g, profile=profile_from_product(model.name, 1))
        one = candidate(ask, bigger, 1, 1)
        if one is not None and fits(one, arch, need):
            options.append(
                FitOption(
                    "LargerGPU",
                    f"one GPU of {gib(model.memory_bytes)} or more (such as {model.name})",
                )
            )
            break
    # A shorter context, when the weights fit but a full-length request does not.
    if weights_fit and c.memory.kv_cache > 0:
        room = c.kv_token_room(arch)
        if room >= 256:
            options.append(
                FitOption(
                    "ShorterContext",
                    f"max-model-len {room // 256 * 256:,} or less (the KV cache holds "
                    f"{room:,} tokens)",
                )
            )
        cc = g.profile.compute_capability
        if g.kv_dtype_bytes > 1 and cc is not None and cc >= (8, 9):
            options.append(
                FitOption("KVCacheDtype", "kv-cache-dtype fp8, which halves the KV bytes per token")
            )
    return options


def does_not_fit(ask: Ask, g: GpuChoices, ctx: Context, c: Candidate) -> DoesNotFit:
    arch = ask.model.architecture
    m = c.memory
    gpus = "one" if c.gpus_count == 1 else f"{c.gpus_count}"
    if m.budget - m.weights - m.activations - m.non_torch - m.cuda_graphs <= 0 and (
        ask.pins.kv_cache_memory_bytes is None
    ):
        summary = (
            f"{ask.model.name} ({g.fmt.describe()}, {gib(c.weights)} of weights) does not "
            f"fit {gpus} {g.profile.name} ({gib(g.profile.memory_bytes)} each; "
            f"{gib(m.budget)} usable per GPU at utilization {c.utilization:.2f})"
        )
        reason: FitReason = "WeightsDoNotFit"
    else:
        need = max(1, min(ctx.typical, ctx.wanted))
        summary = (
            f"{ask.model.name} fits {gpus} {g.profile.name} but its KV cache holds only "
            f"{c.kv_token_room(arch):,} tokens, less than a {need:,}-token request"
        )
        reason = "ContextDoesNotFit"
    return DoesNotFit(
        reason,
        summary,
        tuple(fit_options(ask, g, ctx, c)),
        gpu=g.profile,
        model=ask.model,
        memory=m,
        notes=g.profile.notes,
    )
