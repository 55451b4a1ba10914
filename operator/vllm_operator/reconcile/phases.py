"""The status of our kinds that move through phases (InferenceBenchmark, ModelCache): the
three conditions kstatus and Argo CD read, from what the phase means, and the status
written only when it changed, with an event when the phase did (decided with the rest of
a pass's step, :func:`phase_event`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from vllm_operator.k8s.api import ClusterAPI, apply_status
from vllm_operator.models.base import Condition, Manifest
from vllm_operator.models.conditions import condition, find
from vllm_operator.reconcile.steps import Event, emit


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


def phase_event(old: PhasedStatus | None, new: PhasedStatus) -> Event | None:
    """The event of a pass that changed the phase (a warning when Failed): its Ready
    condition's reason, and the phase with its message; none while the phase holds."""
    if old == new or new.phase == (old.phase if old else None):
        return None
    ready = find(new.conditions, "Ready")
    assert ready is not None  # phase_conditions made it
    return Event(ready.reason, f"Phase {new.phase}: {ready.message}", new.phase == "Failed")


async def write_phase_status(
    api: ClusterAPI,
    body: Manifest,
    old: PhasedStatus | None,
    new: PhasedStatus,
    events: Sequence[Event] = (),
) -> None:
    """Apply ``new`` unless it equals ``old``, then the pass's events."""
    if old == new:
        return
    await apply_status(api, body, new.to_wire())
    await emit(api, body, events)
