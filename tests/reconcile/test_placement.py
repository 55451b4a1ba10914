"""One set of node rules (reconcile/placement.py) for the tuner's candidates and the
reconcile's GPU check; once two copies parsed the GPU count differently."""

from __future__ import annotations

from typing import Any

import pytest

from tests.specs import isvc
from vllm_operator.constants import GPU_RESOURCE, NODE_LABEL_GPU_INTERCONNECT
from vllm_operator.constants import NODE_LABEL_GPU_PRODUCT as PRODUCT
from vllm_operator.models.inference_service import EffectiveTuning, PlannedPod
from vllm_operator.reconcile.placement import (
    allocatable_gpus,
    candidate_nodes,
    fits_placement,
)


def _node(name: str, gpus: Any = "2", unschedulable: bool = False, **labels: str) -> Any:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"unschedulable": unschedulable},
        "status": {"allocatable": {GPU_RESOURCE: gpus}},
    }


@pytest.mark.parametrize(("value", "count"), [("8", 8), (4, 4), ("x", 0), ("-1", 0), (None, 0)])
def test_allocatable_gpus_are_read_once_one_way(value: Any, count: int) -> None:
    assert allocatable_gpus(_node("n", value)) == count


def test_candidates_are_schedulable_selected_gpu_nodes() -> None:
    service = isvc(podTemplate={"nodeSelector": {"pool": "a"}})
    nodes = [
        _node("ok", pool="a"),
        _node("cordoned", unschedulable=True, pool="a"),
        _node("no-gpus", "0", pool="a"),
        _node("other-pool", pool="b"),
    ]
    assert [n["metadata"]["name"] for n in candidate_nodes(service, nodes)] == ["ok"]


def test_placement_adds_the_product_and_the_planned_interconnect() -> None:
    service = isvc(gpu={"count": 2, "products": ["NVIDIA-L4"]})
    nvlink = EffectiveTuning(planned_by="Tuner", pod=PlannedPod(interconnect="NVLink"))
    l4_nvlink = _node("a", **{PRODUCT: "NVIDIA-L4", NODE_LABEL_GPU_INTERCONNECT: "nvlink"})
    l4_pcie = _node("b", **{PRODUCT: "NVIDIA-L4", NODE_LABEL_GPU_INTERCONNECT: "pcie"})
    h100 = _node("c", **{PRODUCT: "NVIDIA-H100", NODE_LABEL_GPU_INTERCONNECT: "nvlink"})
    assert [fits_placement(service, n, nvlink) for n in (l4_nvlink, l4_pcie, h100)] == [
        True,
        False,
        False,
    ]
    unplanned = EffectiveTuning(planned_by="SpecOnly")
    assert fits_placement(service, l4_pcie, unplanned)
