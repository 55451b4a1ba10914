"""The utilization leaves room for the CUDA graphs vLLM captures outside its budget.

Before 0.20, and for dense models on Model Runner V2 from 0.25.1 (vllm-project/vllm#49224),
vLLM sizes the KV cache to the whole budget and captures the graphs afterwards, from the
memory outside it (docs/memory-model.md). The tuner's own choice keeps its reserve (the
CUDA context, the runtime allowance, 1 % of the card) plus those graphs outside the budget;
a pinned utilization that leaves less gets a note; eager plans and plans whose release
deducts the graphs inside the budget keep the reserve alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from tests.tuning.helpers import arg, as_plan, gpus, model
from vllm_operator.models.inference_service import TuningSpec
from vllm_operator.releases.version import TESTED_VERSION, Version
from vllm_operator.tuning.memory import (
    GIB,
    MAX_UTILIZATION,
    cuda_total_bytes,
    memory_utilization,
    outside_reserve_bytes,
)
from vllm_operator.tuning.plan import plan
from vllm_operator.tuning.results import Plan

DENSE_8B = "Llama-3.1-8B-Instruct"
MOE = "Qwen3-30B-A3B"


@dataclass(frozen=True)
class Case:
    model: str
    product: str
    overrides: dict[str, str] = field(default_factory=dict)
    version: Version = TESTED_VERSION
    check: Callable[[Plan], None] = lambda p: None

    def run(self) -> Plan:
        return as_plan(
            plan(
                model(self.model),
                gpus(self.product),
                tuning=TuningSpec(overrides=self.overrides),
                vllm_version=self.version,
            )
        )


def _outside(p: Plan) -> int:
    """Bytes of the CUDA total the budget leaves outside (what vLLM's own arithmetic sees)."""
    return p.memory.total - p.memory.budget


def _reserve(p: Plan) -> int:
    return outside_reserve_bytes(p.gpu.memory_bytes)


def _util(p: Plan) -> float:
    value = arg(p, "gpu-memory-utilization")
    assert value is not None
    return float(value)


def _holds_reserve_and_graphs(p: Plan) -> None:
    m = p.memory
    assert m.cuda_graphs == 0 and m.cuda_graphs_outside > 0
    assert _outside(p) >= _reserve(p) + m.cuda_graphs_outside
    # The largest two-decimal utilization that does: one step up would not.
    total = cuda_total_bytes(p.gpu.memory_bytes)
    higher = round(m.utilization + 0.01, 2)
    assert higher > MAX_UTILIZATION or (
        total - math.ceil(higher * total) < _reserve(p) + m.cuda_graphs_outside
    )
    old, _ = memory_utilization(p.gpu.memory_bytes)
    assert m.utilization < old
    setting = p.argument("gpu-memory-utilization")
    assert setting is not None and setting.source == "Tuner"
    assert f"~{m.cuda_graphs_outside / GIB:.2f} GiB of CUDA graphs" in setting.reason
    assert f"{old:.2f} without them" in setting.reason
    assert not [n for n in p.notes if "may not fit" in n]


def _keeps_the_reserve_alone(p: Plan) -> None:
    assert p.memory.cuda_graphs_outside == 0
    assert (_util(p), p.memory.utilization) == (memory_utilization(p.gpu.memory_bytes)[0],) * 2
    setting = p.argument("gpu-memory-utilization")
    assert setting is not None and "CUDA graphs" not in setting.reason


def _capped_with_room_to_spare(p: Plan) -> None:
    assert p.memory.utilization == MAX_UTILIZATION
    assert _outside(p) >= _reserve(p) + p.memory.cuda_graphs_outside > _reserve(p)
    setting = p.argument("gpu-memory-utilization")
    assert setting is not None and "the 0.95 cap leaves room for them" in setting.reason


def _warns_the_graphs_may_not_fit(p: Plan) -> None:
    setting = p.argument("gpu-memory-utilization")
    assert setting is not None and setting.source == "Override" and setting.value == "0.92"
    assert _outside(p) < _reserve(p) + p.memory.cuda_graphs_outside
    (note,) = [n for n in p.notes if "may not fit" in n]
    safe, _ = memory_utilization(p.gpu.memory_bytes, graphs_outside=p.memory.cuda_graphs_outside)
    assert f"gpu-memory-utilization of {safe:.2f} or less, or enforce-eager" in note
    assert f"~{p.memory.cuda_graphs_outside / GIB:.2f} GiB of CUDA graphs" in note


def _no_note(p: Plan) -> None:
    assert not [n for n in p.notes if "may not fit" in n]


CASES = [
    pytest.param(
        Case(DENSE_8B, "NVIDIA-L4", check=_holds_reserve_and_graphs),
        id="a dense 8B on an L4 at the tested release leaves the reserve plus its graphs outside",
    ),
    pytest.param(
        Case(DENSE_8B, "NVIDIA-GeForce-RTX-4090", check=_holds_reserve_and_graphs),
        id="a dense 8B on an RTX 4090 at the tested release leaves the reserve plus its graphs",
    ),
    pytest.param(
        Case(DENSE_8B, "NVIDIA-L4", version=Version(0, 19, 0), check=_holds_reserve_and_graphs),
        id="before 0.20 the graphs are outside the budget too and the utilization makes room",
    ),
    pytest.param(
        Case(DENSE_8B, "NVIDIA-L4", {"enforce-eager": "true"}, check=_keeps_the_reserve_alone),
        id="an eager plan captures no graphs and keeps the old utilization",
    ),
    pytest.param(
        Case(DENSE_8B, "NVIDIA-L4", version=Version(0, 20, 0), check=_keeps_the_reserve_alone),
        id="on 0.20 to 0.25.0 a dense model's graphs are in the budget and nothing changes",
    ),
    pytest.param(
        Case(MOE, "NVIDIA-H100-80GB-HBM3", check=_keeps_the_reserve_alone),
        id="a MoE model stays on the legacy runner, whose budget holds the graphs",
    ),
    pytest.param(
        Case(DENSE_8B, "NVIDIA-H100-80GB-HBM3", check=_capped_with_room_to_spare),
        id="on an 80 GB card the 0.95 cap already leaves room for the graphs",
    ),
    pytest.param(
        Case(
            DENSE_8B,
            "NVIDIA-GeForce-RTX-4090",
            {"gpu-memory-utilization": "0.92"},
            check=_warns_the_graphs_may_not_fit,
        ),
        id="a pinned 0.92 on a 24 GB card is kept with a note that the graphs may not fit",
    ),
    pytest.param(
        Case(
            DENSE_8B, "NVIDIA-GeForce-RTX-4090", {"gpu-memory-utilization": "0.85"}, check=_no_note
        ),
        id="a pinned utilization with room for the graphs gets no note",
    ),
    pytest.param(
        Case(
            DENSE_8B,
            "NVIDIA-GeForce-RTX-4090",
            {"gpu-memory-utilization": "0.92", "enforce-eager": "true"},
            check=_no_note,
        ),
        id="a pinned utilization on an eager plan gets no note about graphs",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_graph_reserve(case: Case) -> None:
    case.check(case.run())


def test_the_reserve_plus_graphs_costs_the_kv_cache_what_the_graphs_take() -> None:
    """The budget shrinks by the graphs, within a hundredth of the CUDA total (the
    rounding), and the KV cache pays for it: nothing else in the budget moves."""
    graphs = as_plan(plan(model(DENSE_8B), gpus("NVIDIA-L4")))
    eager = as_plan(
        plan(
            model(DENSE_8B),
            gpus("NVIDIA-L4"),
            tuning=TuningSpec(overrides={"enforce-eager": "true"}),
        )
    )
    g, e = graphs.memory, eager.memory
    assert (g.weights, g.non_torch, g.activations) == (e.weights, e.non_torch, e.activations)
    step = e.budget - g.budget
    hundredth = 0.01 * g.total + 1
    assert g.cuda_graphs_outside - hundredth < step < g.cuda_graphs_outside + hundredth
    assert e.kv_cache - g.kv_cache == step
