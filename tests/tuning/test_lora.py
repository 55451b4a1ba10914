"""The LoRA plan: capacity arguments, what the slots cost, and stability under adapter edits."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.specs import BASE
from vllm_operator.models import InferenceService
from vllm_operator.render.deployment import build_deployment
from vllm_operator.tuning.architecture import Architecture
from vllm_operator.tuning.gpus import profile_from_product
from vllm_operator.tuning.lora import (
    DEFAULT_MAX_RANK,
    DeclaredAdapter,
    LoRAAsk,
    plan_lora,
    rank_choice,
    slot_bytes_per_gpu,
)
from vllm_operator.tuning.plan import plan_service
from vllm_operator.tuning.results import Plan, SpecOnly

L4 = [profile_from_product("NVIDIA-L4", 1)]
LLAMA_8B = {"huggingFace": {"repo": "meta-llama/Llama-3.1-8B-Instruct"}}


def _service(adapters: list[dict[str, Any]], **spec: Any) -> InferenceService:
    body = copy.deepcopy(BASE)
    body["spec"] = {"model": {"source": LLAMA_8B}, "adapters": adapters, **spec}
    return InferenceService.model_validate(body)


def _adapter(name: str, rank: int | None = None, claim: str = "adapters") -> dict[str, Any]:
    found: dict[str, Any] = {
        "name": name,
        "source": {"pvc": {"claimName": claim, "path": f"/{name}"}},
    }
    if rank is not None:
        found["rank"] = rank
    return found


def _plan(svc: InferenceService) -> Plan:
    result = plan_service(svc.spec, L4)
    assert isinstance(result, Plan), result
    return result


def _args(plan: Plan) -> dict[str, str]:
    return {a.name: a.value for a in plan.arguments}


def test_no_adapters_no_lora() -> None:
    args = _args(_plan(_service([])))
    assert not {"enable-lora", "max-loras", "max-lora-rank", "max-cpu-loras"} & set(args)


def test_adapters_turn_lora_on_with_runtime_updating() -> None:
    plan = _plan(_service([_adapter("sql")]))
    args = _args(plan)
    assert args["enable-lora"] == "true"
    assert (args["max-loras"], args["max-lora-rank"], args["max-cpu-loras"]) == ("4", "16", "8")
    env = {e.name: e.value for e in plan.environment}
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert any(n.startswith("LoRA: 4 adapter slots of rank 16") for n in plan.notes)


def test_the_slots_come_out_of_the_kv_cache_and_the_cache_out_of_host_memory() -> None:
    without = _plan(_service([]))
    with_lora = _plan(_service([_adapter("sql", rank=64)]))
    arch = without.model.architecture
    slots = 4 * slot_bytes_per_gpu(arch, rank=64, dtype_bytes=2, tensor_parallel=1)
    assert without.memory.kv_cache - with_lora.memory.kv_cache == pytest.approx(slots, abs=1)
    assert with_lora.pod.memory_bytes > without.pod.memory_bytes


def test_one_slot_of_llama_8b_at_rank_16_by_hand() -> None:
    """A (one per slice of a merged module) and B of qkv, o, gate/up and down, 32 layers,
    bf16, as vLLM 0.32's LoRA layers allocate them."""
    arch = Architecture(
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_kv_heads=8,
        head_dim=128,
        vocab_size=128256,
        max_position_embeddings=131072,
        intermediate_size=14336,
    )
    per_layer = (3 * 4096 + 6144) + (4096 + 4096) + (2 * 4096 + 2 * 14336) + (14336 + 4096)
    assert slot_bytes_per_gpu(arch, rank=16, dtype_bytes=2, tensor_parallel=1) == (
        16 * per_layer * 32 * 2
    )
    # TP 2 shards B of the column-parallel modules and A of the row-parallel ones.
    tp2 = (3 * 4096 + 6144 // 2) + (4096 // 2 + 4096) + (2 * 4096 + 14336) + (14336 // 2 + 4096)
    assert slot_bytes_per_gpu(arch, rank=16, dtype_bytes=2, tensor_parallel=2) == (
        16 * tp2 * 32 * 2
    )


def test_a_declared_rank_above_the_default_raises_the_limit_to_a_vllm_choice() -> None:
    plan = plan_lora(LoRAAsk((DeclaredAdapter("a", 8), DeclaredAdapter("b", 40))))
    assert plan.max_rank == 64
    reason = next(s.reason for s in plan.settings if s.name == "max-lora-rank")
    assert "adapter b" in reason and "spec.tuning.overrides" in reason
    assert plan_lora(LoRAAsk((DeclaredAdapter("a", 8),))).max_rank == DEFAULT_MAX_RANK
    assert [rank_choice(r) for r in (1, 2, 16, 17, 300, 512, 999)] == [1, 8, 16, 32, 320, 512, 512]


def test_slots_grow_in_steps_of_four() -> None:
    slots = [plan_lora(LoRAAsk(tuple(DeclaredAdapter(str(i)) for i in range(n)))).max_loras
             for n in (0, 1, 4, 5, 8, 9)]  # fmt: skip
    assert slots == [4, 4, 4, 8, 8, 12]


def test_adding_or_removing_an_adapter_within_the_capacity_changes_no_pod() -> None:
    """The whole point: the pod template (arguments, environment, volumes) stays the same,
    so the Deployment does not roll out; the operator loads the adapter at run time."""

    def template(adapters: list[dict[str, Any]]) -> dict[str, Any]:
        svc = _service(adapters)
        tuning = _plan(svc).effective_tuning()
        found: dict[str, Any] = build_deployment(svc, tuning, image="vllm:x", replicas=1)
        return found["spec"]["template"]

    one = template([_adapter("sql")])
    assert template([_adapter("sql"), _adapter("support")]) == one
    assert template([_adapter("support")]) == one
    # An adapter on a claim the pods do not mount yet needs the claim mounted: a rollout.
    assert template([_adapter("sql"), _adapter("other", claim="more")]) != one


def test_overridden_capacity_is_what_the_memory_counts() -> None:
    base = _plan(_service([_adapter("sql")]))
    pinned = _plan(
        _service([_adapter("sql")], tuning={"overrides": {"max-loras": "1", "max-lora-rank": "8"}})
    )
    args = _args(pinned)
    assert (args["max-loras"], args["max-lora-rank"]) == ("1", "8")
    assert next(a for a in pinned.arguments if a.name == "max-loras").source == "Override"
    assert pinned.memory.kv_cache > base.memory.kv_cache


def test_lora_kept_on_with_no_adapters_through_the_override() -> None:
    args = _args(_plan(_service([], tuning={"overrides": {"enable-lora": "true"}})))
    assert args["enable-lora"] == "true" and args["max-loras"] == "4"


def test_a_service_of_unknown_shape_still_gets_the_lora_arguments() -> None:
    body = copy.deepcopy(BASE)
    body["spec"] = {
        "model": {"source": {"huggingFace": {"repo": "someone/unknown-model"}}},
        "adapters": [_adapter("sql")],
    }
    result = plan_service(InferenceService.model_validate(body).spec, L4)
    assert isinstance(result, SpecOnly)
    tuning = result.effective_tuning()
    assert {a.name for a in tuning.arguments} >= {"enable-lora", "max-loras", "max-lora-rank"}
    assert [e.name for e in tuning.environment] == ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"]


def test_a_pinned_slot_count_raises_the_host_cache_with_it() -> None:
    """vLLM refuses max-cpu-loras below max-loras at start."""
    args = _args(_plan(_service([_adapter("sql")], tuning={"overrides": {"max-loras": "10"}})))
    assert (args["max-loras"], args["max-cpu-loras"]) == ("10", "20")
    pinned = {"max-loras": "10", "max-cpu-loras": "12"}
    args = _args(_plan(_service([_adapter("sql")], tuning={"overrides": pinned})))
    assert (args["max-loras"], args["max-cpu-loras"]) == ("10", "12")
