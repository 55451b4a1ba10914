"""Bandwidth probe results: timed copies turned into GB/s against what the hardware should do.

Pure. ``agent.cuda`` times the copies (``Measurement``: bytes, repeats, seconds); this module
turns them into the GPUNode's ``Bandwidth`` entries and sets each beside an expected value:

- ``DeviceCopy`` (one GPU's memory to itself) counts the bytes read plus the bytes
  written, as memory datasheets and framework benchmarks do, so it is comparable with the
  product's memory bandwidth (4.8 TB/s for an H200). The expected value comes from a table
  of products; for one not in it, from NVML's memory bus width and memory clock.
- ``HostToDevice`` / ``DeviceToHost`` (pinned host memory) count the bytes moved once;
  expected is the PCIe link's rate at its maximum generation and width (what the slot
  should deliver; a degraded link shows as a shortfall).
- ``PeerToPeer`` (GPU to GPU) counts the bytes moved once; expected is the NVLinks between
  the pair times each link's rate in one direction, or the slower PCIe link of the two.

All rates are in GB/s of 10^9 bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

from vllm_operator.agent.readings import DeviceReading, NvmlSnapshot
from vllm_operator.models.gpu_node import Bandwidth, BandwidthProbe, GPULink

CopyKind = Literal["DeviceCopy", "HostToDevice", "DeviceToHost", "PeerToPeer"]

# Memory bandwidth by product, GB/s, from NVIDIA's datasheets. Matched against NVML's
# product name in order: more specific names first (H100 NVL before H100).
MEMORY_BANDWIDTH: Final[tuple[tuple[str, float], ...]] = (
    (r"GH200", 4000.0),
    (r"H200", 4800.0),
    (r"H100 NVL", 3900.0),
    (r"H100 PCIe", 2000.0),
    (r"H100|H800", 3350.0),
    (r"A100.*80GB.*PCIe", 1935.0),
    (r"A100.*80GB", 2039.0),
    (r"A100|A800", 1555.0),
    (r"L40S|L40\b", 864.0),
    (r"\bL4\b", 300.0),
    (r"A10G|\bA10\b", 600.0),
    (r"RTX 4090", 1008.0),
    (r"RTX 3090", 936.0),
    (r"RTX 3060", 360.0),
    (r"V100", 900.0),
    (r"\bT4\b", 320.0),
)

# PCIe payload rate per lane and direction, GB/s: signalling rate less line encoding
# (8b/10b up to gen 2, 128b/130b for gens 3 to 5, FLIT for gen 6).
PCIE_LANE_RATE: Final[dict[int, float]] = {
    1: 0.25,
    2: 0.5,
    3: 0.985,
    4: 1.969,
    5: 3.938,
    6: 7.563,
}

# One NVLink's rate in one direction, GB/s, by nvmlNvlinkVersion_t (1: 1.0, 2: 2.0, 3: 2.2,
# 4: 3.0, 5: 3.1, 6: 4.0, 7: 5.0).
NVLINK_RATE: Final[dict[int, float]] = {
    1: 20.0,
    2: 25.0,
    3: 25.0,
    4: 25.0,
    5: 25.0,
    6: 25.0,
    7: 50.0,
}


@dataclass(frozen=True)
class Measurement:
    """One timed copy: ``repeats`` copies of ``bytes_per_copy`` took ``seconds``.

    ``src``/``dst`` are NVML indices; ``None`` is host memory.
    """

    kind: CopyKind
    src: int | None
    dst: int | None
    bytes_per_copy: int
    repeats: int
    seconds: float


@dataclass(frozen=True)
class ProbeRun:
    """What the probe measured, and what it could not."""

    measurements: tuple[Measurement, ...] = ()
    errors: tuple[str, ...] = ()


def memory_bandwidth(device: DeviceReading) -> float | None:
    """What the product's memory should deliver, GB/s (read plus write)."""
    for pattern, rate in MEMORY_BANDWIDTH:
        if re.search(pattern, device.name):
            return rate
    if device.memory_bus_width_bits and device.clock_mem_max_mhz:
        # NVML's memory clock is half the data rate (two transfers a clock).
        return device.memory_bus_width_bits / 8 * device.clock_mem_max_mhz * 2 / 1000
    return None


def pcie_bandwidth(device: DeviceReading) -> float | None:
    """What the GPU's PCIe link should deliver in one direction, GB/s."""
    if device.pcie_max_generation is None or device.pcie_max_width is None:
        return None
    lane = PCIE_LANE_RATE.get(device.pcie_max_generation)
    return None if lane is None else lane * device.pcie_max_width


def nvlink_rate(device: DeviceReading) -> float | None:
    """One NVLink's rate in one direction for this GPU, GB/s."""
    versions = {link.version for link in device.nvlinks if link.active and link.version}
    if versions:
        return min(NVLINK_RATE.get(v, 25.0) for v in versions)
    return None


def peer_bandwidth(a: DeviceReading, b: DeviceReading, link: GPULink | None) -> float | None:
    """What the path between two GPUs should deliver in one direction, GB/s."""
    if link is not None and link.kind == "NVLink" and link.nvlinks:
        rate = nvlink_rate(a) or nvlink_rate(b)
        return None if rate is None else rate * link.nvlinks
    rates = [r for r in (pcie_bandwidth(a), pcie_bandwidth(b)) if r is not None]
    return min(rates) if rates else None


def gigabytes_per_second(m: Measurement) -> float:
    """The measured rate; a device copy counts bytes read plus bytes written."""
    moved = m.bytes_per_copy * m.repeats * (2 if m.kind == "DeviceCopy" else 1)
    return moved / m.seconds / 1e9


def _source(m: Measurement) -> str:
    def name(index: int | None) -> str:
        return "host" if index is None else f"gpu{index}"

    if m.kind == "DeviceCopy":
        return name(m.src)
    return f"{name(m.src)}->{name(m.dst)}"


def expected(m: Measurement, snapshot: NvmlSnapshot, links: list[GPULink]) -> float | None:
    """What the hardware should deliver for this measurement, GB/s."""
    src = snapshot.device(m.src) if m.src is not None else None
    dst = snapshot.device(m.dst) if m.dst is not None else None
    if m.kind == "DeviceCopy":
        return memory_bandwidth(src) if src else None
    if m.kind == "HostToDevice":
        return pcie_bandwidth(dst) if dst else None
    if m.kind == "DeviceToHost":
        return pcie_bandwidth(src) if src else None
    if src is None or dst is None:
        return None
    pair = {frozenset((link.a, link.b)): link for link in links}.get(
        frozenset((src.index, dst.index))
    )
    return peer_bandwidth(src, dst, pair)


def results(run: ProbeRun, snapshot: NvmlSnapshot, links: list[GPULink]) -> list[Bandwidth]:
    """The status entries for a probe run, GB/s rounded to 0.1."""
    out: list[Bandwidth] = []
    for m in run.measurements:
        if m.seconds <= 0 or m.repeats <= 0:
            continue
        want = expected(m, snapshot, links)
        out.append(
            Bandwidth(
                source=_source(m),
                kind=m.kind,
                gigabytes_per_second=round(gigabytes_per_second(m), 1),
                expected_gigabytes_per_second=None if want is None else round(want, 1),
            )
        )
    return out


def probe_status(
    request_id: str | None,
    run: ProbeRun,
    snapshot: NvmlSnapshot,
    links: list[GPULink],
    *,
    measured_at: datetime,
) -> BandwidthProbe:
    """The GPUNode's ``status.bandwidth`` for a probe run."""
    return BandwidthProbe(
        request_id=request_id,
        measured_at=measured_at,
        results=results(run, snapshot, links),
        error="; ".join(run.errors) or None,
    )
