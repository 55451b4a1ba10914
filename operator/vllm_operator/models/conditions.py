"""Conditions: the one home of their rules, for every writer and reader of them. The
operator's reconciles (InferenceService, InferenceBenchmark, ModelCache), the node agent's
GPUNode facts and the warmup's readiness gate on a server pod all set them here, and every
lookup of one, in our models or in any object as served (pods, Jobs, Deployments, HPAs),
is here too. It sits in the models layer because the node agent, which may not import the
operator's reconcile (pyproject's contracts), writes conditions too.

The one rule of a setter: a condition keeps its ``lastTransitionTime`` while its status
does not change, so a status computed again and again equals the last one unless
something really changed (and is not written again).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Final

from vllm_operator.models.base import (
    CONDITION_MESSAGE_MAX,
    Condition,
    ConditionStatus,
    Manifest,
)


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
    same, so a status computed again and again does not look like a change. A message
    longer than metav1.Condition allows (32 KiB) is cut, marked at its end, so that a long
    error (an apiserver's, a Job's log) never makes the status write itself fail."""
    value: ConditionStatus = ("True" if status else "False") if isinstance(status, bool) else status
    old = find(previous, type_)
    since = old.last_transition_time if old is not None and old.status == value else now
    return Condition(
        type=type_,
        status=value,
        reason=reason,
        message=clip_message(message),
        last_transition_time=since,
        observed_generation=generation,
    )


CLIPPED: Final = " [cut]"


def clip_message(message: str) -> str:
    """``message`` within metav1.Condition's limit, its end marked when cut."""
    if len(message) <= CONDITION_MESSAGE_MAX:
        return message
    return message[: CONDITION_MESSAGE_MAX - len(CLIPPED)] + CLIPPED


def find(conditions: Iterable[Condition], type_: str) -> Condition | None:
    """The condition ``type_`` among ours, if there is one."""
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


def manifest_condition_update(
    obj: Manifest, type_: str, status: bool, reason: str, message: str, *, now: datetime
) -> dict[str, Any] | None:
    """The condition ``type_`` to set on an object as served (a readiness gate on a pod's
    status), in its wire form; None when the object says that already. Its transition time
    is the object's own while the status holds."""
    old = manifest_condition(obj, type_)
    value = "True" if status else "False"
    if old and (old.get("status"), old.get("reason"), old.get("message")) == (
        value,
        reason,
        message,
    ):
        return None
    since = old["lastTransitionTime"] if old and old.get("status") == value else now
    stamp = since if isinstance(since, str) else since.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": stamp,
    }
