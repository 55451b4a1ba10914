"""Model shapes from config.json, the spec and the catalog; weight formats."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_operator.models.inference_service import ModelArchitecture, Quantization
from vllm_operator.tuning import catalog, quantization
from vllm_operator.tuning.architecture import ArchitectureError, from_config, from_spec
from vllm_operator.tuning.quantization import WeightFormat, kernel


@pytest.mark.parametrize("entry", catalog.MODELS, ids=lambda m: m.repo)
def test_the_shape_of_every_catalog_model_adds_up_to_its_published_parameter_count(
    entry: catalog.CatalogModel,
) -> None:
    arch = entry.architecture()
    assert arch.estimated_parameter_count == entry.parameters


@pytest.mark.parametrize(
    ("name", "repo"),
    [
        pytest.param(
            "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B", id="an instruct repo id"
        ),
        pytest.param(
            "Meta-Llama-3.1-70B-Instruct", "meta-llama/Llama-3.1-70B", id="the old Meta- prefix"
        ),
        pytest.param(
            "TheBloke/Llama-2-7B-Chat-GPTQ",
            "meta-llama/Llama-2-7b-hf",
            id="a quantized chat variant",
        ),
        pytest.param(
            "Qwen/Qwen2.5-72B-Instruct-AWQ", "Qwen/Qwen2.5-72B-Instruct", id="an AWQ variant"
        ),
        pytest.param(
            "mistralai/Mistral-7B-v0.1", "mistralai/Mistral-7B-v0.1", id="Mistral v0.1 is not v0.3"
        ),
        pytest.param(
            "mistralai/Mistral-7B-Instruct-v0.3",
            "mistralai/Mistral-7B-Instruct-v0.3",
            id="Mistral v0.3",
        ),
    ],
)
def test_catalog_lookup(name: str, repo: str) -> None:
    entry = catalog.lookup(name)
    assert entry is not None
    assert entry.repo == repo


def test_an_unknown_model_is_not_in_the_catalog() -> None:
    assert catalog.lookup("acme/very-private-13b") is None


LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def test_a_llama_config_reads_gqa_and_head_size() -> None:
    arch = from_config(LLAMA)
    assert (arch.num_layers, arch.num_attention_heads, arch.num_kv_heads) == (32, 32, 8)
    assert arch.head_dim == 128
    assert arch.torch_dtype == "bfloat16"
    assert not arch.is_moe


def test_a_multimodal_config_reads_its_text_model() -> None:
    config = {
        "model_type": "llava",
        "torch_dtype": "float16",
        "text_config": {k: v for k, v in LLAMA.items() if k != "torch_dtype"},
        "vision_config": {"hidden_size": 1024},
    }
    arch = from_config(config)
    assert arch.num_layers == 32
    assert arch.torch_dtype == "float16"


def test_gpt2_style_keys_are_read() -> None:
    arch = from_config(
        {
            "model_type": "gpt2",
            "n_layer": 12,
            "n_embd": 768,
            "n_head": 12,
            "vocab_size": 50257,
            "n_positions": 1024,
        }
    )
    assert (arch.num_layers, arch.hidden_size, arch.num_kv_heads, arch.head_dim) == (
        12,
        768,
        12,
        64,
    )
    assert arch.max_position_embeddings == 1024
    assert not arch.gated_mlp


def test_linear_rope_scaling_extends_the_context_as_vllm_does() -> None:
    config = {
        **LLAMA,
        "max_position_embeddings": 4096,
        "rope_scaling": {"type": "linear", "factor": 4.0},
    }
    assert from_config(config).max_position_embeddings == 16384
    llama3 = {
        **LLAMA,
        "max_position_embeddings": 131072,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0},
    }
    assert from_config(llama3).max_position_embeddings == 131072


def test_qwen_sliding_window_counts_only_when_used() -> None:
    qwen = catalog.lookup("Qwen2.5-7B")
    assert qwen is not None
    assert qwen.architecture().sliding_window is None
    mistral = catalog.lookup("mistralai/Mistral-7B-v0.1")
    assert mistral is not None
    arch = mistral.architecture()
    assert (arch.sliding_window, arch.sliding_window_layers) == (4096, 32)


def test_layer_types_mark_hybrid_sliding_window_models() -> None:
    layer_types = ["sliding_attention"] * 5 + ["full_attention"]
    config = {**LLAMA, "num_hidden_layers": 6, "sliding_window": 1024, "layer_types": layer_types}
    arch = from_config(config)
    assert (arch.sliding_window, arch.sliding_window_layers) == (1024, 5)


def test_mixtral_reads_its_experts() -> None:
    entry = catalog.lookup("Mixtral-8x7B")
    assert entry is not None
    arch = entry.architecture()
    assert (arch.num_experts, arch.num_experts_per_token) == (8, 2)
    # 12.9B active of 46.7B (Mistral AI's figures).
    assert 12.5e9 < arch.active_parameter_count < 13.2e9


def test_deepseek_latent_attention_is_read() -> None:
    config = {
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "q_lora_rank": 1536,
        "vocab_size": 129280,
        "max_position_embeddings": 163840,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 2048,
        "n_shared_experts": 1,
        "first_k_dense_replace": 3,
        "intermediate_size": 18432,
    }
    arch = from_config(config)
    assert arch.uses_mla
    assert arch.is_moe
    assert arch.dense_layers == 3
    # 671B total, 37B active (DeepSeek-V3 report), within 5 %.
    assert arch.estimated_parameter_count == pytest.approx(671e9, rel=0.05)
    assert arch.active_parameter_count == pytest.approx(37e9, rel=0.1)


@pytest.mark.parametrize(
    ("config", "missing"),
    [
        pytest.param({"model_type": "x"}, "num_hidden_layers", id="no layers"),
        pytest.param({**LLAMA, "vocab_size": None}, "vocab_size", id="no vocabulary"),
        pytest.param(
            {**LLAMA, "num_key_value_heads": 5},
            "key/value heads",
            id="heads not a multiple of KV heads",
        ),
        pytest.param({**LLAMA, "num_hidden_layers": "32"}, "integer", id="a number as a string"),
    ],
)
def test_an_unusable_config_names_what_is_wrong(config: dict[str, Any], missing: str) -> None:
    with pytest.raises(ArchitectureError, match=missing):
        from_config(config)


def test_the_spec_architecture_defaults_kv_heads_and_head_size() -> None:
    arch = from_spec(
        ModelArchitecture(
            num_layers=2,
            hidden_size=256,
            num_attention_heads=4,
            vocab_size=512,
            max_position_embeddings=2048,
        )
    )
    assert (arch.num_kv_heads, arch.head_dim) == (4, 64)


# --- weight formats --------------------------------------------------------------------------


def test_gptq_config_is_read() -> None:
    fmt = quantization.from_config(
        {
            "quantization_config": {
                "quant_method": "gptq",
                "bits": 4,
                "group_size": 128,
                "desc_act": True,
                "sym": True,
            }
        }
    )
    assert fmt == WeightFormat("GPTQ", 4, 128, True, True, origin=fmt.origin if fmt else "")


def test_awq_config_with_old_key_names_is_read() -> None:
    fmt = quantization.from_config(
        {"quantization_config": {"quant_method": "awq", "w_bit": 4, "q_group_size": 64}}
    )
    assert fmt is not None
    assert (fmt.method, fmt.bits, fmt.group_size) == ("AWQ", 4, 64)


def test_compressed_tensors_bits_come_from_the_weight_group() -> None:
    fmt = quantization.from_config(
        {
            "quantization_config": {
                "quant_method": "compressed-tensors",
                "config_groups": {"group_0": {"weights": {"num_bits": 4, "group_size": 128}}},
            }
        }
    )
    assert fmt is not None
    assert (fmt.method, fmt.bits, fmt.group_size) == ("CompressedTensors", 4, 128)


def test_an_unquantized_config_has_no_format() -> None:
    assert quantization.from_config(LLAMA) is None


def test_the_spec_format_wins() -> None:
    fmt = quantization.from_spec(Quantization(method="AWQ", bits=4, group_size=128))
    assert fmt is not None
    assert fmt.origin == "spec.model.quantization"


@pytest.mark.parametrize(
    ("fmt", "capability", "expected"),
    [
        pytest.param(
            WeightFormat("GPTQ", 4, 128),
            (8, 6),
            "gptq_marlin",
            id="GPTQ 4-bit on Ampere uses Marlin",
        ),
        pytest.param(
            WeightFormat("GPTQ", 8, -1),
            (9, 0),
            "gptq_marlin",
            id="GPTQ 8-bit per-channel on Hopper uses Marlin",
        ),
        pytest.param(
            WeightFormat("GPTQ", 3, 128), (9, 0), "gptq", id="GPTQ 3-bit has no Marlin kernel"
        ),
        pytest.param(WeightFormat("GPTQ", 4, 128), (7, 5), "gptq", id="GPTQ on Turing falls back"),
        pytest.param(
            WeightFormat("AWQ", 4, 128), (8, 9), "awq_marlin", id="AWQ on Ada uses Marlin"
        ),
        pytest.param(WeightFormat("AWQ", 4, 128), (7, 0), "awq", id="AWQ on Volta falls back"),
        pytest.param(WeightFormat("FP8", 8), (8, 0), "fp8", id="FP8 on Ampere runs weight-only"),
        pytest.param(WeightFormat(), (9, 0), None, id="unquantized weights need no kernel"),
    ],
)
def test_quantization_kernel(
    fmt: WeightFormat, capability: tuple[int, int], expected: str | None
) -> None:
    value, reason = kernel(fmt, capability)
    assert value == expected
    assert reason


def test_a_4_bit_group_128_weight_costs_a_little_over_half_a_byte() -> None:
    per_weight = WeightFormat("GPTQ", 4, 128).bytes_per_quantized_weight()
    assert 0.5 < per_weight < 0.52
