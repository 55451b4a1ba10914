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
their constants are stated below with where they come from.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Final, Literal

from vllm_operator.tuning.architecture import Architecture
from vllm_operator.tuning.quantization import WeightFormat, mxfp4_expert_parameters

__all__ = [
    "CPU_BLOCK_SIZE",
    "GIB",
    "GPU_BLOCK_SIZE",
    "GpuMemoryPlan",
    "KVCacheCapacity",
    "activation_bytes",
    "dtype_bytes",
    "gpu_memory_plan",
    "kv_bytes_per_token",
    "kv_cache_capacity",
    "memory_utilization",
    "sequence_kv_bytes",
    "weights_bytes",
]

GIB: Final = 1024**3
MIB: Final = 1024**2

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

# Inside the budget, not torch tensors: cuBLAS/cuDNN workspaces; with TP > 1 also NCCL
# channel buffers and the custom all-reduce's IPC buffers. vLLM logs ~0.1-0.4 GiB
# ("non_torch_memory takes 0.39GiB", vllm-project/vllm#11251) for one GPU.
NON_TORCH_BYTES: Final = 256 * MIB
NON_TORCH_TP_BYTES: Final = 512 * MIB
# CUDA graphs for the decode batch sizes (captured up to 2 x max-num-seqs, at most 512):
# vLLM logs "Estimated CUDA graph memory: 0.58 GiB" and "Graph capturing ... took 0.46 GiB"
# for mid-size models; a fixed estimate plus the all-reduce graph buffers under TP.
CUDA_GRAPH_BYTES: Final = 512 * MIB
CUDA_GRAPH_TP_BYTES: Final = 256 * MIB

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


# --- the rest of the budget ----------------------------------------------------------------


def activation_bytes(
    arch: Architecture,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    dtype_bytes: int,
    tensor_parallel: int = 1,
) -> int:
    """Peak activation memory of vLLM's startup profile run, on one GPU (an estimate).

    The profile run pushes ``max_num_batched_tokens`` dummy tokens through the model, then
    samples for ``max_num_seqs`` requests. Its peak is the widest point of a layer (the
    MLP's gate-and-up output plus its activation, beside a few hidden-size buffers and the
    attention projections) and the fp32 logits of the sampler with the copies top-p/top-k
    sorting makes. Calibrated against logs such as "PyTorch activation peak memory takes
    2.53GiB" (vllm-project/vllm#11251) within a few hundred MiB.
    """
    tp = max(1, tensor_parallel)
    h = arch.hidden_size
    if arch.is_moe:
        inter = (arch.moe_intermediate_size or arch.intermediate_size or 4 * h) * (
            arch.num_experts_per_token or 1
        )
    else:
        inter = arch.intermediate_size or 4 * h
    qkv = (arch.num_attention_heads + 2 * arch.num_kv_heads) * arch.head_dim
    per_token = dtype_bytes * (4 * h + qkv // tp + 3 * inter // tp)
    # Logits (fp32) for every sampled request, plus sorted values and int64 indices.
    sampler = max_num_seqs * arch.vocab_size * (4 + 4 + 8)
    return max_num_batched_tokens * per_token + sampler


def memory_utilization(memory_bytes: int) -> tuple[float, int]:
    """The ``--gpu-memory-utilization`` for a card, and the bytes it leaves outside vLLM.

    Outside vLLM's budget go the CUDA context, the runtime allowance and 1 % of the card;
    the result is rounded down to two decimals and capped at 0.95.
    """
    reserve = (
        CUDA_CONTEXT_BYTES + RUNTIME_ALLOWANCE_BYTES + int(PROPORTIONAL_ALLOWANCE * memory_bytes)
    )
    fraction = math.floor(max(0.0, 1 - reserve / memory_bytes) * 100) / 100
    fraction = min(MAX_UTILIZATION, fraction)
    return fraction, memory_bytes - math.ceil(fraction * memory_bytes)


@dataclasses.dataclass(frozen=True)
class GpuMemoryPlan:
    """One GPU of a replica: the budget and how it is spent. Bytes throughout."""

    total: int
    utilization: float
    budget: int  # ceil(utilization x total), as vLLM computes it
    weights: int
    non_torch: int
    activations: int
    cuda_graphs: int
    kv_cache: int  # what is left; negative when the rest does not fit
    cpu_offload: int = 0

    @property
    def fits_weights(self) -> bool:
        return self.kv_cache > 0

    def describe(self) -> str:
        g = GIB
        return (
            f"{self.weights / g:.2f} GiB weights + "
            f"{self.activations / g:.2f} activations + {self.non_torch / g:.2f} non-torch + "
            f"{self.cuda_graphs / g:.2f} CUDA graphs + {self.kv_cache / g:.2f} KV cache"
        )


def gpu_memory_plan(
    *,
    total_bytes: int,
    utilization: float,
    weights_per_gpu: int,
    activations: int,
    tensor_parallel: int,
    cuda_graphs: bool,
    cpu_offload_bytes: int = 0,
    kv_cache_bytes: int | None = None,
) -> GpuMemoryPlan:
    """The budget of one GPU. ``kv_cache_bytes`` pins the KV size (``--kv-cache-memory-bytes``)."""
    budget = math.ceil(total_bytes * utilization)
    non_torch = NON_TORCH_BYTES + (NON_TORCH_TP_BYTES if tensor_parallel > 1 else 0)
    graphs = (CUDA_GRAPH_BYTES + (CUDA_GRAPH_TP_BYTES if tensor_parallel > 1 else 0)) * int(
        cuda_graphs
    )
    weights = max(0, weights_per_gpu - cpu_offload_bytes)
    left = budget - weights - non_torch - activations - graphs
    if kv_cache_bytes is None:
        kv = left
    else:
        # vLLM skips profiling and takes the stated size; it fits only if the rest does
        # (a negative value is the shortfall).
        kv = kv_cache_bytes if left >= kv_cache_bytes else left - kv_cache_bytes
    return GpuMemoryPlan(
        total=total_bytes,
        utilization=utilization,
        budget=budget,
        weights=weights,
        non_torch=non_torch,
        activations=activations,
        cuda_graphs=graphs,
        kv_cache=kv,
        cpu_offload=min(cpu_offload_bytes, weights_per_gpu),
    )
