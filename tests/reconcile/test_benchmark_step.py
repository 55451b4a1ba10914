"""The InferenceBenchmark's decision (``next_step``) as a table: an observation in, the
step out (status, objects to apply and delete, events), with no fake API."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.reconcile.test_benchmark import BENCH, _target
from vllm_operator.models import InferenceBenchmark, InferenceService
from vllm_operator.models.base import Manifest
from vllm_operator.reconcile.benchmark import Observed, next_step
from vllm_operator.reconcile.steps import Ref
from vllm_operator.settings import OperatorSettings

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
SETTINGS = OperatorSettings()


def _bench(phase: str | None = None, chaos: dict[str, Any] | None = None) -> InferenceBenchmark:
    body = copy.deepcopy(BENCH)
    if chaos is not None:
        body["spec"]["chaos"] = chaos
    if phase is not None:
        body["status"] = {"phase": phase, "startTime": "2026-11-29T11:59:00Z"}
    return InferenceBenchmark.model_validate(body)


def _job(state: str | None) -> Manifest:
    status = {"conditions": [{"type": state, "status": "True"}]} if state else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "load-load"},
        "status": status,
    }


def _load_pod(report: dict[str, Any]) -> Manifest:
    message = json.dumps(report)
    return {
        "metadata": {
            "name": "load-load-x",
            "labels": {"batch.kubernetes.io/job-name": "load-load"},
        },
        "status": {"containerStatuses": [{"state": {"terminated": {"message": message}}}]},
    }


@dataclass(frozen=True)
class Row:
    bench: InferenceBenchmark
    observed: Observed
    phase: str
    reason: str | None
    applied: list[str] = field(default_factory=list)  # kind/name in order
    deleted: list[Ref] = field(default_factory=list)
    event: str | None = None


HEADLINE = {"requests": 60, "succeeded": 60, "failed": 0, "requestsPerSecond": 2.0}
NEIGHBOUR = {"ratePerSecond": 2, "noisyNeighbour": {"cpuShare": 0.5}}
READY = InferenceService.model_validate(_target(ready=True))
ROWS = {
    "a benchmark without its target waits for it": Row(
        _bench(), Observed(), "Pending", "TargetNotFound", event="TargetNotFound"
    ),
    "a benchmark of a target that is not Ready waits": Row(
        _bench(),
        Observed(target=InferenceService.model_validate(_target(ready=False))),
        "Pending",
        "TargetNotReady",
        event="TargetNotReady",
    ),
    "a Ready target gets what the load Job needs, then the Job": Row(
        _bench(),
        Observed(target=READY),
        "Running",
        "LoadRunning",
        applied=[
            "ConfigMap/load-spec",
            "ConfigMap/load-results",
            "ServiceAccount/load-load",
            "Role/load-load",
            "RoleBinding/load-load",
            "Job/load-load",
        ],
        event="LoadRunning",
    ),
    "a running load Job is Running, with no event while the phase holds": Row(
        _bench("Running"), Observed(job=_job(None)), "Running", "LoadRunning"
    ),
    "a load Job that succeeded gives the results": Row(
        _bench("Running"),
        Observed(
            job=_job("Complete"),
            load_pods=[_load_pod({"levels": [HEADLINE], "headline": HEADLINE})],
        ),
        "Succeeded",
        "Completed",
        event="Completed",
    ),
    "a load Job that failed takes its noisy neighbour away": Row(
        _bench("Running", chaos=NEIGHBOUR),
        Observed(job=_job("Failed"), load_pods=[_load_pod({"message": "boom"})]),
        "Failed",
        "LoadFailed",
        deleted=[Ref("batch/v1", "Job", "load-neighbour", "team-a")],
        event="LoadFailed",
    ),
    "a load Job that succeeded leaves its neighbour to end on its own": Row(
        _bench("Running", chaos=NEIGHBOUR),
        Observed(job=_job("Complete"), load_pods=[_load_pod({"headline": HEADLINE})]),
        "Succeeded",
        "Completed",
        event="Completed",
    ),
    "a load Job gone while Running lost its results": Row(
        _bench("Running"), Observed(), "Failed", "ResultsLost", event="ResultsLost"
    ),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_next_step(row: Row) -> None:
    step = next_step(row.bench, row.observed, NOW, settings=SETTINGS)
    assert step.phase == row.phase
    assert step.status is not None and step.status.phase == row.phase
    ready = next(c for c in step.status.conditions if c.type == "Ready")
    assert ready.reason == row.reason
    assert [f"{m['kind']}/{m['metadata']['name']}" for m in step.apply] == row.applied
    assert list(step.delete) == row.deleted
    assert [e.reason for e in step.events] == ([row.event] if row.event else [])
    assert all(e.warning == (row.phase == "Failed") for e in step.events)
    if row.phase in ("Succeeded", "Failed"):
        assert step.status.completion_time == NOW


def test_a_finished_benchmark_is_a_record_and_nothing_is_written() -> None:
    step = next_step(_bench("Succeeded"), Observed(job=_job(None)), NOW, settings=SETTINGS)
    assert (step.phase, step.status, step.apply, step.delete) == ("Succeeded", None, (), ())
