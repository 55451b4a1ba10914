"""The status of our kinds that move through phases (InferenceBenchmark, ModelCache): the
three conditions kstatus and Argo CD read, from what the phase means, and the status
written only when it changed, with an event when the phase did."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from vllm_operator.k8s.api import ClusterAPI, apply_status
from vllm_operator.models.base import Condition, Manifest
from vllm_operator.models.conditions import condition, find


class PhasedStatus(Protocol):
    @property
    def phase(self) -> str | None: ...
    @property
    def conditions(self) -> list[Condition]: ...
    def to_wire(self) -> Manifest: ...


def phase_conditions(
    reason: str,
    message: str,
    *,
    ready: bool,
    reconciling: bool,
    stalled: bool,
    now: datetime,
    generation: int | None,
    previous: list[Condition],
) -> list[Condition]:
    """Ready, Reconciling and Stalled, each with the phase's reason and message."""
    return [
        condition(type_, value, reason, message, now=now, generation=generation, previous=previous)
        for type_, value in (("Ready", ready), ("Reconciling", reconciling), ("Stalled", stalled))
    ]


async def write_phase_status(
    api: ClusterAPI, body: Manifest, old: PhasedStatus | None, new: PhasedStatus
) -> bool:
    """Apply ``new`` unless it equals ``old``; an event (a warning when Failed) when the
    phase changed. Whether the phase changed."""
    if old == new:
        return False
    await apply_status(api, body, new.to_wire())
    if new.phase == (old.phase if old else None):
        return False
    ready = find(new.conditions, "Ready")
    assert ready is not None  # phase_conditions made it
    await api.event(
        body,
        reason=ready.reason,
        message=f"Phase {new.phase}: {ready.message}",
        warning=new.phase == "Failed",
    )
    return True
