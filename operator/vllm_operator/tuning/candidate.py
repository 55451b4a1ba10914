"""One candidate: a tensor-parallel size on a GPU profile, and the choices it rests on.

:func:`gpu_choices` makes the choices that depend on the GPU but not on the TP size
(:class:`GpuChoices`: dtype, KV dtype, quantization kernel, CUDA graphs or eager, the batch
budget, the sequence target). :func:`candidate` then evaluates ``tp`` x ``pp`` GPUs of the
profile (:class:`Candidate`: the GPU group, memory utilization, the memory budget per GPU;
the utilization also leaves room for the CUDA graphs vLLM captures outside its budget),
:func:`fits` says whether its KV cache holds a request, :func:`valid_tp` whether the model
splits over that many GPUs at all, and :func:`decode_estimate` predicts its decode rate.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Final, Literal

from vllm_operator.models.gpu_node import LinkKind
from vllm_operator.releases.memory import memory_model
from vllm_operator.tuning import lora, quantization
from vllm_operator.tuning.architecture import Architecture
from vllm_operator.tuning.args import Setting
from vllm_operator.tuning.gpus import GPUProfile
from vllm_operator.tuning.memory import (
    GIB,
    GPU_BLOCK_SIZE,
    MAX_UTILIZATION,
    GpuMemoryPlan,
    KVCacheCapacity,
    activation_bytes,
    cuda_graph_bytes,
    cuda_total_bytes,
    dtype_bytes,
    gpu_memory_plan,
    kv_bytes_per_token,
    kv_cache_capacity,
    memory_utilization,
    outside_reserve_bytes,
    weights_bytes,
)
from vllm_operator.tuning.performance import DecodeEstimate, decode_rate
from vllm_operator.tuning.quantization import WeightFormat
from vllm_operator.tuning.request import Ask, seq_target
from vllm_operator.tuning.units import gib, round_up

__all__ = [
    "Candidate",
    "GpuChoices",
    "candidate",
    "decode_estimate",
    "fits",
    "gpu_choices",
    "valid_tp",
]

EAGER_COST: Final = "15-22 % less steady-state throughput (docs/field-notes.md)"


def valid_tp(arch: Architecture, fmt: WeightFormat, tp: int) -> str | None:
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


@dataclasses.dataclass(frozen=True)
class Candidate:
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
    notes: tuple[str, ...] = ()  # for the plan's notes (a pinned utilization's risk)

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


def fits(c: Candidate, arch: Architecture, need_tokens: int) -> bool:
    return c.memory.kv_cache > 0 and c.kv_token_room(arch) >= need_tokens


@dataclasses.dataclass(frozen=True)
class GpuChoices:
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


def _dtype(ask: Ask, gpu: GPUProfile) -> tuple[Setting, int]:
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


def _weight_format_with_pins(ask: Ask) -> WeightFormat:
    """Online quantization requested by an override changes the bytes of the weights."""
    method = (ask.pins.quantization or "").lower()
    if not ask.fmt.quantized and method == "fp8":
        return WeightFormat(method="FP8", bits=8, origin="override (online FP8)")
    if not ask.fmt.quantized and method == "bitsandbytes":
        return WeightFormat(method="BitsAndBytes", bits=4, origin="override (online bnb)")
    return ask.fmt


def _kv_dtype(ask: Ask, gpu: GPUProfile, act_bytes: int) -> tuple[Setting, int]:
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


def _batched_tokens(ask: Ask, gpu: GPUProfile, seqs: int) -> Setting:
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
        why = f"{ask.profile}: vLLM's default for this GPU class ({gib(gpu.memory_bytes)})"
    if ask.pins.enable_chunked_prefill is False:
        # Without chunked prefill a whole prompt must fit one step.
        value = max(value, ask.pins.max_model_len or 0)
    if value < seqs:
        value, why = round_up(seqs, 256), f"{why}; raised to hold one token of every sequence"
    return Setting("max-num-batched-tokens", str(value), "Tuner", why)


def _eager(ask: Ask) -> Setting:
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


def gpu_choices(ask: Ask, gpu: GPUProfile) -> GpuChoices:
    # As vLLM lays the weights out on this GPU (MXFP4's expert padding depends on it).
    fmt = quantization.for_gpu(_weight_format_with_pins(ask), gpu.compute_capability)
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
        seqs, seqs_reason = seq_target(ask)
    return GpuChoices(
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


def candidate(
    ask: Ask, g: GpuChoices, tp: int, pp: int, *, across_nodes: bool = False
) -> Candidate | None:
    """Evaluate ``tp`` x ``pp`` GPUs of the profile; None if the node has too few.
    ``across_nodes``: each of the ``pp`` stages on its own node of this profile (a
    multi-node plan, tuning/multinode.py), so one node needs only ``tp`` GPUs."""
    gpu = g.profile
    group = gpu.best_group(tp if across_nodes else tp * pp)
    if group is None:
        return None
    indices, link = group
    arch = ask.model.architecture
    weights = weights_bytes(arch, g.fmt, activation_dtype_bytes=g.dtype_bytes, tensor_parallel=tp)
    graphs = 0
    if g.eager.value != "true":
        graphs = cuda_graph_bytes(arch, max_num_seqs=g.seqs_target, pipeline_parallel=pp)
    line = memory_model(ask.vllm_version)
    # Graphs vLLM captures after it has sized the KV cache come out of the memory outside
    # its budget: the utilization leaves room for them besides the usual reserve.
    outside_graphs = 0 if line.deducts_graphs(moe=arch.is_moe) else graphs
    util, util_reason, util_source, util_notes = _utilization(ask, gpu, outside_graphs)
    act = activation_bytes(
        arch,
        max_num_batched_tokens=int(g.batched.value) if g.batched.value.isdigit() else 8192,
        max_num_seqs=g.seqs_target,
        dtype_bytes=g.dtype_bytes,
        tensor_parallel=tp,
        version=ask.vllm_version,
        fused_moe=g.fmt.method != "MXFP4",
    )
    offload = int((ask.pins.cpu_offload_gb or 0) * 10**9)
    # LoRA slots are allocated at start, before vLLM profiles: static, like the weights.
    lora_slots = (
        lora.gpu_bytes_per_gpu(arch, ask.lora, dtype_bytes=g.dtype_bytes, tensor_parallel=tp)
        if ask.lora is not None
        else 0
    )
    memory = gpu_memory_plan(
        total_bytes=gpu.memory_bytes,
        utilization=util,
        weights_per_gpu=math.ceil(weights / (tp * pp)) + lora_slots,
        activations=act,
        tensor_parallel=tp,
        cuda_graphs=graphs,
        cpu_offload_bytes=offload,
        kv_cache_bytes=ask.pins.kv_cache_memory_bytes,
        version=ask.vllm_version,
        # NCCL's NVLink buffers: an NVLink part (SXM, NVSwitch) joined over NVLink.
        nvlink=link == "NVLink" and gpu.model is not None and gpu.model.nvlink,
        moe=arch.is_moe,
    )
    return Candidate(
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
        notes=util_notes,
    )


def _utilization(
    ask: Ask, gpu: GPUProfile, graphs_outside: int
) -> tuple[float, str, Literal["Tuner", "Override"], tuple[str, ...]]:
    """The utilization, its reason and source, and notes: the tuner's choice leaves the
    reserve plus ``graphs_outside`` (graph memory captured outside the budget) outside
    vLLM's budget; a pinned one that leaves less gets a note."""
    why = memory_model(ask.vllm_version).graphs_outside_why()
    graphs = f"~{graphs_outside / GIB:.2f} GiB of CUDA graphs"
    pinned = ask.pins.gpu_memory_utilization
    if pinned is None:
        util, outside = memory_utilization(gpu.memory_bytes, graphs_outside=graphs_outside)
        reason = (
            f"{util:.2f} of {gib(gpu.memory_bytes)} leaves {gib(outside)} outside vLLM's "
            "budget for the CUDA context and runtime overhead its profile cannot see "
            "(0.9 OOMed on 24 GB cards with ~1.2 GB of it)"
        )
        if graphs_outside:
            without, _ = memory_utilization(gpu.memory_bytes)
            if without != util:
                lowered = f"{without:.2f} without them"
            elif util == MAX_UTILIZATION:
                lowered = f"the {MAX_UTILIZATION:.2f} cap leaves room for them"
            else:
                lowered = "the rounding leaves room for them"
            reason += (
                f", and the {graphs} vLLM captures there after sizing the KV cache ({why}; "
                f"{lowered})"
            )
        return util, reason, "Tuner", ()
    total = cuda_total_bytes(gpu.memory_bytes)
    room = total - math.ceil(pinned * total)
    need = outside_reserve_bytes(gpu.memory_bytes) + graphs_outside
    if not graphs_outside or room >= need:
        return pinned, "set in spec.tuning.overrides", "Override", ()
    safe, _ = memory_utilization(gpu.memory_bytes, graphs_outside=graphs_outside)
    note = (
        f"gpu-memory-utilization {pinned:.2f} (spec.tuning.overrides) leaves {gib(room)} of "
        f"the {gib(total)} CUDA total outside vLLM's budget; the {graphs} vLLM captures "
        f"there after sizing the KV cache ({why}) and the {gib(need - graphs_outside)} the "
        f"tuner keeps for the CUDA context and runtime overhead need {gib(need)}: the graphs "
        "may not fit and vLLM may run out of memory at start. A gpu-memory-utilization of "
        f"{safe:.2f} or less, or enforce-eager, would leave room"
    )
    return pinned, "set in spec.tuning.overrides", "Override", (note,)


def decode_estimate(
    ask: Ask, g: GpuChoices, c: Candidate, context_tokens: int
) -> DecodeEstimate | None:
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
