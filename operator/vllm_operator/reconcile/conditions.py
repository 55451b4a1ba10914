"""Conditions: ours, which keep their lastTransitionTime while their status does not
change, and the lookup of a condition in any object's status (pods, Jobs, HPAs)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from vllm_operator.models.base import Condition, ConditionStatus, Manifest


def condition(
    type_: str,
    status: bool | ConditionStatus,
    reason: str,
    message: str,
    *,
    now: datetime,
    generation: int | None,
    previous: Iterable[Condition] = (),
) -> Condition:
    """A condition; its transition time is kept from ``previous`` when the status is the
    same, so a status computed again and again does not look like a change."""
    value: ConditionStatus = ("True" if status else "False") if isinstance(status, bool) else status
    old = next((c for c in previous if c.type == type_), None)
    since = old.last_transition_time if old is not None and old.status == value else now
    return Condition(
        type=type_,
        status=value,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    )


def find(conditions: Iterable[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def manifest_condition(obj: Manifest, type_: str) -> dict[str, Any] | None:
    """The condition ``type_`` in an object's ``status.conditions``, as served."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            found: dict[str, Any] = cond
            return found
    return None


def pod_condition(pod: Manifest, type_: str) -> bool:
    """Whether a pod's condition ``type_`` (Ready, ContainersReady, a readiness gate) is True."""
    return (manifest_condition(pod, type_) or {}).get("status") == "True"
