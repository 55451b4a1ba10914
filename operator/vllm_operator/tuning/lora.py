"""LoRA adapters on the served model: vLLM's capacity arguments and what they cost.

vLLM serves adapters only when started with ``--enable-lora``; its capacity is fixed at
start: ``--max-loras`` adapters in one batch (each a GPU slot), ranks up to
``--max-lora-rank``, ``--max-cpu-loras`` adapters cached in host memory. The operator loads
and unloads the adapters themselves at run time (``/v1/load_lora_adapter``), so the
capacity is planned to change as seldom as possible: a change restarts the pods, an adapter
added within it does not.

What a slot costs. At start vLLM allocates, for each of ``max-loras`` slots and each
layer, the A and B matrices of every module it can adapt (query/key/value, output, the
MLP's gate/up and down; the experts' too for a mixture of experts) at ``max-lora-rank``,
in the model's dtype, and profiles with them in place: the slots come out of the KV cache.
A merged module keeps one A per slice (three for qkv, two for gate/up). Under tensor
parallelism a column-parallel module (qkv, gate/up) shards B and keeps A whole, a
row-parallel one (output, down) shards A and keeps B whole (vllm/lora/layers in 0.32:
ColumnParallelLinearWithLoRA, MergedColumnParallelLinearWithLoRA,
RowParallelLinearWithLoRA). The embedding and output head are left out: whether vLLM wraps
them depends on the model and the release. Host memory
holds ``max-cpu-loras`` adapters at most that rank.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Final

from vllm_operator.tuning.architecture import Architecture
from vllm_operator.tuning.args import Setting

# vLLM's own default rank limit, and the ranks its --max-lora-rank accepts (the choices of
# every release 0.10-0.33; releases/vllm_flags.json checks the value again per release).
DEFAULT_MAX_RANK: Final = 16
RANK_CHOICES: Final = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# GPU slots in steps of this many, so adding or removing one adapter seldom changes them.
SLOT_STEP: Final = 4
# Adapters kept in host memory per GPU slot.
CPU_PER_SLOT: Final = 2
RUNTIME_UPDATING_ENV: Final = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


@dataclasses.dataclass(frozen=True)
class DeclaredAdapter:
    """What the planner needs of one adapter of spec.adapters."""

    name: str
    rank: int | None = None


@dataclasses.dataclass(frozen=True)
class LoRAAsk:
    """LoRA on, with the adapters declared (possibly none: enable-lora overridden on)."""

    adapters: tuple[DeclaredAdapter, ...] = ()


@dataclasses.dataclass(frozen=True)
class LoRAPlan:
    max_loras: int
    max_rank: int
    max_cpu_loras: int
    settings: tuple[Setting, ...]


def rank_choice(rank: int) -> int:
    """The smallest rank vLLM accepts that holds ``rank``."""
    for choice in RANK_CHOICES:
        if choice >= rank:
            return choice
    return RANK_CHOICES[-1]


def _pinned(overrides: Mapping[str, str], flag: str) -> int | None:
    value = overrides.get(flag, "")
    return int(value) if value.isdigit() else None


def plan_lora(ask: LoRAAsk, overrides: Mapping[str, str] | None = None) -> LoRAPlan:
    """The capacity arguments, each with its reason; ``overrides`` (spec.tuning.overrides)
    still win afterwards, and the plan's figures are theirs where they pin one. The host
    cache is never planned below a pinned slot count: vLLM refuses max-cpu-loras below
    max-loras."""
    overrides = overrides or {}
    count = len(ask.adapters)
    slots = max(SLOT_STEP, math.ceil(count / SLOT_STEP) * SLOT_STEP)
    slots_in_force = _pinned(overrides, "max-loras") or slots
    declared = [a.rank for a in ask.adapters if a.rank is not None]
    largest = max(declared, default=0)
    if largest > DEFAULT_MAX_RANK:
        rank = rank_choice(largest)
        holder = next(a.name for a in ask.adapters if a.rank == largest)
        rank_reason = (
            f"the largest declared rank, {largest} (adapter {holder}), as vLLM's choices "
            "allow; pin it in spec.tuning.overrides so that changing adapters never changes "
            "it (a change restarts the pods)"
        )
    else:
        rank = DEFAULT_MAX_RANK
        rank_reason = (
            f"vLLM's default, {DEFAULT_MAX_RANK}, holds every declared rank; an adapter of a "
            "higher rank is refused at load unless this is raised in spec.tuning.overrides"
        )
    cpu = slots_in_force * CPU_PER_SLOT
    settings = (
        Setting(
            "enable-lora",
            "true",
            "Spec",
            f"spec.adapters declares {count} adapter(s); the operator loads them at run time "
            "through vLLM's adapter API, so adding or removing one restarts no pod",
        ),
        Setting(
            "max-loras",
            str(slots),
            "Tuner",
            f"GPU slots for {slots} different adapters in one batch ({count} declared, in "
            f"steps of {SLOT_STEP} so that adding or removing one seldom changes it); their "
            "memory comes out of the KV cache",
        ),
        Setting("max-lora-rank", str(rank), "Tuner", rank_reason),
        Setting(
            "max-cpu-loras",
            str(cpu),
            "Tuner",
            f"{CPU_PER_SLOT} adapters in host memory per GPU slot: switching between more "
            "adapters than slots reloads from host memory, not from disk",
        ),
    )
    return LoRAPlan(
        max_loras=slots_in_force,
        max_rank=_pinned(overrides, "max-lora-rank") or rank,
        max_cpu_loras=_pinned(overrides, "max-cpu-loras") or cpu,
        settings=settings,
    )


def runtime_updating_env() -> Setting:
    return Setting(
        RUNTIME_UPDATING_ENV,
        "True",
        "Tuner",
        "lets the operator load, replace and unload adapters on a running server "
        "(/v1/load_lora_adapter, /v1/unload_lora_adapter) instead of restarting it",
    )


def _module_shapes(arch: Architecture) -> Sequence[tuple[int, tuple[int, ...], str]]:
    """(input, the output of each slice, parallel style) of every adaptable module of one
    layer; the experts' modules once per expert. A merged module (qkv: three slices,
    gate/up: two) keeps an A matrix per slice (vLLM's MergedColumnParallelLinearWithLoRA)."""
    q = arch.num_attention_heads * arch.head_dim
    kv = arch.num_kv_heads * arch.head_dim
    h = arch.hidden_size
    shapes: list[tuple[int, tuple[int, ...], str]] = [(h, (q, kv, kv), "column"), (q, (h,), "row")]

    def mlp(inter: int) -> list[tuple[int, tuple[int, ...], str]]:
        up = (inter, inter) if arch.gated_mlp else (inter,)
        return [(h, up, "column"), (inter, (h,), "row")]

    if arch.is_moe:
        inter = arch.moe_intermediate_size or arch.intermediate_size or 4 * h
        shapes += mlp(inter) * (arch.num_experts or 1)
        if arch.shared_expert_intermediate_size:
            shapes += mlp(arch.shared_expert_intermediate_size)
    else:
        shapes += mlp(arch.intermediate_size or 4 * h)
    return shapes


def slot_bytes_per_gpu(
    arch: Architecture, *, rank: int, dtype_bytes: int, tensor_parallel: int
) -> int:
    """One adapter slot's A and B matrices on one GPU, every layer."""
    tp = max(1, tensor_parallel)
    per_layer = 0
    for fan_in, outputs, style in _module_shapes(arch):
        if style == "column":
            per_layer += (
                rank * fan_in * len(outputs) + sum(math.ceil(o / tp) for o in outputs) * rank
            )
        else:
            per_layer += rank * math.ceil(fan_in / tp) + sum(outputs) * rank
    return per_layer * arch.num_layers * dtype_bytes


def gpu_bytes_per_gpu(
    arch: Architecture, plan: LoRAPlan, *, dtype_bytes: int, tensor_parallel: int
) -> int:
    """The slots vLLM allocates at start on each GPU."""
    return plan.max_loras * slot_bytes_per_gpu(
        arch, rank=plan.max_rank, dtype_bytes=dtype_bytes, tensor_parallel=tensor_parallel
    )


def host_bytes(arch: Architecture, plan: LoRAPlan, *, dtype_bytes: int) -> int:
    """The host-memory cache of ``max-cpu-loras`` whole adapters."""
    return plan.max_cpu_loras * slot_bytes_per_gpu(
        arch, rank=plan.max_rank, dtype_bytes=dtype_bytes, tensor_parallel=1
    )
