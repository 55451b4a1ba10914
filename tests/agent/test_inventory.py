"""NVML answers -> the GPUNode's inventory, links and node labels, for the field's shapes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from devenv.fakes import answer_sets
from vllm_operator.agent.inventory import (
    cpu_ranges,
    cuda_version,
    event_reason_names,
    inventory,
    label_value,
    node_labels,
)
from vllm_operator.agent.readings import NvLinkReading
from vllm_operator.agent.topology import interconnect, links, pcie_kind, topo_cell
from vllm_operator.models.gpu_node import GPULink


def test_two_rtx_4090_behind_one_host_bridge_are_phb_with_pcie_interconnect() -> None:
    inv = inventory(answer_sets.rtx4090x2_phb())
    assert [(link.a, link.b, link.kind, link.nvlinks) for link in inv.links] == [
        (0, 1, "PHB", None)
    ]
    assert inv.interconnect == "PCIe"
    assert [g.nvlinks_active for g in inv.gpus] == [0, 0]
    assert node_labels(inv) == {
        "nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090",
        "nvidia.com/gpu.memory": "24564",
        "nvidia.com/gpu.count": "2",
        "inference.vllm-operator.dev/gpu-interconnect": "pcie",
    }


def test_eight_h100_on_nvswitch_are_nv18_everywhere_although_pcie_says_node_or_sys() -> None:
    inv = inventory(answer_sets.h100x8_nvlink())
    assert len(inv.links) == 28
    assert {topo_cell(link) for link in inv.links} == {"NV18"}
    assert inv.interconnect == "NVLink"
    assert node_labels(inv)["inference.vllm-operator.dev/gpu-interconnect"] == "nvlink"
    assert [g.numa_node for g in inv.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert inv.gpus[4].cpu_affinity == "56-111"


def test_direct_nvlinks_count_per_peer_and_beat_the_host_bridge() -> None:
    # Two GPUs bridged directly by four NVLinks, PCIe through the host bridge.
    snapshot = answer_sets.rtx4090x2_phb()
    a, b = snapshot.devices

    def bridged(src: object, peer: str) -> tuple[NvLinkReading, ...]:
        return tuple(NvLinkReading(n, True, peer, "GPU", 4) for n in range(4))

    snapshot = replace(
        snapshot,
        devices=(
            replace(a, nvlinks=bridged(a, "0000:02:00.0"), errors={}),
            replace(b, nvlinks=bridged(b, "0000:01:00.0"), errors={}),
        ),
    )
    assert [topo_cell(link) for link in links(snapshot)] == ["NV4"]


def test_inactive_nvlinks_do_not_count() -> None:
    snapshot = answer_sets.h100x8_nvlink()
    down = replace(
        snapshot.devices[0],
        nvlinks=tuple(replace(n, active=n.link >= 6) for n in snapshot.devices[0].nvlinks),
    )
    snapshot = replace(snapshot, devices=(down, *snapshot.devices[1:]))
    assert topo_cell(links(snapshot)[0]) == "NV12"
    assert inventory(snapshot).gpus[0].nvlinks_active == 12


@pytest.mark.parametrize(
    ("level", "kind"),
    [(0, "PIX"), (10, "PIX"), (20, "PXB"), (30, "PHB"), (40, "NODE"), (50, "SYS"), (None, "SYS")],
)
def test_nvml_topology_levels_map_to_the_names_of_nvidia_smi_topo(
    level: int | None, kind: str
) -> None:
    assert pcie_kind(level) == kind


def test_the_interconnect_class_is_the_weakest_pair() -> None:
    mixed = [GPULink(a=0, b=1, kind="NVLink", nvlinks=4), GPULink(a=0, b=2, kind="SYS")]
    assert interconnect(mixed, 3) == "PCIe"
    assert interconnect([], 1) == "None"


def test_a_single_gpu_node_has_no_interconnect() -> None:
    inv = inventory(answer_sets.x8_in_x16_slot())
    assert inv.links == []
    assert inv.interconnect == "None"
    assert node_labels(inv)["inference.vllm-operator.dev/gpu-interconnect"] == "none"


def test_units_become_the_apis_watts_mhz_and_strings() -> None:
    gpu = inventory(answer_sets.capped_300w_of_450w()).gpus[0]
    assert gpu.power is not None and gpu.clocks is not None and gpu.pcie is not None
    assert (gpu.power.current, gpu.power.default, gpu.power.min, gpu.power.max) == (
        300.0,
        450.0,
        150.0,
        600.0,
    )
    assert gpu.power.draw == 298.0
    assert (gpu.clocks.sm, gpu.clocks.sm_max) == (1710, 3120)
    assert gpu.clocks.throttle_reasons == ["SwPowerCap"]
    assert gpu.memory_bytes == 24564 * 1024 * 1024
    assert gpu.compute_capability == "8.9"
    assert gpu.cpu_affinity == "0-31"


def test_idle_is_not_listed_among_throttle_reasons() -> None:
    assert event_reason_names(0x1 | 0x40) == ["HwThermalSlowdown"]
    assert event_reason_names(None) == []


@pytest.mark.parametrize(
    ("cpus", "text"),
    [((0, 1, 2, 3, 8), "0-3,8"), ((5,), "5"), ((), None), (None, None), ((3, 1, 2), "1-3")],
)
def test_cpu_lists_are_written_as_linux_does(cpus: tuple[int, ...] | None, text: str) -> None:
    assert cpu_ranges(cpus) == text


def test_cuda_versions_read_as_nvidia_smi_prints_them() -> None:
    assert cuda_version(13000) == "13.0"
    assert cuda_version(12080) == "12.8"
    assert cuda_version(None) is None


def test_label_values_follow_gpu_feature_discovery() -> None:
    assert label_value("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert label_value("Tesla V100-SXM2-32GB (rev a1)") == "Tesla-V100-SXM2-32GB-rev-a1"
    assert len(label_value("x" * 100)) == 63
