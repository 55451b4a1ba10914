"""The offline model catalog: every entry's shape against its published size, lookup of
variants, and the suggestions a catalog miss makes (the tuner's and ``tune``'s message)."""

from __future__ import annotations

import pytest

from vllm_operator.models.inference_service import (
    HuggingFaceSource,
    InferenceServiceSpec,
    ModelSource,
    ModelSpec,
)
from vllm_operator.tune_cli import main
from vllm_operator.tuning import catalog
from vllm_operator.tuning.architecture import from_config
from vllm_operator.tuning.plan import plan_service
from vllm_operator.tuning.request import resolve_model

from .helpers import as_spec_only, gpus, workload

# Every catalog entry with the parameter count its publisher states: the Hub's safetensors
# total where the catalog's comment cites it (to the parameter), else the model card's
# rounded figure. Adding an entry means adding its row.
PUBLISHED: dict[str, int] = {
    "meta-llama/Llama-3.1-8B": 8_030_261_248,
    "meta-llama/Llama-3.1-70B": 70_553_706_496,
    "meta-llama/Llama-3.2-1B": 1_235_814_400,
    "meta-llama/Llama-3.2-3B": 3_212_749_824,
    "meta-llama/Llama-2-7b-hf": 6_738_415_616,
    "meta-llama/Llama-2-13b-hf": 13_015_864_320,
    "mistralai/Mistral-7B-v0.1": 7_241_732_096,
    "mistralai/Mistral-7B-Instruct-v0.3": 7_248_023_552,
    "mistralai/Mixtral-8x7B-v0.1": 46_702_792_704,
    "Qwen/Qwen2.5-0.5B-Instruct": 494_032_768,
    "Qwen/Qwen2.5-7B-Instruct": 7_615_616_512,
    "Qwen/Qwen2.5-72B-Instruct": 72_706_203_648,
    "Qwen/Qwen2-7B-Instruct": 7_615_616_512,  # the same shape as Qwen2.5-7B-Instruct
    "Qwen/Qwen2.5-1.5B-Instruct": 1_543_714_304,
    "Qwen/Qwen2.5-3B-Instruct": 3_085_938_688,
    "Qwen/Qwen2.5-14B-Instruct": 14_700_000_000,  # model card: 14.7B
    "Qwen/Qwen2.5-32B-Instruct": 32_500_000_000,  # model card: 32.5B
    "Qwen/Qwen3-0.6B": 600_000_000,  # model card: 0.6B
    "Qwen/Qwen3-4B": 4_000_000_000,  # model card: 4.0B
    "Qwen/Qwen3-8B": 8_200_000_000,  # model card: 8.2B
    "Qwen/Qwen3-14B": 14_800_000_000,  # model card: 14.8B
    "Qwen/Qwen3-32B": 32_762_123_264,
    "Qwen/Qwen3-30B-A3B": 30_500_000_000,  # model card: 30.5B
    "Qwen/Qwen3-235B-A22B": 235_000_000_000,  # model card: 235B
    "deepseek-ai/DeepSeek-R1-Distill-Llama-8B": 8_030_261_248,
    "deepseek-ai/DeepSeek-R1-Distill-Llama-70B": 70_553_706_496,  # Llama-3.3-70B's shape
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": 1_780_000_000,  # the Hub: 1.78B
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B": 7_620_000_000,  # the Hub: 7.62B
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B": 14_800_000_000,  # the Hub: 14.8B
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B": 32_763_876_352,
    "mistralai/Mistral-Nemo-Instruct-2407": 12_200_000_000,  # the Hub: 12.2B (card: 12B)
    "mistralai/Mistral-Small-24B-Instruct-2501": 24_000_000_000,  # model card: 24B
    "mistralai/Mixtral-8x22B-v0.1": 141_000_000_000,  # Mistral AI: 141B
    "openai/gpt-oss-20b": 20_900_000_000,  # model card (arXiv 2508.10925): 20.9B
    "openai/gpt-oss-120b": 116_800_000_000,  # model card: 116.8B
    "meta-llama/Llama-3.1-405B": 405_853_388_800,
    "deepseek-ai/DeepSeek-V3": 671_000_000_000,  # model card: 671B without the MTP module
}

# Active parameters per token of the mixtures of experts, as their publishers state them.
PUBLISHED_ACTIVE: dict[str, int] = {
    "mistralai/Mixtral-8x7B-v0.1": 12_900_000_000,
    "mistralai/Mixtral-8x22B-v0.1": 39_000_000_000,
    "Qwen/Qwen3-30B-A3B": 3_300_000_000,
    "Qwen/Qwen3-235B-A22B": 22_000_000_000,
    "deepseek-ai/DeepSeek-V3": 37_000_000_000,
}


def _entry(repo: str) -> catalog.CatalogModel:
    entry = catalog.lookup(repo)
    assert entry is not None, repo
    return entry


def test_every_entry_has_a_published_count() -> None:
    assert sorted(PUBLISHED) == sorted(m.repo for m in catalog.MODELS)
    assert len({m.repo for m in catalog.MODELS}) == len(catalog.MODELS)


@pytest.mark.parametrize(("repo", "published"), sorted(PUBLISHED.items()))
def test_the_shape_gives_the_published_parameter_count_within_2_percent(
    repo: str, published: int
) -> None:
    entry = _entry(repo)
    computed = from_config(entry.config, name=repo).estimated_parameter_count
    assert abs(computed - published) <= 0.02 * published, f"{repo}: {computed:,} vs {published:,}"
    assert abs(entry.parameters - published) <= 0.02 * published
    assert entry.architecture().parameter_count == entry.parameters


@pytest.mark.parametrize(("repo", "published"), sorted(PUBLISHED_ACTIVE.items()))
def test_a_mixture_of_experts_reads_its_active_parameters(repo: str, published: int) -> None:
    arch = _entry(repo).architecture()
    assert arch.is_moe
    assert abs(arch.active_parameter_count - published) <= 0.03 * published


@pytest.mark.parametrize("entry", catalog.MODELS, ids=lambda m: m.repo)
def test_every_repository_id_and_alias_finds_its_own_entry(entry: catalog.CatalogModel) -> None:
    """No name an entry answers to is shadowed by an earlier entry with the same key."""
    for name in (entry.repo, *entry.aliases):
        assert catalog.lookup(name) is entry, name


def test_the_seed_models_are_in_the_catalog() -> None:
    for repo in (
        "Qwen/Qwen2-7B-Instruct",
        "Qwen/Qwen2.5-14B-Instruct",
        "meta-llama/Llama-3.3-70B-Instruct",
        "mistralai/Mixtral-8x22B-v0.1",
        "Qwen/Qwen3-8B",
        "Qwen/Qwen3-30B-A3B",
        "openai/gpt-oss-120b",
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B",
        "deepseek-ai/DeepSeek-R1-Distill-Llama-70B",
    ):
        assert catalog.lookup(repo) is not None, repo


def test_a_gptq_variant_has_its_base_shape_and_its_own_weight_format() -> None:
    base = _entry("Qwen/Qwen2-7B-Instruct")
    assert catalog.lookup("Qwen/Qwen2-7B-Instruct-GPTQ-Int4") is base
    assert "quantization_config" not in base.config
    spec = ModelSpec(
        source=ModelSource(hugging_face=HuggingFaceSource(repo="Qwen/Qwen2-7B-Instruct-GPTQ-Int4"))
    )
    resolved = resolve_model(spec)
    assert resolved is not None
    assert resolved.architecture == base.architecture()
    assert resolved.origin == "catalog (Qwen/Qwen2-7B-Instruct)"
    assert (resolved.weight_format.method, resolved.weight_format.bits) == ("GPTQ", 4)
    assert resolved.weight_format.origin == "model name"


def test_gpt_oss_keeps_its_published_quantization_and_sliding_layers() -> None:
    for repo, layers in (("openai/gpt-oss-20b", 24), ("openai/gpt-oss-120b", 36)):
        entry = _entry(repo)
        assert entry.config["quantization_config"]["quant_method"] == "mxfp4"
        arch = entry.architecture()
        assert (arch.num_layers, arch.sliding_window, arch.sliding_window_layers) == (
            layers,
            128,
            layers // 2,
        )
        assert (arch.num_experts_per_token, arch.head_dim, arch.attention_bias) == (4, 64, True)


def test_qwen3_moe_reads_its_expert_width_not_the_dense_one() -> None:
    arch = _entry("Qwen/Qwen3-30B-A3B").architecture()
    assert (arch.num_experts, arch.num_experts_per_token, arch.moe_intermediate_size) == (
        128,
        8,
        768,
    )
    assert arch.dense_layers == 0


# --- nearest -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "first"),
    [
        pytest.param("Qwen2.5-8B", "Qwen/Qwen2.5-7B-Instruct", id="a size the catalog lacks"),
        pytest.param(
            "someone/Qwen2.5-8B-Instruct-AWQ", "Qwen/Qwen2.5-7B-Instruct", id="with suffixes"
        ),
        pytest.param(
            "mistralai/Mixtral-8x22B-Instruct-v0.1",
            "mistralai/Mixtral-8x22B-v0.1",
            id="a variant word inside the name",
        ),
        pytest.param(
            "Qwen/Qwen3-30B-A3B-Instruct-2507", "Qwen/Qwen3-30B-A3B", id="a later release"
        ),
        pytest.param(
            "deepseek-ai/DeepSeek-R1-Distill-Qwen-8B",
            "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
            id="a distill",
        ),
    ],
)
def test_nearest_suggests_the_closest_entry_first(name: str, first: str) -> None:
    near = catalog.nearest(name)
    assert near[0] == first
    assert 1 <= len(near) <= 3
    assert len(set(near)) == len(near)
    assert all(catalog.lookup(repo) is not None for repo in near)


def test_nearest_takes_a_count_and_suggests_nothing_far() -> None:
    assert len(catalog.nearest("Qwen2.5-8B", n=1)) == 1
    assert len(catalog.nearest("Qwen2.5-8B", n=5)) == 5
    assert catalog.nearest("Qwen2.5-8B", n=0) == []
    assert catalog.nearest("acme/very-private-13b") == []


# --- the catalog miss, as the tuner and `tune` word it ------------------------------------


def _unknown(repo: str) -> InferenceServiceSpec:
    return InferenceServiceSpec(
        model=ModelSpec(source=ModelSource(hugging_face=HuggingFaceSource(repo=repo))),
        workload=workload(prompt=(10, 2000), output=(10, 500), peak=8),
    )


def test_the_tuners_miss_says_how_to_give_the_shape_and_what_is_near() -> None:
    result = as_spec_only(plan_service(_unknown("Qwen/Qwen2.5-8B-Instruct"), [gpus("L4")]))
    message = result.message
    assert "architecture is unknown" in message
    assert "Qwen/Qwen2.5-8B-Instruct is not in the tuner's catalog" in message
    assert "spec.model.architecture" in message
    assert "tune FOLDER" in message and "config.json" in message
    assert "nearest catalog names: Qwen/Qwen2.5-7B-Instruct, " in message
    # Suggestions, not the whole catalog.
    assert "meta-llama/Llama-2-13b-hf" not in message
    assert message.count("/") <= 1 + 3


def test_the_tuners_miss_without_a_near_name_suggests_nothing() -> None:
    message = as_spec_only(plan_service(_unknown("acme/secret-model"), [gpus("L4")])).message
    assert "acme/secret-model is not in the tuner's catalog" in message
    assert "nearest" not in message


def test_tunes_miss_says_how_to_give_the_shape_and_what_is_near(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["Qwen2.5-8B", "--gpu", "L4"])
    out = capsys.readouterr().out
    assert code == 1
    assert "NOT PLANNED (ArchitectureUnknown)" in out
    text = " ".join(out.split())  # the table may wrap the message
    assert "Qwen2.5-8B is neither a folder with config.json nor in the tuner's catalog" in text
    assert "the model's folder or its config.json" in text
    assert "--service with spec.model.architecture" in text
    assert "nearest catalog names: Qwen/Qwen2.5-7B-Instruct," in text
    assert "meta-llama/Llama-2-13b-hf" not in text
