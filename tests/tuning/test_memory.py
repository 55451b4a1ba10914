"""The memory model: weights, KV bytes per token, vLLM's block arithmetic, the budget."""

from __future__ import annotations

import math

import pytest

from tests.tuning.helpers import model
from vllm_operator.releases.arguments import parse_human_int
from vllm_operator.tuning.architecture import Architecture
from vllm_operator.tuning.args import Pins, read_overrides
from vllm_operator.tuning.memory import (
    GIB,
    cuda_total_bytes,
    gpu_memory_plan,
    kv_bytes_per_token,
    kv_cache_capacity,
    memory_utilization,
    weights_bytes,
)
from vllm_operator.tuning.quantization import UNQUANTIZED, WeightFormat
from vllm_operator.tuning.workload import length_stats

# scripts/make_tiny_model.py's tiny model: 2 layers, 4 heads of 64, 2 KV heads.
TINY = Architecture(
    num_layers=2,
    hidden_size=256,
    num_attention_heads=4,
    num_kv_heads=2,
    head_dim=64,
    vocab_size=512,
    max_position_embeddings=2048,
    intermediate_size=512,
)


def test_kv_bytes_per_token_is_two_times_layers_kv_heads_head_size_and_dtype() -> None:
    assert kv_bytes_per_token(TINY, kv_dtype_bytes=2) == 2 * 2 * 2 * 64 * 2
    llama70 = model("Llama-3.1-70B").architecture
    assert kv_bytes_per_token(llama70, kv_dtype_bytes=2) == 2 * 80 * 8 * 128 * 2
    # Tensor parallel shards the KV heads; beyond their number each GPU keeps one.
    assert kv_bytes_per_token(llama70, kv_dtype_bytes=2, tensor_parallel=4) == 2 * 80 * 2 * 128 * 2
    assert kv_bytes_per_token(llama70, kv_dtype_bytes=2, tensor_parallel=16) == 2 * 80 * 1 * 128 * 2
    assert kv_bytes_per_token(llama70, kv_dtype_bytes=1) == 80 * 8 * 128 * 2


def test_the_environment_docs_example_one_gib_holds_a_million_tokens() -> None:
    # "CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 1,024 tokens per
    # request: 1024.00x" (what vLLM 0.32's CPU build logs for that model with 1 GiB).
    capacity = kv_cache_capacity(GIB, TINY, kv_dtype_bytes=2, block_size=128, max_model_len=1024)
    assert capacity.tokens == 1_048_576
    assert capacity.max_concurrency == 1024.0


def test_vllm_rounds_blocks_down_and_counts_whole_requests() -> None:
    # 96-token blocks of 4 KiB tokens do not divide 2 GiB: 5461 blocks; a 1000-token request
    # takes 11 blocks; vLLM logs int(5461 / 11 * 1000) (measured: 496,454).
    arch = Architecture(
        num_layers=4,
        hidden_size=512,
        num_attention_heads=8,
        num_kv_heads=4,
        head_dim=64,
        vocab_size=512,
        max_position_embeddings=4096,
    )
    capacity = kv_cache_capacity(2 * GIB, arch, kv_dtype_bytes=2, block_size=96, max_model_len=1000)
    assert capacity.num_blocks == 5461
    assert capacity.tokens == 496_454


def test_a_sliding_window_bounds_what_one_long_sequence_holds() -> None:
    mistral = model("mistralai/Mistral-7B-v0.1").architecture
    full = model("Mistral-7B").architecture
    capacity = kv_cache_capacity(
        8 * GIB, mistral, kv_dtype_bytes=2, block_size=16, max_model_len=32768
    )
    dense = kv_cache_capacity(8 * GIB, full, kv_dtype_bytes=2, block_size=16, max_model_len=32768)
    assert capacity.num_blocks == dense.num_blocks
    assert capacity.max_concurrency > 7 * dense.max_concurrency


def test_weights_of_a_7b_model() -> None:
    arch = model("Llama-2-7B").architecture
    assert weights_bytes(arch, UNQUANTIZED, activation_dtype_bytes=2) == 6_738_415_616 * 2
    gptq = weights_bytes(arch, WeightFormat("GPTQ", 4, 128), activation_dtype_bytes=2)
    # TheBloke/Llama-2-7B-GPTQ's model.safetensors: 3.90 GB.
    assert gptq == pytest.approx(3.90e9, rel=0.02)
    awq = weights_bytes(arch, WeightFormat("AWQ", 4, 128), activation_dtype_bytes=2)
    # TheBloke/Llama-2-7B-AWQ's model.safetensors: 3.89 GB.
    assert awq == pytest.approx(3.89e9, rel=0.02)
    gguf = weights_bytes(arch, WeightFormat("GGUF", 4), activation_dtype_bytes=2)
    # TheBloke/Llama-2-7B-GGUF's llama-2-7b.Q4_K_M.gguf (embeddings quantized too): 4.08 GB.
    assert gguf == pytest.approx(4.08e9, rel=0.02)


def test_weights_of_an_8b_model_in_nf4() -> None:
    arch = model("Llama-3.1-8B").architecture
    nf4 = WeightFormat("BitsAndBytes", 4, double_quant=True)
    # unsloth/llama-3-8b-bnb-4bit's model.safetensors (embeddings and lm_head bf16): 5.7 GB.
    assert weights_bytes(arch, nf4, activation_dtype_bytes=2) == pytest.approx(5.7e9, rel=0.03)


def test_mxfp4_quantizes_the_experts_only() -> None:
    arch = model("Mixtral-8x7B").architecture
    experts = arch.expert_parameters
    fmt = WeightFormat("MXFP4", 4)
    expected = experts * 4.25 / 8 + (arch.parameter_count - experts) * 2
    assert weights_bytes(arch, fmt, activation_dtype_bytes=2) == pytest.approx(expected, abs=1)
    # A dense model has no experts: vLLM runs its linear layers unquantized under mxfp4.
    dense = model("Llama-2-7B").architecture
    assert weights_bytes(dense, fmt, activation_dtype_bytes=2) == dense.parameter_count * 2


def test_an_unknown_method_is_the_checkpoints_size_or_the_8_bit_bound() -> None:
    arch = model("Llama-2-7B").architecture
    sized = WeightFormat("Unknown", checkpoint_bytes=4_000_000_000)
    assert weights_bytes(arch, sized, activation_dtype_bytes=2) == 4_000_000_000
    bound = weights_bytes(arch, WeightFormat("Unknown"), activation_dtype_bytes=2)
    int8 = weights_bytes(arch, WeightFormat("CompressedTensors", 8), activation_dtype_bytes=2)
    assert bound == int8


@pytest.mark.parametrize(
    ("memory_gib", "expected"),
    [
        pytest.param(12.0, 0.84, id="a 12 GB card keeps 0.84"),
        pytest.param(23.99, 0.91, id="a 24 GB card stays above 0.9's OOM by leaving 2.2 GiB"),
        pytest.param(79.65, 0.95, id="an 80 GB card is capped at 0.95"),
    ],
)
def test_memory_utilization(memory_gib: float, expected: float) -> None:
    fraction, outside = memory_utilization(int(memory_gib * GIB))
    assert fraction == expected
    assert outside >= int(1.7 * GIB)


def test_the_budget_adds_up() -> None:
    plan = gpu_memory_plan(
        total_bytes=24 * GIB,
        utilization=0.9,
        weights_per_gpu=10 * GIB,
        activations=GIB,
        tensor_parallel=1,
        cuda_graphs=GIB // 2,
    )
    assert plan.budget == math.ceil(cuda_total_bytes(24 * GIB) * 0.9)
    assert (
        plan.weights + plan.activations + plan.non_torch + plan.cuda_graphs + plan.kv_cache
        == plan.budget
    )
    eager = gpu_memory_plan(
        total_bytes=24 * GIB,
        utilization=0.9,
        weights_per_gpu=10 * GIB,
        activations=GIB,
        tensor_parallel=1,
        cuda_graphs=0,
    )
    assert eager.kv_cache == plan.kv_cache + plan.cuda_graphs


def test_a_pinned_kv_size_that_does_not_fit_shows_the_shortfall() -> None:
    plan = gpu_memory_plan(
        total_bytes=24 * GIB,
        utilization=0.9,
        weights_per_gpu=20 * GIB,
        activations=GIB,
        tensor_parallel=1,
        cuda_graphs=GIB // 2,
        kv_cache_bytes=4 * GIB,
    )
    assert plan.kv_cache < 0


# --- lengths and overrides ---------------------------------------------------------------------


def test_length_statistics() -> None:
    from vllm_operator.models.workload import LengthDistribution

    uniform = length_stats(LengthDistribution(type="Uniform", min=10, max=2000))
    assert (uniform.mean, uniform.longest, uniform.bounded) == (1005, 2000, True)
    lognormal = length_stats(LengthDistribution(type="LogNormal", median=500, sigma=1.0))
    assert not lognormal.bounded
    assert 10_000 < lognormal.longest < 11_500  # 500 * e^3.09
    clamped = length_stats(LengthDistribution(type="LogNormal", median=500, sigma=1.0, max=4000))
    assert (clamped.longest, clamped.bounded) == (4000, True)


@pytest.mark.parametrize(
    ("text", "value"),
    [("2048", 2048), ("32k", 32_000), ("32K", 32_768), ("1.5k", 1500), ("1.5K", None), ("x", None)],
)
def test_numbers_are_read_as_vllm_reads_them(text: str, value: int | None) -> None:
    assert parse_human_int(text) == value


def test_overrides_that_change_what_fits_are_read() -> None:
    pins = read_overrides(
        {
            "tensor-parallel-size": "2",
            "max-model-len": "8K",
            "gpu-memory-utilization": "0.8",
            "enforce-eager": "true",
            "kv-cache-dtype": "fp8",
            "max-num-seqs": "lots",
            "swap-space": "4",
        }
    )
    assert pins == Pins(
        tensor_parallel_size=2,
        max_model_len=8192,
        gpu_memory_utilization=0.8,
        enforce_eager=True,
        kv_cache_dtype="fp8",
        unreadable=("max-num-seqs",),
    )
