"""The shape of a model, as the tuner needs it: what costs memory and what bounds parallelism.

Everything the planner derives (weights bytes, KV-cache bytes per token, which tensor
parallel sizes are legal, the longest context) follows from a handful of numbers: layers,
hidden size, attention heads and key/value heads (grouped-query attention), head size,
vocabulary, the MLP width, experts for a mixture of experts, and whether some layers only
attend over a sliding window. They come from one of three places, in this order:

1. the InferenceService's explicit ``spec.model.architecture`` (:func:`from_spec`);
2. the model's Hugging Face ``config.json`` (:func:`from_config`), read by whoever can
   reach it (the CLI from a folder, the reconcile through its adapters);
3. the offline catalog of well-known models (:mod:`vllm_operator.tuning.catalog`), whose
   entries are excerpts of the published ``config.json`` files and go through the same
   reader.

``config.json`` files differ between families in key names (``n_layer`` or
``num_hidden_layers``), in where the text model sits (``text_config`` in multimodal
models), and in how experts, latent attention (DeepSeek's MLA) and sliding windows are
spelled; :func:`from_config` reads the spellings vLLM itself reads for the families the
operator targets, and raises :class:`ArchitectureError` naming what is missing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from vllm_operator.models.inference_service import ModelArchitecture

__all__ = [
    "Architecture",
    "ArchitectureError",
    "from_config",
    "from_spec",
]


class ArchitectureError(ValueError):
    """A config.json (or a catalog entry) lacks what the tuner needs; the message says what."""


# Families whose MLP has two matrices (up, down) rather than the gated three (gate, up,
# down) of Llama-style SwiGLU. Only used to estimate the parameter count when neither the
# spec nor the catalog gives it.
_UNGATED_MLP: Final = frozenset(
    {"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi", "starcoder2", "gpt_bigcode"}
)

# Keys vLLM reads (in vllm/config/model.py, _get_and_verify_max_len) for the longest
# context a model was trained for; it takes the smallest one present.
_MAX_LEN_KEYS: Final = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)

# RoPE scaling types whose ``factor`` vLLM multiplies into the maximum length; the others
# (llama3, yarn, longrope, su, ...) already state the scaled length in the config.
_ROPE_TYPES_SCALING_MAX_LEN: Final = frozenset({"linear", "dynamic"})


@dataclasses.dataclass(frozen=True)
class Architecture:
    """A decoder-only transformer's shape. All counts are for the whole model (no TP)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    intermediate_size: int | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    gated_mlp: bool = True
    # Layers that attend over a window of this many tokens only (Mistral v0.1: all 32 of
    # 4096; Gemma 2: every other layer). vLLM frees their blocks outside the window.
    sliding_window: int | None = None
    sliding_window_layers: int = 0
    # Mixture of experts.
    num_experts: int | None = None
    num_experts_per_token: int | None = None
    moe_intermediate_size: int | None = None
    shared_expert_intermediate_size: int | None = None
    dense_layers: int = 0  # leading layers with a dense MLP (DeepSeek first_k_dense_replace)
    # Multi-head latent attention (DeepSeek V2/V3): the KV cache holds one latent vector
    # of kv_lora_rank + qk_rope_head_dim values per token and layer, shared by all heads.
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    q_lora_rank: int | None = None
    # Given rather than estimated (spec or catalog).
    parameter_count_given: int | None = None
    torch_dtype: str | None = None
    model_type: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        for field in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads"):
            if getattr(self, field) < 1:
                raise ArchitectureError(f"{field} must be at least 1")
        if self.head_dim < 1 or self.vocab_size < 1 or self.max_position_embeddings < 1:
            raise ArchitectureError("head_dim, vocab_size and max positions must be positive")
        if self.kv_lora_rank is None and self.num_attention_heads % self.num_kv_heads:
            raise ArchitectureError(
                f"{self.num_attention_heads} attention heads are not a multiple of "
                f"{self.num_kv_heads} key/value heads"
            )

    # --- derived -----------------------------------------------------------------------

    @property
    def is_moe(self) -> bool:
        return bool(self.num_experts and self.num_experts > 1)

    @property
    def uses_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def embedding_parameters(self) -> int:
        """Token embedding plus the output head when it is a separate matrix."""
        table = self.vocab_size * self.hidden_size
        return table if self.tie_word_embeddings else 2 * table

    @property
    def parameter_count(self) -> int:
        """Total parameters: as given, else estimated from the shape."""
        if self.parameter_count_given is not None:
            return self.parameter_count_given
        return self.estimated_parameter_count

    @property
    def estimated_parameter_count(self) -> int:
        h = self.hidden_size
        norms = 2 * h * self.num_layers + h
        return (
            self.embedding_parameters
            + self.num_layers * self._attention_parameters()
            + self._mlp_parameters_all_layers(active_only=False)
            + norms
        )

    @property
    def expert_parameters(self) -> int:
        """Parameters in routed experts (zero for a dense model)."""
        if not self.is_moe:
            return 0
        return self._routed_expert_parameters(active_only=False)

    @property
    def active_parameter_count(self) -> int:
        """Parameters one token's forward pass reads: all but the unrouted experts."""
        if not self.is_moe:
            return self.parameter_count
        inactive = self._routed_expert_parameters(active_only=False) - (
            self._routed_expert_parameters(active_only=True)
        )
        return max(1, self.parameter_count - inactive)

    def _attention_parameters(self) -> int:
        h, heads = self.hidden_size, self.num_attention_heads
        if self.uses_mla:
            # DeepSeek-V2/V3: queries through an optional low-rank projection, keys and
            # values through the shared latent, per-head up-projections, then the output.
            rope = self.qk_rope_head_dim or 64
            latent = self.kv_lora_rank or 512
            q_head = self.head_dim + rope
            q = (
                h * self.q_lora_rank + self.q_lora_rank * heads * q_head
                if self.q_lora_rank
                else h * heads * q_head
            )
            return (
                q
                + h * (latent + rope)
                + latent * heads * 2 * self.head_dim
                + (heads * self.head_dim * h)
            )
        q = h * heads * self.head_dim
        kv = 2 * h * self.num_kv_heads * self.head_dim
        o = heads * self.head_dim * h
        bias = (heads + 2 * self.num_kv_heads) * self.head_dim if self.attention_bias else 0
        return q + kv + o + bias

    def _dense_mlp_parameters(self) -> int:
        inter = self.intermediate_size or 4 * self.hidden_size
        matrices = 3 if self.gated_mlp else 2
        return matrices * self.hidden_size * inter

    def _routed_expert_parameters(self, *, active_only: bool) -> int:
        experts = self.num_experts or 0
        if active_only:
            experts = min(experts, self.num_experts_per_token or 1)
        inter = self.moe_intermediate_size or self.intermediate_size or 4 * self.hidden_size
        per_layer = experts * 3 * self.hidden_size * inter
        return per_layer * (self.num_layers - self.dense_layers)

    def _mlp_parameters_all_layers(self, *, active_only: bool) -> int:
        if not self.is_moe:
            return self.num_layers * self._dense_mlp_parameters()
        moe_layers = self.num_layers - self.dense_layers
        shared = 3 * self.hidden_size * (self.shared_expert_intermediate_size or 0)
        router = self.hidden_size * (self.num_experts or 0)
        return (
            self.dense_layers * self._dense_mlp_parameters()
            + self._routed_expert_parameters(active_only=active_only)
            + moe_layers * (shared + router)
        )

    def describe(self) -> str:
        """One line for reasons and the CLI: '32 layers, 32/8 heads x 128, 8.0B params'."""
        kind = f"MoE {self.num_experts}x top-{self.num_experts_per_token}, " if self.is_moe else ""
        attn = (
            f"MLA latent {self.kv_lora_rank}"
            if self.uses_mla
            else f"{self.num_attention_heads}/{self.num_kv_heads} heads x {self.head_dim}"
        )
        return (
            f"{kind}{self.num_layers} layers, {attn}, "
            f"{self.parameter_count / 1e9:.2f}B params, "
            f"max {self.max_position_embeddings:,} tokens"
        )


# --- readers -------------------------------------------------------------------------------


def from_spec(spec: ModelArchitecture, *, name: str | None = None) -> Architecture:
    """The architecture an InferenceService states explicitly (``spec.model.architecture``)."""
    head_dim = spec.head_dim or spec.hidden_size // spec.num_attention_heads
    if head_dim < 1:
        raise ArchitectureError("hiddenSize is smaller than numAttentionHeads; set headDim")
    return Architecture(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_attention_heads,
        num_kv_heads=spec.num_key_value_heads or spec.num_attention_heads,
        head_dim=head_dim,
        vocab_size=spec.vocab_size,
        max_position_embeddings=spec.max_position_embeddings,
        intermediate_size=spec.intermediate_size,
        num_experts=spec.num_experts,
        num_experts_per_token=spec.num_experts_per_token,
        parameter_count_given=spec.parameter_count,
        name=name,
    )


def _first(config: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        value = config.get(key)
        if value is not None:
            return value
    return None


def _int(config: Mapping[str, Any], *keys: str, required: bool = True) -> int | None:
    value = _first(config, *keys)
    if value is None:
        if required:
            raise ArchitectureError(f"config.json has none of {', '.join(keys)}")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ArchitectureError(f"config.json {keys[0]} is not an integer: {value!r}")
    return int(value)


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal configs keep the language model under text_config (or llm_config)."""
    for key in ("text_config", "llm_config", "language_config"):
        inner = config.get(key)
        if isinstance(inner, Mapping) and _first(
            inner, "num_hidden_layers", "n_layer", "num_layers"
        ):
            merged = dict(inner)
            for inherited in ("torch_dtype", "dtype", "quantization_config"):
                if inherited not in merged and inherited in config:
                    merged[inherited] = config[inherited]
            return merged
    return config


def _max_len(config: Mapping[str, Any]) -> int:
    present = [int(config[k]) for k in _MAX_LEN_KEYS if isinstance(config.get(k), int | float)]
    if not present:
        # vLLM assumes 2048 too, with a warning.
        return 2048
    length = min(present)
    rope = config.get("rope_scaling") or config.get("rope_parameters")
    if isinstance(rope, Mapping):
        rope_type = rope.get("rope_type") or rope.get("type")
        factor = rope.get("factor")
        if rope_type in _ROPE_TYPES_SCALING_MAX_LEN and isinstance(factor, int | float):
            length = int(length * factor)
    return length


def _sliding(config: Mapping[str, Any], layers: int) -> tuple[int | None, int]:
    window = _int(config, "sliding_window", "attention_window_size", required=False)
    if window is None or config.get("use_sliding_window") is False:
        return None, 0
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        count = sum(1 for t in layer_types if t == "sliding_attention")
        return (window, count) if count else (None, 0)
    pattern = _int(config, "sliding_window_pattern", required=False)
    if pattern:  # Gemma 3: every pattern-th layer is global, the others slide
        return window, layers - layers // pattern
    if config.get("model_type") == "gemma2":
        return window, layers // 2
    return window, layers


def _torch_dtype(config: Mapping[str, Any]) -> str | None:
    value = _first(config, "torch_dtype", "dtype")
    return value if isinstance(value, str) else None


# The keys a config.json must have, each with the other names models use for it.
_REQUIRED: tuple[tuple[str, ...], ...] = (
    ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    ("hidden_size", "n_embd", "d_model", "model_dim"),
    ("num_attention_heads", "n_head", "n_heads", "num_heads"),
    ("vocab_size", "padded_vocab_size"),
)


def missing_keys(config: Mapping[str, Any]) -> list[str]:
    """The required keys (by their usual names) that ``config`` has under no name."""
    cfg = _text_config(config)
    return [keys[0] for keys in _REQUIRED if _first(cfg, *keys) is None]


def from_config(config: Mapping[str, Any], *, name: str | None = None) -> Architecture:
    """Read a Hugging Face ``config.json`` (already parsed) into an :class:`Architecture`."""
    cfg = _text_config(config)
    model_type = cfg.get("model_type") if isinstance(cfg.get("model_type"), str) else None
    layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    hidden = _int(cfg, "hidden_size", "n_embd", "d_model", "model_dim")
    heads = _int(cfg, "num_attention_heads", "n_head", "n_heads", "num_heads")
    assert layers is not None and hidden is not None and heads is not None
    kv_heads = _int(
        cfg, "num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num",
        required=False,
    )  # fmt: skip
    if kv_heads is None:
        kv_heads = 1 if cfg.get("multi_query") is True else heads
    kv_lora = _int(cfg, "kv_lora_rank", required=False)
    head_dim = _int(cfg, "head_dim", required=False)
    if kv_lora is not None:
        head_dim = _int(cfg, "qk_nope_head_dim", required=False) or head_dim or 128
        kv_heads = heads
    if head_dim is None:
        head_dim = hidden // heads
    vocab = _int(cfg, "vocab_size", "padded_vocab_size")
    assert vocab is not None
    experts = _int(
        cfg, "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts",
        required=False,
    )  # fmt: skip
    window, window_layers = _sliding(cfg, layers)
    dense_layers = _int(cfg, "first_k_dense_replace", required=False) or 0
    shared_inter = _int(cfg, "shared_expert_intermediate_size", required=False)
    n_shared = _int(cfg, "n_shared_experts", required=False)
    moe_inter = _int(cfg, "moe_intermediate_size", required=False)
    if shared_inter is None and n_shared and moe_inter:
        shared_inter = n_shared * moe_inter
    top_k = _int(
        cfg, "num_experts_per_tok", "num_experts_per_token", "moe_top_k", "top_k", required=False
    )
    tie = cfg.get("tie_word_embeddings")
    if tie is None:
        # transformers' PretrainedConfig default is True; Llama-family configs say so.
        tie = model_type not in {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe"}
    return Architecture(
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        max_position_embeddings=_max_len(cfg),
        intermediate_size=_int(
            cfg, "intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size", required=False
        ),
        tie_word_embeddings=bool(tie),
        attention_bias=bool(cfg.get("attention_bias") or model_type in {"qwen2", "qwen2_moe"}),
        gated_mlp=model_type not in _UNGATED_MLP,
        sliding_window=window,
        sliding_window_layers=window_layers,
        num_experts=experts if experts and experts > 1 else None,
        num_experts_per_token=top_k if experts and experts > 1 else None,
        moe_intermediate_size=moe_inter,
        shared_expert_intermediate_size=shared_inter,
        dense_layers=dense_layers if experts and experts > 1 else 0,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=_int(cfg, "qk_rope_head_dim", required=False),
        q_lora_rank=_int(cfg, "q_lora_rank", required=False),
        torch_dtype=_torch_dtype(cfg),
        model_type=model_type,
        name=name,
    )
