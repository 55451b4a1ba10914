"""The autoscaler's decision (``next_step``) as a table: a reading in, the step out (the
scale with its deletion costs, status.autoscaling, events, the next reading), with no fake
API and no scrape."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.reconcile.test_autoscale import _metrics
from tests.specs import BASE
from vllm_operator.autoscale.decide import ScalerState
from vllm_operator.models import InferenceService
from vllm_operator.models.base import Manifest
from vllm_operator.reconcile.autoscale import Observed, next_step
from vllm_operator.releases.metrics import parse_metrics

NOW = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
AT = 1000.0


def _service(replicas: int, *, decision: str | None = None, **autoscaling: Any) -> InferenceService:
    body = copy.deepcopy(BASE)
    body["spec"]["replicas"] = replicas
    body["spec"]["autoscaling"] = {
        "enabled": True, "metric": "RequestsRunning", "target": "2", "maxReplicas": 4,
        "periodSeconds": 5, "scaleDownWindowSeconds": 0, **autoscaling,
    }  # fmt: skip
    if decision is not None:
        body["status"] = {
            "autoscaling": {"mode": "Operator", "metric": "RequestsRunning", "target": "2",
                            "decision": decision},
        }  # fmt: skip
    return InferenceService.model_validate(body)


def _pod(name: str) -> Manifest:
    return {"metadata": {"name": name, "namespace": "team-a"}, "status": {"podIP": "10.0.0.1"}}


def _reading(replicas: int, running: list[float], held_by: str | None = None) -> Observed:
    readings = [parse_metrics(f"chat-{i}", _metrics(r)) for i, r in enumerate(running)]
    pods = [_pod(f"chat-{i}") for i in range(len(running))]
    return Observed(AT, ScalerState.seeded(AT - 60, replicas), pods, readings, held_by)


@dataclass(frozen=True)
class Row:
    isvc: InferenceService
    observed: Observed
    decision: str | None  # status.autoscaling.decision; None: no status
    scale_to: int | None
    costs: list[str] = field(default_factory=list)  # pods whose deletion cost is set
    events: list[str] = field(default_factory=list)
    requeue: float | None = 5.0


ROWS = {
    "load above the target scales up": Row(
        _service(1), _reading(1, [7]), "ScaleUp", 4,
    ),
    "idle pods scale down, with deletion costs first": Row(
        _service(2), _reading(2, [0, 0]), "ScaleDown", 1, costs=["chat-0", "chat-1"],
    ),
    "a scale-down under a benchmark's lock is held, and said once": Row(
        _service(2), _reading(2, [0, 0], held_by="load"), "ScaleDownHeld", None,
        events=["ScaleDownHeld"],
    ),
    "a scale-down still held says nothing again": Row(
        _service(2, decision="ScaleDownHeld"), _reading(2, [0, 0], held_by="load"),
        "ScaleDownHeld", None,
    ),
    "a scale-up is not held by the lock": Row(
        _service(1), _reading(1, [7], held_by="load"), "ScaleUp", 4,
    ),
    "load at the target keeps the replicas": Row(
        _service(2), _reading(2, [2, 2]), "Steady", None,
    ),
    "autoscaling off forgets the memory and writes none": Row(
        _service(2, enabled=False), Observed(AT), None, None, requeue=None,
    ),
}  # fmt: skip


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_next_step(row: Row) -> None:
    state_before = copy.deepcopy(row.observed.state)
    step = next_step(row.isvc, row.observed, NOW)
    assert (step.status.decision if step.status else None) == row.decision
    assert (step.scale.replicas if step.scale else None) == row.scale_to
    costs = [pod for pod, _, _ in step.scale.costs] if step.scale else []
    assert costs == row.costs
    assert [e.reason for e in step.events] == row.events
    assert step.requeue == row.requeue
    assert (step.state is None) == (row.decision is None)
    # Pure: the memory it was given is as it was; the new one is the step's.
    assert row.observed.state == state_before
    if step.scale is not None:
        assert step.status is not None and step.status.last_scale_time == NOW
        assert step.scale.refused.decision == "Steady"
        assert step.scale.refused.desired_replicas == row.isvc.spec.replicas


def test_hpa_mode_copies_the_hpas_view() -> None:
    hpa = {
        "metadata": {"name": "chat"},
        "status": {
            "currentReplicas": 2,
            "desiredReplicas": 3,
            "currentMetrics": [{"pods": {"current": {"averageValue": "700m"}}}],
            "conditions": [{"type": "ScalingActive", "status": "True", "message": "ok"}],
        },
    }
    step = next_step(_service(2, mode="HPA"), Observed(AT, hpa=hpa), NOW)
    assert step.status is not None and step.scale is None and step.state is None
    assert (step.status.current_value, step.status.desired_replicas) == ("700m", 3)
    assert (step.status.message, step.requeue) == ("ok", 5.0)
