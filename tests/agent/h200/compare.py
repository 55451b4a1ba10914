"""The agent's GPUNode for a captured real machine, set field by field beside nvidia-smi.

A capture folder (made by ``capture.sh`` on the machine) holds nvidia-smi's outputs and
the agent's raw NVML answer set (``nvml.json``). ``compare`` maps that answer set through
the agent's own inventory code and pairs every field with nvidia-smi's value for it.

Readings that move between two reads (temperature, power draw, current SM clock) were
taken a second apart by two programs; they are compared within a stated tolerance. All
else must be equal. Print the table for a capture with:

    .venv/bin/python -m tests.agent.h200.compare tests/agent/fixtures/h200/x2
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.agent.nvidia_smi import read_query, read_topo, read_xml
from vllm_operator.agent.inventory import inventory
from vllm_operator.agent.readings import NvmlSnapshot, load_answer_file, snapshot_from_data
from vllm_operator.agent.topology import topo_cell
from vllm_operator.models.gpu_node import GPUNodeStatus

MIB = 1024 * 1024
# Tolerances for readings that move between the two programs' reads.
TEMPERATURE_C = 3
DRAW_W = 25.0
SM_CLOCK_FRACTION = 0.15


@dataclass(frozen=True)
class Row:
    gpu: str
    field: str
    nvidia_smi: Any
    gpunode: Any
    ok: bool
    note: str = ""


def snapshot(folder: Path) -> NvmlSnapshot:
    return snapshot_from_data(load_answer_file(folder / "nvml.json"))


def agent_status(folder: Path, name: str = "gpunode.json") -> GPUNodeStatus:
    return GPUNodeStatus.model_validate(json.loads((folder / name).read_text())["status"])


def compare(folder: Path) -> list[Row]:
    snap = snapshot(folder)
    inv = inventory(snap)
    smi = read_xml(folder / "nvidia-smi-q.xml")
    topo = read_topo(folder / "nvidia-smi-topo-m.txt")
    query = read_query(folder / "nvidia-smi-query.csv")
    rows: list[Row] = []

    def eq(gpu: str, field: str, want: Any, got: Any) -> None:
        rows.append(Row(gpu, field, want, got, want == got))

    def near(gpu: str, field: str, want: float, got: float | None, tol: float) -> None:
        ok = got is not None and abs(want - got) <= tol
        rows.append(Row(gpu, field, want, got, ok, f"moving reading, within {tol:g}"))

    eq("node", "driverVersion", smi.driver_version, inv.driver_version)
    eq("node", "cudaVersion", smi.cuda_version, inv.cuda_version)
    eq("node", "GPU count", smi.attached_gpus, len(inv.gpus))
    by_bus = {g.bus_id: g for g in smi.gpus}
    for gpu, reading in zip(inv.gpus, sorted(snap.devices, key=lambda d: d.index), strict=True):
        s = by_bus[gpu.pci_bus_id or ""]
        q = query[gpu.index]
        name = f"gpu{gpu.index}"
        assert gpu.power and gpu.clocks and gpu.pcie
        eq(name, "uuid", s.uuid, gpu.uuid)
        eq(name, "product", s.product, gpu.product)
        eq(name, "pciBusId", s.bus_id, gpu.pci_bus_id)
        eq(name, "memory (MiB)", s.memory_mib, (gpu.memory_bytes or 0) // MIB)
        eq(name, "computeCapability", q["compute_cap"], gpu.compute_capability)
        eq(name, "power.current (W)", s.power_current, gpu.power.current)
        eq(name, "requested limit (W)", s.power_requested, (reading.power_limit_mw or 0) / 1000)
        eq(name, "power.default (W)", s.power_default, gpu.power.default)
        eq(name, "power.min (W)", s.power_min, gpu.power.min)
        eq(name, "power.max (W)", s.power_max, gpu.power.max)
        near(name, "power.draw (W)", s.power_draw, gpu.power.draw, DRAW_W)
        near(name, "clocks.sm (MHz)", s.sm_clock, gpu.clocks.sm, s.sm_clock * SM_CLOCK_FRACTION)
        eq(name, "clocks.smMax (MHz)", s.sm_clock_max, gpu.clocks.sm_max)
        eq(name, "clocks.memory (MHz)", s.mem_clock, gpu.clocks.memory)
        eq(name, "clocks.memoryMax (MHz)", s.mem_clock_max, gpu.clocks.memory_max)
        eq(
            name,
            "clocks.throttleReasons",
            [r for r in s.active_reasons if r != "GpuIdle"],
            gpu.clocks.throttle_reasons,
        )
        near(name, "temperature (C)", s.temperature, gpu.temperature_celsius, TEMPERATURE_C)
        eq(name, "pcie.generation", s.pcie_generation, gpu.pcie.generation)
        eq(name, "pcie.maxGeneration", s.pcie_max_generation, gpu.pcie.max_generation)
        eq(name, "pcie.width", s.pcie_width, gpu.pcie.width)
        eq(name, "pcie.maxWidth", s.pcie_max_width, gpu.pcie.max_width)
        eq(name, "cpuAffinity (topo -m)", topo.cpu_affinity[gpu.index], gpu.cpu_affinity)
        numa = topo.numa_affinity[gpu.index]
        eq(name, "numaNode (topo -m NUMA Affinity)", numa, str(gpu.numa_node))
    for link in inv.links:
        eq(
            f"gpu{link.a}-gpu{link.b}",
            "link (topo -m)",
            topo.cells[(link.a, link.b)],
            topo_cell(link),
        )
    return rows


def table(rows: list[Row]) -> str:
    lines = [f"{'gpu':10} {'field':34} {'nvidia-smi':>42} {'GPUNode':>42}  ok"]
    for r in rows:
        mark = "yes" if r.ok else "NO"
        lines.append(
            f"{r.gpu:10} {r.field:34} {r.nvidia_smi!s:>42} {r.gpunode!s:>42}  {mark} {r.note}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(f"== {arg}")
        print(table(compare(Path(arg))))
