"""Readers for nvidia-smi's own outputs, the reference the agent is checked against.

``nvidia-smi -q -x`` (XML) gives versions, identities, memory, power limits, clocks, clock
event reasons, temperature and PCIe links; ``nvidia-smi topo -m`` the pairwise relation
(NV18, PHB, ...), CPU affinity and NUMA affinity; ``--query-gpu=...,compute_cap`` the
compute capability, which the XML does not carry.
"""

from __future__ import annotations

import csv
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

# nvidia-smi's clock event reason tags -> NVML's names for the same bits.
REASON_TAGS = {
    "clocks_event_reason_gpu_idle": "GpuIdle",
    "clocks_event_reason_applications_clocks_setting": "ApplicationsClocksSetting",
    "clocks_event_reason_sw_power_cap": "SwPowerCap",
    "clocks_event_reason_hw_slowdown": "HwSlowdown",
    "clocks_event_reason_sync_boost": "SyncBoost",
    "clocks_event_reason_sw_thermal_slowdown": "SwThermalSlowdown",
    "clocks_event_reason_hw_thermal_slowdown": "HwThermalSlowdown",
    "clocks_event_reason_hw_power_brake_slowdown": "HwPowerBrakeSlowdown",
    "clocks_event_reason_display_clocks_setting": "DisplayClockSetting",
}


def number(text: str | None) -> float:
    """The number in '700.00 W', '143771 MiB', '16x', '36 C'."""
    match = re.match(r"\s*(-?[0-9.]+)", text or "")
    if match is None:
        raise ValueError(f"no number in {text!r}")
    return float(match.group(1))


@dataclass(frozen=True)
class SmiGpu:
    """One GPU as nvidia-smi -q -x describes it."""

    bus_id: str
    product: str
    uuid: str
    memory_mib: int
    power_current: float
    power_requested: float
    power_default: float
    power_min: float
    power_max: float
    power_draw: float
    sm_clock: int
    sm_clock_max: int
    mem_clock: int
    mem_clock_max: int
    active_reasons: list[str]
    temperature: int
    pcie_generation: int
    pcie_max_generation: int
    pcie_width: int
    pcie_max_width: int


@dataclass(frozen=True)
class SmiLog:
    driver_version: str
    cuda_version: str
    attached_gpus: int
    gpus: list[SmiGpu]


def read_xml(path: Path) -> SmiLog:
    root = ET.parse(path).getroot()

    def text(node: ET.Element, where: str) -> str:
        found = node.find(where)
        if found is None or found.text is None:
            raise ValueError(f"{path}: no {where}")
        return found.text.strip()

    gpus = []
    for g in root.findall("gpu"):
        reasons = g.find("clocks_event_reasons")
        active = [
            REASON_TAGS[child.tag]
            for child in (reasons if reasons is not None else [])
            if child.tag in REASON_TAGS and (child.text or "").strip() == "Active"
        ]
        power = "gpu_power_readings"
        link = "pci/pci_gpu_link_info"
        gpus.append(
            SmiGpu(
                bus_id=g.attrib["id"],
                product=text(g, "product_name"),
                uuid=text(g, "uuid"),
                memory_mib=int(number(text(g, "fb_memory_usage/total"))),
                power_current=number(text(g, f"{power}/current_power_limit")),
                power_requested=number(text(g, f"{power}/requested_power_limit")),
                power_default=number(text(g, f"{power}/default_power_limit")),
                power_min=number(text(g, f"{power}/min_power_limit")),
                power_max=number(text(g, f"{power}/max_power_limit")),
                power_draw=number(text(g, f"{power}/instant_power_draw")),
                sm_clock=int(number(text(g, "clocks/sm_clock"))),
                sm_clock_max=int(number(text(g, "max_clocks/sm_clock"))),
                mem_clock=int(number(text(g, "clocks/mem_clock"))),
                mem_clock_max=int(number(text(g, "max_clocks/mem_clock"))),
                active_reasons=active,
                temperature=int(number(text(g, "temperature/gpu_temp"))),
                pcie_generation=int(number(text(g, f"{link}/pcie_gen/current_link_gen"))),
                pcie_max_generation=int(number(text(g, f"{link}/pcie_gen/max_link_gen"))),
                pcie_width=int(number(text(g, f"{link}/link_widths/current_link_width"))),
                pcie_max_width=int(number(text(g, f"{link}/link_widths/max_link_width"))),
            )
        )
    return SmiLog(
        driver_version=text(root, "driver_version"),
        cuda_version=text(root, "cuda_version"),
        attached_gpus=int(text(root, "attached_gpus")),
        gpus=gpus,
    )


@dataclass(frozen=True)
class Topology:
    """`nvidia-smi topo -m`: the GPU matrix and each GPU's affinities."""

    cells: dict[tuple[int, int], str]
    cpu_affinity: dict[int, str]
    numa_affinity: dict[int, str]


def read_topo(path: Path) -> Topology:
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in path.read_text().splitlines()]
    header = [h.strip() for h in lines[0].split("\t") if h.strip()]
    gpu_columns = [h for h in header if re.fullmatch(r"GPU\d+", h)]
    cells: dict[tuple[int, int], str] = {}
    cpu: dict[int, str] = {}
    numa: dict[int, str] = {}
    for line in lines[1:]:
        if not re.match(r"GPU\d+\t", line):
            continue
        fields = [f.strip() for f in line.split("\t")]
        row = int(fields[0][3:])
        values = fields[1:]
        for col, value in zip(gpu_columns, values, strict=False):
            cells[(row, int(col[3:]))] = value
        rest = values[len(gpu_columns) :]
        cpu[row] = rest[header.index("CPU Affinity") - len(gpu_columns)]
        numa[row] = rest[header.index("NUMA Affinity") - len(gpu_columns)]
    return Topology(cells=cells, cpu_affinity=cpu, numa_affinity=numa)


def read_query(path: Path) -> list[dict[str, str]]:
    """`nvidia-smi --query-gpu=... --format=csv` as rows keyed by the query's names."""
    rows = list(csv.reader(path.read_text().splitlines(), skipinitialspace=True))
    names = [re.sub(r"\s*\[.*\]$", "", h.strip()) for h in rows[0]]
    return [dict(zip(names, (v.strip() for v in row), strict=True)) for row in rows[1:]]
