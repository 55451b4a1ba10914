"""The planner: model + GPUs + workload + profile -> vLLM settings with reasons, or a verdict.

Planning one replica on one node's GPU set goes in this order, each step stating why:

1. **Context** (``--max-model-len``) from the workload's longest requests (prompt plus
   output, see :mod:`~vllm_operator.tuning.workload`), not the model's maximum: a 32k
   context for requests under 2k wastes KV blocks and cut throughput from 112 to 43 QPS in
   one deployment (docs/field-notes.md, 2). Without declared lengths, the model's maximum.
2. **Sequences** (``--max-num-seqs``) about 1.5x the peak concurrency one replica sees, not
   vLLM's 256: at 256 where 128 sufficed, P99 was 22 % worse. Bounded by how many typical
   requests the KV cache holds, so the scheduler does not admit work it must preempt.
3. **Tensor parallelism**: the smallest GPU count that holds the weights plus a KV cache
   for at least one typical request; then, only over NVLink, the smallest that also holds
   the workload's KV demand (headroom) or meets a TPOT objective. Never more GPUs over
   PCIe than the weights need: for a model that fits one GPU, TP across a host bridge ran
   at 3.2 tok/s where one GPU per replica gave 12 (docs/field-notes.md, 1), so extra GPUs become
   replicas instead. TP must divide the attention heads (and the KV heads, or be a
   multiple of them) and the MLP width.
4. Memory utilization, dtype, the quantization kernel, KV dtype, batch budget, prefix
   caching, chunked prefill, CUDA graphs, the all-reduce path, pod resources.
5. **Predictions**: weights, KV bytes and tokens, concurrency at the chosen context, decode
   rate, load time.

When nothing fits, the result is a :class:`DoesNotFit` with a condition reason
(``WeightsDoNotFit``, ``ContextDoesNotFit``, ``InvalidParallelism``, ``NotEnoughGPUs``,
``NoMatchingGPUs``) and the options that would fit: never an exception, never a plan that
will OOM. When the model's shape is unknown, :class:`SpecOnly` carries only what the spec
says. :func:`plan_service` is the entry point for an InferenceService; :func:`plan` plans a
resolved model on one GPU profile (the CLI and the tests use it directly).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal

from vllm_operator.models.gpu_node import LinkKind
from vllm_operator.models.inference_service import (
    Dtype,
    InferenceServiceSpec,
    ModelSpec,
    NodeSpec,
    PlannedPod,
    Predictions,
    Profile,
    TuningSpec,
)
from vllm_operator.models.quantity import to_bytes
from vllm_operator.models.workload import SLO, Workload
from vllm_operator.tuning import architecture as arch_mod
from vllm_operator.tuning import catalog, quantization
from vllm_operator.tuning.architecture import Architecture, ArchitectureError
from vllm_operator.tuning.args import Pins, Setting, apply_overrides, read_overrides
from vllm_operator.tuning.gpus import CATALOG, GPUProfile, match_product, profile_from_product
from vllm_operator.tuning.memory import (
    GIB,
    GPU_BLOCK_SIZE,
    GpuMemoryPlan,
    KVCacheCapacity,
    activation_bytes,
    dtype_bytes,
    gpu_memory_plan,
    kv_bytes_per_token,
    kv_cache_capacity,
    memory_utilization,
    weights_bytes,
)
from vllm_operator.tuning.performance import DecodeEstimate, decode_rate, load_time
from vllm_operator.tuning.quantization import UNQUANTIZED, WeightFormat
from vllm_operator.tuning.results import (
    DoesNotFit,
    FitOption,
    FitReason,
    ModelInput,
    Plan,
    PodPlan,
    SpecOnly,
    TuningResult,
    gib_quantity,
)
from vllm_operator.tuning.workload import LengthStats, length_stats

__all__ = ["plan", "plan_service", "resolve_model", "spec_only"]

PEAK_HEADROOM: Final = 1.5
CONTEXT_ROUNDING: Final = 256
# Profile defaults when the peak concurrency is not declared. Balanced and FastStart keep
# vLLM's own default for the API server (256).
DEFAULT_SEQS: Final[dict[str, int]] = {
    "Latency": 64,
    "Balanced": 256,
    "Throughput": 512,
    "FastStart": 256,
}
# Output tokens assumed when only prompt lengths are declared.
ASSUMED_OUTPUT_TOKENS: Final = 1024
EAGER_COST: Final = "15-22 % less steady-state throughput (docs/field-notes.md)"


# --- inputs ---------------------------------------------------------------------------------


def resolve_model(
    model: ModelSpec,
    *,
    config: Mapping[str, Any] | None = None,
    fallback_name: str | None = None,
) -> ModelInput | None:
    """The model's shape from the spec, its config.json, or the catalog; None if unknown.

    Quantization: the spec's, else config.json's, else a hint in the repository name.
    Raises nothing: a config.json that cannot be read counts as absent.
    """
    hf = model.source.hugging_face
    name = (hf.repo if hf else None) or model.name or fallback_name or "model"
    arch: Architecture | None = None
    origin = ""
    if model.architecture is not None:
        try:
            arch, origin = (
                arch_mod.from_spec(model.architecture, name=name),
                "spec.model.architecture",
            )
        except ArchitectureError:
            arch = None
    if arch is None and config is not None:
        try:
            arch, origin = arch_mod.from_config(config, name=name), "config.json"
        except ArchitectureError:
            arch = None
    entry = None
    for candidate in (hf.repo if hf else None, model.name, fallback_name):
        if candidate and (entry := catalog.lookup(candidate)) is not None:
            break
    if arch is None and entry is not None:
        arch, origin = entry.architecture(), f"catalog ({entry.repo})"
    if arch is None:
        return None
    fmt = (
        quantization.from_spec(model.quantization)
        or (quantization.from_config(config) if config is not None else None)
        or quantization.from_name(name)
        or UNQUANTIZED
    )
    return ModelInput(name=name, architecture=arch, weight_format=fmt, origin=origin)


# --- helpers --------------------------------------------------------------------------------


def parse_quantity(text: str) -> int | None:
    """Bytes in a Kubernetes quantity ("2Gi", "512M", "1.5G"), rounded up; None if the
    text is not one (admission's pattern is looser than the grammar)."""
    try:
        return to_bytes(text)
    except ValueError:
        return None


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.1f} GiB"


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def _valid_tp(arch: Architecture, fmt: WeightFormat, tp: int) -> str | None:
    """Why ``tp`` is not a legal tensor-parallel size for the model; None if it is."""
    if arch.num_attention_heads % tp:
        return f"{arch.num_attention_heads} attention heads are not divisible by {tp}"
    kv = arch.num_kv_heads
    if not arch.uses_mla and kv % tp and tp % kv:
        return f"{kv} KV heads neither divide by {tp} nor divide it"
    inter = arch.moe_intermediate_size if arch.is_moe else arch.intermediate_size
    if inter and inter % tp:
        return f"MLP width {inter} is not divisible by {tp}"
    group = fmt.group_size or 0
    if fmt.quantized and group > 0 and inter and (inter // tp) % group:
        return f"the {fmt.describe()} groups do not split evenly over {tp} GPUs"
    return None


# --- the request: everything decided before a GPU is chosen ------------------------------------


@dataclasses.dataclass(frozen=True)
class _Ask:
    model: ModelInput
    fmt: WeightFormat
    profile: Profile
    pins: Pins
    overrides: Mapping[str, str]
    spec_dtype: Dtype
    gpu_count: int | Literal["auto"]
    prompt: LengthStats | None
    output: LengthStats | None
    peak_per_replica: int | None
    replicas: int
    slo: SLO
    node: NodeSpec
    downloads_weights: bool


@dataclasses.dataclass(frozen=True)
class _Context:
    wanted: int  # the context the workload (or pin, or model) asks for
    origin: Literal["override", "workload", "model"]
    reason: str
    typical: int  # tokens of a typical request (KV sizing)
    typical_reason: str


def _context(ask: _Ask) -> _Context:
    origin: Literal["override", "workload", "model"]
    arch = ask.model.architecture
    model_max = arch.max_position_embeddings
    prompt, output = ask.prompt, ask.output
    typical_prompt = prompt.mean if prompt else None
    typical_output = output.mean if output else None
    if ask.pins.max_model_len is not None:
        wanted, origin = ask.pins.max_model_len, "override"
        reason = "set in spec.tuning.overrides"
    elif prompt is not None:
        out_longest = output.longest if output else ASSUMED_OUTPUT_TOKENS
        longest = prompt.longest + out_longest
        out_text = output.describe_longest() if output else f"{ASSUMED_OUTPUT_TOKENS:,} assumed"
        wanted = min(model_max, _round_up(longest, CONTEXT_ROUNDING))
        origin = "workload"
        reason = (
            f"longest request in the workload: prompt {prompt.describe_longest()} + output "
            f"{out_text} = {longest:,}, rounded up to a multiple of {CONTEXT_ROUNDING}; not "
            f"the model's {model_max:,} (unused context wastes KV blocks)"
        )
        if longest > model_max:
            reason = (
                f"the model's maximum {model_max:,}: the workload's longest request "
                f"({longest:,}) exceeds it and such requests will be rejected"
            )
    else:
        wanted, origin = model_max, "model"
        reason = (
            f"the model's maximum {model_max:,}: no prompt lengths declared in spec.workload "
            "(declare them to cap the context and free KV blocks)"
        )
    if typical_prompt is None:
        typical_prompt = min(wanted / 2, 1024)
    if typical_output is None:
        typical_output = min(wanted / 4, 512 if prompt is None else ASSUMED_OUTPUT_TOKENS / 2)
    typical = max(1, min(wanted, math.ceil(typical_prompt + typical_output)))
    declared = prompt is not None and output is not None
    typical_reason = (
        f"mean prompt + output of the workload = {typical:,} tokens"
        if declared
        else f"{typical:,} tokens assumed per request (lengths not fully declared)"
    )
    return _Context(wanted, origin, reason, typical, typical_reason)


def _seq_target(ask: _Ask) -> tuple[int, str]:
    if ask.peak_per_replica is not None:
        target = math.ceil(PEAK_HEADROOM * ask.peak_per_replica)
        per = (
            f"{ask.peak_per_replica} per replica of {ask.replicas}"
            if ask.replicas > 1
            else f"{ask.peak_per_replica}"
        )
        return target, (
            f"1.5x the peak concurrency ({per}): room for bursts without the tail latency "
            "of an oversized batch (P99 was 22 % worse at 256 than at 128)"
        )
    default = DEFAULT_SEQS[ask.profile]
    return default, (
        f"{ask.profile} profile default (no peak concurrency declared in spec.workload)"
    )


# --- one candidate: a tensor-parallel size on a GPU profile ------------------------------------


@dataclasses.dataclass(frozen=True)
class _Candidate:
    tp: int
    pp: int
    gpus: tuple[int, ...]
    link: LinkKind | None
    utilization: float
    utilization_reason: str
    utilization_source: Literal["Tuner", "Override"]
    weights: int  # per replica
    memory: GpuMemoryPlan
    dtype_bytes: int
    kv_dtype_bytes: int
    block_size: int

    @property
    def gpus_count(self) -> int:
        return self.tp * self.pp

    def kv(self, arch: Architecture, context: int) -> KVCacheCapacity:
        return kv_cache_capacity(
            max(0, self.memory.kv_cache),
            arch,
            kv_dtype_bytes=self.kv_dtype_bytes,
            block_size=self.block_size,
            max_model_len=max(1, context),
            tensor_parallel=self.tp,
            pipeline_parallel=self.pp,
        )

    def kv_token_room(self, arch: Architecture) -> int:
        """Tokens the KV cache holds (whole blocks), regardless of the context."""
        per_token = kv_bytes_per_token(
            arch,
            kv_dtype_bytes=self.kv_dtype_bytes,
            tensor_parallel=self.tp,
            pipeline_parallel=self.pp,
        )
        blocks = max(0, self.memory.kv_cache) // (self.block_size * per_token)
        return blocks * self.block_size


@dataclasses.dataclass(frozen=True)
class _Gpu:
    """Choices that depend on the GPU but not on the TP size."""

    profile: GPUProfile
    dtype: Setting
    dtype_bytes: int
    kv_dtype: Setting
    kv_dtype_bytes: int
    fmt: WeightFormat
    quantization: Setting | None
    eager: Setting
    batched: Setting
    seqs_target: int
    seqs_reason: str


def _dtype(ask: _Ask, gpu: GPUProfile) -> tuple[Setting, int]:
    if ask.pins.dtype is not None:
        value = ask.pins.dtype
        return Setting("dtype", value, "Override", "set in spec.tuning.overrides"), dtype_bytes(
            value if value != "auto" else "bfloat16"
        )
    if ask.spec_dtype != "auto":
        setting = Setting("dtype", ask.spec_dtype, "Spec", "spec.model.dtype")
        return setting, dtype_bytes(ask.spec_dtype)
    checkpoint = ask.model.architecture.torch_dtype
    bf16 = gpu.bf16
    if bf16 is None:
        return Setting(
            "dtype", "auto", "Tuner", f"{gpu.product} is not in the GPU catalog: vLLM picks"
        ), 2
    if checkpoint == "float16" or ask.fmt.method in ("GPTQ", "AWQ"):
        return Setting(
            "dtype",
            "float16",
            "Tuner",
            "the checkpoint is float16; casting it to bfloat16 would drop mantissa bits",
        ), 2
    if bf16:
        cc = gpu.compute_capability
        assert cc is not None
        return Setting(
            "dtype",
            "bfloat16",
            "Tuner",
            f"{gpu.name} (compute capability {cc[0]}.{cc[1]}) has bfloat16: the range of "
            "float32 at half the bytes, no overflow where float16 has it",
        ), 2
    return Setting(
        "dtype",
        "float16",
        "Tuner",
        f"{gpu.name} has no bfloat16 (compute capability < 8.0); float16 instead",
    ), 2


def _weight_format_with_pins(ask: _Ask) -> WeightFormat:
    """Online quantization requested by an override changes the bytes of the weights."""
    method = (ask.pins.quantization or "").lower()
    if not ask.fmt.quantized and method == "fp8":
        return WeightFormat(method="FP8", bits=8, origin="override (online FP8)")
    if not ask.fmt.quantized and method == "bitsandbytes":
        return WeightFormat(method="BitsAndBytes", bits=4, origin="override (online bnb)")
    return ask.fmt


def _kv_dtype(ask: _Ask, gpu: GPUProfile, act_bytes: int) -> tuple[Setting, int]:
    if ask.pins.kv_cache_dtype is not None:
        value = ask.pins.kv_cache_dtype
        nbytes = act_bytes if value == "auto" else dtype_bytes(value)
        return Setting("kv-cache-dtype", value, "Override", "set in spec.tuning.overrides"), nbytes
    cc = gpu.compute_capability
    fp8_hint = (
        "; fp8 would double the KV capacity at a small accuracy cost (opt in with an override)"
        if cc is not None and cc >= (8, 9)
        else ""
    )
    return Setting(
        "kv-cache-dtype", "auto", "Default", f"the model's dtype, no accuracy loss{fp8_hint}"
    ), act_bytes


def _batched_tokens(ask: _Ask, gpu: GPUProfile, seqs: int) -> Setting:
    if ask.pins.max_num_batched_tokens is not None:
        value = ask.pins.max_num_batched_tokens
        return Setting("max-num-batched-tokens", str(value), "Override", "set in overrides")
    # vLLM's own API-server defaults by GPU class (vllm/engine/arg_utils.py): 2048, and
    # 8192 on >= 70 GiB cards other than A100 (larger hurt A100 throughput, vllm#17885).
    big = gpu.memory_bytes >= 70 * GIB and "a100" not in gpu.name.lower()
    huge = gpu.memory_bytes >= 160 * GIB
    vllm_default = 16384 if huge else 8192 if big else 2048
    if ask.profile == "Latency":
        value, why = 2048, "Latency: small prefill chunks keep inter-token latency low"
    elif ask.profile == "Throughput":
        value = max(8192, vllm_default)
        why = "Throughput: large prefill chunks fill the GPU (vLLM docs: > 8192 for throughput)"
    else:
        value = vllm_default
        why = f"{ask.profile}: vLLM's default for this GPU class ({_gib(gpu.memory_bytes)})"
    if ask.pins.enable_chunked_prefill is False:
        # Without chunked prefill a whole prompt must fit one step.
        value = max(value, ask.pins.max_model_len or 0)
    if value < seqs:
        value, why = _round_up(seqs, 256), f"{why}; raised to hold one token of every sequence"
    return Setting("max-num-batched-tokens", str(value), "Tuner", why)


def _eager(ask: _Ask) -> Setting:
    if ask.pins.enforce_eager is not None:
        value = "true" if ask.pins.enforce_eager else "false"
        return Setting("enforce-eager", value, "Override", "set in spec.tuning.overrides")
    if ask.profile == "FastStart":
        return Setting(
            "enforce-eager",
            "true",
            "Tuner",
            f"FastStart: skips CUDA-graph capture and compilation to start sooner; costs "
            f"{EAGER_COST}",
        )
    return Setting(
        "enforce-eager",
        "false",
        "Default",
        f"CUDA graphs on: eager mode would cost {EAGER_COST}; the warmup pays the capture",
    )


def _gpu_choices(ask: _Ask, gpu: GPUProfile) -> _Gpu:
    fmt = _weight_format_with_pins(ask)
    dtype, act_bytes = _dtype(ask, gpu)
    kv_dtype, kv_bytes = _kv_dtype(ask, gpu, act_bytes)
    quant: Setting | None = None
    if ask.pins.quantization is not None:
        quant = Setting("quantization", ask.pins.quantization, "Override", "set in overrides")
    else:
        value, why = quantization.kernel(fmt, gpu.compute_capability)
        if value is not None:
            quant = Setting("quantization", value, "Tuner", f"{why} (format from {fmt.origin})")
    if ask.pins.max_num_seqs is not None:
        seqs, seqs_reason = ask.pins.max_num_seqs, "set in spec.tuning.overrides"
    else:
        seqs, seqs_reason = _seq_target(ask)
    return _Gpu(
        profile=gpu,
        dtype=dtype,
        dtype_bytes=act_bytes,
        kv_dtype=kv_dtype,
        kv_dtype_bytes=kv_bytes,
        fmt=fmt,
        quantization=quant,
        eager=_eager(ask),
        batched=_batched_tokens(ask, gpu, seqs),
        seqs_target=seqs,
        seqs_reason=seqs_reason,
    )


def _candidate(ask: _Ask, g: _Gpu, tp: int, pp: int) -> _Candidate | None:
    """Evaluate ``tp`` x ``pp`` GPUs of the profile; None if the node has too few."""
    gpu = g.profile
    group = gpu.best_group(tp * pp)
    if group is None:
        return None
    indices, link = group
    arch = ask.model.architecture
    weights = weights_bytes(arch, g.fmt, activation_dtype_bytes=g.dtype_bytes)
    util_source: Literal["Tuner", "Override"]
    if ask.pins.gpu_memory_utilization is not None:
        util = ask.pins.gpu_memory_utilization
        util_reason, util_source = "set in spec.tuning.overrides", "Override"
    else:
        util, outside = memory_utilization(gpu.memory_bytes)
        util_source = "Tuner"
        util_reason = (
            f"{util:.2f} of {_gib(gpu.memory_bytes)} leaves {_gib(outside)} outside vLLM's "
            "budget for the CUDA context and runtime overhead its profile cannot see "
            "(0.9 OOMed on 24 GB cards with ~1.2 GB of it)"
        )
    act = activation_bytes(
        arch,
        max_num_batched_tokens=int(g.batched.value) if g.batched.value.isdigit() else 8192,
        max_num_seqs=g.seqs_target,
        dtype_bytes=g.dtype_bytes,
        tensor_parallel=tp,
    )
    offload = int((ask.pins.cpu_offload_gb or 0) * 10**9)
    memory = gpu_memory_plan(
        total_bytes=gpu.memory_bytes,
        utilization=util,
        weights_per_gpu=math.ceil(weights / (tp * pp)),
        activations=act,
        tensor_parallel=tp,
        cuda_graphs=g.eager.value != "true",
        cpu_offload_bytes=offload,
        kv_cache_bytes=ask.pins.kv_cache_memory_bytes,
    )
    return _Candidate(
        tp=tp,
        pp=pp,
        gpus=indices,
        link=link,
        utilization=util,
        utilization_reason=util_reason,
        utilization_source=util_source,
        weights=weights,
        memory=memory,
        dtype_bytes=g.dtype_bytes,
        kv_dtype_bytes=g.kv_dtype_bytes,
        block_size=ask.pins.block_size or GPU_BLOCK_SIZE,
    )


def _decode(ask: _Ask, g: _Gpu, c: _Candidate, context_tokens: int) -> DecodeEstimate | None:
    bandwidth = g.profile.bandwidth_bytes_per_second
    if bandwidth is None:
        return None
    arch = ask.model.architecture
    return decode_rate(
        arch,
        weights_bytes=c.weights,
        kv_bytes_per_token_gpu=kv_bytes_per_token(
            arch, kv_dtype_bytes=c.kv_dtype_bytes, tensor_parallel=c.tp, pipeline_parallel=c.pp
        ),
        context_tokens=context_tokens,
        bandwidth_bytes_per_second=bandwidth,
        measured=g.profile.bandwidth_measured,
        tensor_parallel=c.tp,
        link=c.link,
        peer_to_peer=g.profile.pcie_p2p,
    )


# --- choosing the tensor-parallel size ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Choice:
    candidate: _Candidate
    source: Literal["Tuner", "Spec", "Override"]
    reason: str
    notes: tuple[str, ...] = ()


def _fits(c: _Candidate, arch: Architecture, need_tokens: int) -> bool:
    return c.memory.kv_cache > 0 and c.kv_token_room(arch) >= need_tokens


def _choose_tp(ask: _Ask, g: _Gpu, ctx: _Context) -> _Choice | DoesNotFit:
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
        why = _valid_tp(arch, g.fmt, fixed)
        if why is not None:
            valid = [t for t in range(1, 17) if _valid_tp(arch, g.fmt, t) is None]
            return DoesNotFit(
                "InvalidParallelism",
                f"tensor parallel {fixed} is not possible for {ask.model.name}: {why}",
                (FitOption("MoreGPUs", f"a GPU count of {', '.join(map(str, valid))}"),),
                gpu=gpu,
                model=ask.model,
            )
        c = _candidate(ask, g, fixed, pp)
        if c is None:
            return DoesNotFit(
                "NotEnoughGPUs",
                f"{fixed * pp} GPUs per replica asked for; {gpu.describe()} has {gpu.count}",
                gpu=gpu,
                model=ask.model,
            )
        if not _fits(c, arch, need):
            return _does_not_fit(ask, g, ctx, c)
        where = "spec.gpu.count" if fixed_source == "Spec" else "spec.tuning.overrides"
        return _Choice(c, fixed_source, f"set by {where}")

    valid = [t for t in range(1, gpu.count // pp + 1) if _valid_tp(arch, g.fmt, t) is None]
    candidates = [c for t in valid if (c := _candidate(ask, g, t, pp)) is not None]
    fitting = [c for c in candidates if _fits(c, arch, need)]
    if not fitting:
        largest = candidates[-1] if candidates else None
        if largest is None:
            return DoesNotFit(
                "NotEnoughGPUs",
                f"{pp} pipeline stages need more GPUs than {gpu.describe()} has",
                gpu=gpu,
                model=ask.model,
            )
        return _does_not_fit(ask, g, ctx, largest)
    base = fitting[0]
    demand = max(ctx.wanted, g.seqs_target * ctx.typical)

    def comfortable(c: _Candidate) -> bool:
        return c.kv_token_room(arch) >= demand

    if base.tp == 1:
        reason = (
            f"the weights ({_gib(base.weights)}) and the KV cache fit one "
            f"{gpu.name}: one GPU per replica, no all-reduce on any step"
        )
    else:
        reason = (
            f"the weights ({_gib(base.weights)}) need {base.tp} GPUs of "
            f"{_gib(gpu.memory_bytes)}; {base.tp} is the smallest count that fits and divides "
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
        estimate = _decode(ask, g, chosen, ctx.typical)
        if estimate is not None and estimate.step_seconds * 1000 > target:
            faster = next(
                (
                    c
                    for c in fitting
                    if c.tp > chosen.tp
                    and c.link == "NVLink"
                    and (e := _decode(ask, g, c, ctx.typical)) is not None
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
    return _Choice(chosen, "Tuner", reason, tuple(notes))


# --- verdicts -------------------------------------------------------------------------------


def _min_tp_that_fits(
    ask: _Ask, g: _Gpu, need: int, *, max_gpus: int = 16
) -> tuple[int, _Candidate] | None:
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
        if _valid_tp(arch, g.fmt, tp) is not None:
            continue
        c = _candidate(ask, wide, tp, pp)
        if c is not None and _fits(c, arch, need):
            return tp, c
    return None


def _options(ask: _Ask, g: _Gpu, ctx: _Context, c: _Candidate) -> list[FitOption]:
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
                        f"{label} ({_gib(cand.weights)} of weights) on {where} of this kind",
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
                f"({_gib(cand.weights / tp)} of weights each){here}",
            )
        )
    # A larger GPU.
    for model in sorted(CATALOG, key=lambda m: m.memory_mib):
        if model.memory_bytes <= g.profile.memory_bytes:
            continue
        bigger = dataclasses.replace(g, profile=profile_from_product(model.name, 1))
        one = _candidate(ask, bigger, 1, 1)
        if one is not None and _fits(one, arch, need):
            options.append(
                FitOption(
                    "LargerGPU",
                    f"one GPU of {_gib(model.memory_bytes)} or more (such as {model.name})",
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


def _does_not_fit(ask: _Ask, g: _Gpu, ctx: _Context, c: _Candidate) -> DoesNotFit:
    arch = ask.model.architecture
    m = c.memory
    gpus = "one" if c.gpus_count == 1 else f"{c.gpus_count}"
    if m.budget - m.weights - m.activations - m.non_torch - m.cuda_graphs <= 0 and (
        ask.pins.kv_cache_memory_bytes is None
    ):
        summary = (
            f"{ask.model.name} ({g.fmt.describe()}, {_gib(c.weights)} of weights) does not "
            f"fit {gpus} {g.profile.name} ({_gib(g.profile.memory_bytes)} each; "
            f"{_gib(m.budget)} usable per GPU at utilization {c.utilization:.2f})"
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
        tuple(_options(ask, g, ctx, c)),
        gpu=g.profile,
        model=ask.model,
        memory=m,
        notes=g.profile.notes,
    )


# --- the plan -------------------------------------------------------------------------------


def _final_context(ask: _Ask, ctx: _Context, c: _Candidate) -> tuple[int, str, list[str]] | None:
    """The max-model-len in force, its reason and notes; None if a pinned one cannot fit."""
    arch = ask.model.architecture
    room = c.kv_token_room(arch)
    if ctx.wanted <= room:
        return ctx.wanted, ctx.reason, []
    if ctx.origin == "override":
        return None
    capped = room // CONTEXT_ROUNDING * CONTEXT_ROUNDING if room >= 2 * CONTEXT_ROUNDING else room
    capped = max(c.block_size, capped // c.block_size * c.block_size)
    reason = (
        f"{ctx.reason.split(':')[0]} capped to {capped:,}: the KV cache holds {room:,} tokens "
        "and vLLM refuses a context one sequence cannot fill"
    )
    notes = []
    if ctx.origin == "workload":
        notes.append(
            f"requests longer than {capped:,} tokens will be rejected (the workload's longest "
            f"is {ctx.wanted:,}); more GPUs or a shorter workload would avoid it"
        )
    return capped, reason, notes


def _pod(ask: _Ask, c: _Candidate, load_seconds: float, weights_per_gpu: int) -> PodPlan:
    gpus = c.gpus_count
    node = ask.node
    reasons: list[Setting] = []
    # /dev/shm
    shm_spec = parse_quantity(node.shm_size) if node.shm_size != "auto" else None
    if shm_spec is not None:
        shm = shm_spec
        reasons.append(Setting("shm-size", gib_quantity(shm), "Spec", "spec.node.shmSize"))
    elif gpus == 1:
        shm = GIB
        reasons.append(
            Setting(
                "shm-size",
                "1Gi",
                "Tuner",
                "one GPU: vLLM's processes exchange little through /dev/shm, but Docker's "
                "64 MB default still breaks its multiprocess front end",
            )
        )
    else:
        shm = max(2, gpus) * GIB
        reasons.append(
            Setting(
                "shm-size",
                gib_quantity(shm),
                "Tuner",
                f"{gpus} GPU worker processes: vLLM's shared-memory broadcast queue and NCCL's "
                "SHM transport (used where peer-to-peer is not) need /dev/shm; 64 MB breaks NCCL",
            )
        )
    # CPUs
    if node.cpus is not None:
        cpus = node.cpus
        reasons.append(Setting("cpus", str(cpus), "Spec", "spec.node.cpus"))
    else:
        extra = 2 if ask.profile == "Throughput" else 1
        cpus = 2 + gpus + extra
        reasons.append(
            Setting(
                "cpus",
                str(cpus),
                "Tuner",
                f"vLLM V1 busy-polls in its API server, engine core and each of {gpus} GPU "
                f"worker(s): 2 + {gpus}, plus {extra} for tokenization and detokenization",
            )
        )
    # Host memory
    if node.memory is not None and (spec_mem := parse_quantity(node.memory)) is not None:
        memory = spec_mem
        reasons.append(Setting("memory", node.memory, "Spec", "spec.node.memory"))
    else:
        offload = int((ask.pins.cpu_offload_gb or 0) * 10**9) * gpus
        memory = _round_up(4 * GIB + 3 * GIB * gpus + offload, GIB)
        reasons.append(
            Setting(
                "memory",
                gib_quantity(memory),
                "Tuner",
                "4 GiB for the API server and engine core, 3 GiB per GPU worker (torch, CUDA "
                "runtime, load staging)"
                + (", plus the CPU-offloaded weights" if offload else "")
                + "; weights are memory-mapped (page cache), not copied; /dev/shm comes on top",
            )
        )
    # Pinning
    if node.cpu_pinning:
        reasons.append(
            Setting(
                "cpu-pinning",
                "true",
                "Spec",
                "spec.node.cpuPinning: exclusive cores (Guaranteed QoS), so a noisy neighbour "
                "cannot take the tokenizer's and engine's cores",
            )
        )
    else:
        hint = (
            "; the Latency profile would benefit: a noisy neighbour pushed P99 up 300 %"
            if ask.profile == "Latency"
            else ""
        )
        reasons.append(
            Setting("cpu-pinning", "false", "Default", f"spec.node.cpuPinning is off{hint}")
        )
    # Startup budget: download, load, compile and capture, with a wide margin.
    download = weights_per_gpu * c.gpus_count / 200e6 if ask.downloads_weights else 0.0
    compile_s = 0.0 if ask.pins.enforce_eager or ask.profile == "FastStart" else 120.0
    startup = max(300, _round_up(int(60 + 2 * (download + load_seconds) + compile_s * 1.5), 60))
    reasons.append(
        Setting(
            "startup-seconds",
            str(startup),
            "Tuner",
            "engine start + twice the predicted load"
            + (" and download (at an assumed 200 MB/s)" if download else "")
            + (" + compilation and CUDA-graph capture" if compile_s else "")
            + ", at least 5 minutes",
        )
    )
    interconnect: Literal["NVLink", "PCIe"] | None = None
    if c.tp > 1 and c.link == "NVLink":
        interconnect = "NVLink"
        reasons.append(
            Setting(
                "interconnect",
                "NVLink",
                "Tuner",
                f"tensor parallel {c.tp} needs its GPUs on NVLink: only nodes labelled nvlink",
            )
        )
    return PodPlan(
        shm_bytes=shm,
        cpus=cpus,
        memory_bytes=memory,
        cpu_pinning=node.cpu_pinning,
        startup_seconds=startup,
        interconnect=interconnect,
        reasons=tuple(reasons),
    )


def _environment(g: _Gpu, c: _Candidate) -> list[Setting]:
    if c.gpus_count < 2 or c.link == "NVLink" or g.profile.pcie_p2p:
        return []
    return [
        Setting(
            "NCCL_P2P_DISABLE",
            "1",
            "Tuner",
            f"{g.profile.name} boards have no PCIe peer-to-peer, yet some drivers report it and "
            "NCCL then hangs on the first all-reduce (NVIDIA/nccl-tests#117, "
            "vllm-project/vllm#5484); NCCL goes through host memory instead",
        )
    ]


def _plan(ask: _Ask, gpu: GPUProfile) -> Plan | DoesNotFit:
    arch = ask.model.architecture
    g = _gpu_choices(ask, gpu)
    ctx = _context(ask)
    choice = _choose_tp(ask, g, ctx)
    if isinstance(choice, DoesNotFit):
        return choice
    c = choice.candidate
    model_max = arch.max_position_embeddings
    if ctx.origin == "override" and ctx.wanted > model_max:
        return DoesNotFit(
            "ContextDoesNotFit",
            f"max-model-len {ctx.wanted:,} from spec.tuning.overrides exceeds the model's "
            f"maximum of {model_max:,}; vLLM refuses it (unless VLLM_ALLOW_LONG_MAX_MODEL_LEN "
            "is set, at the risk of wrong output)",
            (FitOption("ShorterContext", f"max-model-len {model_max:,} or less"),),
            gpu=gpu,
            model=ask.model,
            memory=c.memory,
        )
    final = _final_context(ask, ctx, c)
    if final is None:
        room = c.kv_token_room(arch)
        return DoesNotFit(
            "ContextDoesNotFit",
            f"max-model-len {ctx.wanted:,} from spec.tuning.overrides does not fit: the KV "
            f"cache of {c.gpus_count} {gpu.name} holds {room:,} tokens",
            tuple(_options(ask, g, ctx, c)),
            gpu=gpu,
            model=ask.model,
            memory=c.memory,
        )
    context, context_reason, context_notes = final
    kv = c.kv(arch, context)
    # Sequences: the target, bounded by typical requests that fit the KV cache.
    per_request_blocks = math.ceil(min(ctx.typical, context) / c.block_size)
    fit_seqs = max(1, kv.num_blocks // per_request_blocks)
    seqs = g.seqs_target
    seqs_source: Literal["Tuner", "Override"] = "Tuner"
    seqs_reason = g.seqs_reason
    notes = [*gpu.notes, *choice.notes, *context_notes]
    if ask.pins.max_num_seqs is not None:
        seqs_source = "Override"
        if seqs > fit_seqs:
            notes.append(
                f"max-num-seqs {seqs} exceeds the {fit_seqs} typical requests the KV cache "
                "holds; vLLM will preempt and recompute under load"
            )
    elif seqs > fit_seqs:
        seqs_reason = (
            f"{seqs_reason}, bounded to {fit_seqs} by the KV cache "
            f"({kv.num_blocks * c.block_size:,} tokens / {ctx.typical:,} per request: "
            f"{ctx.typical_reason})"
        )
        seqs = fit_seqs

    tp_source = choice.source
    arguments: list[Setting] = [
        Setting("tensor-parallel-size", str(c.tp), tp_source, choice.reason),
    ]
    if c.pp > 1:
        arguments.append(
            Setting("pipeline-parallel-size", str(c.pp), "Override", "set in overrides")
        )
    arguments += [
        Setting("max-model-len", str(context), "Tuner", context_reason),
        Setting("max-num-seqs", str(seqs), seqs_source, seqs_reason),
        g.batched,
        Setting(
            "gpu-memory-utilization",
            f"{c.utilization:.2f}",
            c.utilization_source,
            c.utilization_reason,
        ),
        g.dtype,
    ]
    if g.quantization is not None:
        arguments.append(g.quantization)
    arguments += [
        g.kv_dtype,
        Setting(
            "enable-prefix-caching",
            "true",
            "Default",
            "shared prompt prefixes (system prompts, chat history) skip prefill; near-zero "
            "cost when nothing is shared",
        ),
        Setting(
            "enable-chunked-prefill",
            "true",
            "Default",
            "long prompts are prefilled in chunks between decode steps, so running "
            "sequences keep streaming",
        ),
        g.eager,
    ]
    if c.gpus_count > 1:
        arguments.append(
            Setting(
                "distributed-executor-backend",
                "mp",
                "Default",
                "one process per GPU on one node; Ray is only needed across nodes",
            )
        )
    if c.tp > 1 and c.link != "NVLink":
        arguments.append(
            Setting(
                "disable-custom-all-reduce",
                "true",
                "Tuner",
                f"GPUs joined by PCIe ({c.link}): vLLM's custom all-reduce needs NVLink or "
                "peer-to-peer (custom_all_reduce.py disables it for > 2 PCIe GPUs); NCCL "
                "chooses the PCIe path itself",
            )
        )
    if ask.pins.unreadable:
        notes.append(
            "overrides the planner could not read (passed to vLLM as written; predictions "
            f"ignore them): {', '.join(ask.pins.unreadable)}"
        )
    final_args = apply_overrides(arguments, ask.overrides)

    # Predictions.
    replica_kv = kv.bytes * c.gpus_count
    decode = _decode(ask, g, c, min(context, ctx.typical))
    load = load_time(
        weights_bytes=c.weights,
        tensor_parallel=c.gpus_count,
        pcie_generation=gpu.model.pcie_generation if gpu.model else None,
        host_to_device_bytes_per_second=gpu.host_to_device_bytes_per_second,
    )
    predictions = Predictions(
        weights_bytes=c.weights,
        kv_cache_bytes=replica_kv,
        kv_cache_tokens=kv.tokens,
        max_concurrent_sequences=int(kv.max_concurrency),
        context_length=context,
        decode_tokens_per_second=round(decode.tokens_per_second, 1) if decode else None,
        load_seconds=round(load.seconds, 1),
    )
    bw = gpu.bandwidth_bytes_per_second
    prediction_reasons = [
        Setting(
            "memory-per-gpu",
            f"{c.memory.budget / GIB:.2f} GiB",
            "Tuner",
            f"vLLM's budget on each {_gib(gpu.memory_bytes)} GPU: {c.memory.describe()} "
            f"(weights: {arch.parameter_count / 1e9:.2f}B params, {g.fmt.describe()})",
        ),
        Setting(
            "kv-cache-tokens",
            f"{kv.tokens:,}",
            "Tuner",
            f"{kv.num_blocks:,} blocks of {c.block_size} tokens at {kv.bytes_per_token:,} "
            f"bytes per token per GPU; {kv.max_concurrency:.2f} requests of {context:,} tokens",
        ),
    ]
    if decode is not None and bw is not None:
        prediction_reasons.append(
            Setting(
                "decode-tokens-per-second",
                f"{decode.tokens_per_second:.1f}",
                "Tuner",
                f"roofline for one sequence of {min(context, ctx.typical):,} tokens: "
                f"{_gib(decode.bytes_per_gpu)} read per step per GPU at "
                f"{bw / 1e9:.0f} GB/s ({'measured' if gpu.bandwidth_measured else 'datasheet'})"
                + (
                    f" + {decode.communication_seconds * 1000:.2f} ms of all-reduce"
                    if decode.communication_seconds
                    else ""
                ),
            )
        )
    prediction_reasons.append(
        Setting(
            "load-seconds",
            f"{load.seconds:.1f}",
            "Tuner",
            f"{_gib(c.weights)} from storage at an assumed 2 GB/s (network volumes are slower) "
            f"and {_gib(c.weights / c.gpus_count)} per GPU over PCIe"
            + (" (measured)" if gpu.host_to_device_measured else ""),
        )
    )
    if arch.sliding_window_layers:
        notes.append(
            f"{arch.sliding_window_layers} of {arch.num_layers} layers use a "
            f"{arch.sliding_window:,}-token sliding window; KV predictions approximate vLLM's "
            "hybrid allocator"
        )
    replicas_per_node = gpu.count // c.gpus_count
    if replicas_per_node > 1:
        notes.append(
            f"{gpu.describe()} holds {replicas_per_node} replicas of {c.gpus_count} GPU(s)"
        )
    if gpu.links_assumed and c.gpus_count > 1:
        notes.append("the GPUs' pairwise links were not read (no GPUNode); assumed from labels")
    return Plan(
        model=ask.model,
        gpu=gpu,
        gpu_indices=c.gpus,
        link=c.link,
        tensor_parallel_size=c.tp,
        pipeline_parallel_size=c.pp,
        arguments=tuple(final_args),
        environment=tuple(_environment(g, c)),
        pod=_pod(ask, c, load.seconds, math.ceil(c.weights / c.gpus_count)),
        memory=c.memory,
        kv_cache=kv,
        predictions=predictions,
        prediction_reasons=tuple(prediction_reasons),
        notes=tuple(notes),
        replicas_per_node=replicas_per_node,
    )


def plan(
    model: ModelInput,
    gpu: GPUProfile,
    *,
    workload: Workload | None = None,
    slo: SLO | None = None,
    tuning: TuningSpec | None = None,
    node: NodeSpec | None = None,
    dtype: Dtype = "auto",
    gpu_count: int | Literal["auto"] = "auto",
    replicas: int = 1,
    downloads_weights: bool = False,
) -> Plan | DoesNotFit:
    """Plan one replica of ``model`` on the GPU set ``gpu``."""
    tuning = tuning or TuningSpec()
    workload = workload or Workload()
    replicas = max(1, replicas)
    peak = workload.peak_concurrency
    ask = _Ask(
        model=model,
        fmt=model.weight_format,
        profile=tuning.profile,
        pins=read_overrides(tuning.overrides),
        overrides=dict(tuning.overrides),
        spec_dtype=dtype,
        gpu_count=gpu_count,
        prompt=length_stats(workload.prompt_tokens) if workload.prompt_tokens else None,
        output=length_stats(workload.output_tokens) if workload.output_tokens else None,
        peak_per_replica=math.ceil(peak / replicas) if peak else None,
        replicas=replicas,
        slo=slo or SLO(),
        node=node or NodeSpec(),
        downloads_weights=downloads_weights,
    )
    return _plan(ask, gpu)


def _rank(result: Plan) -> tuple[int, float, int, str]:
    decode = result.predictions.decode_tokens_per_second or 0.0
    return (
        result.gpus_per_replica,
        -decode,
        -(result.predictions.kv_cache_tokens or 0),
        result.gpu.name,
    )


def _matches(products: Sequence[str], gpu: GPUProfile) -> bool:
    if not products:
        return True
    for wanted in products:
        if wanted == gpu.product:
            return True
        model = match_product(wanted)
        if model is not None and gpu.model is not None and model.name == gpu.model.name:
            return True
    return False


def spec_only(spec: InferenceServiceSpec, message: str) -> SpecOnly:
    """The spec's own settings, unplanned: GPU count, dtype, quantization, overrides."""
    proposed: list[Setting] = []
    if isinstance(spec.gpu.count, int):
        proposed.append(
            Setting("tensor-parallel-size", str(spec.gpu.count), "Spec", "spec.gpu.count")
        )
    if spec.model.dtype != "auto":
        proposed.append(Setting("dtype", spec.model.dtype, "Spec", "spec.model.dtype"))
    q = spec.model.quantization
    if q is not None and q.method != "None":
        method = {"BitsAndBytes": "bitsandbytes", "CompressedTensors": "compressed-tensors"}.get(
            q.method, q.method.lower()
        )
        proposed.append(Setting("quantization", method, "Spec", "spec.model.quantization"))
    node = spec.node
    pod = PlannedPod(
        shm_size=None if node.shm_size == "auto" else node.shm_size,
        cpus=node.cpus,
        memory=node.memory,
        cpu_pinning=node.cpu_pinning,
    )
    return SpecOnly(
        "ArchitectureUnknown",
        message,
        tuple(apply_overrides(proposed, spec.tuning.overrides)),
        gpus=spec.gpu.count if isinstance(spec.gpu.count, int) else 1,
        pod=pod,
    )


def plan_service(
    spec: InferenceServiceSpec,
    gpus: Sequence[GPUProfile],
    *,
    config: Mapping[str, Any] | None = None,
    name: str | None = None,
) -> TuningResult:
    """Plan an InferenceService over the candidate nodes' GPU profiles.

    ``gpus``: one profile per candidate node (from GPUNode status, else node labels).
    ``config``: the model's config.json when the caller could read it. ``name``: the
    InferenceService's name (a catalog lookup falls back to it). Profiles not allowed by
    ``spec.gpu.products`` are skipped; among the plans that fit, the one with the fewest
    GPUs per replica wins, then the fastest decode, then the largest KV cache.
    """
    model = resolve_model(spec.model, config=config, fallback_name=name)
    if model is None:
        return spec_only(
            spec,
            "the model's architecture is unknown: set spec.model.architecture, or use a "
            "model whose config.json the operator can read or that is in the catalog "
            f"({', '.join(catalog.names())})",
        )
    candidates = [g for g in gpus if _matches(spec.gpu.products, g)]
    if not candidates:
        wanted = ", ".join(spec.gpu.products) or "any"
        return DoesNotFit(
            "NoMatchingGPUs",
            f"no node offers GPUs matching {wanted} (seen: "
            f"{', '.join(sorted({g.product for g in gpus})) or 'none'})",
            model=model,
        )
    hf = spec.model.source.hugging_face is not None
    results = [
        plan(
            model,
            g,
            workload=spec.workload,
            slo=spec.slo,
            tuning=spec.tuning,
            node=spec.node,
            dtype=spec.model.dtype,
            gpu_count=spec.gpu.count,
            replicas=spec.replicas,
            downloads_weights=hf,
        )
        for g in _unique(candidates)
    ]
    plans = [r for r in results if isinstance(r, Plan)]
    if plans:
        return min(plans, key=_rank)
    verdicts = [r for r in results if isinstance(r, DoesNotFit)]
    # The verdict for the roomiest GPU set says most about what would fit.
    return max(verdicts, key=_verdict_rank)


def _verdict_rank(v: DoesNotFit) -> tuple[int, int]:
    gpu = v.gpu
    return (gpu.memory_bytes * gpu.count, gpu.count) if gpu else (0, 0)


def _unique(profiles: Sequence[GPUProfile]) -> list[GPUProfile]:
    """One profile per distinct GPU set (many nodes share a shape); order kept."""
    seen: set[tuple[Any, ...]] = set()
    result: list[GPUProfile] = []
    key: Callable[[GPUProfile], tuple[Any, ...]] = lambda p: (  # noqa: E731
        p.product,
        p.count,
        p.memory_bytes,
        p.links,
        p.bandwidth_bytes_per_second,
        p.compute_capability,
    )
    for p in profiles:
        if key(p) not in seen:
            seen.add(key(p))
            result.append(p)
    return result
