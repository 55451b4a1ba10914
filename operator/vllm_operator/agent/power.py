"""Power policy: from the GPUNode's spec and the observed limits to the set-calls to make.

Pure. ``plan`` compares, for every GPU, the limit NVML reports with the limit the policy
asks for, and returns the set-calls that close the gap and the records to keep on the
status. ``outcome`` takes what actually happened to those calls and returns the records
and the ``PowerPolicyApplied`` condition. The loop does the I/O in between.

The rules, each for a reason:

- The comparison runs every loop, not once: a reboot or a driver reload puts the board's
  own limit back, and the next loop puts the policy's limit back.
- The limit found before the agent first changed a GPU is recorded on the GPUNode status
  (``status.power[].originalWatts``), so it survives a restart of the agent, and is
  restored when the policy returns to ``Unmanaged`` (and on the agent's shutdown).
- ``Watts`` is clamped to the GPU's allowed range, and the clamp is reported.
- A dry run plans the same calls and reports them as what it would do; the loop makes
  none. It never rewrites a record a real run left, so a later real run can still restore.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from vllm_operator.agent.conditions import POWER_POLICY_APPLIED, Fact
from vllm_operator.agent.readings import DeviceReading, NvmlCallError
from vllm_operator.models.gpu_node import AppliedPower, PowerPolicy, PowerSpec


@dataclass(frozen=True)
class PowerAction:
    """One set-call: GPU ``index`` from its present limit to ``to_milliwatts``."""

    index: int
    uuid: str
    from_milliwatts: int | None
    to_milliwatts: int
    purpose: Literal["Apply", "Restore"]


@dataclass(frozen=True)
class PowerPlan:
    """What to set, and what to record if every call succeeds."""

    policy: PowerPolicy
    dry_run: bool
    actions: tuple[PowerAction, ...]
    records: tuple[AppliedPower, ...]
    previous: tuple[AppliedPower, ...]
    notes: tuple[str, ...] = ()


def _mw(watts: float) -> int:
    return round(watts * 1000)


def _w(milliwatts: int | None) -> str:
    return "unknown" if milliwatts is None else f"{milliwatts / 1000:g} W"


def target_milliwatts(spec: PowerSpec, device: DeviceReading) -> tuple[int | None, str | None]:
    """The limit the policy asks of this GPU, and a note when it had to be adjusted."""
    name = f"GPU {device.index}"
    if spec.policy == "Default":
        if device.default_power_limit_mw is None:
            return None, f"{name}: default limit unknown; left as found"
        return device.default_power_limit_mw, None
    if spec.policy == "Max":
        if device.power_max_mw is None:
            return None, f"{name}: maximum limit unknown; left as found"
        return device.power_max_mw, None
    if spec.policy == "Watts" and spec.watts is not None:
        wanted = spec.watts * 1000
        low, high = device.power_min_mw, device.power_max_mw
        if low is not None and wanted < low:
            return low, f"{name}: {spec.watts} W is below the minimum {_w(low)}; using {_w(low)}"
        if high is not None and wanted > high:
            return high, f"{name}: {spec.watts} W is above the maximum {_w(high)}; using {_w(high)}"
        return wanted, None
    return None, None


def plan(
    spec: PowerSpec,
    devices: Sequence[DeviceReading],
    recorded: Sequence[AppliedPower],
    *,
    dry_run: bool,
) -> PowerPlan:
    """The set-calls that bring every GPU to the policy, and the records to keep."""
    by_uuid = {r.uuid: r for r in recorded}
    present = {d.uuid for d in devices}
    actions: list[PowerAction] = []
    records: list[AppliedPower] = []
    notes: list[str] = []
    for device in sorted(devices, key=lambda d: d.index):
        record = by_uuid.get(device.uuid)
        # Only a real run's record says "the agent changed this GPU"; a dry run's does not.
        real = record if record is not None and not record.dry_run else None
        current = device.power_limit_mw
        if spec.policy == "Unmanaged":
            if real is None:
                continue  # never changed by us (or only in a dry run): nothing to restore
            original_mw = _mw(real.original_watts)
            if current != original_mw:
                actions.append(
                    PowerAction(device.index, device.uuid, current, original_mw, "Restore")
                )
                if dry_run:
                    records.append(real)  # still changed; a real run must restore it
            continue
        if current is None:
            notes.append(f"GPU {device.index}: power limit not readable; left as found")
            if record is not None:
                records.append(record)
            continue
        target, note = target_milliwatts(spec, device)
        if note:
            notes.append(note)
        if target is None:
            if record is not None:
                records.append(record)
            continue
        if current != target:
            actions.append(PowerAction(device.index, device.uuid, current, target, "Apply"))
        if dry_run and real is not None:
            records.append(real)  # leave what a real run recorded untouched
            continue
        original = real.original_watts if real is not None else current / 1000
        records.append(
            AppliedPower(
                uuid=device.uuid,
                original_watts=original,
                applied_watts=target / 1000,
                dry_run=dry_run,
            )
        )
    # A GPU that is gone from NVML (fallen off the bus) keeps its record until it is back.
    records.extend(r for r in recorded if r.uuid not in present and not r.dry_run)
    return PowerPlan(
        policy=spec.policy,
        dry_run=dry_run,
        actions=tuple(actions),
        records=tuple(records),
        previous=tuple(recorded),
        notes=tuple(notes),
    )


def outcome(
    power_plan: PowerPlan, failures: Mapping[int, NvmlCallError]
) -> tuple[list[AppliedPower], Fact]:
    """The records and the PowerPolicyApplied condition once the calls were made.

    ``failures`` maps a GPU index to the error its set-call raised; a GPU whose call failed
    keeps the record it had before, since nothing changed on it.
    """
    failed_uuids = {a.uuid for a in power_plan.actions if a.index in failures}
    before = {r.uuid: r for r in power_plan.previous}
    records = [r for r in power_plan.records if r.uuid not in failed_uuids]
    records.extend(before[u] for u in sorted(failed_uuids) if u in before)
    records.sort(key=lambda r: r.uuid)
    return records, _fact(power_plan, failures)


def _describe(action: PowerAction, *, done: bool) -> str:
    if action.purpose == "Restore":
        verb = "restored" if done else "restore"
    else:
        verb = "changed" if done else "set"
    frm, to = _w(action.from_milliwatts), _w(action.to_milliwatts)
    return f"{verb} GPU {action.index} from {frm} to {to}"


def _fact(power_plan: PowerPlan, failures: Mapping[int, NvmlCallError]) -> Fact:
    notes = list(power_plan.notes)
    if failures:
        first = failures[min(failures)]
        parts = [f"GPU {i}: {failures[i].message}" for i in sorted(failures)]
        return Fact(POWER_POLICY_APPLIED, "False", first.reason, "; ".join(parts + notes))
    actions = power_plan.actions
    if power_plan.dry_run and actions:
        message = "dry run: would " + "; would ".join(_describe(a, done=False) for a in actions)
        return Fact(POWER_POLICY_APPLIED, "False", "DryRun", "; ".join([message, *notes]))
    if power_plan.policy == "Unmanaged":
        if actions:
            message = "; ".join(_describe(a, done=True) for a in actions)
            return Fact(POWER_POLICY_APPLIED, "True", "Restored", message)
        return Fact(POWER_POLICY_APPLIED, "True", "Unmanaged", "power limits are left as found")
    if actions:
        message = "; ".join(_describe(a, done=True) for a in actions)
    else:
        message = f"every GPU is at the limit the {power_plan.policy} policy asks for"
    if power_plan.dry_run:
        message = "dry run: " + message
    return Fact(POWER_POLICY_APPLIED, "True", "Applied", "; ".join([message, *notes]))
