"""The GPUNode status, computed whole from one loop's observations.

Pure: ``compute_status`` takes the NVML read (or why there is none), the power outcome,
the probe result and the previous status, and returns the entire new status. Nothing is
accumulated across loops except what must be: the transition times of conditions whose
status held, the power records (the originals to restore) and the last probe's result.

``needs_write`` decides whether the status is worth a write. Temperatures, power draw,
current clocks and the current PCIe generation move on every read; writing each change
would turn every agent into a steady stream of API writes. So a status is written when
anything else changed (a condition, a limit, a GPU, a link, a probe result), and at the
latest every ``refresh`` interval so the moving readings stay roughly current.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from vllm_operator.agent import conditions as cond
from vllm_operator.agent.inventory import inventory
from vllm_operator.agent.readings import NvmlCallError, NvmlSnapshot
from vllm_operator.models.gpu_node import AppliedPower, BandwidthProbe, GPUNodeStatus


def compute_status(
    *,
    snapshot: NvmlSnapshot | None,
    nvml_error: NvmlCallError | None,
    previous: GPUNodeStatus | None,
    power_records: Sequence[AppliedPower] | None,
    power_fact: cond.Fact | None,
    bandwidth: BandwidthProbe | None,
    generation: int | None,
    now: datetime,
) -> GPUNodeStatus:
    """The whole status for this loop.

    Without a snapshot (NVML failed) the last inventory is kept, marked stale by
    ``Ready=False`` and an unchanged ``lastUpdated``: a transient NVML failure must not
    make the node look GPU-less to the scheduler.
    """
    prev = previous or GPUNodeStatus()
    records = list(power_records) if power_records is not None else list(prev.power)
    probe = bandwidth if bandwidth is not None else prev.bandwidth
    if snapshot is None:
        reason = nvml_error.reason if nvml_error else "NvmlUnavailable"
        message = nvml_error.message if nvml_error else "NVML was not read"
        if prev.last_updated is not None:
            message += f"; inventory below is from {prev.last_updated.isoformat()}"
        facts = [
            cond.Fact(cond.READY, "False", reason, message),
            *(c for c in _kept(prev, exclude={cond.READY, cond.POWER_POLICY_APPLIED})),
            power_fact or cond.Fact(cond.POWER_POLICY_APPLIED, "Unknown", reason, message),
        ]
        return prev.model_copy(
            update={
                "observed_generation": generation,
                "conditions": cond.merge(prev.conditions, facts, now=now, generation=generation),
                "power": records,
                "bandwidth": probe,
            }
        )
    inv = inventory(snapshot)
    devices = snapshot.devices
    facts = [
        cond.ready(devices, None),
        cond.power_capped(devices, records),
        cond.link_degraded(devices),
        cond.clocks_throttled(devices),
    ]
    if power_fact is not None:
        facts.append(power_fact)
    return GPUNodeStatus(
        observed_generation=generation,
        conditions=cond.merge(prev.conditions, facts, now=now, generation=generation),
        driver_version=inv.driver_version,
        cuda_version=inv.cuda_version,
        gpus=inv.gpus,
        gpu_count=len(inv.gpus),
        links=inv.links,
        interconnect=inv.interconnect,
        bandwidth=probe,
        power=records,
        last_updated=now,
    )


def _kept(prev: GPUNodeStatus, *, exclude: set[str]) -> list[cond.Fact]:
    return [
        cond.Fact(c.type, c.status, c.reason, c.message)
        for c in prev.conditions
        if c.type not in exclude
    ]


# Readings that move on every read; see the module docstring.
_MOVING_GPU_FIELDS = ("temperatureCelsius",)
_MOVING_NESTED = {"power": ("draw",), "clocks": ("sm", "memory"), "pcie": ("generation",)}


def stable_view(status: GPUNodeStatus | None) -> dict[str, Any]:
    """The status without its moving readings and timestamps, for comparison."""
    if status is None:
        return {}
    data = status.to_wire()
    data.pop("lastUpdated", None)
    for gpu in data.get("gpus", []):
        for key in _MOVING_GPU_FIELDS:
            gpu.pop(key, None)
        for part, keys in _MOVING_NESTED.items():
            for key in keys:
                gpu.get(part, {}).pop(key, None)
    return data


def needs_write(
    new: GPUNodeStatus,
    written: GPUNodeStatus | None,
    *,
    written_at: datetime | None,
    now: datetime,
    refresh: timedelta,
) -> bool:
    """Whether ``new`` is worth writing over what was written last."""
    if written is None or written_at is None:
        return True
    if stable_view(new) != stable_view(written):
        return True
    return now - written_at >= refresh
