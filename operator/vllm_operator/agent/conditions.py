"""Conditions: the field's classic GPU faults, as facts on the GPUNode.

Each function looks at one NVML read and states one fact:

- ``PowerCapped``: a GPU's enforced limit is below its board default (the 450 W card that
  a management layer silently capped at 300 W, whose clocks sat at 1710 MHz, not 2250).
- ``LinkDegraded``: a GPU's PCIe link runs narrower than the slot allows (a x16 card in a
  x8 slot, or a badly seated one), or slower than the link allows while the GPU is busy.
  GPUs drop their PCIe generation when idle to save power, so a lower generation on an
  idle GPU is not a fault and is not counted.
- ``ClocksThrottled``: clocks held down by a power cap, heat or a hardware slowdown.
- ``Ready``: the inventory could be read.

``merge`` turns facts into ``Condition`` objects through the one condition setter
(models/conditions.py), which keeps ``lastTransitionTime`` when a condition's status did
not change, so that a status recomputed every loop is equal to the last one unless
something really changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from vllm_operator.agent.readings import CLOCK_EVENT_GPU_IDLE, DeviceReading
from vllm_operator.models.base import Condition, ConditionStatus
from vllm_operator.models.conditions import condition
from vllm_operator.models.gpu_node import AppliedPower

READY: Final = "Ready"
POWER_CAPPED: Final = "PowerCapped"
LINK_DEGRADED: Final = "LinkDegraded"
CLOCKS_THROTTLED: Final = "ClocksThrottled"
POWER_POLICY_APPLIED: Final = "PowerPolicyApplied"

# Clock event reasons that mean "slower than it could be", most severe first. The rest
# (idle, application clocks, sync boost, display clock) are settings or idleness, not faults.
_THROTTLES: Final = (
    (0x80, "HwPowerBrakeSlowdown"),
    (0x40, "HwThermalSlowdown"),
    (0x8, "HwSlowdown"),
    (0x20, "SwThermalSlowdown"),
    (0x4, "SwPowerCap"),
)


@dataclass(frozen=True)
class Fact:
    """A condition before it has a transition time."""

    type: str
    status: ConditionStatus
    reason: str
    message: str


def _name(device: DeviceReading) -> str:
    return f"GPU {device.index} ({device.name})"


def _w(milliwatts: int) -> str:
    return f"{milliwatts / 1000:g} W"


def ready(devices: Sequence[DeviceReading], error: tuple[str, str] | None) -> Fact:
    """Ready: NVML answered and there is at least one GPU. ``error``: (reason, message)."""
    if error is not None:
        return Fact(READY, "False", error[0], error[1])
    if not devices:
        return Fact(READY, "False", "NoGPUs", "NVML answered but reported no GPUs")
    return Fact(READY, "True", "InventoryRead", f"read {len(devices)} GPU(s) through NVML")


def power_capped(devices: Sequence[DeviceReading], managed: Sequence[AppliedPower] = ()) -> Fact:
    """PowerCapped: an enforced limit below the board default, with both values.

    When the agent itself set that limit (a Watts policy below the default), the fact is
    the same but the reason says who did it.
    """
    ours = {p.uuid: p for p in managed if not p.dry_run and p.applied_watts is not None}
    capped = [
        d
        for d in devices
        if d.enforced_power_limit_mw is not None
        and d.default_power_limit_mw is not None
        and d.enforced_power_limit_mw < d.default_power_limit_mw
    ]
    if not capped:
        known = [d for d in devices if d.enforced_power_limit_mw is not None]
        if devices and not known:
            return Fact(POWER_CAPPED, "Unknown", "PowerLimitUnknown", "NVML gave no power limits")
        return Fact(POWER_CAPPED, "False", "AtDefaultOrAbove", "no GPU is below its default limit")
    by_policy = all(
        d.uuid in ours and round((ours[d.uuid].applied_watts or 0) * 1000) == d.power_limit_mw
        for d in capped
    )
    message = "; ".join(
        f"{_name(d)}: limit {_w(d.enforced_power_limit_mw or 0)}, "
        f"default {_w(d.default_power_limit_mw or 0)}"
        for d in capped
    )
    return Fact(
        POWER_CAPPED,
        "True",
        "CappedByPowerPolicy" if by_policy else "LimitBelowDefault",
        message,
    )


def link_degraded(devices: Sequence[DeviceReading]) -> Fact:
    """LinkDegraded: PCIe narrower than the slot allows, or slower while busy."""
    narrow: list[str] = []
    slow: list[str] = []
    unknown = 0
    for d in devices:
        if d.pcie_width is None or d.pcie_max_width is None:
            unknown += 1
        elif d.pcie_width < d.pcie_max_width:
            narrow.append(f"{_name(d)}: x{d.pcie_width} of x{d.pcie_max_width}")
        idle = d.clock_event_reasons is not None and bool(
            d.clock_event_reasons & CLOCK_EVENT_GPU_IDLE
        )
        if (
            d.pcie_generation is not None
            and d.pcie_max_generation is not None
            and d.pcie_generation < d.pcie_max_generation
            and not idle
            # Unknown idleness: do not accuse the link on a reading that may be power saving.
            and d.clock_event_reasons is not None
        ):
            slow.append(f"{_name(d)}: gen {d.pcie_generation} of gen {d.pcie_max_generation}")
    if narrow or slow:
        reason = "PCIeWidthReduced" if narrow else "PCIeGenerationReduced"
        return Fact(LINK_DEGRADED, "True", reason, "; ".join(narrow + slow))
    if devices and unknown == len(devices):
        return Fact(LINK_DEGRADED, "Unknown", "PCIeLinkUnknown", "NVML gave no PCIe link widths")
    return Fact(LINK_DEGRADED, "False", "AtMaximum", "every PCIe link runs at its full width")


def clocks_throttled(devices: Sequence[DeviceReading]) -> Fact:
    """ClocksThrottled: clocks held down by power, heat or a hardware slowdown."""
    found: list[tuple[int, str, str]] = []
    for d in devices:
        names = [name for bit, name in _THROTTLES if (d.clock_event_reasons or 0) & bit]
        if names:
            rank = next(i for i, (_, n) in enumerate(_THROTTLES) if n == names[0])
            found.append((rank, names[0], f"{_name(d)}: {', '.join(names)}"))
    if not found:
        return Fact(CLOCKS_THROTTLED, "False", "NotThrottled", "no clock slowdown is active")
    found.sort()
    return Fact(CLOCKS_THROTTLED, "True", found[0][1], "; ".join(m for _, _, m in found))


def merge(
    previous: Sequence[Condition],
    facts: Sequence[Fact],
    *,
    now: datetime,
    generation: int | None,
) -> list[Condition]:
    """Conditions for these facts, keeping each one's transition time while its status holds
    (the one setter, models/conditions.py).

    Conditions of other types on ``previous`` are dropped: the agent owns the whole list.
    """
    return [
        condition(f.type, f.status, f.reason, f.message, now=now, generation=generation,
                  previous=previous)
        for f in facts
    ]  # fmt: skip
