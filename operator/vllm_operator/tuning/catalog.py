"""A small offline catalog of well-known models, so the tuner can plan without a download.

Each entry is an excerpt of the model's published ``config.json`` on the Hugging Face Hub
(the keys the tuner reads, values unchanged; the comment above it says where the copy was
read) and its parameter count, and goes through the same reader as a real file
(:func:`vllm_operator.tuning.architecture.from_config`). The count is the one the shape
gives (:attr:`Architecture.estimated_parameter_count`): for Llama, Mistral, Mixtral and
Qwen2 it is the Hub's safetensors count to the parameter; for Qwen3 (query/key norms) and
gpt-oss (biases, attention sinks) it leaves out well under 0.1 %. The published figure is
beside each entry, and ``tests/tuning/test_catalog.py`` holds the two within 2 %.
Instruct, chat and quantized variants share their base model's shape and are found under
the base entry's aliases; a quantized variant's format comes from its own config.json or
its name (:mod:`vllm_operator.tuning.quantization`), never from the catalog.

Lookup (:func:`lookup`) accepts a repository id (``meta-llama/Llama-3.1-8B-Instruct``), a
bare name (``Llama-3.1-8B``), and names with a quantization suffix
(``TheBloke/Llama-2-7B-GPTQ``, ``Qwen/Qwen2-7B-Instruct-GPTQ-Int4``): it compares
lower-case names without the organisation and without suffixes such as ``-Instruct``,
``-chat``, ``-hf``, ``-GPTQ``, ``-Int4``, ``-AWQ``. :func:`nearest` names the entries
closest to a name that is not in the catalog, for the message that says so.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping
from typing import Any, Final

from vllm_operator.tuning.architecture import Architecture, from_config

__all__ = ["MODELS", "CatalogModel", "lookup", "names", "nearest"]


@dataclasses.dataclass(frozen=True)
class CatalogModel:
    """One catalog entry: a canonical repository id, aliases and the config excerpt."""

    repo: str
    parameters: int
    config: Mapping[str, Any]
    aliases: tuple[str, ...] = ()

    def architecture(self) -> Architecture:
        arch = from_config(self.config, name=self.repo)
        return dataclasses.replace(arch, parameter_count_given=self.parameters)


_LLAMA31 = {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}, "rope_theta": 500000.0}
# gpt-oss: both sizes share their RoPE scaling and quantization_config excerpts.
_GPT_OSS_YARN = {
    "rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
    "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
}  # fmt: skip
_GPT_OSS_MXFP4 = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head",
    ],
}  # fmt: skip

MODELS: Final[tuple[CatalogModel, ...]] = (
    CatalogModel(
        "meta-llama/Llama-3.1-8B",
        8_030_261_248,
        {
            "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", **_LLAMA31,
        },
        aliases=("meta-llama/Meta-Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct"),
    ),
    CatalogModel(
        "meta-llama/Llama-3.1-70B",
        70_553_706_496,
        {
            "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
            "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", **_LLAMA31,
        },
        aliases=(
            "meta-llama/Meta-Llama-3.1-70B",
            "meta-llama/Llama-3.1-70B-Instruct",
            "meta-llama/Llama-3.3-70B-Instruct",
        ),
    ),
    CatalogModel(
        "meta-llama/Llama-3.2-1B",
        1_235_814_400,
        {
            "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
            "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 131072,
            "tie_word_embeddings": True, "torch_dtype": "bfloat16",
            "rope_scaling": {"rope_type": "llama3", "factor": 32.0},
        },
        aliases=("meta-llama/Llama-3.2-1B-Instruct",),
    ),
    CatalogModel(
        "meta-llama/Llama-3.2-3B",
        3_212_749_824,
        {
            "model_type": "llama", "hidden_size": 3072, "intermediate_size": 8192,
            "num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072,
            "tie_word_embeddings": True, "torch_dtype": "bfloat16",
            "rope_scaling": {"rope_type": "llama3", "factor": 32.0},
        },
        aliases=("meta-llama/Llama-3.2-3B-Instruct",),
    ),
    CatalogModel(
        "meta-llama/Llama-2-7b-hf",
        6_738_415_616,
        {
            "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
            "vocab_size": 32000, "max_position_embeddings": 4096,
            "tie_word_embeddings": False, "torch_dtype": "float16",
        },
        aliases=("meta-llama/Llama-2-7b", "meta-llama/Llama-2-7b-chat-hf", "Llama-2-7B"),
    ),
    CatalogModel(
        "meta-llama/Llama-2-13b-hf",
        13_015_864_320,
        {
            "model_type": "llama", "hidden_size": 5120, "intermediate_size": 13824,
            "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 40,
            "vocab_size": 32000, "max_position_embeddings": 4096,
            "tie_word_embeddings": False, "torch_dtype": "float16",
        },
        aliases=("meta-llama/Llama-2-13b-chat-hf", "Llama-2-13B"),
    ),
    CatalogModel(
        "mistralai/Mistral-7B-v0.1",
        7_241_732_096,
        {
            "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": 4096,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        aliases=("mistralai/Mistral-7B-Instruct-v0.1",),
    ),
    CatalogModel(
        "mistralai/Mistral-7B-Instruct-v0.3",
        7_248_023_552,
        {
            "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 32768, "max_position_embeddings": 32768,
            "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        aliases=("mistralai/Mistral-7B-v0.3", "Mistral-7B"),
    ),
    CatalogModel(
        "mistralai/Mixtral-8x7B-v0.1",
        46_702_792_704,
        {
            "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": None,
            "num_local_experts": 8, "num_experts_per_tok": 2,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        aliases=("mistralai/Mixtral-8x7B-Instruct-v0.1", "Mixtral-8x7B"),
    ),
    CatalogModel(
        "Qwen/Qwen2.5-0.5B-Instruct",
        494_032_768,
        {
            "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
            "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
            "vocab_size": 151936, "max_position_embeddings": 32768,
            "sliding_window": 32768, "use_sliding_window": False,
            "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        },
        aliases=("Qwen/Qwen2.5-0.5B",),
    ),
    CatalogModel(
        "Qwen/Qwen2.5-7B-Instruct",
        7_615_616_512,
        {
            "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
            "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
            "vocab_size": 152064, "max_position_embeddings": 32768,
            "sliding_window": 131072, "use_sliding_window": False,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        aliases=("Qwen/Qwen2.5-7B", "Qwen2.5-7B"),
    ),
    CatalogModel(
        "Qwen/Qwen2.5-72B-Instruct",
        72_706_203_648,
        {
            "model_type": "qwen2", "hidden_size": 8192, "intermediate_size": 29568,
            "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
            "vocab_size": 152064, "max_position_embeddings": 32768,
            "sliding_window": 131072, "use_sliding_window": False,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        aliases=("Qwen/Qwen2.5-72B", "Qwen2.5-72B"),
    ),
    # --- Qwen2 ---------------------------------------------------------------------------
    # Qwen/Qwen2-7B-Instruct/config.json as copied into Hub fine-tunes saved from it (e.g.
    # XiaoY1/Qwen2-7B-Instruct-DPO-hotpot-beta0.5, from snapshot f2826a00; shisa-ai/
    # shisa-v1-qwen2-7b). Parameters: computed, the same shape as Qwen2.5-7B-Instruct, whose
    # Hub count (7,615,616,512) it equals. The GPTQ-Int4 repository is this shape quantized:
    # its weight format comes from its own config.json or, offline, from its name.
    CatalogModel(
        "Qwen/Qwen2-7B-Instruct",
        7_615_616_512,
        {
            "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
            "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
            "vocab_size": 152064, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
            "sliding_window": 131072, "use_sliding_window": False,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        aliases=("Qwen/Qwen2-7B-Instruct-GPTQ-Int4", "Qwen/Qwen2-7B-Instruct-GPTQ-Int8"),
    ),
    # --- Qwen2.5 -------------------------------------------------------------------------
    # Qwen/Qwen2.5-1.5B-Instruct/config.json at Hub revision 989aa798 and its safetensors
    # count (1,543,714,304), both captured in daniel-p-green/alain-ai-learning-platform
    # (out/research-qwen-qwen2-5-1-5b-instruct/sources/huggingface/).
    CatalogModel(
        "Qwen/Qwen2.5-1.5B-Instruct",
        1_543_714_304,
        {
            "model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960,
            "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
            "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
            "sliding_window": 32768, "use_sliding_window": False,
            "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        },
        aliases=("Qwen/Qwen2.5-1.5B", "Qwen2.5-1.5B"),
    ),
    # Qwen/Qwen2.5-3B-Instruct/config.json at revision aa8e7253 and its safetensors count
    # (3,085,938,688), same capture (out/research-qwen-qwen2-5-3b-instruct/).
    CatalogModel(
        "Qwen/Qwen2.5-3B-Instruct",
        3_085_938_688,
        {
            "model_type": "qwen2", "hidden_size": 2048, "intermediate_size": 11008,
            "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
            "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
            "sliding_window": 32768, "use_sliding_window": False,
            "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        },
        aliases=("Qwen/Qwen2.5-3B", "Qwen2.5-3B"),
    ),
    # Qwen/Qwen2.5-14B-Instruct/config.json as in jebish7/Qwen2.5-14B-Instruct ("Duplicate
    # from Qwen/Qwen2.5-14B-Instruct"). Parameters: computed (model card: 14.7B).
    CatalogModel(
        "Qwen/Qwen2.5-14B-Instruct",
        14_770_033_664,
        {
            "model_type": "qwen2", "hidden_size": 5120, "intermediate_size": 13824,
            "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
            "vocab_size": 152064, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
            "sliding_window": 131072, "use_sliding_window": False,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        aliases=("Qwen/Qwen2.5-14B", "Qwen2.5-14B"),
    ),
    # Qwen/Qwen2.5-32B-Instruct/config.json as in fine-tunes saved from it (ehristoforu/
    # qwen2.5-test-32b-it, Cqy2019/m1-32B-1m; transformers rewrote its sliding_window, not
    # read while use_sliding_window is false, so it is left out). Parameters: computed; the
    # same-shape DeepSeek-R1-Distill-Qwen-32B has this Hub count (model card: 32.5B).
    CatalogModel(
        "Qwen/Qwen2.5-32B-Instruct",
        32_763_876_352,
        {
            "model_type": "qwen2", "hidden_size": 5120, "intermediate_size": 27648,
            "num_hidden_layers": 64, "num_attention_heads": 40, "num_key_value_heads": 8,
            "vocab_size": 152064, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
            "use_sliding_window": False,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        aliases=("Qwen/Qwen2.5-32B", "Qwen2.5-32B"),
    ),
    # --- Qwen3 ---------------------------------------------------------------------------
    # Qwen3 adds a per-head RMSNorm on queries and keys (2 x head_dim per layer) that the
    # shape formula leaves out; the counts below are computed from the shape and the model
    # cards' figures are given beside them (tests/tuning/test_catalog.py checks both).
    # Qwen/Qwen3-0.6B/config.json at revision c1899de2, captured in daniel-p-green/
    # alain-ai-learning-platform (out/research-qwen-qwen3-0-6b/). Model card: 0.6B (0.44B
    # without embeddings); the Hub's safetensors count, 751,632,384, includes a stored copy
    # of the tied output head that vLLM does not load.
    CatalogModel(
        "Qwen/Qwen3-0.6B",
        596_042_752,
        {
            "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
            "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
            "rope_theta": 1000000, "rope_scaling": None,
            "sliding_window": None, "use_sliding_window": False,
            "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        },
    ),
    # Qwen/Qwen3-4B/config.json as collected in citsjtu2020/LLM-Prof (sglang/
    # Model_Config.md). Model card: 4.0B.
    CatalogModel(
        "Qwen/Qwen3-4B",
        4_022_458_880,
        {
            "model_type": "qwen3", "hidden_size": 2560, "intermediate_size": 9728,
            "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
            "rope_theta": 1000000, "rope_scaling": None,
            "sliding_window": None, "use_sliding_window": False,
            "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        },
    ),
    # Qwen/Qwen3-8B/config.json: citsjtu2020/LLM-Prof (sglang/Model_Config.md), and the
    # Hub's thejaminator/qwen-hook-layer-9 ("Copy config.json from Qwen/Qwen3-8B").
    # Model card: 8.2B.
    CatalogModel(
        "Qwen/Qwen3-8B",
        8_190_726_144,
        {
            "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
            "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
            "rope_theta": 1000000, "rope_scaling": None,
            "sliding_window": None, "use_sliding_window": False,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
    ),
    # Qwen/Qwen3-14B/config.json: citsjtu2020/LLM-Prof (sglang/Model_Config.md). Model
    # card: 14.8B.
    CatalogModel(
        "Qwen/Qwen3-14B",
        14_768_296_960,
        {
            "model_type": "qwen3", "hidden_size": 5120, "intermediate_size": 17408,
            "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
            "rope_theta": 1000000, "rope_scaling": None,
            "sliding_window": None, "use_sliding_window": False,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
    ),
    # Qwen/Qwen3-32B/config.json at revision 9216db57 (alain-ai-learning-platform,
    # out/research-qwen-qwen3-32b/; the same values in LLM-Prof). Hub safetensors count:
    # 32,762,123,264 (the query/key norms make the difference).
    CatalogModel(
        "Qwen/Qwen3-32B",
        32_762_106_880,
        {
            "model_type": "qwen3", "hidden_size": 5120, "intermediate_size": 25600,
            "num_hidden_layers": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
            "rope_theta": 1000000, "rope_scaling": None,
            "sliding_window": None, "use_sliding_window": False,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
    ),
    # Qwen/Qwen3-30B-A3B/config.json: citsjtu2020/LLM-Prof (sglang/Model_Config.md); the
    # same MoE shape in Ascend/MindSpeed-RL configs/model/qwen3_30b_a3b.yaml. Model card:
    # 30.5B total, 3.3B activated; 128 experts, 8 per token, no shared expert.
    CatalogModel(
        "Qwen/Qwen3-30B-A3B",
        30_532_110_336,
        {
            "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
            "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
            "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
            "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
            "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
            "rope_theta": 1000000.0, "rope_scaling": None,
            "sliding_window": None, "use_sliding_window": False,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
    ),
    # Qwen/Qwen3-235B-A22B/config.json as embedded (all keys) in a litellm_config.py on
    # GitHub (HARD_CODED_CONFIGS["Qwen/Qwen3-235B-A22B"]); the shape agrees with Ascend/
    # MindSpeed-RL configs/model/qwen3_235b_a22b.yaml and AI-Hypercomputer/maxtext's
    # qwen3-235b-a22b.yml. Model card: 235B total, 22B activated.
    CatalogModel(
        "Qwen/Qwen3-235B-A22B",
        235_093_610_496,
        {
            "model_type": "qwen3_moe", "hidden_size": 4096, "intermediate_size": 12288,
            "moe_intermediate_size": 1536, "num_experts": 128, "num_experts_per_tok": 8,
            "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
            "num_hidden_layers": 94, "num_attention_heads": 64, "num_key_value_heads": 4,
            "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
            "rope_theta": 1000000.0, "rope_scaling": None,
            "sliding_window": None, "use_sliding_window": False,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
    ),
    # --- Larger than one node (multi-node plans, tuning/multinode.py) -------------------
    # meta-llama/Llama-3.1-405B/config.json as published on the Hub (the keys the tuner
    # reads); its safetensors count, 405,853,388,800, is what the shape gives.
    CatalogModel(
        "meta-llama/Llama-3.1-405B",
        405_853_388_800,
        {
            "model_type": "llama", "hidden_size": 16384, "intermediate_size": 53248,
            "num_hidden_layers": 126, "num_attention_heads": 128, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", **_LLAMA31,
        },
        aliases=("meta-llama/Meta-Llama-3.1-405B", "meta-llama/Llama-3.1-405B-Instruct"),
    ),
    # deepseek-ai/DeepSeek-V3/config.json as published on the Hub, with its FP8 block
    # quantization_config (the checkpoint is FP8); the count is the shape's. Model card: 671B
    # total (685B with the multi-token-prediction module, which vLLM loads only for
    # speculative decoding), 37B activated; R1 shares the shape.
    CatalogModel(
        "deepseek-ai/DeepSeek-V3",
        671_026_279_424,
        {
            "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
            "moe_intermediate_size": 2048, "num_hidden_layers": 61,
            "num_attention_heads": 128, "num_key_value_heads": 128,
            "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
            "first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 1536,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "vocab_size": 129280, "max_position_embeddings": 163840,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "quantization_config": {
                "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                "weight_block_size": [128, 128],
            },
        },
        aliases=("deepseek-ai/DeepSeek-V3-0324", "deepseek-ai/DeepSeek-R1"),
    ),
    # --- Llama 3.x distilled by DeepSeek -------------------------------------------------
    # deepseek-ai/DeepSeek-R1-Distill-Llama-8B/config.json at revision 6a6f4aa4 and its
    # safetensors count (8,030,261,248), captured in alain-ai-learning-platform
    # (out/research-deepseek-ai-deepseek-r1-distill-llama-8b/): Llama-3.1-8B's shape.
    CatalogModel(
        "deepseek-ai/DeepSeek-R1-Distill-Llama-8B",
        8_030_261_248,
        {
            "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "vocab_size": 128256, "max_position_embeddings": 131072,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", **_LLAMA31,
        },
    ),
    # deepseek-ai/DeepSeek-R1-Distill-Llama-70B/config.json as in models saved from it
    # (perplexity-ai/r1-1776-distill-llama-70b; casperhansen/deepseek-r1-distill-llama-70b-awq,
    # from snapshot 07a264a5): Llama-3.3-70B-Instruct's shape. Parameters: computed, as for
    # Llama-3.1-70B (Hub count 70,553,706,496).
    CatalogModel(
        "deepseek-ai/DeepSeek-R1-Distill-Llama-70B",
        70_553_706_496,
        {
            "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
            "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", **_LLAMA31,
        },
    ),
    # --- Qwen2.5 distilled by DeepSeek ---------------------------------------------------
    # deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B/config.json as in models saved from it
    # (wh-zhu/DeepSeek-R1-TrRa-1.5B-lambda_2, from snapshot e9378405; onnx-community/
    # DeepSeek-R1-Distill-Qwen-1.5B-ONNX). Unlike Qwen2.5-1.5B it does not tie its output
    # head. Parameters: computed (model card: 1.5B; the Hub shows 1.78B).
    CatalogModel(
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
        1_777_088_000,
        {
            "model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960,
            "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
            "vocab_size": 151936, "max_position_embeddings": 131072, "rope_theta": 10000,
            "rope_scaling": None, "sliding_window": None, "use_sliding_window": False,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
    ),
    # deepseek-ai/DeepSeek-R1-Distill-Qwen-7B/config.json as in models saved from it
    # (mlfoundations-dev/DeepSeek-R1-Distill-Qwen-7B_OpenThoughts3, from snapshot 916b56a4;
    # prithivMLmods/QwQ-R1-Distill-7B-CoT). Parameters: computed (model card: 7B).
    CatalogModel(
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
        7_615_616_512,
        {
            "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
            "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
            "vocab_size": 152064, "max_position_embeddings": 131072, "rope_theta": 10000,
            "rope_scaling": None, "sliding_window": None, "use_sliding_window": False,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
    ),
    # deepseek-ai/DeepSeek-R1-Distill-Qwen-14B/config.json as in models saved from it
    # (neody/r1-14b-awq, from snapshot c79f47ac; RealSafe/RealSafe-R1-14B). Parameters:
    # computed (model card: 14B; the Hub shows 14.8B).
    CatalogModel(
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B",
        14_770_033_664,
        {
            "model_type": "qwen2", "hidden_size": 5120, "intermediate_size": 13824,
            "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
            "vocab_size": 152064, "max_position_embeddings": 131072, "rope_theta": 1000000.0,
            "rope_scaling": None, "sliding_window": None, "use_sliding_window": False,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
    ),
    # deepseek-ai/DeepSeek-R1-Distill-Qwen-32B/config.json at revision 711ad2ea and its
    # safetensors count (32,763,876,352), captured in alain-ai-learning-platform
    # (out/research-deepseek-ai-deepseek-r1-distill-qwen-32b/).
    CatalogModel(
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B",
        32_763_876_352,
        {
            "model_type": "qwen2", "hidden_size": 5120, "intermediate_size": 27648,
            "num_hidden_layers": 64, "num_attention_heads": 40, "num_key_value_heads": 8,
            "vocab_size": 152064, "max_position_embeddings": 131072, "rope_theta": 1000000.0,
            "sliding_window": 131072, "use_sliding_window": False,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
    ),
    # --- Mistral -------------------------------------------------------------------------
    # mistralai/Mistral-Nemo-Instruct-2407/config.json as in models saved from it
    # (riple-saanvi-lab/Saanvi-C0-12B, sleepdeprived3/Reformed-Christian-Bible-Expert-v1.1-12B).
    # Copies saved before the repository's update read max_position_embeddings 1024000; the
    # model card states a 128k context. Parameters: computed (model card: 12B; the Hub
    # shows 12.2B for its BF16 weights, e.g. mlx-community/Mistral-Nemo-Instruct-2407-bf16).
    CatalogModel(
        "mistralai/Mistral-Nemo-Instruct-2407",
        12_247_782_400,
        {
            "model_type": "mistral", "hidden_size": 5120, "intermediate_size": 14336,
            "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 131072, "max_position_embeddings": 131072,
            "rope_theta": 1000000.0, "sliding_window": None,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
    ),
    # mistralai/Mistral-Small-24B-Instruct-2501/config.json as in models saved from it
    # (unsloth/Mistral-Small-24B-Instruct-2501-GGUF, ReadyArt/Forgotten-Safeword-24B); the
    # base model (estrogen/Mistral-Small-24b-Sertraline-0304-eval-template, from
    # mistralai/Mistral-Small-24B-Base-2501) has the same shape. Parameters: computed
    # (model card: 24B).
    CatalogModel(
        "mistralai/Mistral-Small-24B-Instruct-2501",
        23_572_403_200,
        {
            "model_type": "mistral", "hidden_size": 5120, "intermediate_size": 32768,
            "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 131072, "max_position_embeddings": 32768,
            "rope_theta": 100000000.0, "sliding_window": None,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        aliases=("mistralai/Mistral-Small-24B-Base-2501",),
    ),
    # mistralai/Mixtral-8x22B-v0.1/config.json as in mistral-community/Mixtral-8x22B-v0.1
    # (revision 42a1ba7e, the snapshot internlm's mixtral8x22b names as its base). The
    # Instruct model has a 32768-token vocabulary and is not this entry. Parameters:
    # computed (Mistral AI: 141B total, 39B active).
    CatalogModel(
        "mistralai/Mixtral-8x22B-v0.1",
        140_620_634_112,
        {
            "model_type": "mixtral", "hidden_size": 6144, "intermediate_size": 16384,
            "num_hidden_layers": 56, "num_attention_heads": 48, "num_key_value_heads": 8,
            "vocab_size": 32000, "max_position_embeddings": 65536, "rope_theta": 1000000,
            "sliding_window": None, "num_local_experts": 8, "num_experts_per_tok": 2,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        aliases=("mistral-community/Mixtral-8x22B-v0.1", "Mixtral-8x22B"),
    ),
    # --- gpt-oss -------------------------------------------------------------------------
    # openai/gpt-oss-20b/config.json at revision 6cee5e81, captured in alain-ai-learning-
    # platform (out/research-openai-gpt-oss-20b/); it states no torch_dtype. The experts are
    # MXFP4 (quantization_config), attention and embeddings BF16. Every other layer attends
    # over a 128-token window. Parameters: computed; the model card (arXiv 2508.10925) gives
    # 20.9B total, 3.6B active (the Hub's count, 21,511,953,984, counts packed FP4 bytes).
    CatalogModel(
        "openai/gpt-oss-20b",
        20_908_050_240,
        {
            "model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
            "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8,
            "head_dim": 64, "vocab_size": 201088, "max_position_embeddings": 131072,
            "num_local_experts": 32, "num_experts_per_tok": 4, "experts_per_token": 4,
            "attention_bias": True, "sliding_window": 128,
            "layer_types": ["sliding_attention", "full_attention"] * 12,
            "rope_theta": 150000, "rope_scaling": _GPT_OSS_YARN,
            "tie_word_embeddings": False, "quantization_config": _GPT_OSS_MXFP4,
        },
    ),
    # openai/gpt-oss-120b/config.json at revision b5c939de (out/research-openai-gpt-oss-120b/
    # of the same capture). Parameters: computed; model card: 116.8B total, 5.1B active.
    CatalogModel(
        "openai/gpt-oss-120b",
        116_789_232_960,
        {
            "model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
            "num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8,
            "head_dim": 64, "vocab_size": 201088, "max_position_embeddings": 131072,
            "num_local_experts": 128, "num_experts_per_tok": 4, "experts_per_token": 4,
            "attention_bias": True, "sliding_window": 128,
            "layer_types": ["sliding_attention", "full_attention"] * 18,
            "rope_theta": 150000, "rope_scaling": _GPT_OSS_YARN,
            "tie_word_embeddings": False, "quantization_config": _GPT_OSS_MXFP4,
        },
    ),
)  # fmt: skip

_VARIANTS: Final = (
    "instruct|chat|hf|base|it|gptq|awq|fp8|int4|int8|4bit|8bit|w4a16|w8a8|gguf|marlin|dynamic"
)
_SUFFIXES: Final = re.compile(rf"(-({_VARIANTS}))+$")
_VARIANT_WORDS: Final = frozenset(_VARIANTS.split("|"))


def _key(name: str) -> str:
    base = name.strip().split("/")[-1].lower().replace("_", "-")
    base = base.replace("meta-llama-", "llama-")
    previous = None
    while previous != base:
        previous = base
        base = _SUFFIXES.sub("", base)
    return base


def _loose(key: str) -> str:
    """A key without variant words anywhere (Instruct-2507, -Base-2407), for suggestions."""
    return "-".join(w for w in key.split("-") if w not in _VARIANT_WORDS)


_INDEX: Final[dict[str, CatalogModel]] = {}
_LOOSE: Final[dict[str, CatalogModel]] = {}
for _model in MODELS:
    for _name in (_model.repo, *_model.aliases):
        _INDEX.setdefault(_key(_name), _model)
        _LOOSE.setdefault(_loose(_key(_name)), _model)


def lookup(name: str) -> CatalogModel | None:
    """The catalog entry for a repository id or model name; None when not in the catalog."""
    return _INDEX.get(_key(name))


def names() -> list[str]:
    return [m.repo for m in MODELS]


def nearest(name: str, n: int = 3) -> list[str]:
    """Up to ``n`` catalog repository ids whose names are closest to ``name``, best first.

    Names are compared as :func:`lookup` normalises them (lower case, no organisation),
    and without variant words wherever they stand (``-Instruct-2507``, ``-Base-2407``,
    ``-GPTQ``), by difflib's similarity: ``Qwen2.5-8B`` suggests
    ``Qwen/Qwen2.5-7B-Instruct`` first. Empty when nothing is close (a ratio below 0.6).
    """
    if n < 1:
        return []
    found: list[str] = []
    for key in difflib.get_close_matches(_loose(_key(name)), list(_LOOSE), n=len(_LOOSE)):
        repo = _LOOSE[key].repo
        if repo not in found:
            found.append(repo)
        if len(found) == n:
            break
    return found
