"""The memory model against what real vLLM startups logged.

Every point of ``tests/tuning/data/vllm_startup_logs.yaml`` (public startup logs; sources in
``docs/memory-calibration-sources.md``) is either predicted here, with the point's own
settings pinned and its vLLM version, or listed in :data:`EXCLUDED` with the reason the
tuner cannot represent it. The prediction goes through the tuner's own path
(:func:`candidate.gpu_choices` and :func:`candidate.candidate`): weights, activation peak,
non-torch and CUDA-graph memory and the CUDA total of ``tuning/memory.py``, then the KV
tokens vLLM logs as ``GPU KV cache size`` (whole blocks). Each point must be within 10 %,
the median within 3 %. The error table of ``docs/memory-model.md`` is what
:func:`error_table` prints (``python -m tests.tuning.test_memory_calibration``).

Settings a log does not show are vLLM's defaults for that release and card
(``vllm/engine/arg_utils.py``: ``gpu_memory_utilization`` 0.9, ``max_model_len`` the
model's, on >= 70 GiB cards other than A100 8192 batched tokens and 1024 sequences, else
2048 and 256; CUDA graphs on); each point says which it assumed.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_operator.models.inference_service import NodeSpec
from vllm_operator.models.workload import SLO
from vllm_operator.releases.version import Version
from vllm_operator.tuning import catalog, memory
from vllm_operator.tuning.architecture import Architecture, from_config
from vllm_operator.tuning.args import read_overrides
from vllm_operator.tuning.candidate import Candidate, candidate, gpu_choices
from vllm_operator.tuning.gpus import CATALOG, profile_from_product
from vllm_operator.tuning.quantization import WeightFormat, from_name
from vllm_operator.tuning.request import Ask
from vllm_operator.tuning.results import ModelInput

GIB = 1024**3
DATA = Path(__file__).parent / "data" / "vllm_startup_logs.yaml"
POINTS_YAML: list[dict[str, Any]] = yaml.safe_load(DATA.read_text())
BY_ID = {p["id"]: p for p in POINTS_YAML}

# Models the catalog lacks, from their public config.json (the fields the tuner reads).
CONFIGS: dict[str, Mapping[str, Any]] = {
    # google/gemma-2-9b-it config.json
    "google/gemma-2-9b-it": {
        "model_type": "gemma2",
        "hidden_size": 3584,
        "intermediate_size": 14336,
        "num_hidden_layers": 42,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "vocab_size": 256000,
        "max_position_embeddings": 8192,
        "sliding_window": 4096,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    },
    # meta-llama/Llama-4-Scout-17B-16E-Instruct config.json (text_config)
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": {
        "model_type": "llama4",
        "text_config": {
            "model_type": "llama4_text",
            "hidden_size": 5120,
            "intermediate_size": 8192,
            "intermediate_size_mlp": 16384,
            "num_hidden_layers": 48,
            "num_attention_heads": 40,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "vocab_size": 202048,
            "max_position_embeddings": 10485760,
            "num_local_experts": 16,
            "num_experts_per_tok": 1,
            "torch_dtype": "bfloat16",
        },
    },
}
# W8A8 int8 compressed-tensors (weights and activations 8 bits; embeddings, lm_head bf16).
W8A8 = WeightFormat(method="CompressedTensors", bits=8, activation_bits=8, origin="test")


@dataclasses.dataclass(frozen=True)
class Point:
    """How a YAML point is represented: the card, the release, the model, and what was
    assumed where the log is silent."""

    gpu: str
    version: str
    catalog_name: str | None = None  # a catalog name of the same shape, when it differs
    fmt: WeightFormat | None = None
    assumed: str = ""

    def vllm_version(self) -> Version:
        v = Version.parse(self.version)
        assert v is not None
        return v


_H100 = "H100-80GB"
SCOUT = "llmd-v0.19.0-llama-4-scout-17b-16e-instruct-h100-tp4-pp1-8192"
POINTS: dict[str, Point] = {
    "pr21429-qwen3-235b-a22b-fp8-tp4-gmu0.5": Point(
        "H200",
        "0.10.0",
        assumed="GPU: a 141 GB-class card (69.86 GiB requested at 0.5), taken as H200; "
        "release: 0.10.0 development (main, 2025-07-22); vLLM defaults for "
        "max_model_len, max_num_seqs, max_num_batched_tokens",
    ),
    "issue21348-qwen3-235b-a22b-fp8-4xh100-tp4": Point(
        _H100,
        "0.10.0",
        assumed="release: the 0.9.2/0.10.0 era (issue dated 2025-07-22), taken as 0.10.0; "
        "vLLM defaults for utilization (0.9) and the rest",
    ),
    **{
        f"llmd-sweep-v{v}-qwen3-14b-h100-tp1": Point(
            _H100, v, assumed="vLLM defaults for max_num_seqs and max_num_batched_tokens"
        )
        for v in ("0.15.0", "0.16.0", "0.17.0", "0.18.0")
    },
    "page-myoceane-gpt-oss-20b-a100-v0.19.0": Point(
        "A100-80GB",
        "0.19.0",
        assumed="GPU: A100 80 GB (13.72 + 36.56 GiB at utilization 0.65 is more than a "
        "40 GB card); vLLM's A100 defaults (2048 batched tokens, 256 sequences)",
    ),
    **{
        p["id"]: Point(_H100, "0.19.0")
        for p in POINTS_YAML
        if p["id"].startswith("llmd-v0.19.0-")
        and "quantized.w8a8" not in p["id"]
        and "fp8-dynamic" not in p["id"]
        and p["id"] != SCOUT
    },
    "llmd-v0.19.0-llama-3.3-70b-instruct-quantized.w8a8-h100-tp2-pp1-8192": Point(
        _H100,
        "0.19.0",
        catalog_name="meta-llama/Llama-3.1-70B",
        fmt=W8A8,
        assumed="model: the Llama-3.1-70B shape (3.3 shares it), int8 W8A8",
    ),
    "llmd-v0.19.0-llama-3.3-70b-instruct-fp8-dynamic-h100-tp4-pp1-8192": Point(
        _H100, "0.19.0", assumed="model: the Llama-3.1-70B shape (3.3 shares it), FP8"
    ),
    "finetuning-llama-llama-3.1-8b-rtx6000ada-v0.15.1": Point(
        "RTX-6000-Ada",
        "0.15.1",
        assumed="model: the Llama-3.1-8B shape (the fine-tune adds one vocabulary row); vLLM "
        "defaults for utilization (0.9) and max_num_seqs (256 below 70 GiB)",
    ),
}
# Points from a desktop under WSL2 (one RTX 4090, vLLM 0.27.1): predicted and reported by
# error_table, kept out of the error figures, because the machine is not a Kubernetes node's
# and shows two differences from one. Its CUDA total is the card's whole 24564 MiB (23.99
# GiB logged; a native driver reports about 0.45 GiB less, test_cuda_total_below_nvml,
# which is what the tuner takes). And the memory outside the weights and the KV cache grows
# with the weights: the budget less the tuner's weights and the logged KV tokens' bytes
# leaves 1.47, 1.66 and 2.41 GiB beside 5.19, 8.11 and 14.19 GiB of weights (one 7B model
# in three formats), where native 0.27.1 starts on the same card leave 0.45 and 0.44 GiB
# beside 7.63 and 12.49 (the coldstart-recon points' own figures), and the same BF16
# checkpoint on an H100 closes within 0.1 %. The two pull opposite ways, so small models
# come out close and large ones do not (the BF16 7B +22 %).
_WSL2 = "under WSL2, vLLM's API-server defaults below 70 GiB (2048 batched tokens, 256 sequences)"
WSL2: dict[str, Point] = {
    "llmso-qwen2.5-0.5b-rtx4090-v0.27.1-gmu0.85-mml2048": Point(
        "RTX-4090", "0.27.1", assumed=_WSL2
    ),
    "llmso-qwen2.5-0.5b-rtx4090-v0.27.1-gmu0.92-llm-api": Point(
        "RTX-4090",
        "0.27.1",
        assumed="under WSL2, the offline LLM() API: max_model_len the model's (32768), 256 "
        "sequences",
    ),
    **{
        f"llmso-qwen2.5-7b-instruct{tail}-rtx4090-v0.27.1-gmu0.92-mml8192": Point(
            "RTX-4090", "0.27.1", assumed=_WSL2
        )
        for tail in ("", "-gptq-int4", "-fp8-dynamic")
    },
}
# Points that failed to start: the tuner must say they do not fit (checked apart from the
# error distribution: vLLM's KV figure there is a shortfall, not a capacity).
FAILED: dict[str, Point] = {
    "issue23278-gpt-oss-120b-h100": Point(
        _H100,
        "0.10.1",
        assumed="release: 0.10.1 (the first with gpt-oss; issue dated 2025-08-20); vLLM "
        "defaults for utilization and the rest",
    ),
    "issue27508-gpt-oss-120b-h100-gmu0.95-mnbt1024": Point(
        _H100, "0.11.0", assumed="release: the 0.11 line (comment dated 2025-10-31)"
    ),
}
_V0 = "V0 engine (before vLLM 0.10, which the tuner does not plan for: releases/arguments.py)"
_HYBRID = (
    "hybrid linear-attention model (Qwen3.6 / Kimi-Linear: gated delta-net layers with a "
    "constant-size state): the tuner's architecture has no such layers"
)
_LORA = (
    "LoRA enabled (the adapter slots are inside the logged weights) and the record gives "
    "neither max_num_seqs nor max_num_batched_tokens"
)
EXCLUDED: dict[str, str] = {
    SCOUT: "the tuner's architecture reads neither Llama 4's shared expert nor its vision "
    "tower: 46.9 GiB of weights per GPU against vLLM's 53.12, so the KV cache comes out "
    "37 % too large; the memory model itself is checked on it with vLLM's weights "
    "(test_kv_cache_given_the_logged_weights)",
    "issue6746-llama-3.1-405b-fp8-8xh100-tp8": f"{_V0}; and the log shows weights only",
    "issue10517-llama-3.1-8b-rtx3090-mml20000": _V0,
    "issue10517-llama-3.1-8b-rtx3090-mml29000": _V0,
    "issue10517-llama-3.1-8b-rtx3090-mml35000": f"{_V0}; and no KV figure",
    "issue10360-qwen2.5-32b-awq-a6000": _V0,
    "pr10511-llama-3-8b-80gb-tp1": f"{_V0}; and the card is not named",
    "pr10511-llama-3-8b-80gb-tp2": f"{_V0}; and no KV figure",
    "pr12126-llama-3.2-11b-vision-h100-eager": f"{_V0}; and a cross-attention vision model",
    "pr12569-llama-3.1-70b-w8a8-v1-mml2048": "before 0.10 (V1 on main, 2025-01); no KV figure, "
    "no card",
    "issue13061-r1-distill-qwen-14b-2x4090-tp2": _V0,
    "issue15664-nemotron-super-49b-gptq-l40s-v0": f"{_V0}; and no KV figure",
    "pr17122-llama-3.1-8b-l40s-v1": "before 0.10 (main between 0.8.4 and 0.8.5) and the "
    "utilization is not shown",
    "issue28228-kimi-linear-48b-awq-2x3090-tp2": _HYBRID,
    "issue33155-gpt-oss-120b-h100-v0.14.1": "no KV figure (the log shows the weights only)",
    "lmcache-issue3430-qwen3-8b-rtxa5000-v0.21.0": "the RTX A5000 is not in the tuner's GPU "
    "catalog, and the excerpt shows neither the weights, the activation peak nor "
    "max_num_batched_tokens (an offline LLM script: 8192 by default below 70 GiB). Taken as an "
    "RTX 4090 (the same 24564 MiB) at max_num_seqs 256 the tuner predicts 41,136 tokens (-11.3 %) "
    "at 8192 batched tokens and 43,664 (-5.8 %) at 2048; most of the gap is the CUDA-graph "
    "estimate, 0.95 GiB in the tuner against the 0.52 GiB logged (0.43 GiB, about 3,100 tokens)",
    "club3090-issue46-qwen3.6-27b-2x4090-tp2": f"{_HYBRID}; a patched nightly",
    "club3090-issue142-qwen3.6-27b-2x3090-tp2": f"{_HYBRID}; a patched nightly",
    "club3090-issue612-qwen3.6-35b-a3b-nvfp4-rtx5090-v0.24.0": f"{_HYBRID}; NVFP4 (modelopt)",
    "issue50159-qwen2.5-0.5b-rtxpro6000-v0.26.0-mrv2": "the card (RTX PRO 6000 Blackwell, "
    "96 GB) is not in the tuner's GPU catalog, and the thread gives neither the KV GiB nor "
    "the weights; kept for its runner A/B (graph reservation 0.20 GiB under MRv1, 0.10 under "
    "MRv2)",
    "issue50159-gemma-4-31b-awq-2x3090-tp2-v0.26.0-mrv2": "Gemma 4 (KV shared across layers, "
    "sliding and global attention) and an int8 per-token-head KV cache: neither is in the "
    "tuner's architecture; kept for the MRv2 delta (+0.89 GiB of KV against MRv1)",
    "coldstart-recon-qwen3-4b-lora1-rtx4090-v0.27.1-gmu0.80": f"{_LORA}; checked with its "
    "logged weights and activation (test_dense_graphs_outside_the_budget_on_model_runner_v2)",
    "coldstart-recon-qwen3-4b-lora64-rtx4090-v0.27.1-gmu0.80": f"{_LORA}; checked with its "
    "logged weights and activation (test_dense_graphs_outside_the_budget_on_model_runner_v2)",
}


def _model(entry: Mapping[str, Any], point: Point) -> ModelInput:
    name = entry["model"]
    if name in CONFIGS:
        arch: Architecture = from_config(CONFIGS[name], name=name)
    else:
        found = catalog.lookup(point.catalog_name or name)
        assert found is not None, name
        arch = found.architecture()
        if point.fmt is None and from_name(name) is None:
            fmt = catalog_format(found)
            return ModelInput(name, arch, fmt, origin="catalog")
    fmt = point.fmt or from_name(name) or WeightFormat()
    return ModelInput(name, arch, fmt, origin="test")


def catalog_format(entry: catalog.CatalogModel) -> WeightFormat:
    from vllm_operator.tuning.quantization import from_config as fmt_from_config

    return fmt_from_config(entry.config) or WeightFormat()


def _overrides(
    entry: Mapping[str, Any], gpu: str, gpu_bytes: int, arch: Architecture
) -> dict[str, str]:
    big = gpu_bytes >= 70 * GIB and "a100" not in gpu.lower()
    kv = entry.get("kv_cache_dtype")
    dtype = entry.get("dtype")
    values: dict[str, Any] = {
        "tensor-parallel-size": entry["tp"],
        "pipeline-parallel-size": entry["pp"] or 1,
        "gpu-memory-utilization": entry["gpu_memory_utilization"] or 0.9,
        "max-model-len": entry["max_model_len"] or arch.max_position_embeddings,
        "max-num-seqs": entry["max_num_seqs"] or (1024 if big else 256),
        "max-num-batched-tokens": entry["max_num_batched_tokens"] or (8192 if big else 2048),
        "enforce-eager": "true" if entry["enforce_eager"] else "false",
        "kv-cache-dtype": kv if kv and kv != "auto" else "auto",
        "dtype": dtype if dtype and dtype != "auto" else "bfloat16",
    }
    return {k: str(v) for k, v in values.items()}


def predict(point_id: str, point: Point) -> tuple[Candidate, ModelInput]:
    entry = BY_ID[point_id]
    model = _model(entry, point)
    tp, pp = entry["tp"], entry["pp"] or 1
    gpu = profile_from_product(point.gpu, tp * pp)
    overrides = _overrides(entry, point.gpu, gpu.memory_bytes, model.architecture)
    ask = Ask(
        model=model,
        fmt=model.weight_format,
        profile="Balanced",
        pins=read_overrides(overrides),
        overrides=overrides,
        spec_dtype="auto",
        gpu_count=tp * pp,
        prompt=None,
        output=None,
        peak_per_replica=None,
        replicas=1,
        slo=SLO(),
        node=NodeSpec(),
        downloads_weights=False,
        vllm_version=point.vllm_version(),
    )
    c = candidate(ask, gpu_choices(ask, gpu), tp, pp)
    assert c is not None
    return c, model


@dataclasses.dataclass(frozen=True)
class Outcome:
    point_id: str
    logged: float
    predicted: float
    unit: str  # "tokens" or "GiB"

    @property
    def error(self) -> float:
        return (self.predicted - self.logged) / self.logged


def outcome(point_id: str) -> Outcome:
    entry = BY_ID[point_id]
    c, model = predict(point_id, POINTS.get(point_id) or WSL2[point_id])
    if entry["kv_cache_tokens"]:
        tokens = c.kv_token_room(model.architecture)
        return Outcome(point_id, entry["kv_cache_tokens"], tokens, "tokens")
    return Outcome(point_id, entry["kv_cache_gib"], c.memory.kv_cache / GIB, "GiB")


def test_every_point_is_predicted_or_excluded_with_a_reason() -> None:
    ids = set(BY_ID)
    placed = set(POINTS) | set(FAILED) | set(EXCLUDED) | set(WSL2)
    assert ids == placed, (sorted(ids - placed), sorted(placed - ids))
    assert not set(POINTS) & set(EXCLUDED)
    assert all(EXCLUDED.values())


@pytest.mark.parametrize("point_id", sorted(POINTS))
def test_kv_cache_within_ten_percent_of_the_log(point_id: str) -> None:
    result = outcome(point_id)
    assert abs(result.error) <= 0.10, (
        f"{point_id}: predicted {result.predicted:,.2f} {result.unit}, vLLM logged "
        f"{result.logged:,.2f} ({result.error:+.1%})"
    )


def test_median_error_within_three_percent() -> None:
    errors = [abs(outcome(p).error) for p in POINTS]
    assert statistics.median(errors) <= 0.03, f"median {statistics.median(errors):.1%}"


@pytest.mark.parametrize("point_id", sorted(FAILED))
def test_points_that_failed_to_start_do_not_fit(point_id: str) -> None:
    entry = BY_ID[point_id]
    c, model = predict(point_id, FAILED[point_id])
    context = entry["max_model_len"] or model.architecture.max_position_embeddings
    # vLLM refuses to start when the KV cache holds less than one request of the context.
    assert c.memory.kv_cache <= 0 or c.kv_token_room(model.architecture) < context


def _with_logged_weights() -> list[str]:
    return sorted(
        p
        for p in (*POINTS, SCOUT)
        if BY_ID[p]["weights_gib"] is not None and BY_ID[p]["kv_cache_gib"] is not None
    )


@pytest.mark.parametrize("point_id", _with_logged_weights())
def test_kv_cache_given_the_logged_weights(point_id: str) -> None:
    """The budget split alone: the predicted KV GiB with vLLM's own weights figure."""
    entry = BY_ID[point_id]
    c, _ = predict(point_id, POINTS.get(point_id) or Point(_H100, "0.19.0"))
    kv = (c.memory.kv_cache + c.memory.weights) / GIB - entry["weights_gib"]
    assert abs(kv - entry["kv_cache_gib"]) <= 0.05 * entry["kv_cache_gib"], (
        f"{point_id}: {kv:.2f} GiB vs {entry['kv_cache_gib']}"
    )


# --- the CUDA-graph estimate on Model Runner V2 -----------------------------------------------

MRV2_POINTS = sorted(p for p in BY_ID if p.startswith("coldstart-recon-qwen3-4b-"))


@pytest.mark.parametrize("point_id", MRV2_POINTS)
def test_dense_graphs_outside_the_budget_on_model_runner_v2(point_id: str) -> None:
    """From 0.25.1 a dense model runs on Model Runner V2, whose graph estimate is 0: the
    KV cache is the budget less weights, non-torch memory and activations, and the graphs
    are captured outside it. Checked with the point's own logged weights (LoRA slots
    included) and activation peak, so only the split is tested."""
    entry = BY_ID[point_id]
    found = catalog.lookup(entry["model"])
    assert found is not None
    arch = found.architecture()
    version = Version.parse(entry["vllm_version"])
    assert version is not None
    card = next(m for m in CATALOG if m.name == "RTX-4090").memory_bytes
    graphs = memory.cuda_graph_bytes(arch, max_num_seqs=256)
    plan = memory.gpu_memory_plan(
        total_bytes=card,
        utilization=entry["gpu_memory_utilization"],
        weights_per_gpu=int(entry["weights_gib"] * GIB),
        activations=int(entry["activation_peak_gib"] * GIB),
        tensor_parallel=1,
        cuda_graphs=graphs,
        version=version,
        moe=False,
    )
    assert plan.cuda_graphs == 0
    assert plan.cuda_graphs_outside == graphs
    kv = plan.kv_cache / GIB
    assert abs(kv - entry["kv_cache_gib"]) <= 0.03 * entry["kv_cache_gib"], (
        f"{point_id}: {kv:.2f} GiB vs {entry['kv_cache_gib']}"
    )
    tokens = memory.kv_cache_capacity(
        plan.kv_cache,
        arch,
        kv_dtype_bytes=2,
        block_size=memory.GPU_BLOCK_SIZE,
        max_model_len=entry["max_model_len"],
    ).tokens
    assert abs(tokens - entry["kv_cache_tokens"]) <= 0.03 * entry["kv_cache_tokens"]
    # A MoE model on the same release stays on the legacy runner, which deducts it.
    moe_plan = memory.gpu_memory_plan(
        total_bytes=card,
        utilization=entry["gpu_memory_utilization"],
        weights_per_gpu=int(entry["weights_gib"] * GIB),
        activations=int(entry["activation_peak_gib"] * GIB),
        tensor_parallel=1,
        cuda_graphs=graphs,
        version=version,
        moe=True,
    )
    assert moe_plan.cuda_graphs == graphs
    assert moe_plan.kv_cache == plan.kv_cache - graphs


# --- the CUDA total --------------------------------------------------------------------------

# (card, the total vLLM printed in GiB, the point or source). The H200's is torch's
# mem_get_info total on one (139.80 GiB against NVML's 143,771 MiB).
CUDA_TOTALS: list[tuple[str, float, str]] = [
    ("RTX-3090", 23.58, "issue10517-llama-3.1-8b-rtx3090-mml20000"),
    ("RTX-4090", 23.55, "vllm-project/vllm#13061 (0.98 x total = 23.08)"),
    ("RTX-4090", 23.52, "coldstart-recon-qwen3-4b-lora1-rtx4090-v0.27.1-gmu0.80"),
    ("RTX-5090", 31.4, "club-3090 log (docs/memory-calibration-sources.md)"),
    ("RTX-A6000", 47.54, "issue10360-qwen2.5-32b-awq-a6000"),
    ("H100-80GB", 79.19, "llmd-v0.19.0-* (17 logs)"),
    ("H200", 139.80, "torch.cuda.mem_get_info on an H200"),
]


@pytest.mark.parametrize(("card", "logged", "source"), CUDA_TOTALS)
def test_cuda_total_below_nvml(card: str, logged: float, source: str) -> None:
    model = next(m for m in CATALOG if m.name == card)
    predicted = memory.cuda_total_bytes(model.memory_bytes) / GIB
    assert abs(predicted - logged) <= 0.06, f"{card}: {predicted:.2f} vs {logged} ({source})"


def test_wsl2_points_show_the_whole_card_to_cuda() -> None:
    """Why the WSL2 points stay out of the figures, in their own numbers: each that prints
    its CUDA total prints the card's whole memory, not the native driver's smaller total."""
    card = next(m for m in CATALOG if m.name == "RTX-4090").memory_bytes
    totals = [BY_ID[p]["gpu_total_gib"] for p in WSL2 if BY_ID[p]["gpu_total_gib"] is not None]
    assert totals
    for total in totals:
        assert abs(total - card / GIB) <= 0.01
        assert total - memory.cuda_total_bytes(card) / GIB >= 0.4


# --- the error table -------------------------------------------------------------------------


def _group(point_id: str) -> dict[str, str]:
    entry = BY_ID[point_id]
    point = POINTS[point_id]
    gb = next(m for m in CATALOG if m.name == point.gpu).memory_bytes / GIB
    return {
        "gpu": "24 GB" if gb < 30 else "48 GB" if gb < 60 else "80 GB" if gb < 100 else "141 GB",
        "arch": "MoE" if entry["architecture"] == "moe" else "dense",
        "tp": f"TP {entry['tp']}" + (f" PP {entry['pp']}" if (entry["pp"] or 1) > 1 else ""),
        "version": point.version,
    }


def error_table() -> str:
    results = [outcome(p) for p in sorted(POINTS)]
    lines = [f"{'point':<72} {'logged':>12} {'predicted':>12} {'error':>7}"]
    for r in results:
        lines.append(
            f"{r.point_id:<72} {r.logged:>12,.2f} {r.predicted:>12,.2f} {r.error:>+7.1%}"
            + (" GiB" if r.unit == "GiB" else "")
        )
    errors = [abs(r.error) for r in results]
    lines.append(
        f"all ({len(errors)}): median {statistics.median(errors):.1%}, worst {max(errors):.1%}"
    )
    for key in ("gpu", "arch", "tp", "version"):
        groups: dict[str, list[float]] = {}
        for r in results:
            groups.setdefault(_group(r.point_id)[key], []).append(abs(r.error))
        for name, errs in sorted(groups.items()):
            lines.append(
                f"  {key} {name} ({len(errs)}): median {statistics.median(errs):.1%}, "
                f"worst {max(errs):.1%}"
            )
    for p in sorted(WSL2):
        r = outcome(p)
        lines.append(
            f"under WSL2, not in the figures: {p}: {r.logged:,.0f} logged, "
            f"{r.predicted:,.0f} predicted, {r.error:+.1%}"
        )
    for p in sorted(FAILED):
        c, model = predict(p, FAILED[p])
        lines.append(
            f"failed to start: {p}: predicted KV {c.memory.kv_cache / GIB:.2f} GiB, "
            f"{c.kv_token_room(model.architecture):,} tokens (vLLM: "
            f"{BY_ID[p]['kv_cache_gib']} GiB)"
        )
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(error_table())
