"""Inventory: NVML's answers turned into the GPUNode's description of the node's GPUs.

Pure: an ``NvmlSnapshot`` in, the inventory part of ``GPUNodeStatus`` out (driver and CUDA
versions, one ``GPUInfo`` per GPU, the pairwise links and the interconnect class), plus
the node labels the scheduler and the tuner select on. NVML's units become the API's:
milliwatts become watts, an affinity mask a CPU list such as ``0-31``, the CUDA driver
version 13000 the string ``13.0``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vllm_operator.agent.readings import (
    CLOCK_EVENT_GPU_IDLE,
    CLOCK_EVENT_REASONS,
    DeviceReading,
    NvmlSnapshot,
)
from vllm_operator.agent.topology import Interconnect, interconnect, links
from vllm_operator.constants import (
    NODE_LABEL_GPU_COUNT,
    NODE_LABEL_GPU_INTERCONNECT,
    NODE_LABEL_GPU_MEMORY_MIB,
    NODE_LABEL_GPU_PRODUCT,
)
from vllm_operator.models.gpu_node import Clocks, GPUInfo, GPULink, PCIeLink, PowerLimits

MIB = 1024 * 1024


@dataclass(frozen=True)
class Inventory:
    """The inventory part of a GPUNode's status."""

    driver_version: str | None
    cuda_version: str | None
    gpus: list[GPUInfo]
    links: list[GPULink]
    interconnect: Interconnect


def watts(milliwatts: int | None) -> float | None:
    """NVML's milliwatts as the API's watts."""
    return None if milliwatts is None else milliwatts / 1000


def cuda_version(driver_api_version: int | None) -> str | None:
    """``nvmlSystemGetCudaDriverVersion``'s 13000 as ``13.0`` (how nvidia-smi prints it)."""
    if driver_api_version is None:
        return None
    return f"{driver_api_version // 1000}.{driver_api_version % 1000 // 10}"


def cpu_ranges(cpus: tuple[int, ...] | None) -> str | None:
    """CPU numbers as a Linux CPU list: (0, 1, 2, 3, 8) -> ``0-3,8``."""
    if not cpus:
        return None
    ordered = sorted(set(cpus))
    spans: list[str] = []
    start = prev = ordered[0]
    for cpu in [*ordered[1:], None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(spans)


def event_reason_names(bits: int | None) -> list[str]:
    """Active clock event reasons other than idle, by NVML's names."""
    if bits is None:
        return []
    return [
        name
        for bit, name in sorted(CLOCK_EVENT_REASONS.items())
        if bits & bit and bit != CLOCK_EVENT_GPU_IDLE
    ]


def numa_node(device: DeviceReading) -> int | None:
    """The GPU's NUMA node: its own if NVML or sysfs knows it, else the one NUMA node its
    memory affinity names (what `nvidia-smi topo -m` shows as NUMA Affinity). Several
    nodes, or none known, leave it unset rather than guessed."""
    if device.numa_node is not None:
        return device.numa_node
    if device.numa_affinity is not None and len(device.numa_affinity) == 1:
        return device.numa_affinity[0]
    return None


def gpu_info(device: DeviceReading) -> GPUInfo:
    """One GPU as the API describes it."""
    active_nvlinks = sum(1 for link in device.nvlinks if link.active)
    return GPUInfo(
        index=device.index,
        uuid=device.uuid,
        product=device.name,
        memory_bytes=device.memory_total_bytes,
        compute_capability=device.compute_capability,
        pci_bus_id=device.pci_bus_id,
        power=PowerLimits(
            current=watts(device.enforced_power_limit_mw),
            default=watts(device.default_power_limit_mw),
            min=watts(device.power_min_mw),
            max=watts(device.power_max_mw),
            draw=watts(device.power_usage_mw),
        ),
        clocks=Clocks(
            sm=device.clock_sm_mhz,
            sm_max=device.clock_sm_max_mhz,
            memory=device.clock_mem_mhz,
            memory_max=device.clock_mem_max_mhz,
            throttle_reasons=event_reason_names(device.clock_event_reasons),
        ),
        temperature_celsius=device.temperature_c,
        pcie=PCIeLink(
            generation=device.pcie_generation,
            max_generation=device.pcie_max_generation,
            width=device.pcie_width,
            max_width=device.pcie_max_width,
        ),
        numa_node=numa_node(device),
        cpu_affinity=cpu_ranges(device.cpu_affinity),
        # Absent (not 0) when NVML could not say, so "no NVLink" and "unknown" differ.
        nvlinks_active=active_nvlinks if device.nvlinks or "nvlinks" in device.errors else None,
    )


def inventory(snapshot: NvmlSnapshot) -> Inventory:
    """The node's GPUs, links and interconnect class from one NVML read."""
    devices = sorted(snapshot.devices, key=lambda d: d.index)
    pairwise = links(snapshot)
    return Inventory(
        driver_version=snapshot.driver_version,
        cuda_version=cuda_version(snapshot.cuda_driver_version),
        gpus=[gpu_info(d) for d in devices],
        links=pairwise,
        interconnect=interconnect(pairwise, len(devices)),
    )


_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9._-]+")


def label_value(text: str) -> str:
    """A string made into a valid label value. Spaces become dashes, as GPU Feature
    Discovery writes ``nvidia.com/gpu.product`` (NVIDIA H200 -> NVIDIA-H200)."""
    value = _LABEL_VALUE_BAD.sub("-", text.strip())[:63]
    return value.strip("-_.")


def node_labels(inv: Inventory) -> dict[str, str]:
    """The node labels for this inventory: product, memory (MiB) and count as GPU Feature
    Discovery spells them, and the interconnect class (nvlink, pcie or none).

    A node with mixed GPUs is labelled after GPU 0, as GPU Feature Discovery does.
    """
    if not inv.gpus:
        return {NODE_LABEL_GPU_COUNT: "0", NODE_LABEL_GPU_INTERCONNECT: "none"}
    first = inv.gpus[0]
    labels = {
        NODE_LABEL_GPU_PRODUCT: label_value(first.product),
        NODE_LABEL_GPU_COUNT: str(len(inv.gpus)),
        NODE_LABEL_GPU_INTERCONNECT: inv.interconnect.lower(),
    }
    if first.memory_bytes is not None:
        labels[NODE_LABEL_GPU_MEMORY_MIB] = str(first.memory_bytes // MIB)
    return labels
