"""A small offline catalog of well-known models, so the tuner can plan without a download.

Each entry is an excerpt of the model's published ``config.json`` on the Hugging Face Hub
(the keys the tuner reads, values unchanged) and its published parameter count, and goes
through the same reader as a real file (:func:`vllm_operator.tuning.architecture.from_config`).
Instruct and chat variants share their base model's shape and are found under the base
entry's aliases.

Lookup (:func:`lookup`) accepts a repository id (``meta-llama/Llama-3.1-8B-Instruct``), a
bare name (``Llama-3.1-8B``), and names with a quantization suffix
(``TheBloke/Llama-2-7B-GPTQ``): it compares lower-case names without the organisation and
without suffixes such as ``-Instruct``, ``-chat``, ``-hf``, ``-GPTQ``, ``-AWQ``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any, Final

from vllm_operator.tuning.architecture import Architecture, from_config

__all__ = ["MODELS", "CatalogModel", "lookup", "names"]


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
)  # fmt: skip

_SUFFIXES: Final = re.compile(
    r"(-(instruct|chat|hf|base|it|gptq|awq|fp8|int4|int8|4bit|8bit|w4a16|w8a8|gguf"
    r"|marlin|dynamic))+$"
)


def _key(name: str) -> str:
    base = name.strip().split("/")[-1].lower().replace("_", "-")
    base = base.replace("meta-llama-", "llama-")
    previous = None
    while previous != base:
        previous = base
        base = _SUFFIXES.sub("", base)
    return base


_INDEX: Final[dict[str, CatalogModel]] = {}
for _model in MODELS:
    for _name in (_model.repo, *_model.aliases):
        _INDEX.setdefault(_key(_name), _model)


def lookup(name: str) -> CatalogModel | None:
    """The catalog entry for a repository id or model name; None when not in the catalog."""
    return _INDEX.get(_key(name))


def names() -> list[str]:
    return [m.repo for m in MODELS]
