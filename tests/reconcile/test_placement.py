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


def test_a_gpu_node_status_is_parsed_once_per_resource_version() -> None:
    """Each pass of each service profiles every node; a GPUNode's status is parsed again
    only when its resourceVersion moved, so a change is never missed."""
    import copy
    import json
    from pathlib import Path

    from vllm_operator.reconcile.placement import gpu_profiles

    fixture = Path(__file__).parents[1] / "agent/fixtures/h200/x2/gpunode.json"
    gpu_node = json.loads(fixture.read_text())
    name = gpu_node["metadata"]["name"]
    gpu_node["metadata"]["resourceVersion"] = "41"
    node = {"metadata": {"name": name, "labels": {}}}
    first = gpu_profiles([node], [gpu_node])
    assert [p.source for p in first] == ["GPUNode"]
    assert gpu_profiles([node], [copy.deepcopy(gpu_node)]) == first
    changed = copy.deepcopy(gpu_node)
    changed["status"]["gpus"] = changed["status"]["gpus"][:1]
    changed["metadata"]["resourceVersion"] = "42"
    assert gpu_profiles([node], [changed])[0].count == 1 != first[0].count
    # A GPUNode of a node that is not a candidate is not read at all.
    assert gpu_profiles([], [changed]) == []


def test_a_nodes_profile_is_built_again_when_the_node_or_its_gpu_node_moves() -> None:
    """Profiles are kept by the node's and its GPUNode's resourceVersions: a new version of
    either is a new profile; the same versions are the same objects, so the same profile."""
    from vllm_operator.reconcile.placement import gpu_profiles

    def node(version: str | None, product: str) -> Any:
        meta: dict[str, Any] = {"name": "n-profile", "labels": {PRODUCT: product}}
        if version is not None:
            meta["resourceVersion"] = version
        return {"metadata": meta, "status": {"allocatable": {GPU_RESOURCE: "1"}}}

    [l4] = gpu_profiles([node("7", "NVIDIA-L4")], [])
    assert l4.product == "NVIDIA-L4"
    # Relabelled: a new resourceVersion, a new profile.
    [h100] = gpu_profiles([node("8", "NVIDIA-H100-80GB-HBM3")], [])
    assert h100.product == "NVIDIA-H100-80GB-HBM3"
    # The same version is the same object: its profile is not built again.
    assert gpu_profiles([node("8", "NVIDIA-H100-80GB-HBM3")], [])[0] is h100
    # A hand-made node without a version is profiled every time.
    assert gpu_profiles([node(None, "NVIDIA-L4")], [])[0].product == "NVIDIA-L4"
    assert gpu_profiles([node(None, "NVIDIA-H100-80GB-HBM3")], [])[0] is not h100
    # A GPUNode that appears gives the node another profile, even at the node's version.
    gpu_node = {"metadata": {"name": "n-profile", "resourceVersion": "3"}, "status": {}}
    assert gpu_profiles([node("8", "NVIDIA-H100-80GB-HBM3")], [gpu_node])[0] is not h100


def test_the_memo_keeps_its_most_recent_entries_and_builds_without_a_key() -> None:
    """Bounded, least recently used out first; a None key (no resourceVersion) is never kept."""
    from vllm_operator.reconcile.placement import _Memo

    built: list[str] = []

    def build(value: str) -> Any:
        return lambda: built.append(value) or value

    memo: _Memo[str, str] = _Memo(2)
    assert memo.get("a", build("a1")) == "a1"
    assert memo.get("b", build("b1")) == "b1"
    assert memo.get("a", build("a2")) == "a1"  # kept, and now the most recent
    assert memo.get("c", build("c1")) == "c1"  # over the bound: "b" goes, not "a"
    assert memo.get("a", build("a3")) == "a1"
    assert memo.get("b", build("b2")) == "b2"
    assert memo.get(None, build("n1")) == "n1" and memo.get(None, build("n2")) == "n2"
    assert built == ["a1", "b1", "c1", "b2", "n1", "n2"]
