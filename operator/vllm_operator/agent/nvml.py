"""NVML readers: the agent's only way to the GPUs' state and power limits.

``NvmlReader`` is the small protocol the rest of the agent uses: one call that reads the
whole node into an ``NvmlSnapshot``, and one that sets a power limit. Three readers:

- ``PynvmlReader`` talks to the real NVML through ``pynvml`` (the ``nvidia-ml-py``
  package), imported lazily so that a node without the driver, or a development machine
  without the package, yields an ``NvmlUnavailable`` condition rather than a crash.
- ``FixtureReader`` answers from a recorded or hand-built answer set (JSON or YAML), and
  records every set-call to a file as JSON lines, so tests and local runs can check what
  the agent would have done to real GPUs.
- ``ReadOnlyReader`` wraps another and refuses every set: ``--dry-run`` uses it, so a
  dry run cannot change a GPU even through a bug in the decision logic.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from vllm_operator.agent.readings import (
    REASON_GPU_LOST,
    REASON_NO_PERMISSION,
    REASON_NOT_SUPPORTED,
    REASON_NVML_ERROR,
    REASON_NVML_UNAVAILABLE,
    REASON_OUT_OF_RANGE,
    DeviceReading,
    NvLinkReading,
    NvmlCallError,
    NvmlSnapshot,
    PairReading,
    load_answer_file,
    snapshot_from_data,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

# nvmlNvLinkDeviceType_t values, as names.
_NVLINK_REMOTE_TYPES = {0: "GPU", 1: "IBMNPU", 2: "Switch", 0xFF: "Unknown"}

# The set-call as it appears in recordings: NVML's own function name.
SET_POWER_LIMIT_CALL = "nvmlDeviceSetPowerManagementLimit"


class NvmlReader(Protocol):
    """What the agent needs from NVML."""

    def snapshot(self) -> NvmlSnapshot:
        """Read every GPU of the node. Raises NvmlCallError when NVML cannot be used."""
        ...

    def set_power_limit(self, index: int, milliwatts: int) -> None:
        """Set a GPU's power limit. Raises NvmlCallError with a classified reason."""
        ...

    def close(self) -> None:
        """Release NVML."""
        ...


def classify(error: BaseException) -> NvmlCallError:
    """Turn a pynvml error into an NvmlCallError with a condition reason, once."""
    if isinstance(error, NvmlCallError):
        return error
    value = getattr(error, "value", None)
    # NVML_ERROR_* codes (nvml.h); compared by value so this module needs no pynvml import.
    reason = {
        1: REASON_NVML_UNAVAILABLE,  # UNINITIALIZED
        2: REASON_OUT_OF_RANGE,  # INVALID_ARGUMENT: what a set out of min/max answers
        3: REASON_NOT_SUPPORTED,
        4: REASON_NO_PERMISSION,
        9: REASON_NVML_UNAVAILABLE,  # DRIVER_NOT_LOADED
        12: REASON_NVML_UNAVAILABLE,  # LIBRARY_NOT_FOUND
        13: REASON_NOT_SUPPORTED,  # FUNCTION_NOT_FOUND: older driver
        15: REASON_GPU_LOST,
    }.get(value if isinstance(value, int) else -1, REASON_NVML_ERROR)
    return NvmlCallError(reason, str(error) or type(error).__name__)


def cpu_list(mask_words: list[int], word_bits: int = 64) -> tuple[int, ...]:
    """CPU numbers set in an NVML affinity mask (an array of 64-bit words)."""
    return tuple(
        w * word_bits + bit
        for w, word in enumerate(mask_words)
        for bit in range(word_bits)
        if word >> bit & 1
    )


def sysfs_numa_node(pci_bus_id: str, root: Path = Path("/sys/bus/pci/devices")) -> int | None:
    """NUMA node of a PCI device from sysfs, where nvidia-smi reads it too.

    NVML's nvmlDeviceGetNumaNodeId answers Not Supported on some systems (seen on H200
    with driver 580), while sysfs knows. NVML's bus id has an 8-digit domain
    (00000000:19:00.0); sysfs uses 4 digits, lower case (0000:19:00.0).
    """
    domain, _, rest = pci_bus_id.partition(":")
    name = f"{int(domain, 16):04x}:{rest.lower()}"
    try:
        value = int((root / name / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    # -1 means the platform has no NUMA information for the device.
    return value if value >= 0 else None


class PynvmlReader:
    """The real NVML, through pynvml. Thread-safe: the probe may run beside a read."""

    def __init__(self, *, sysfs_pci: Path = Path("/sys/bus/pci/devices")) -> None:
        self._lock = threading.Lock()
        self._nvml: Any = None
        self._sysfs_pci = sysfs_pci

    def _init(self) -> Any:
        if self._nvml is not None:
            return self._nvml
        try:
            import pynvml
        except ImportError as error:
            raise NvmlCallError(
                REASON_NVML_UNAVAILABLE, f"the nvidia-ml-py package is not installed: {error}"
            ) from error
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            raise classify(error) from error
        self._nvml = pynvml
        return pynvml

    def _reset_on(self, error: NvmlCallError) -> None:
        # After a driver reload NVML's handles are stale; initialise again next time.
        if error.reason in (REASON_NVML_UNAVAILABLE, REASON_GPU_LOST) and self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                log.debug("NVML shutdown failed", exc_info=True)
            self._nvml = None

    def snapshot(self) -> NvmlSnapshot:
        with self._lock:
            nvml = self._init()
            try:
                return self._read(nvml)
            except nvml.NVMLError as raw:
                error = classify(raw)
                self._reset_on(error)
                raise error from raw

    def set_power_limit(self, index: int, milliwatts: int) -> None:
        with self._lock:
            nvml = self._init()
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                nvml.nvmlDeviceSetPowerManagementLimit(handle, milliwatts)
            except nvml.NVMLError as raw:
                error = classify(raw)
                self._reset_on(error)
                raise error from raw

    def close(self) -> None:
        with self._lock:
            if self._nvml is not None:
                try:
                    self._nvml.nvmlShutdown()
                finally:
                    self._nvml = None

    # --- reading --------------------------------------------------------------------------

    def _read(self, nvml: Any) -> NvmlSnapshot:
        errors: dict[str, str] = {}
        driver = _get(errors, "driver_version", lambda: _text(nvml.nvmlSystemGetDriverVersion()))
        cuda = _get(
            errors, "cuda_driver_version", lambda: int(nvml.nvmlSystemGetCudaDriverVersion())
        )
        nvml_version = _get(errors, "nvml_version", lambda: _text(nvml.nvmlSystemGetNVMLVersion()))
        count = int(nvml.nvmlDeviceGetCount())
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        devices = tuple(self._device(nvml, i, h) for i, h in enumerate(handles))
        pairs = tuple(
            self._pair(nvml, a, b, handles[a], handles[b])
            for a in range(count)
            for b in range(a + 1, count)
        )
        return NvmlSnapshot(
            driver_version=driver,
            cuda_driver_version=cuda,
            nvml_version=nvml_version,
            devices=devices,
            pairs=pairs,
            errors=errors,
        )

    def _device(self, nvml: Any, index: int, h: Any) -> DeviceReading:
        e: dict[str, str] = {}
        bus_id = _text(nvml.nvmlDeviceGetPciInfo(h).busId)

        def cc() -> str:
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(h)
            return f"{int(major)}.{int(minor)}"

        def limits() -> tuple[int, int]:
            low, high = nvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
            return int(low), int(high)

        def reasons() -> int:
            # Renamed from "throttle" to "clocks event" reasons in newer NVML; same bits.
            if hasattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons"):
                return int(nvml.nvmlDeviceGetCurrentClocksEventReasons(h))
            return int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))

        def numa_affinity() -> tuple[int, ...]:
            # Scope 0 is NVML_AFFINITY_SCOPE_NODE: NUMA nodes, not sockets. 16 words, as below.
            return cpu_list([int(w) for w in nvml.nvmlDeviceGetMemoryAffinity(h, 16, 0)])

        def affinity() -> tuple[int, ...]:
            # Enough 64-bit words for every CPU: a host may have more than this process sees.
            words = max(16, -(-(os.cpu_count() or 1) // 64))
            return cpu_list([int(w) for w in nvml.nvmlDeviceGetCpuAffinity(h, words)])

        constraints = _get(e, "power_constraints", limits)
        numa = _get(e, "numa_node", lambda: int(nvml.nvmlDeviceGetNumaNodeId(h)))
        if numa is None:
            numa = sysfs_numa_node(bus_id, self._sysfs_pci)
            if numa is not None:
                e["numa_node"] = e["numa_node"] + " (read from sysfs instead)"
        return DeviceReading(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(h)),
            name=_text(nvml.nvmlDeviceGetName(h)),
            pci_bus_id=bus_id,
            memory_total_bytes=_get(
                e, "memory_total_bytes", lambda: int(nvml.nvmlDeviceGetMemoryInfo(h).total)
            ),
            memory_bus_width_bits=_get(
                e, "memory_bus_width_bits", lambda: int(nvml.nvmlDeviceGetMemoryBusWidth(h))
            ),
            compute_capability=_get(e, "compute_capability", cc),
            power_limit_mw=_get(
                e, "power_limit_mw", lambda: int(nvml.nvmlDeviceGetPowerManagementLimit(h))
            ),
            enforced_power_limit_mw=_get(
                e, "enforced_power_limit_mw", lambda: int(nvml.nvmlDeviceGetEnforcedPowerLimit(h))
            ),
            default_power_limit_mw=_get(
                e,
                "default_power_limit_mw",
                lambda: int(nvml.nvmlDeviceGetPowerManagementDefaultLimit(h)),
            ),
            power_min_mw=constraints[0] if constraints else None,
            power_max_mw=constraints[1] if constraints else None,
            power_usage_mw=_get(e, "power_usage_mw", lambda: int(nvml.nvmlDeviceGetPowerUsage(h))),
            clock_sm_mhz=_get(
                e, "clock_sm_mhz", lambda: int(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
            ),
            clock_sm_max_mhz=_get(
                e,
                "clock_sm_max_mhz",
                lambda: int(nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM)),
            ),
            clock_mem_mhz=_get(
                e,
                "clock_mem_mhz",
                lambda: int(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM)),
            ),
            clock_mem_max_mhz=_get(
                e,
                "clock_mem_max_mhz",
                lambda: int(nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_MEM)),
            ),
            clock_event_reasons=_get(e, "clock_event_reasons", reasons),
            temperature_c=_get(
                e,
                "temperature_c",
                lambda: int(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
            ),
            pcie_generation=_get(
                e, "pcie_generation", lambda: int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(h))
            ),
            # The highest generation both the GPU and the slot it sits in allow.
            pcie_max_generation=_get(
                e, "pcie_max_generation", lambda: int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(h))
            ),
            pcie_width=_get(e, "pcie_width", lambda: int(nvml.nvmlDeviceGetCurrPcieLinkWidth(h))),
            pcie_max_width=_get(
                e, "pcie_max_width", lambda: int(nvml.nvmlDeviceGetMaxPcieLinkWidth(h))
            ),
            numa_node=numa,
            numa_affinity=_get(e, "numa_affinity", numa_affinity),
            cpu_affinity=_get(e, "cpu_affinity", affinity),
            nvlinks=self._nvlinks(nvml, h, e),
            errors=e,
        )

    def _nvlinks(self, nvml: Any, h: Any, e: dict[str, str]) -> tuple[NvLinkReading, ...]:
        links: list[NvLinkReading] = []
        for link in range(int(nvml.NVML_NVLINK_MAX_LINKS)):
            try:
                active = bool(nvml.nvmlDeviceGetNvLinkState(h, link))
            except nvml.NVMLError as raw:
                # A GPU answers for the links it has and Not Supported / Invalid Argument
                # past them; only a failure on link 0 says the GPU has no NVLink at all.
                if link == 0:
                    e["nvlinks"] = str(raw)
                break
            if not active:
                links.append(NvLinkReading(link=link, active=False))
                continue
            links.append(self._nvlink(nvml, h, link, e))
        return tuple(links)

    def _nvlink(self, nvml: Any, h: Any, link: int, e: dict[str, str]) -> NvLinkReading:
        le: dict[str, str] = {}
        remote = _get(
            le, "remote", lambda: _text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
        )
        kind = _get(le, "type", lambda: int(nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, link)))
        version = _get(le, "version", lambda: int(nvml.nvmlDeviceGetNvLinkVersion(h, link)))
        for key, message in le.items():
            e[f"nvlinks.{link}.{key}"] = message
        return NvLinkReading(
            link=link,
            active=True,
            remote_pci_bus_id=remote,
            remote_device_type=None if kind is None else _NVLINK_REMOTE_TYPES.get(kind),
            version=version,
        )

    def _pair(self, nvml: Any, a: int, b: int, ha: Any, hb: Any) -> PairReading:
        e: dict[str, str] = {}
        ancestor = _get(
            e, "common_ancestor", lambda: int(nvml.nvmlDeviceGetTopologyCommonAncestor(ha, hb))
        )
        # Pass the NVLink index as a plain int: pynvml spells NVML_P2P_CAPS_INDEX_READ with a
        # trailing comma (a tuple), so the named constants are not all safe to pass.
        p2p = _get(
            e,
            "p2p_nvlink",
            lambda: int(nvml.nvmlDeviceGetP2PStatus(ha, hb, 2)) == 0,
        )
        return PairReading(a=a, b=b, common_ancestor=ancestor, p2p_nvlink=p2p, errors=e)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _get(errors: dict[str, str], name: str, read: Callable[[], T]) -> T | None:
    """One NVML field: its value, or None with the reason kept in ``errors``."""
    try:
        return read()
    except Exception as raw:
        error = classify(raw)
        if error.reason in (REASON_NVML_UNAVAILABLE, REASON_GPU_LOST):
            raise error from raw  # the whole read is void, not just this field
        errors[name] = error.message
        return None


class FixtureReader:
    """Answers from a recorded or hand-built answer set, recording every set-call.

    The file is an ``NvmlSnapshot`` as JSON or YAML (what ``--dump-nvml`` writes), plus two
    optional keys that make faults reproducible: ``unavailable`` (a message: every read
    fails as if NVML were missing) and ``set_power_limit_error`` (a reason such as
    ``NoPermission``: every set fails with it). A set that succeeds changes the limits the
    next read returns, as the real driver would. When the file changes on disk it is read
    again, as after a driver reload: limits go back to what the file says.
    """

    def __init__(self, path: Path, *, record: Path | None = None) -> None:
        self._path = path
        self._record = record
        self._lock = threading.Lock()
        self._mtime: float | None = None
        self._snapshot = NvmlSnapshot()
        self._unavailable: str | None = None
        self._set_error: str | None = None
        self._load()

    def _load(self) -> None:
        mtime = self._path.stat().st_mtime
        if mtime == self._mtime:
            return
        data = load_answer_file(self._path)
        unavailable = data.pop("unavailable", None)
        set_error = data.pop("set_power_limit_error", None)
        self._snapshot = snapshot_from_data(data)
        self._unavailable = None if unavailable is None else str(unavailable)
        self._set_error = None if set_error is None else str(set_error)
        self._mtime = mtime

    def snapshot(self) -> NvmlSnapshot:
        with self._lock:
            self._load()
            if self._unavailable is not None:
                raise NvmlCallError(REASON_NVML_UNAVAILABLE, self._unavailable)
            return self._snapshot

    def set_power_limit(self, index: int, milliwatts: int) -> None:
        with self._lock:
            self._load()
            if self._unavailable is not None:
                raise NvmlCallError(REASON_NVML_UNAVAILABLE, self._unavailable)
            device = self._snapshot.device(index)
            if device is None:
                raise NvmlCallError(REASON_NVML_ERROR, f"no GPU with index {index}")
            outcome = self._set_error
            low, high = device.power_min_mw, device.power_max_mw
            if outcome is None and (
                (low is not None and milliwatts < low) or (high is not None and milliwatts > high)
            ):
                outcome = REASON_OUT_OF_RANGE
            self._write_record(
                {
                    "call": SET_POWER_LIMIT_CALL,
                    "index": index,
                    "uuid": device.uuid,
                    "milliwatts": milliwatts,
                    "error": outcome,
                }
            )
            if outcome is not None:
                raise NvmlCallError(outcome, f"{SET_POWER_LIMIT_CALL} failed: {outcome}")
            changed = dataclasses.replace(
                device, power_limit_mw=milliwatts, enforced_power_limit_mw=milliwatts
            )
            self._snapshot = dataclasses.replace(
                self._snapshot,
                devices=tuple(changed if d.index == index else d for d in self._snapshot.devices),
            )

    def _write_record(self, entry: dict[str, Any]) -> None:
        if self._record is None:
            return
        with self._record.open("a") as out:
            out.write(json.dumps(entry, sort_keys=True) + "\n")

    def close(self) -> None:
        pass


class ReadOnlyReader:
    """Another reader with every set refused: the dry run's guarantee."""

    def __init__(self, inner: NvmlReader) -> None:
        self._inner = inner

    def snapshot(self) -> NvmlSnapshot:
        return self._inner.snapshot()

    def set_power_limit(self, index: int, milliwatts: int) -> None:
        raise RuntimeError(f"refused to set GPU {index} to {milliwatts} mW: read-only (dry run)")

    def close(self) -> None:
        self._inner.close()


def read_recorded_calls(path: Path) -> list[dict[str, Any]]:
    """The set-calls a FixtureReader recorded, oldest first."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
