"""Where a GPU's memory goes when vLLM serves a model, and what is left for the KV cache.

vLLM (V1 engine; ``vllm/v1/worker/gpu_worker.py``, ``determine_available_memory``) gives
itself ``gpu_memory_utilization x total`` bytes of each GPU and splits them as:

    budget = weights + non-torch memory (NCCL, cuBLAS) + peak activations of a profile run
             + CUDA-graph memory (profiled by default since v0.21)            + KV cache

The CUDA context and anything another process holds are *outside* that budget: vLLM
refuses to start when less than the budget is free. So the utilization is chosen from the
card's memory minus the context and a runtime allowance (:func:`memory_utilization`), and
the KV cache is what remains of the budget (:func:`gpu_memory_plan`).

The KV cache is allocated in blocks of ``block_size`` tokens (16 on GPUs, 128 on the CPU
backend). One token costs, on one GPU:

    2 (K and V) x layers x KV heads on this GPU x head size x bytes of the KV dtype

(grouped-query attention shrinks the KV heads; under tensor parallelism each GPU holds
``KV heads / TP`` of them, at least one). vLLM computes ``num_blocks = bytes // (block_size
x per-token bytes)`` and logs ``KV cache size: N tokens`` with N = ``num_blocks /
ceil(max_model_len / block_size) x max_model_len`` (``vllm/v1/core/kv_cache_utils.py``,
``get_max_concurrency_for_kv_cache_config``): the tokens of whole requests that fit, which
is ``num_blocks x block_size`` when the context is a multiple of the block size and a little
less otherwise. :func:`kv_cache_capacity` mirrors that exactly; it is checked against a real
vLLM (the CPU build, whose KV space is ``VLLM_CPU_KVCACHE_SPACE`` GiB) in
``tests/tuning/test_kv_against_vllm.py``.

Activation, non-torch and CUDA-graph memory are estimates (vLLM measures them at startup);
their constants, and how each line of vLLM releases splits the budget, are in
``releases/memory.py`` with where they come from.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Final, Literal

from vllm_operator.releases.memory import (
    GIB,
    GRAPH_FIRST_CAPTURE,
    GRAPH_MAX_CAPTURE,
    GRAPH_PER_LAYER,
    HIDDEN_COPIES,
    MIB,
    NON_TORCH_NVLINK_BASE,
    NON_TORCH_NVLINK_PER_GPU,
    NON_TORCH_PCIE_TP,
    memory_model,
)
from vllm_operator.releases.version import TESTED_VERSION, Version
from vllm_operator.tuning.architecture import Architecture
from vllm_operator.tuning.quantization import WeightFormat, mxfp4_expert_parameters

__all__ = [
    "CPU_BLOCK_SIZE",
    "GIB",
    "GPU_BLOCK_SIZE",
    "GpuMemoryPlan",
    "KVCacheCapacity",
    "activation_bytes",
    "cuda_graph_bytes",
    "cuda_total_bytes",
    "dtype_bytes",
    "gpu_memory_plan",
    "kv_bytes_per_token",
    "kv_cache_capacity",
    "memory_utilization",
    "non_torch_bytes",
    "outside_reserve_bytes",
    "sequence_kv_bytes",
    "weights_bytes",
]


# vLLM's default block size on CUDA, and the CPU backend's (vllm/platforms/cpu.py sets 128
# unless the user chose one).
GPU_BLOCK_SIZE: Final = 16
CPU_BLOCK_SIZE: Final = 128

# Outside vLLM's budget: the CUDA context (in the baseline snapshot vLLM takes before it
# loads anything, so never part of the budget; ~0.3-0.6 GiB on Ampere/Hopper with lazy
# module loading).
CUDA_CONTEXT_BYTES: Final = 512 * MIB
# Also outside: what the startup profile does not see: allocator fragmentation, sampler
# temporaries for top-k/top-p and logprobs at full batch, lazily grown NCCL buffers. The
# figure is docs/field-notes.md's (4): --gpu-memory-utilization 0.9 OOMed on 24 GB cards
# with ~1.2 GB of such overhead (see also vllm-project/vllm#7553 and #19186, OOM at high
# utilization).
RUNTIME_ALLOWANCE_BYTES: Final = int(1.2 * GIB)
# Plus a share of the card for estimation error that grows with what is allocated.
PROPORTIONAL_ALLOWANCE: Final = 0.01
MAX_UTILIZATION: Final = 0.95

DtypeName = Literal["bfloat16", "float16", "float32", "fp8"]


def dtype_bytes(name: str) -> int:
    """Bytes per element of a torch dtype name (bf16/fp16 2, fp32 4, fp8 variants 1)."""
    lowered = name.lower()
    if lowered.startswith("fp8") or lowered.startswith("float8"):
        return 1
    if lowered in ("float32", "fp32", "float"):
        return 4
    return 2


# --- weights -------------------------------------------------------------------------------


def weights_bytes(
    arch: Architecture,
    fmt: WeightFormat,
    *,
    activation_dtype_bytes: int,
    tensor_parallel: int = 1,
) -> int:
    """Bytes of the weights of one replica (all GPUs together).

    Quantized checkpoints keep embeddings, the output head and norms in the activation
    dtype (GPTQ, AWQ, FP8, compressed-tensors, bitsandbytes); the other layers cost
    :meth:`WeightFormat.bytes_per_quantized_weight`. Exceptions:

    * GGUF quantizes every tensor, embeddings included: the whole count at its bits.
    * MXFP4 quantizes the routed experts only (gpt-oss keeps attention, router,
      embeddings and lm_head in bf16): expert parameters x 4.25 bits (4.5 on Hopper, where
      vLLM before 0.25 keeps a second copy of the scales), after the padding vLLM's MoE
      kernel applies on the chosen GPU (``fmt.moe_padding``; it depends on each GPU's
      share of the intermediate size, hence ``tensor_parallel``), plus the rest in the
      activation dtype. The expert count is
      :attr:`Architecture.expert_parameters`: experts x 3 x hidden x intermediate x MoE
      layers (gate, up and down of a gated MLP per expert).
    * A method the tuner does not know: the checkpoint's own size when known, else
      8 bits per weight of the quantized layers (an upper bound for the methods vLLM
      loads, which store at most 8 bits per weight plus small scales).
    """
    total = arch.parameter_count
    if not fmt.quantized:
        return total * activation_dtype_bytes
    if fmt.method == "Unknown" and fmt.checkpoint_bytes:
        return fmt.checkpoint_bytes
    if fmt.method == "GGUF":
        return math.ceil(total * fmt.bytes_per_quantized_weight())
    if fmt.method == "MXFP4":
        experts = min(total, arch.expert_parameters)
        padded = mxfp4_expert_parameters(
            experts,
            hidden_size=arch.hidden_size,
            intermediate_size=arch.moe_intermediate_size or arch.intermediate_size or 1,
            padding=fmt.moe_padding,
            tensor_parallel=tensor_parallel,
        )
        rest = total - experts
        return math.ceil(padded * fmt.bytes_per_quantized_weight()) + rest * activation_dtype_bytes
    norms = 2 * arch.hidden_size * arch.num_layers + arch.hidden_size
    plain = min(total, arch.embedding_parameters + norms)
    quantized = total - plain
    return math.ceil(quantized * fmt.bytes_per_quantized_weight()) + plain * activation_dtype_bytes


# --- KV cache ------------------------------------------------------------------------------


def _layers_per_stage(arch: Architecture, pipeline_parallel: int) -> int:
    return math.ceil(arch.num_layers / max(1, pipeline_parallel))


def kv_bytes_per_token(
    arch: Architecture,
    *,
    kv_dtype_bytes: int,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
) -> int:
    """KV-cache bytes one token takes on one GPU, every layer of its pipeline stage."""
    layers = _layers_per_stage(arch, pipeline_parallel)
    if arch.uses_mla:
        # One latent (kv_lora_rank + rope dims) per token and layer, replicated on each TP
        # rank (vllm/v1/kv_cache_interface.py, MLAAttentionSpec).
        latent = (arch.kv_lora_rank or 0) + (arch.qk_rope_head_dim or 0)
        return layers * latent * kv_dtype_bytes
    heads = max(1, arch.num_kv_heads // max(1, tensor_parallel))
    return 2 * layers * heads * arch.head_dim * kv_dtype_bytes


def sequence_kv_bytes(
    arch: Architecture,
    length: int,
    *,
    kv_dtype_bytes: int,
    block_size: int,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
) -> int:
    """KV bytes one sequence of ``length`` tokens holds on one GPU, in whole blocks.

    Sliding-window layers hold at most the window (plus one block) of a long sequence.
    """
    per_token = kv_bytes_per_token(
        arch,
        kv_dtype_bytes=kv_dtype_bytes,
        tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
    )
    blocks = math.ceil(length / block_size)
    if not arch.sliding_window or not arch.sliding_window_layers:
        return blocks * block_size * per_token
    share = arch.sliding_window_layers / arch.num_layers
    window_blocks = min(blocks, math.ceil((arch.sliding_window - 1) / block_size) + 1)
    full = (1 - share) * blocks * block_size * per_token
    sliding = share * window_blocks * block_size * per_token
    return math.ceil(full + sliding)


@dataclasses.dataclass(frozen=True)
class KVCacheCapacity:
    """The KV cache of one GPU (all GPUs of a replica hold the same tokens, sharded)."""

    bytes: int
    block_size: int
    num_blocks: int
    tokens: int  # as vLLM logs it: whole max-model-len requests that fit, in tokens
    max_concurrency: float  # requests of max-model-len that fit at once
    bytes_per_token: int


def kv_cache_capacity(
    kv_cache_bytes: int,
    arch: Architecture,
    *,
    kv_dtype_bytes: int,
    block_size: int,
    max_model_len: int,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
) -> KVCacheCapacity:
    """What vLLM makes of ``kv_cache_bytes`` on one GPU (see the module docstring)."""
    per_token = kv_bytes_per_token(
        arch,
        kv_dtype_bytes=kv_dtype_bytes,
        tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
    )
    block_bytes = block_size * per_token
    num_blocks = max(0, kv_cache_bytes) // block_bytes
    per_request = sequence_kv_bytes(
        arch,
        max_model_len,
        kv_dtype_bytes=kv_dtype_bytes,
        block_size=block_size,
        tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
    )
    # vLLM: max_concurrency = num_blocks / blocks per request; tokens = int(that x length).
    concurrency = num_blocks * block_bytes / per_request if per_request else 0.0
    if not arch.sliding_window_layers or not arch.sliding_window:
        concurrency = num_blocks / math.ceil(max_model_len / block_size)
    return KVCacheCapacity(
        bytes=num_blocks * block_bytes,
        block_size=block_size,
        num_blocks=num_blocks,
        tokens=int(concurrency * max_model_len),
        max_concurrency=concurrency,
        bytes_per_token=per_token,
    )


# --- the CUDA total ------------------------------------------------------------------------

# vLLM multiplies the total of torch.cuda.mem_get_info (cudaMemGetInfo), which is below
# NVML's (nvidia-smi, GPU Feature Discovery's label): the driver keeps part of the memory.
# The gap: RTX 3090 24,576 MiB vs 23.58 GiB (0.42), RTX 4090 24,564 MiB vs 23.55 (0.44),
# RTX 5090 32,607 MiB vs 31.4 (0.44), RTX A6000 49,140 MiB vs 47.54 (0.45), H100 81,559 MiB
# vs 79.19 (0.46), H200 143,771 MiB vs 139.80 (0.60). Fitted: 0.39 GiB + 0.13 % of the
# card, within 0.04 GiB of each (tests/tuning/test_memory_calibration.py).
CUDA_RESERVED_BYTES: Final = int(0.39 * GIB)
CUDA_RESERVED_SHARE: Final = 0.0013


def cuda_total_bytes(card_bytes: int) -> int:
    """The total CUDA reports for a card whose NVML (nvidia-smi) total is ``card_bytes``."""
    return max(0, card_bytes - CUDA_RESERVED_BYTES - int(CUDA_RESERVED_SHARE * card_bytes))


# --- the rest of the budget ----------------------------------------------------------------


def _moe_workspace(arch: Architecture, tokens: int, dtype_bytes: int, tp: int, chunk: int) -> int:
    """fused_moe's intermediate caches for a batch (fused_moe.py: cache1 of M x top-k x
    2N, cache2 of M x top-k x N, cache3 of M x top-k x hidden; N the GPU's expert width)."""
    width = (arch.moe_intermediate_size or arch.intermediate_size or 4 * arch.hidden_size) // tp
    rows = min(tokens, chunk) * (arch.num_experts_per_token or 1)
    return rows * (3 * width + arch.hidden_size) * dtype_bytes


def activation_bytes(
    arch: Architecture,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    dtype_bytes: int,
    tensor_parallel: int = 1,
    version: Version = TESTED_VERSION,
    fused_moe: bool = True,
) -> int:
    """The torch peak increase of vLLM's profile run on one GPU (the last pipeline stage,
    which samples and so binds the KV size).

    The profile run (``gpu_model_runner.py``, ``profile_run``) pushes
    ``max_num_batched_tokens`` dummy tokens through the model, then warms the sampler with
    ``min(max_num_seqs, max_num_batched_tokens)`` requests. The peak is the larger of

    * the forward pass: the widest point of a layer, ``tokens x (4 hidden + QKV / TP +
      3 MLP width / TP)`` elements (the gate-and-up output, its activation, the residual);
    * the sampler phase: ``sampler_logit_copies`` fp32 logits of every request plus
      ``HIDDEN_COPIES`` of the batch's hidden states (see :class:`ReleaseMemoryModel`);

    plus, for MoE layers run by fused_moe from 0.13, its workspace (it stays allocated).
    MXFP4 experts (gpt-oss) run other kernels: ``fused_moe=False``. Neither term depends on
    ``max_model_len`` or on TP (the logits are gathered whole), as the 0.19 logs show.
    """
    line = memory_model(version)
    tp = max(1, tensor_parallel)
    tokens = max_num_batched_tokens
    h = arch.hidden_size
    qkv = (arch.num_attention_heads + 2 * arch.num_kv_heads) * arch.head_dim
    moe = arch.is_moe and fused_moe
    inter = 0 if arch.is_moe else (arch.intermediate_size or 4 * h)
    forward = tokens * dtype_bytes * (4 * h + qkv // tp + 3 * inter // tp)
    workspace = _moe_workspace(arch, tokens, dtype_bytes, tp, line.moe_chunk_tokens) if moe else 0
    requests = min(max_num_seqs, tokens)
    sampler = int(line.sampler_logit_copies * requests * arch.vocab_size * 4) + int(
        HIDDEN_COPIES * tokens * h * dtype_bytes
    )
    if line.moe_workspace_persistent:
        return max(forward, sampler) + workspace
    return max(forward + workspace, sampler)


def non_torch_bytes(
    tensor_parallel: int, *, nvlink: bool = True, version: Version = TESTED_VERSION
) -> int:
    """Memory vLLM uses outside torch's allocator on one GPU (see the constants above)."""
    single = memory_model(version).non_torch_single_gpu
    if tensor_parallel <= 1:
        return single
    if nvlink:
        return NON_TORCH_NVLINK_BASE + NON_TORCH_NVLINK_PER_GPU * tensor_parallel
    return single + NON_TORCH_PCIE_TP


def _capture_sizes(max_num_seqs: int) -> int:
    """How many batch sizes vLLM captures (config/compilation.py: 1, 2, 4, then steps of
    8 to 256 and of 16 beyond, up to min(2 x max_num_seqs, 512))."""
    top = min(GRAPH_MAX_CAPTURE, 2 * max(1, max_num_seqs))
    sizes = [s for s in (1, 2, 4) if s <= top]
    sizes += list(range(8, min(top, 256) + 1, 8))
    sizes += list(range(272, top + 1, 16))
    return len(sizes)


def cuda_graph_bytes(arch: Architecture, *, max_num_seqs: int, pipeline_parallel: int = 1) -> int:
    """vLLM's CUDA-graph estimate on one GPU (see GRAPH_FIRST_CAPTURE above)."""
    layers = _layers_per_stage(arch, pipeline_parallel)
    share = _capture_sizes(max_num_seqs) / _capture_sizes(GRAPH_MAX_CAPTURE)
    return GRAPH_FIRST_CAPTURE + int(GRAPH_PER_LAYER * layers * share)


def outside_reserve_bytes(memory_bytes: int) -> int:
    """What the tuner keeps outside vLLM's budget on a card whose NVML total is
    ``memory_bytes``, before any CUDA graphs: the CUDA context, the runtime allowance and
    1 % of the card."""
    return CUDA_CONTEXT_BYTES + RUNTIME_ALLOWANCE_BYTES + int(PROPORTIONAL_ALLOWANCE * memory_bytes)


def memory_utilization(memory_bytes: int, *, graphs_outside: int = 0) -> tuple[float, int]:
    """The ``--gpu-memory-utilization`` for a card, and the bytes it leaves outside vLLM.

    vLLM multiplies the CUDA total (:func:`cuda_total_bytes`), not the card's. Outside its
    budget go :func:`outside_reserve_bytes` plus ``graphs_outside``, the CUDA-graph memory
    vLLM captures after it has sized the KV cache (:attr:`GpuMemoryPlan.cuda_graphs_outside`:
    releases before 0.20, and dense models from 0.25.1); the result is rounded down to two
    decimals and capped at 0.95. ``memory_bytes`` is the card's (NVML) total; the bytes left
    outside are counted from it.
    """
    total = cuda_total_bytes(memory_bytes)
    reserve = outside_reserve_bytes(memory_bytes) + graphs_outside
    fraction = math.floor(max(0.0, 1 - reserve / total) * 100) / 100 if total else 0.0
    fraction = min(MAX_UTILIZATION, fraction)
    return fraction, memory_bytes - math.ceil(fraction * total)


@dataclasses.dataclass(frozen=True)
class GpuMemoryPlan:
    """One GPU of a replica: the budget and how it is spent. Bytes throughout."""

    total: int  # the CUDA total vLLM multiplies (below the card's NVML total)
    utilization: float
    budget: int  # ceil(utilization x total), as vLLM computes it
    weights: int
    non_torch: int
    activations: int
    cuda_graphs: int  # the CUDA-graph estimate where the release deducts it, else 0
    kv_cache: int  # what is left; negative when the rest does not fit
    cpu_offload: int = 0
    # Graph memory captured after the KV cache, outside the budget (releases before 0.20,
    # and dense models on Model Runner V2 from 0.25.1).
    cuda_graphs_outside: int = 0

    @property
    def fits_weights(self) -> bool:
        return self.kv_cache > 0

    def describe(self) -> str:
        g = GIB
        outside = (
            f" (CUDA graphs ~{self.cuda_graphs_outside / g:.2f} GiB outside the budget)"
            if self.cuda_graphs_outside
            else ""
        )
        return (
            f"{self.weights / g:.2f} GiB weights + "
            f"{self.activations / g:.2f} activations + {self.non_torch / g:.2f} non-torch + "
            f"{self.cuda_graphs / g:.2f} CUDA graphs + {self.kv_cache / g:.2f} KV cache" + outside
        )


def gpu_memory_plan(
    *,
    total_bytes: int,
    utilization: float,
    weights_per_gpu: int,
    activations: int,
    tensor_parallel: int,
    cuda_graphs: int,
    cpu_offload_bytes: int = 0,
    kv_cache_bytes: int | None = None,
    version: Version = TESTED_VERSION,
    nvlink: bool = True,
    moe: bool = False,
) -> GpuMemoryPlan:
    """The budget of one GPU whose card (NVML) total is ``total_bytes``.

    ``cuda_graphs``: the CUDA-graph estimate (0 when eager), deducted where the release
    does (for a dense model, ``moe`` False, not from 0.25.1: :class:`ReleaseMemoryModel`).
    ``kv_cache_bytes`` pins the KV size (``--kv-cache-memory-bytes``).
    """
    line = memory_model(version)
    cuda_total = cuda_total_bytes(total_bytes)
    budget = math.ceil(cuda_total * utilization)
    non_torch = non_torch_bytes(tensor_parallel, nvlink=nvlink, version=version)
    in_budget = line.deducts_graphs(moe=moe)
    graphs = cuda_graphs if in_budget else 0
    weights = max(0, weights_per_gpu - cpu_offload_bytes)
    left = budget - weights - non_torch - activations - graphs
    if kv_cache_bytes is None:
        kv = left
    else:
        # vLLM skips profiling and takes the stated size; it fits only if the rest does
        # (a negative value is the shortfall).
        kv = kv_cache_bytes if left >= kv_cache_bytes else left - kv_cache_bytes
    return GpuMemoryPlan(
        total=cuda_total,
        utilization=utilization,
        budget=budget,
        weights=weights,
        non_torch=non_torch,
        activations=activations,
        cuda_graphs=graphs,
        kv_cache=kv,
        cpu_offload=min(cpu_offload_bytes, weights_per_gpu),
        cuda_graphs_outside=0 if in_budget else cuda_graphs,
    )
