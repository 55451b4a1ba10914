"""A stand-in for the ``pynvml`` module that answers from an ``NvmlSnapshot``.

It lets ``PynvmlReader`` (the real adapter) run without a GPU: every function it calls is
here under pynvml's own name, answering what the snapshot says, and raising pynvml's own
``NVMLError`` (with NVML's code) where the snapshot has no value. A test checks that every
name defined here exists in the real pynvml, so a misspelt NVML call fails in the unit
tier rather than on a GPU machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pynvml as real

from vllm_operator.agent.readings import DeviceReading, NvmlSnapshot

NOT_SUPPORTED = 3
INVALID_ARGUMENT = 2

NVMLError = real.NVMLError
NVML_CLOCK_SM = real.NVML_CLOCK_SM
NVML_CLOCK_MEM = real.NVML_CLOCK_MEM
NVML_TEMPERATURE_GPU = real.NVML_TEMPERATURE_GPU
NVML_NVLINK_MAX_LINKS = real.NVML_NVLINK_MAX_LINKS

_TYPES = {"GPU": 0, "IBMNPU": 1, "Switch": 2, "Unknown": 0xFF}


@dataclass
class Handle:
    device: DeviceReading


class FakePynvml:
    """Module-like: install with ``monkeypatch.setitem(sys.modules, "pynvml", fake)``."""

    NVMLError = real.NVMLError
    NVML_CLOCK_SM = real.NVML_CLOCK_SM
    NVML_CLOCK_MEM = real.NVML_CLOCK_MEM
    NVML_TEMPERATURE_GPU = real.NVML_TEMPERATURE_GPU
    NVML_NVLINK_MAX_LINKS = real.NVML_NVLINK_MAX_LINKS

    def __init__(self, snapshot: NvmlSnapshot, *, init_error: int | None = None) -> None:
        self.snapshot = snapshot
        self.init_error = init_error
        self.set_calls: list[tuple[int, int]] = []
        self.initialised = 0

    # --- helpers ------------------------------------------------------------------------

    @staticmethod
    def _value(value: Any, code: int = NOT_SUPPORTED) -> Any:
        if value is None:
            raise real.NVMLError(code)
        return value

    def _pair(self, a: Handle, b: Handle) -> Any:
        i, j = sorted((a.device.index, b.device.index))
        return next(p for p in self.snapshot.pairs if (p.a, p.b) == (i, j))

    # --- system -------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise real.NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(self._value(self.snapshot.driver_version))

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return int(self._value(self.snapshot.cuda_driver_version))

    def nvmlSystemGetNVMLVersion(self) -> str:
        return str(self._value(self.snapshot.nvml_version))

    def nvmlDeviceGetCount(self) -> int:
        return len(self.snapshot.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        return Handle(self.snapshot.devices[index])

    # --- device -------------------------------------------------------------------------

    def nvmlDeviceGetPciInfo(self, h: Handle) -> Any:
        return SimpleNamespace(busId=h.device.pci_bus_id.encode())  # bytes, as old pynvml

    def nvmlDeviceGetUUID(self, h: Handle) -> str:
        return h.device.uuid

    def nvmlDeviceGetName(self, h: Handle) -> str:
        return h.device.name

    def nvmlDeviceGetMemoryInfo(self, h: Handle) -> Any:
        return SimpleNamespace(total=self._value(h.device.memory_total_bytes))

    def nvmlDeviceGetMemoryBusWidth(self, h: Handle) -> int:
        return int(self._value(h.device.memory_bus_width_bits))

    def nvmlDeviceGetCudaComputeCapability(self, h: Handle) -> tuple[int, int]:
        major, minor = str(self._value(h.device.compute_capability)).split(".")
        return int(major), int(minor)

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: Handle) -> list[int]:
        return [self._value(h.device.power_min_mw), self._value(h.device.power_max_mw)]

    def nvmlDeviceGetPowerManagementLimit(self, h: Handle) -> int:
        return int(self._value(h.device.power_limit_mw))

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Handle) -> int:
        return int(self._value(h.device.enforced_power_limit_mw))

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: Handle) -> int:
        return int(self._value(h.device.default_power_limit_mw))

    def nvmlDeviceGetPowerUsage(self, h: Handle) -> int:
        return int(self._value(h.device.power_usage_mw))

    def nvmlDeviceGetClockInfo(self, h: Handle, clock: int) -> int:
        d = h.device
        return int(self._value(d.clock_sm_mhz if clock == NVML_CLOCK_SM else d.clock_mem_mhz))

    def nvmlDeviceGetMaxClockInfo(self, h: Handle, clock: int) -> int:
        d = h.device
        value = d.clock_sm_max_mhz if clock == NVML_CLOCK_SM else d.clock_mem_max_mhz
        return int(self._value(value))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Handle) -> int:
        return int(self._value(h.device.clock_event_reasons))

    def nvmlDeviceGetTemperature(self, h: Handle, sensor: int) -> int:
        assert sensor == NVML_TEMPERATURE_GPU
        return int(self._value(h.device.temperature_c))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: Handle) -> int:
        return int(self._value(h.device.pcie_generation))

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: Handle) -> int:
        return int(self._value(h.device.pcie_max_generation))

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: Handle) -> int:
        return int(self._value(h.device.pcie_width))

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: Handle) -> int:
        return int(self._value(h.device.pcie_max_width))

    def nvmlDeviceGetNumaNodeId(self, h: Handle) -> int:
        return int(self._value(h.device.numa_node))

    def nvmlDeviceGetMemoryAffinity(self, h: Handle, words: int, scope: int) -> list[int]:
        assert scope == real.NVML_AFFINITY_SCOPE_NODE
        return self._mask(self._value(h.device.numa_affinity), words)

    @staticmethod
    def _mask(members: tuple[int, ...], words: int) -> list[int]:
        mask = [0] * words
        for m in members:
            mask[m // 64] |= 1 << (m % 64)
        return mask

    def nvmlDeviceGetCpuAffinity(self, h: Handle, words: int) -> list[int]:
        return self._mask(self._value(h.device.cpu_affinity), words)

    def _link(self, h: Handle, link: int) -> Any:
        if not h.device.nvlinks:
            raise real.NVMLError(NOT_SUPPORTED)
        found = next((n for n in h.device.nvlinks if n.link == link), None)
        if found is None:
            raise real.NVMLError(INVALID_ARGUMENT)
        return found

    def nvmlDeviceGetNvLinkState(self, h: Handle, link: int) -> int:
        return int(self._link(h, link).active)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: Handle, link: int) -> Any:
        return SimpleNamespace(busId=self._value(self._link(h, link).remote_pci_bus_id))

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: Handle, link: int) -> int:
        return _TYPES[self._value(self._link(h, link).remote_device_type)]

    def nvmlDeviceGetNvLinkVersion(self, h: Handle, link: int) -> int:
        return int(self._value(self._link(h, link).version))

    def nvmlDeviceGetTopologyCommonAncestor(self, a: Handle, b: Handle) -> int:
        return int(self._value(self._pair(a, b).common_ancestor))

    def nvmlDeviceGetP2PStatus(self, a: Handle, b: Handle, index: int) -> int:
        assert index == 2, "the NVLink capability index"
        ok = self._value(self._pair(a, b).p2p_nvlink)
        return 0 if ok else 5

    def nvmlDeviceSetPowerManagementLimit(self, h: Handle, milliwatts: int) -> None:
        self.set_calls.append((h.device.index, milliwatts))


def nvml_names() -> list[str]:
    """The pynvml names the fake stands in for."""
    return [n for n in vars(FakePynvml) if n.startswith(("nvml", "NVML"))]
