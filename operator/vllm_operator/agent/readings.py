"""The NVML answer set: what NVML said about a node's GPUs, as plain data.

This is the boundary between the agent's I/O and its logic. The real reader
(``agent.nvml.PynvmlReader``) fills these dataclasses from NVML; the fixture reader loads
them from a JSON or YAML file; every pure module (``inventory``, ``topology``,
``conditions``, ``power``, ``probe``) works on them alone. Units are NVML's own
(milliwatts, MHz, bytes), so a recorded answer set is exactly what NVML returned.

A value NVML could not give is ``None``, and the reason is kept in ``errors`` under the
field's name (for example ``"numa_node": "Not Supported"``): a missing value is never
guessed, and the recorded set says why it is missing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import TypeAdapter

# Clock event ("throttle") reasons, NVML's nvmlClocksEventReason* bits.
CLOCK_EVENT_REASONS: Final[dict[int, str]] = {
    0x1: "GpuIdle",
    0x2: "ApplicationsClocksSetting",
    0x4: "SwPowerCap",
    0x8: "HwSlowdown",
    0x10: "SyncBoost",
    0x20: "SwThermalSlowdown",
    0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown",
    0x100: "DisplayClockSetting",
}
CLOCK_EVENT_GPU_IDLE: Final = 0x1

# NVML's nvmlGpuTopologyLevel_t: how far apart two GPUs are on the PCIe tree.
TOPOLOGY_INTERNAL: Final = 0
TOPOLOGY_SINGLE: Final = 10
TOPOLOGY_MULTIPLE: Final = 20
TOPOLOGY_HOSTBRIDGE: Final = 30
TOPOLOGY_NODE: Final = 40
TOPOLOGY_SYSTEM: Final = 50

# Reasons an NVML call failed, as condition reasons (UpperCamelCase facts).
REASON_NVML_UNAVAILABLE: Final = "NvmlUnavailable"
REASON_NO_PERMISSION: Final = "NoPermission"
REASON_OUT_OF_RANGE: Final = "OutOfRange"
REASON_NOT_SUPPORTED: Final = "NotSupported"
REASON_GPU_LOST: Final = "GpuLost"
REASON_NVML_ERROR: Final = "NvmlError"


class NvmlCallError(Exception):
    """An NVML call failed; ``reason`` classifies it once, for conditions."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class NvLinkReading:
    """One NVLink of a GPU."""

    link: int
    active: bool
    # PCI bus id of what is on the other end: a GPU, or an NVSwitch.
    remote_pci_bus_id: str | None = None
    # "GPU", "Switch", "IBMNPU" or "Unknown" (nvmlNvLinkDeviceType_t).
    remote_device_type: str | None = None
    # nvmlNvlinkVersion_t as NVML answered it.
    version: int | None = None


@dataclass(frozen=True)
class DeviceReading:
    """One GPU, as NVML answered. Units are NVML's: mW, MHz, bytes, °C."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    memory_total_bytes: int | None = None
    memory_bus_width_bits: int | None = None
    compute_capability: str | None = None
    # Requested (management) limit: what a set changes and what the power policy compares.
    power_limit_mw: int | None = None
    # Enforced limit: the lowest of every limit in force (what nvidia-smi calls current).
    enforced_power_limit_mw: int | None = None
    default_power_limit_mw: int | None = None
    power_min_mw: int | None = None
    power_max_mw: int | None = None
    power_usage_mw: int | None = None
    clock_sm_mhz: int | None = None
    clock_sm_max_mhz: int | None = None
    clock_mem_mhz: int | None = None
    clock_mem_max_mhz: int | None = None
    clock_event_reasons: int | None = None
    temperature_c: int | None = None
    pcie_generation: int | None = None
    pcie_max_generation: int | None = None
    pcie_width: int | None = None
    pcie_max_width: int | None = None
    # The GPU's own NUMA node (nvmlDeviceGetNumaNodeId, else sysfs); often unknown.
    numa_node: int | None = None
    # NUMA nodes whose memory is closest (nvmlDeviceGetMemoryAffinity, node scope): what
    # `nvidia-smi topo -m` prints as "NUMA Affinity".
    numa_affinity: tuple[int, ...] | None = None
    cpu_affinity: tuple[int, ...] | None = None
    nvlinks: tuple[NvLinkReading, ...] = ()
    errors: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PairReading:
    """How two GPUs reach each other, as NVML answered (a < b)."""

    a: int
    b: int
    # nvmlGpuTopologyLevel_t of the PCIe path; NVLink is read separately, per link.
    common_ancestor: int | None = None
    # nvmlDeviceGetP2PStatus with the NVLink index: True when NVLink P2P is available.
    p2p_nvlink: bool | None = None
    errors: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NvmlSnapshot:
    """Everything NVML said about the node in one read."""

    driver_version: str | None = None
    # nvmlSystemGetCudaDriverVersion: 13000 for CUDA 13.0.
    cuda_driver_version: int | None = None
    nvml_version: str | None = None
    devices: tuple[DeviceReading, ...] = ()
    pairs: tuple[PairReading, ...] = ()
    errors: dict[str, str] = field(default_factory=dict)

    def device(self, index: int) -> DeviceReading | None:
        """The device with this NVML index, if there is one."""
        return next((d for d in self.devices if d.index == index), None)


_SNAPSHOT: Final = TypeAdapter(NvmlSnapshot)


def snapshot_from_data(data: Any) -> NvmlSnapshot:
    """Validate a decoded answer set (JSON or YAML) into a snapshot."""
    return _SNAPSHOT.validate_python(data)


def snapshot_to_data(snapshot: NvmlSnapshot) -> dict[str, Any]:
    """The answer set as JSON-ready data (the format fixture files use)."""
    data: dict[str, Any] = _SNAPSHOT.dump_python(snapshot, mode="json")
    return data


def load_answer_file(path: Path) -> dict[str, Any]:
    """Read a fixture file, JSON or YAML (JSON is YAML, so one parser reads both)."""
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return data


def dump_snapshot(snapshot: NvmlSnapshot) -> str:
    """The answer set as stable, readable JSON."""
    return json.dumps(snapshot_to_data(snapshot), indent=2, sort_keys=True) + "\n"
