"""Weight formats: what each published config.json says, what its weights cost, which
``--quantization`` vLLM is handed, and what happens to a method the tuner does not know.

Every ``quantization_config`` below is an excerpt of a real checkpoint's config.json (the
source is named per case). The gpt-oss figures are checked against what vLLM and the model
card report (see ``test_gpt_oss_weights_match_the_references``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from tests.specs import isvc
from tests.tuning.helpers import arg, as_plan, gpus
from vllm_operator.models.inference_service import Quantization
from vllm_operator.releases.version import DeployedVersion, Version
from vllm_operator.render.deployment import build_deployment
from vllm_operator.tune_cli import main
from vllm_operator.tuning import plan_service, quantization
from vllm_operator.tuning.architecture import from_config
from vllm_operator.tuning.gpus import profile_from_product
from vllm_operator.tuning.memory import weights_bytes
from vllm_operator.tuning.quantization import MXFP4_BITS, kernel
from vllm_operator.tuning.request import resolve_model

GIB = 1024**3

# --- the published quantization_config of each format -------------------------------------

# TheBloke/Llama-2-7B-GPTQ, config.json (AutoGPTQ).
GPTQ = {
    "bits": 4, "group_size": 128, "damp_percent": 0.01, "desc_act": False, "sym": True,
    "true_sequential": True, "model_name_or_path": None, "model_file_base_name": "model",
    "quant_method": "gptq",
}  # fmt: skip
# TheBloke/Llama-2-7B-AWQ, config.json (AutoAWQ, GEMM kernels).
AWQ = {"quant_method": "awq", "zero_point": True, "group_size": 128, "bits": 4, "version": "gemm"}
# A GPTQ/AWQ checkpoint re-saved under vLLM's own kernel name (vLLM's GPTQMarlinConfig and
# AWQMarlinConfig get_name()); vLLM converts only "gptq" and "awq" to the Marlin kernels
# (override_quantization_method), so this spelling is the only one it accepts for them.
GPTQ_MARLIN = {**GPTQ, "quant_method": "gptq_marlin"}
AWQ_MARLIN = {**AWQ, "quant_method": "awq_marlin"}
# Qwen/Qwen3-8B-FP8, config.json: block-wise FP8, one fp32 scale per 128 x 128 block.
FP8_BLOCK = {
    "activation_scheme": "dynamic", "modules_to_not_convert": ["lm_head"], "fmt": "e4m3",
    "quant_method": "fp8", "weight_block_size": [128, 128],
}  # fmt: skip
# neuralmagic/Meta-Llama-3-8B-Instruct-FP8, config.json (AutoFP8, per-tensor scales).
FP8_TENSOR = {"activation_scheme": "static", "ignored_layers": ["lm_head"], "quant_method": "fp8"}
# meta-llama/Llama-3.1-405B-Instruct-FP8, config.json (FBGEMM row-wise FP8).
FBGEMM_FP8 = {
    "activation_scale_ub": 1200.0, "modules_to_not_convert": ["model.layers.0.mlp"],
    "quant_method": "fbgemm_fp8",
}  # fmt: skip


def _ct(weights: dict[str, Any], acts: dict[str, Any] | None, fmt: str) -> dict[str, Any]:
    """llm-compressor's compressed-tensors quantization_config around one config group."""
    return {
        "config_groups": {
            "group_0": {
                "input_activations": acts, "output_activations": None, "targets": ["Linear"],
                "weights": {"dynamic": False, "observer": "minmax", "observer_kwargs": {},
                            **weights},
            }
        },
        "format": fmt, "global_compression_ratio": 1.5, "ignore": ["lm_head"],
        "kv_cache_scheme": None, "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
    }  # fmt: skip


# RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16, config.json.
W4A16 = _ct(
    {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128,
     "actorder": None, "block_structure": None},
    None,
    "pack-quantized",
)  # fmt: skip
_TOKEN_INT8 = {"dynamic": True, "num_bits": 8, "strategy": "token", "symmetric": True}
# RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8, config.json (int8, dynamic tokens).
W8A8 = _ct(
    {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "group_size": None},
    {**_TOKEN_INT8, "type": "int"},
    "int-quantized",
)
# RedHatAI (neuralmagic) Meta-Llama-3.1-8B-Instruct-FP8-dynamic, config.json.
FP8_DYNAMIC = _ct(
    {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"},
    {**_TOKEN_INT8, "type": "float"},
    "float-quantized",
)
# unsloth/llama-3-8b-bnb-4bit, config.json (transformers' BitsAndBytesConfig, NF4).
BNB4 = {
    "_load_in_4bit": True, "_load_in_8bit": False, "bnb_4bit_compute_dtype": "bfloat16",
    "bnb_4bit_quant_storage": "uint8", "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": True, "llm_int8_enable_fp32_cpu_offload": False,
    "llm_int8_has_fp16_weight": False, "llm_int8_skip_modules": None,
    "llm_int8_threshold": 6.0, "load_in_4bit": True, "load_in_8bit": False,
    "quant_method": "bitsandbytes",
}  # fmt: skip
# transformers' BitsAndBytesConfig(load_in_8bit=True).to_dict(), as saved with LLM.int8().
BNB8 = {
    **BNB4, "_load_in_4bit": False, "_load_in_8bit": True, "load_in_4bit": False,
    "load_in_8bit": True, "bnb_4bit_quant_type": "fp4", "bnb_4bit_use_double_quant": False,
}  # fmt: skip
# openai/gpt-oss-20b and -120b, config.json.
MXFP4 = {
    "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head",
    ],
    "quant_method": "mxfp4",
}  # fmt: skip
# nvidia/Llama-3.1-8B-Instruct-FP8 (TensorRT Model Optimizer): a method vLLM loads and the
# tuner does not know.
MODELOPT = {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": None}


@dataclasses.dataclass(frozen=True)
class Case:
    config: dict[str, Any]
    method: str
    bits: int | None
    bytes_per_weight: float
    capability: tuple[int, int]
    flag: str | None
    says: str  # in the description or the kernel's reason


CASES = {
    "GPTQ 4-bit g128 on Ampere: Marlin": Case(
        GPTQ, "GPTQ", 4, 0.5 + 2.5 / 128, (8, 6), "gptq_marlin", "Marlin int4"
    ),
    "GPTQ 4-bit on a T4: exllama": Case(
        GPTQ, "GPTQ", 4, 0.5 + 2.5 / 128, (7, 5), "gptq", "exllama"
    ),
    "AWQ 4-bit g128 on Ada: Marlin": Case(
        AWQ, "AWQ", 4, 0.5 + 2.5 / 128, (8, 9), "awq_marlin", "Marlin kernel for AWQ"
    ),
    "quant_method gptq_marlin is passed as spelled": Case(
        GPTQ_MARLIN, "GPTQ", 4, 0.5 + 2.5 / 128, (9, 0), "gptq_marlin", "only spelling"
    ),
    "quant_method gptq_marlin on a T4: as spelled, vLLM will refuse": Case(
        GPTQ_MARLIN, "GPTQ", 4, 0.5 + 2.5 / 128, (7, 5), "gptq_marlin", "expect vLLM to refuse"
    ),
    "quant_method awq_marlin is passed as spelled": Case(
        AWQ_MARLIN, "AWQ", 4, 0.5 + 2.5 / 128, (8, 0), "awq_marlin", "only spelling"
    ),
    "FP8 block 128x128: one fp32 scale per block": Case(
        FP8_BLOCK, "FP8", 8, 1 + 4 / (128 * 128), (9, 0), "fp8", "block 128x128"
    ),
    "FP8 per tensor on Ampere: weight-only Marlin": Case(
        FP8_TENSOR, "FP8", 8, 1.0, (8, 0), "fp8", "weight-only FP8 Marlin"
    ),
    "FBGEMM FP8 keeps its own name": Case(FBGEMM_FP8, "FP8", 8, 1.0, (9, 0), "fbgemm_fp8", "FP8"),
    "compressed-tensors W4A16 g128: bf16 scales, no zeros": Case(
        W4A16, "CompressedTensors", 4, 0.5 + 2 / 128, (8, 0), "compressed-tensors", "W4A16"
    ),
    "compressed-tensors W8A8 int8 per channel": Case(
        W8A8, "CompressedTensors", 8, 1.0, (8, 0), "compressed-tensors", "int8 x int8"
    ),
    "compressed-tensors FP8 dynamic on Hopper": Case(
        FP8_DYNAMIC, "CompressedTensors", 8, 1.0, (9, 0), "compressed-tensors", "FP8 x FP8"
    ),
    "bitsandbytes NF4 with double quantization": Case(
        BNB4, "BitsAndBytes", 4, 0.5 + 1 / 64 + 4 / (64 * 256), (8, 9), "bitsandbytes", "NF4"
    ),
    "bitsandbytes 8-bit": Case(BNB8, "BitsAndBytes", 8, 1.0, (8, 0), "bitsandbytes", "8-bit"),
    "MXFP4 on Hopper: 4.25 bits, the Triton MoE kernel": Case(
        MXFP4, "MXFP4", 4, 4.25 / 8, (9, 0), "mxfp4", "Triton"
    ),
    "MXFP4 on Ampere: Marlin": Case(MXFP4, "MXFP4", 4, 4.25 / 8, (8, 0), "mxfp4", "Marlin"),
    "an unknown method: no flag, the stated bound": Case(
        MODELOPT, "Unknown", None, 1.0, (9, 0), None, "does not know quantization method 'modelopt'"
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_each_published_format(case: Case) -> None:
    fmt = quantization.from_config({"quantization_config": case.config})
    assert fmt is not None
    assert (fmt.method, fmt.bits) == (case.method, case.bits)
    assert fmt.bytes_per_quantized_weight() == pytest.approx(case.bytes_per_weight, rel=1e-9)
    flag, why = kernel(fmt, case.capability)
    assert flag == case.flag
    assert case.says in f"{fmt.describe()} {why}"


def test_vllms_spellings_of_compressed_tensors_are_read() -> None:
    # vLLM normalizes compressed_tensors to compressed-tensors and reads the older
    # compression_config key (transformers_utils/model_arch_config_convertor.py).
    for config in (
        {"quantization_config": {**W4A16, "quant_method": "compressed_tensors"}},
        {"compression_config": W4A16},
    ):
        fmt = quantization.from_config(config)
        assert fmt is not None
        assert (fmt.method, fmt.bits, fmt.group_size) == ("CompressedTensors", 4, 128)
        assert kernel(fmt, (9, 0))[0] == "compressed-tensors"


def test_gguf_bits_are_llama_cpps_mixes() -> None:
    # llama.cpp tools/quantize/README.md (Llama 2 7B): Q4_K_M 4.84, Q6_K 6.56 bits per
    # weight; Q8_0 stores 34 bytes per 32 weights.
    for bits, bpw in ((4, 4.84), (6, 6.56), (8, 8.5)):
        fmt = quantization.from_spec(Quantization(method="GGUF", bits=bits))
        assert fmt is not None
        assert fmt.bytes_per_quantized_weight() == pytest.approx(bpw / 8)
        assert kernel(fmt, (8, 9))[0] == "gguf"
    fmt = quantization.from_spec(Quantization(method="GGUF", bits=4))
    assert fmt is not None and "Q4_K_M" in fmt.describe()


def test_no_flag_is_guessed_for_a_gpu_of_unknown_capability() -> None:
    for config in (GPTQ, AWQ, FP8_BLOCK, W4A16, W8A8, BNB4, MXFP4, MODELOPT):
        fmt = quantization.from_config({"quantization_config": config})
        assert fmt is not None
        assert kernel(fmt, None)[0] is None, config["quant_method"]


def test_an_unknown_method_keeps_its_name_and_the_checkpoint_size() -> None:
    fmt = quantization.from_config(
        {"quantization_config": {"quant_method": "Quark"}}, checkpoint_bytes=7_000_000_000
    )
    assert fmt is not None
    assert (fmt.method, fmt.checkpoint_method, fmt.checkpoint_bytes) == (
        "Unknown",
        "quark",
        7_000_000_000,
    )
    assert not fmt.known and fmt.quantized
    assert "the checkpoint's own 7.00 GB (model.safetensors.index.json total_size)" in (
        fmt.describe()
    )
    assert kernel(fmt, (9, 0)) == (None, fmt.describe())


# --- gpt-oss ---------------------------------------------------------------------------------


def gpt_oss(layers: int, experts: int, qc: dict[str, Any] | None = None) -> dict[str, Any]:
    """openai/gpt-oss-20b (24 layers, 32 experts) and -120b (36, 128): config.json."""
    return {
        "architectures": ["GptOssForCausalLM"], "attention_bias": True, "head_dim": 64,
        "hidden_act": "silu", "hidden_size": 2880, "intermediate_size": 2880,
        "layer_types": ["sliding_attention", "full_attention"] * (layers // 2),
        "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
        "num_experts_per_tok": 4, "num_hidden_layers": layers, "num_key_value_heads": 8,
        "num_local_experts": experts, "quantization_config": qc or MXFP4,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                         "original_max_position_embeddings": 4096, "rope_type": "yarn",
                         "truncate": False},
        "rope_theta": 150000, "sliding_window": 128, "tie_word_embeddings": False,
        "vocab_size": 201088,
    }  # fmt: skip


def _weights(config: dict[str, Any], capability: tuple[int, int] | None, tp: int = 1) -> int:
    fmt = quantization.from_config(config)
    assert fmt is not None
    return weights_bytes(
        from_config(config),
        quantization.for_gpu(fmt, capability),
        activation_dtype_bytes=2,
        tensor_parallel=tp,
    )


def test_the_expert_split_of_gpt_oss() -> None:
    # Model card (arXiv 2508.10925, table 1): MLP 19.12B / 114.71B of 20.91B / 116.83B.
    small, large = from_config(gpt_oss(24, 32)), from_config(gpt_oss(36, 128))
    # experts x 3 (gate, up, down) x hidden x intermediate x layers
    assert small.expert_parameters == 32 * 3 * 2880 * 2880 * 24
    assert small.expert_parameters / 1e9 == pytest.approx(19.12, abs=0.01)
    assert large.expert_parameters / 1e9 == pytest.approx(114.71, abs=0.06)
    assert small.parameter_count / 1e9 == pytest.approx(20.91, abs=0.01)
    assert large.parameter_count / 1e9 == pytest.approx(116.83, rel=0.001)


@pytest.mark.parametrize(
    ("layers", "experts", "capability", "reference_gib"),
    [
        # vLLM 0.19.0 on an A100 (Marlin MoE backend), `vllm serve openai/gpt-oss-20b`:
        # "Model loading took 13.72 GiB memory"
        # (https://myoceane.fr/index.php/ai-vllm-a100-gemma-4/, 2026-04-18).
        pytest.param(24, 32, (8, 0), 13.72, id="20b on A100 vs vLLM 0.19.0's 13.72 GiB"),
        # vLLM 0.14.1 on an H100, "Using Triton backend" ... "Model loading took 64.38 GiB"
        # (vllm-project/vllm#33155; tests/tuning/data/vllm_startup_logs.yaml).
        pytest.param(36, 128, (9, 0), 64.38, id="120b on H100 vs vLLM 0.14.1's 64.38 GiB"),
        # vLLM 0.10.1 on an H100 through the Marlin MoE kernel ("Weight-only FP4 compression
        # will be used leveraging the Marlin kernel"): "Model loading took 65.9651 GiB"
        # (vllm-project/vllm#23278). The tuner assumes Hopper's Triton kernel.
        pytest.param(36, 128, (9, 0), 65.9651, id="120b on H100 vs vLLM 0.10.1's 65.97 GiB"),
        # No public H100 log for 20b: the checkpoint, 12.8 GiB per the model card (13.76 GB
        # of safetensors on the Hub), plus the second copy of the scales.
        pytest.param(24, 32, (9, 0), 12.8, id="20b on H100 vs the checkpoint 12.8 GiB"),
    ],
)
def test_gpt_oss_weights_match_the_references(
    layers: int, experts: int, capability: tuple[int, int], reference_gib: float
) -> None:
    config = gpt_oss(layers, experts)
    predicted = _weights(config, capability)
    assert predicted / GIB == pytest.approx(reference_gib, rel=0.05)
    # Before MXFP4 was known, the unknown method was counted at 8 bits: 50 % and more over.
    upper_bound = _weights(gpt_oss(layers, experts, {"quant_method": "not-known"}), capability)
    assert upper_bound / GIB > 1.45 * reference_gib


@pytest.mark.parametrize(
    ("capability", "tp", "hidden", "intermediate"),
    [
        pytest.param((9, 0), 1, 2880, 2880, id="Hopper: 2880 is a multiple of 64"),
        pytest.param((9, 0), 2, 2880, 2 * 1472, id="Hopper TP 2: 1440 per GPU -> 1472"),
        pytest.param((8, 0), 1, 3072, 2944, id="Marlin: hidden -> 3072, intermediate -> 2944"),
        pytest.param((8, 0), 2, 3072, 2 * 1536, id="Marlin TP 2: 1440 per GPU -> 1536"),
        pytest.param((10, 0), 1, 3072, 2944, id="B200 (FlashInfer TRT-LLM): as Marlin"),
        pytest.param(None, 1, 3072, 2944, id="unknown GPU: the larger padding"),
    ],
)
def test_mxfp4_experts_are_padded_as_vllms_moe_kernel_pads_them(
    capability: tuple[int, int] | None, tp: int, hidden: int, intermediate: int
) -> None:
    config = gpt_oss(24, 32)
    arch = from_config(config)
    experts = arch.expert_parameters
    rest = arch.parameter_count - experts
    padded = experts * hidden * intermediate / 2880**2
    # Hopper: one more e8m0 scale per 32 weights (the copy vLLM before 0.25 keeps).
    bits = MXFP4_BITS + (8 / 32 if capability == (9, 0) else 0)
    expected = padded * bits / 8 + 2 * rest
    assert _weights(config, capability, tp) == pytest.approx(expected, abs=1)


def _service(config_repo: str = "openai/gpt-oss-20b", **spec: Any) -> Any:
    return isvc(
        model={"name": "gpt-oss", "source": {"huggingFace": {"repo": config_repo}}},
        gpu={"count": "auto"},
        **spec,
    )


def test_mxfp4_is_passed_from_0_11_and_left_out_with_a_note_on_0_10() -> None:
    service = _service()
    for version, passed in (("0.10.0", False), ("0.11.0", True), ("0.32.0", True)):
        parsed = Version.parse(version)
        assert parsed is not None
        deployed = DeployedVersion(parsed, "Spec")
        result = as_plan(
            plan_service(
                service.spec, [gpus("H100-80GB")], config=gpt_oss(24, 32), version=deployed
            )
        )
        assert (arg(result, "quantization") == "mxfp4") is passed, version
        if not passed:
            assert any("--quantization mxfp4 not passed" in n for n in result.notes)


def test_a_plan_for_an_unknown_method_renders_no_quantization_flag() -> None:
    service = _service("nvidia/gpt-oss-20b-custom")
    config = gpt_oss(24, 32, MODELOPT)
    result = as_plan(plan_service(service.spec, [gpus("H100-80GB")], config=config))
    assert result.argument("quantization") is None
    assert not any(a.startswith("--quantization") for a in result.command_args())
    tuning = result.effective_tuning()
    note = next(n for n in tuning.notes if "does not know quantization method 'modelopt'" in n)
    assert "vLLM will detect it" in note
    assert "upper bound of 8 bits per weight" in note
    assert note in result.notes, "a note of its own, not only inside a prediction's reason"
    deployment = build_deployment(service, tuning, image="vllm:x", replicas=1)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--quantization" not in args
    # The bound: 8 bits for every layer but embeddings and norms.
    arch = from_config(config)
    norms = 2 * 2880 * 24 + 2880
    plain = arch.embedding_parameters + norms
    assert result.predictions.weights_bytes == (arch.parameter_count - plain) + 2 * plain


def test_an_unknown_method_is_sized_from_the_checkpoint_when_it_is_known() -> None:
    spec = _service("nvidia/gpt-oss-20b-custom").spec
    model = resolve_model(
        spec.model, config=gpt_oss(24, 32, MODELOPT), checkpoint_bytes=11_500_000_000
    )
    assert model is not None
    fmt = quantization.for_gpu(model.weight_format, (9, 0))
    assert weights_bytes(model.architecture, fmt, activation_dtype_bytes=2) == 11_500_000_000


def test_a_known_method_on_an_unknown_gpu_passes_nothing() -> None:
    unknown = profile_from_product("Some-Accelerator", 1, memory_mib=81920)
    assert unknown.compute_capability is None
    result = as_plan(plan_service(_service().spec, [unknown], config=gpt_oss(24, 32)))
    assert result.argument("quantization") is None
    # Sized at the largest padding of vLLM's backends.
    assert result.predictions.weights_bytes == _weights(gpt_oss(24, 32), None)


def test_the_spec_can_state_mxfp4() -> None:
    fmt = quantization.from_spec(Quantization(method="MXFP4"))
    assert fmt is not None
    assert kernel(fmt, (9, 0))[0] == "mxfp4"
    assert kernel(fmt, (7, 5))[1].endswith("expect vLLM to refuse")


# --- vllm-operator tune reads the checkpoint's size beside config.json ------------------------


def test_tune_sizes_an_unknown_method_from_the_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(gpt_oss(24, 32, MODELOPT)))
    index = {"metadata": {"total_size": 12_345_678_912}, "weight_map": {}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    code = main([str(tmp_path), "--gpu", "H100-80GB", "-o", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert doc["tuning"]["predictions"]["weightsBytes"] == 12_345_678_912
    assert "--quantization" not in " ".join(doc["command"])
    assert "the checkpoint's own 12.35 GB" in doc["model"]["weights"]
