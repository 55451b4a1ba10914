"""GPU products and node profiles from labels, GPUNode status and the command line."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_operator.models.gpu_node import GPUNodeStatus
from vllm_operator.tuning.gpus import (
    match_product,
    node_profile,
    profile_from_gpu_node,
    profile_from_labels,
    profile_from_product,
)


@pytest.mark.parametrize(
    ("product", "memory_mib", "expected"),
    [
        pytest.param(
            "NVIDIA-GeForce-RTX-4090", None, "RTX-4090", id="a GPU Feature Discovery label"
        ),
        pytest.param("NVIDIA GeForce RTX 3090", None, "RTX-3090", id="an NVML name"),
        pytest.param("RTX-3060", None, "RTX-3060", id="a name typed on the command line"),
        pytest.param("NVIDIA-A10", None, "A10", id="A10 is not A100"),
        pytest.param("NVIDIA-A10G", None, "A10G", id="A10G is not A10"),
        pytest.param("NVIDIA-L40S", None, "L40S", id="L40S is not L40"),
        pytest.param(
            "NVIDIA-A100-SXM4-80GB", None, "A100-80GB", id="an A100 with its size in the name"
        ),
        pytest.param("NVIDIA-A100-80GB-PCIe", None, "A100-80GB-PCIe", id="a PCIe A100"),
        pytest.param("NVIDIA-A100-PCIE-40GB", None, "A100-40GB-PCIe", id="a 40 GB PCIe A100"),
        pytest.param(
            "NVIDIA-A100", 81920, "A100-80GB", id="an A100 told apart by its memory label"
        ),
        pytest.param(
            "NVIDIA-A100", None, "A100-40GB", id="an A100 of unknown memory is the smaller"
        ),
        pytest.param("NVIDIA-H100-80GB-HBM3", None, "H100-80GB", id="an SXM H100"),
        pytest.param("NVIDIA H100 PCIe", None, "H100-PCIe", id="a PCIe H100"),
        pytest.param("NVIDIA H200", None, "H200", id="an H200 as NVML names it"),
        pytest.param("Tesla-T4", None, "T4", id="a Tesla-branded T4"),
        pytest.param("NVIDIA RTX 6000 Ada Generation", None, "RTX-6000-Ada", id="an RTX 6000 Ada"),
        pytest.param("Quadro RTX 5000", None, None, id="an unknown product"),
    ],
)
def test_product_matching(product: str, memory_mib: int | None, expected: str | None) -> None:
    match = match_product(product, memory_mib)
    assert (match.name if match else None) == expected


def test_a_product_profile_defaults_its_interconnect_to_what_the_part_has() -> None:
    h100 = profile_from_product("H100-80GB", 8)
    assert h100.worst_link(range(8)) == "NVLink"
    assert h100.links_assumed
    l40s = profile_from_product("L40S", 4)
    assert l40s.worst_link(range(4)) == "PHB"


def test_an_unknown_product_needs_its_memory() -> None:
    with pytest.raises(ValueError, match="give its memory"):
        profile_from_product("Acme-X1", 1)
    assert profile_from_product("Acme-X1", 1, memory_mib=16384).memory_bytes == 16 << 30


LABELS = {
    "nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090",
    "nvidia.com/gpu.memory": "24564",
    "nvidia.com/gpu.count": "2",
}


def test_a_profile_from_node_labels() -> None:
    profile = profile_from_labels(
        {**LABELS, "inference.vllm-operator.dev/gpu-interconnect": "nvlink"}, node="n1"
    )
    assert profile is not None
    assert (profile.name, profile.count, profile.memory_bytes) == ("RTX-4090", 2, 24564 << 20)
    assert profile.link(0, 1) == "NVLink"
    assert profile.source == "NodeLabels"


def test_a_node_without_an_interconnect_label_is_treated_as_pcie_and_says_so() -> None:
    profile = profile_from_labels(LABELS, node="n1")
    assert profile is not None
    assert profile.link(0, 1) == "PHB"
    assert any("no inference.vllm-operator.dev/gpu-interconnect label" in n for n in profile.notes)


def test_a_node_without_gpus_has_no_profile() -> None:
    assert profile_from_labels({"kubernetes.io/os": "linux"}) is None
    assert profile_from_labels({**LABELS, "nvidia.com/gpu.count": "0"}) is None


def _gpu(index: int, **extra: Any) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": f"GPU-{index}",
        "product": "NVIDIA H200",
        "memoryBytes": 150_754_820_096,
        "computeCapability": "9.0",
        **extra,
    }


def test_a_profile_from_gpunode_status_uses_measured_bandwidth_and_real_links() -> None:
    status = GPUNodeStatus.model_validate(
        {
            "gpus": [_gpu(0), _gpu(1), _gpu(2), _gpu(3)],
            "links": [
                {"a": 0, "b": 1, "kind": "NVLink", "nvlinks": 18},
                {"a": 2, "b": 3, "kind": "NVLink", "nvlinks": 18},
                {"a": 0, "b": 2, "kind": "SYS"},
                {"a": 0, "b": 3, "kind": "SYS"},
                {"a": 1, "b": 2, "kind": "SYS"},
                {"a": 1, "b": 3, "kind": "SYS"},
            ],
            "bandwidth": {
                "results": [
                    {"source": "gpu0", "kind": "DeviceCopy", "gigabytesPerSecond": 4266},
                    {"source": "gpu1", "kind": "DeviceCopy", "gigabytesPerSecond": 4300},
                    {"source": "host->gpu0", "kind": "HostToDevice", "gigabytesPerSecond": 52},
                ]
            },
        }
    )
    profile = profile_from_gpu_node(status, node="h200-a")
    assert profile is not None
    assert profile.name == "H200"
    assert profile.memory_bytes == 150_754_820_096
    assert profile.compute_capability == (9, 0)
    assert profile.bandwidth_measured
    assert profile.bandwidth_bytes_per_second == 4266e9
    assert profile.host_to_device_bytes_per_second == 52e9
    group = profile.best_group(2)
    assert group is not None
    assert group[1] == "NVLink"
    assert profile.best_group(4) == ((0, 1, 2, 3), "SYS")


def test_a_power_capped_gpu_and_a_narrow_link_become_notes() -> None:
    status = GPUNodeStatus.model_validate(
        {
            "gpus": [
                _gpu(0, power={"current": 300, "default": 450}),
                _gpu(1, pcie={"generation": 4, "maxGeneration": 4, "width": 8, "maxWidth": 16}),
            ],
            "interconnect": "PCIe",
        }
    )
    profile = profile_from_gpu_node(status, node="ws")
    assert profile is not None
    assert profile.link(0, 1) == "PHB"
    assert profile.links_assumed
    assert any("power limit 300 W of 450 W" in n for n in profile.notes)
    assert any("x8 of gen4 x16" in n for n in profile.notes)


def test_a_gpunode_without_gpus_has_no_profile() -> None:
    assert profile_from_gpu_node(GPUNodeStatus()) is None


def test_a_node_is_profiled_from_its_gpunode_before_its_labels() -> None:
    status = GPUNodeStatus.model_validate({"gpus": [_gpu(0)]})
    from_status = node_profile(LABELS, status, node="n")
    assert from_status is not None
    assert (from_status.name, from_status.source) == ("H200", "GPUNode")
    from_labels = node_profile(LABELS, GPUNodeStatus(), node="n")
    assert from_labels is not None
    assert (from_labels.name, from_labels.source) == ("RTX-4090", "NodeLabels")


def test_the_best_group_of_sixteen_pcie_gpus_is_found_quickly() -> None:
    profile = profile_from_product("L40S", 16, interconnect="pcie")
    assert profile.best_group(8) == (tuple(range(8)), "PHB")
