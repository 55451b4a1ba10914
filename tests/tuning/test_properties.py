"""Properties of every plan, over generated models, GPU sets, workloads and overrides."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from vllm_operator.models.inference_service import TuningSpec
from vllm_operator.models.workload import LengthDistribution, Workload
from vllm_operator.tuning.architecture import Architecture
from vllm_operator.tuning.gpus import CATALOG, GPUProfile, profile_from_product
from vllm_operator.tuning.memory import memory_utilization
from vllm_operator.tuning.plan import plan
from vllm_operator.tuning.quantization import UNQUANTIZED, WeightFormat
from vllm_operator.tuning.results import DoesNotFit, ModelInput, Plan, TuningResult

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def architectures(draw: st.DrawFn) -> Architecture:
    head_dim = draw(st.sampled_from([64, 80, 128, 256]))
    kv_heads = draw(st.sampled_from([1, 2, 4, 8, 16, 32]))
    groups = draw(st.sampled_from([1, 2, 3, 4, 7, 8]))
    heads = kv_heads * groups
    experts = draw(st.sampled_from([None, None, None, 8, 16]))
    return Architecture(
        num_layers=draw(st.integers(1, 96)),
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=draw(st.integers(256, 256_000)),
        max_position_embeddings=draw(st.sampled_from([2048, 4096, 8192, 32768, 131072])),
        intermediate_size=draw(st.integers(1, 128)) * 256,
        tie_word_embeddings=draw(st.booleans()),
        num_experts=experts,
        num_experts_per_token=2 if experts else None,
        torch_dtype=draw(st.sampled_from(["bfloat16", "float16", None])),
        name="generated",
    )


formats = st.sampled_from(
    [
        UNQUANTIZED,
        WeightFormat("GPTQ", 4, 128),
        WeightFormat("AWQ", 4, 128),
        WeightFormat("FP8", 8),
        WeightFormat("GPTQ", 8, -1),
    ]
)


@st.composite
def gpu_sets(draw: st.DrawFn) -> GPUProfile:
    product = draw(st.sampled_from(sorted({m.name for m in CATALOG})))
    count = draw(st.sampled_from([1, 2, 4, 8]))
    link = draw(st.sampled_from(["nvlink", "pcie", "pix", "sys"]))
    return profile_from_product(product, count, interconnect=link)


@st.composite
def lengths(draw: st.DrawFn) -> LengthDistribution | None:
    kind = draw(st.sampled_from(["none", "Fixed", "Uniform", "LogNormal"]))
    if kind == "none":
        return None
    if kind == "Fixed":
        return LengthDistribution(type="Fixed", value=draw(st.integers(1, 20_000)))
    if kind == "Uniform":
        low = draw(st.integers(1, 10_000))
        return LengthDistribution(type="Uniform", min=low, max=low + draw(st.integers(0, 10_000)))
    return LengthDistribution(
        type="LogNormal",
        median=draw(st.integers(1, 5000)),
        sigma=draw(st.floats(0.05, 2.0)),
    )


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    return Workload(
        prompt_tokens=draw(lengths()),
        output_tokens=draw(lengths()),
        peak_concurrency=draw(st.one_of(st.none(), st.integers(1, 2000))),
    )


profiles = st.sampled_from(["Balanced", "Latency", "Throughput", "FastStart"])


def _run(
    arch: Architecture,
    fmt: WeightFormat,
    gpu: GPUProfile,
    load: Workload,
    profile: str,
    overrides: dict[str, str] | None = None,
) -> TuningResult:
    return plan(
        ModelInput("generated", arch, fmt),
        gpu,
        workload=load,
        tuning=TuningSpec(profile=profile, overrides=overrides or {}),  # type: ignore[arg-type]
    )


@SETTINGS
@given(architectures(), formats, gpu_sets(), workloads(), profiles)
def test_a_plan_fits_the_memory_it_claims(
    arch: Architecture, fmt: WeightFormat, gpu: GPUProfile, load: Workload, profile: str
) -> None:
    result = _run(arch, fmt, gpu, load, profile)
    assert isinstance(result, Plan | DoesNotFit)
    event(result.kind if isinstance(result, Plan) else f"{result.kind}: {result.reason}")
    if not isinstance(result, Plan):
        return
    m = result.memory
    used = m.weights + m.non_torch + m.activations + m.cuda_graphs + result.kv_cache.bytes
    assert used <= m.budget
    assert m.budget <= math.ceil(gpu.memory_bytes * m.utilization)
    # The tuner's choice, with room for the graphs vLLM captures outside the budget.
    utilization, outside = memory_utilization(
        gpu.memory_bytes, graphs_outside=m.cuda_graphs_outside
    )
    assert m.utilization == utilization
    assert m.budget + outside <= gpu.memory_bytes
    # One sequence of the chosen context fits the KV cache (vLLM refuses to start otherwise).
    context = int(result.argument("max-model-len").value)  # type: ignore[union-attr]
    assert result.kv_cache.num_blocks * result.kv_cache.block_size >= context
    assert result.predictions.kv_cache_tokens == result.kv_cache.tokens
    assert result.predictions.weights_bytes is not None
    assert result.predictions.weights_bytes >= m.weights * result.gpus_per_replica - 1024**2


@SETTINGS
@given(architectures(), formats, gpu_sets(), workloads(), profiles)
def test_tensor_parallelism_divides_the_heads(
    arch: Architecture, fmt: WeightFormat, gpu: GPUProfile, load: Workload, profile: str
) -> None:
    result = _run(arch, fmt, gpu, load, profile)
    if not isinstance(result, Plan):
        return
    tp = result.tensor_parallel_size
    assert arch.num_attention_heads % tp == 0
    assert arch.num_kv_heads % tp == 0 or tp % arch.num_kv_heads == 0
    assert tp <= gpu.count
    assert len(result.gpu_indices) == tp
    if tp > 1 and result.link != "NVLink":
        # Over PCIe, only as many GPUs as the weights need: one fewer would not fit.
        assert "need" in result.argument("tensor-parallel-size").reason  # type: ignore[union-attr]


@SETTINGS
@given(architectures(), formats, gpu_sets(), workloads(), profiles)
def test_the_context_never_exceeds_the_models_maximum(
    arch: Architecture, fmt: WeightFormat, gpu: GPUProfile, load: Workload, profile: str
) -> None:
    result = _run(arch, fmt, gpu, load, profile)
    if not isinstance(result, Plan):
        return
    context = int(result.argument("max-model-len").value)  # type: ignore[union-attr]
    assert 1 <= context <= arch.max_position_embeddings
    seqs = int(result.argument("max-num-seqs").value)  # type: ignore[union-attr]
    assert seqs >= 1
    batched = int(result.argument("max-num-batched-tokens").value)  # type: ignore[union-attr]
    assert batched >= seqs


override_values = st.fixed_dictionaries(
    {},
    optional={
        "max-num-seqs": st.integers(1, 1024).map(str),
        "max-model-len": st.sampled_from(["1024", "2k", "4K", "8192"]),
        "gpu-memory-utilization": st.sampled_from(["0.5", "0.8", "0.9"]),
        "enforce-eager": st.sampled_from(["true", "false"]),
        "kv-cache-dtype": st.sampled_from(["auto", "fp8"]),
        "enable-prefix-caching": st.sampled_from(["true", "false"]),
        "max-num-batched-tokens": st.sampled_from(["2048", "16384"]),
        "swap-space": st.sampled_from(["0", "4"]),
        "served-model-alias": st.text("abc", min_size=1, max_size=5),
        "max-num-partial-prefills": st.sampled_from(["1", "not-a-number"]),
    },
)


@SETTINGS
@given(architectures(), formats, gpu_sets(), workloads(), profiles, override_values)
def test_overrides_always_win(
    arch: Architecture,
    fmt: WeightFormat,
    gpu: GPUProfile,
    load: Workload,
    profile: str,
    overrides: dict[str, str],
) -> None:
    result = _run(arch, fmt, gpu, load, profile, overrides)
    event(result.kind if isinstance(result, Plan) else f"{result.kind}: {result.reason}")
    if not isinstance(result, Plan):
        return
    by_name = {a.name: a for a in result.arguments}
    assert len(by_name) == len(result.arguments), "an argument appears twice"
    for key, value in overrides.items():
        assert by_name[key].value == value
        assert by_name[key].source == "Override"
    for name, argument in by_name.items():
        if name not in overrides:
            assert argument.source != "Override"
    # The command line carries each override exactly as written.
    command = result.command_args()
    for key, value in overrides.items():
        if value == "true":
            assert f"--{key}" in command
        elif value == "false":
            assert f"--no-{key}" in command
        else:
            assert command[command.index(f"--{key}") + 1] == value
