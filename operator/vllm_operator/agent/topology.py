"""Interconnect: how each pair of GPUs reaches the other, as `nvidia-smi topo -m` shows it.

NVML answers two different questions, and both are needed:

- ``nvmlDeviceGetTopologyCommonAncestor`` describes the PCIe path only. On an NVLink
  machine it still answers "host bridge" (seen on two H200s joined by 18 NVLinks), so it
  must never be taken as the whole answer.
- The NVLinks are read per link: whether the link is active and what is at its other end
  (a GPU's PCI bus id, or an NVSwitch). Links straight to the peer count; links into an
  NVSwitch reach every GPU on the same switch fabric, so two GPUs that both have switch
  links reach each other over the smaller of their two counts (that is how
  ``nvidia-smi topo -m`` prints NV18 between every pair of an HGX H100/H200 board).

NVLink, when present, beats any PCIe relation. The PCIe relation follows the names of
``nvidia-smi topo -m``: PIX (one PCIe switch), PXB (several switches), PHB (the host
bridge), NODE (host bridges within a NUMA node), SYS (across the inter-socket link).
"""

from __future__ import annotations

from typing import Literal

from vllm_operator.agent.readings import (
    TOPOLOGY_HOSTBRIDGE,
    TOPOLOGY_MULTIPLE,
    TOPOLOGY_NODE,
    TOPOLOGY_SINGLE,
    DeviceReading,
    NvmlSnapshot,
    PairReading,
)
from vllm_operator.models.gpu_node import GPULink, LinkKind

Interconnect = Literal["NVLink", "PCIe", "None"]

# From closest to farthest, so "the weakest link" is the largest rank.
_RANK: dict[LinkKind, int] = {"NVLink": 0, "PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}


def normalise_bus_id(bus_id: str) -> str:
    """A PCI bus id in one spelling: NVML pads the domain to 8 digits in some answers
    (00000000:19:00.0) and 4 in others (0000:19:00.0), in either case."""
    domain, _, rest = bus_id.strip().partition(":")
    try:
        return f"{int(domain, 16):08x}:{rest.lower()}"
    except ValueError:
        return bus_id.strip().lower()


def pcie_kind(common_ancestor: int | None) -> LinkKind:
    """The nvidia-smi name of an NVML topology level."""
    if common_ancestor is None:
        # Unknown path: assume the farthest, so nothing is planned on a link that may not be.
        return "SYS"
    if common_ancestor <= TOPOLOGY_SINGLE:
        # INTERNAL (two GPUs on one board) shares a switch on the board: as close as PIX.
        return "PIX"
    if common_ancestor <= TOPOLOGY_MULTIPLE:
        return "PXB"
    if common_ancestor <= TOPOLOGY_HOSTBRIDGE:
        return "PHB"
    if common_ancestor <= TOPOLOGY_NODE:
        return "NODE"
    return "SYS"


def nvlink_count(a: DeviceReading, b: DeviceReading) -> int:
    """NVLinks between two GPUs: direct links plus the links they share through NVSwitch."""
    a_bus, b_bus = normalise_bus_id(a.pci_bus_id), normalise_bus_id(b.pci_bus_id)

    def direct(src: DeviceReading, peer_bus: str) -> int:
        return sum(
            1
            for link in src.nvlinks
            if link.active
            and link.remote_pci_bus_id is not None
            and link.remote_device_type in (None, "GPU")
            and normalise_bus_id(link.remote_pci_bus_id) == peer_bus
        )

    def switched(src: DeviceReading) -> int:
        return sum(1 for link in src.nvlinks if link.active and link.remote_device_type == "Switch")

    # Count each direction's direct links and take the larger: NVML may know the far end of
    # a link from one side only.
    count = max(direct(a, b_bus), direct(b, a_bus))
    return count + min(switched(a), switched(b))


def pair_link(a: DeviceReading, b: DeviceReading, pair: PairReading | None) -> GPULink:
    """The relation of two GPUs: NVLink when they have any, else the PCIe path."""
    count = nvlink_count(a, b)
    if count > 0:
        return GPULink(a=a.index, b=b.index, kind="NVLink", nvlinks=count)
    return GPULink(a=a.index, b=b.index, kind=pcie_kind(pair.common_ancestor if pair else None))


def links(snapshot: NvmlSnapshot) -> list[GPULink]:
    """Every pair of GPUs, in index order (the upper triangle of `nvidia-smi topo -m`)."""
    pairs = {(p.a, p.b): p for p in snapshot.pairs}
    devices = sorted(snapshot.devices, key=lambda d: d.index)
    return [
        pair_link(a, b, pairs.get((a.index, b.index)) or pairs.get((b.index, a.index)))
        for i, a in enumerate(devices)
        for b in devices[i + 1 :]
    ]


def interconnect(all_links: list[GPULink], gpu_count: int) -> Interconnect:
    """The class of the weakest path between any two GPUs: what tensor parallelism across
    every GPU of the node would have to go through."""
    if gpu_count < 2 or not all_links:
        return "None"
    weakest = max(all_links, key=lambda link: _RANK[link.kind])
    return "NVLink" if weakest.kind == "NVLink" else "PCIe"


def topo_cell(link: GPULink) -> str:
    """The cell `nvidia-smi topo -m` prints for a pair: NV18, PHB, ..."""
    return f"NV{link.nvlinks}" if link.kind == "NVLink" else link.kind
