"""The InferenceService status as a table: each row an observation and the verdict."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.specs import isvc, plan_for
from vllm_operator.constants import WARMED_UP_CONDITION
from vllm_operator.models.base import Condition
from vllm_operator.models.conditions import find
from vllm_operator.reconcile.status import Observed, Problem, compute_status

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _deployment(
    *, replicas: int, ready: int, updated: int | None = None, gen: int = 1, seen: int = 1
) -> dict[str, Any]:
    return {
        "metadata": {"generation": gen},
        "status": {
            "observedGeneration": seen,
            "replicas": replicas,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "updatedReplicas": replicas if updated is None else updated,
        },
    }


def _pod(*, ready: bool, warmed: bool, running: bool = True) -> dict[str, Any]:
    conds = [
        {"type": "ContainersReady", "status": "True" if running else "False"},
        {"type": "Ready", "status": "True" if ready else "False"},
        {"type": WARMED_UP_CONDITION, "status": "True" if warmed else "False"},
    ]
    return {"metadata": {"name": "p"}, "status": {"conditions": conds}}


ROWS = [
    pytest.param(
        {"warmup": {"enabled": False}},
        {"deployment": _deployment(replicas=1, ready=1)},
        ("True", "AllReplicasReady"),
        id="all replicas ready makes the service Ready",
    ),
    pytest.param(
        {"warmup": {"enabled": False}},
        {"deployment": _deployment(replicas=1, ready=1), "endpoints": 0},
        ("False", "AwaitingEndpoints"),
        id="ready replicas the Service does not route to yet are not Ready",
    ),
    pytest.param(
        {"warmup": {"enabled": False}, "replicas": 2},
        {"deployment": _deployment(replicas=2, ready=2), "endpoints": 1},
        ("True", "AllReplicasReady"),
        id="one ready endpoint is enough: the Service serves",
    ),
    pytest.param(
        {"replicas": 0, "warmup": {"enabled": False}},
        {"deployment": _deployment(replicas=0, ready=0), "endpoints": 0},
        ("True", "ScaledToZero"),
        id="no endpoint is expected of zero replicas",
    ),
    pytest.param(
        {"warmup": {"enabled": False}},
        {"deployment": None},
        ("False", "Creating"),
        id="a service without its Deployment yet is Creating",
    ),
    pytest.param(
        {"warmup": {"enabled": False}, "replicas": 2},
        {"deployment": _deployment(replicas=2, ready=1)},
        ("False", "RollingOut"),
        id="one of two replicas ready is still rolling out",
    ),
    pytest.param(
        {"warmup": {"enabled": False}},
        {"deployment": _deployment(replicas=1, ready=1, gen=2, seen=1)},
        ("False", "RollingOut"),
        id="a Deployment change not yet observed is not Ready",
    ),
    pytest.param(
        {"warmup": {"enabled": False}},
        {"deployment": _deployment(replicas=2, ready=1, updated=1)},
        ("False", "RollingOut"),
        id="old replicas still terminating keep it rolling out",
    ),
    pytest.param(
        {},
        {
            "deployment": _deployment(replicas=1, ready=0),
            "pods": [_pod(ready=False, warmed=False)],
        },
        ("False", "WarmingUp"),
        id="running pods waiting for warmup are WarmingUp",
    ),
    pytest.param(
        {"replicas": 0, "warmup": {"enabled": False}},
        {"deployment": _deployment(replicas=0, ready=0)},
        ("True", "ScaledToZero"),
        id="zero replicas asked for and none running is Ready",
    ),
    pytest.param(
        {"warmup": {"enabled": False}},
        {
            "deployment": _deployment(replicas=1, ready=1),
            "problems": [Problem("SecretNotFound", "Secret hf does not exist.")],
        },
        ("False", "SecretNotFound"),
        id="a problem makes it not Ready with that reason even when pods are ready",
    ),
]


@pytest.mark.parametrize(("spec", "seen", "verdict"), ROWS)
def test_ready_condition(spec: dict[str, Any], seen: dict[str, Any], verdict: Any) -> None:
    svc = isvc(**spec)
    status = compute_status(
        svc,
        Observed(tuning=plan_for(svc), desired_replicas=svc.spec.replicas, **seen),
        now=NOW,
    )
    ready = find(status.conditions, "Ready")
    assert ready is not None
    assert (ready.status, ready.reason) == verdict


def test_stalled_and_reconciling_are_exclusive() -> None:
    svc = isvc()
    problem = Problem("NoNodeHasEnoughGPUs", "none")
    status = compute_status(
        svc,
        Observed(tuning=plan_for(svc), desired_replicas=1, problems=[problem]),
        now=NOW,
    )
    stalled, reconciling = (
        find(status.conditions, "Stalled"),
        find(status.conditions, "Reconciling"),
    )
    assert stalled is not None and stalled.status == "True"
    assert stalled.reason == "NoNodeHasEnoughGPUs"
    assert reconciling is not None and reconciling.status == "False"


def test_every_condition_is_there_from_the_first_reconcile() -> None:
    svc = isvc()
    status = compute_status(svc, Observed(tuning=plan_for(svc), desired_replicas=1), now=NOW)
    assert {c.type for c in status.conditions} == {
        "Ready",
        "Reconciling",
        "Stalled",
        "WarmedUp",
        "ScaleDownBlocked",
    }
    assert status.observed_generation == 3
    assert status.selector == "inference.vllm-operator.dev/inference-service=chat"
    assert status.endpoint == "http://chat.team-a.svc:8000/v1"
    # kubectl's MODEL column: the name requests give, spec.model.name or the service's.
    assert status.served_model_name == (svc.spec.model.name or "chat")


def test_transition_time_is_kept_while_the_status_holds() -> None:
    svc = isvc(warmup={"enabled": False})
    earlier = NOW - timedelta(hours=1)
    svc.status = compute_status(
        svc, Observed(tuning=plan_for(svc), desired_replicas=1), now=earlier
    )
    again = compute_status(svc, Observed(tuning=plan_for(svc), desired_replicas=1), now=NOW)
    assert again == svc.status, "nothing changed, so nothing to write"
    ready = compute_status(
        svc,
        Observed(
            tuning=plan_for(svc),
            desired_replicas=1,
            deployment=_deployment(replicas=1, ready=1),
        ),
        now=NOW,
    )
    cond: Condition | None = find(ready.conditions, "Ready")
    assert cond is not None and cond.last_transition_time == NOW
    stalled = find(ready.conditions, "Stalled")
    assert stalled is not None and stalled.last_transition_time == earlier


def test_pods_refused_by_admission_are_named_in_ready() -> None:
    """The first real-node run of the shared model cache sat 8 minutes at '0 of 1 replicas
    run the latest pod template' while PodSecurity refused every pod: the Deployment's
    ReplicaFailure says why, and Ready must too."""
    svc = isvc(warmup={"enabled": False})
    deployment = _deployment(replicas=0, ready=0, updated=0)
    refusal = (
        'pods "x" is forbidden: violates PodSecurity "restricted:latest": '
        "allowPrivilegeEscalation != false"
    )
    deployment["status"]["conditions"] = [
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": refusal}
    ]
    status = compute_status(
        svc,
        Observed(tuning=plan_for(svc), desired_replicas=1, deployment=deployment),
        now=NOW,
    )
    ready = find(status.conditions, "Ready")
    assert ready is not None and (ready.status, ready.reason) == ("False", "RollingOut")
    assert ready.message == (
        f"0 of 1 replicas run the latest pod template. Pods cannot be created: {refusal}"
    )


def test_ready_endpoints_counts_the_services_own_ready_ones() -> None:
    """Only the slices of the Service of that name; an endpoint whose ready is unset is
    ready (the EndpointSlice API's reading), one whose ready is false is not."""
    from tests.fakes import endpoint_slice
    from vllm_operator.reconcile.status import ready_endpoints

    unset = endpoint_slice("ns", "chat", ready=1, name="chat-2")
    del unset["endpoints"][0]["conditions"]["ready"]
    empty = endpoint_slice("ns", "chat", ready=0, name="chat-3")
    del empty["endpoints"]
    slices = [
        endpoint_slice("ns", "chat", ready=2, unready=3),
        unset,
        empty,
        endpoint_slice("ns", "other", ready=4, name="other-1"),
    ]
    assert ready_endpoints(slices, "chat") == 3
    assert ready_endpoints(slices, "other") == 4
    assert ready_endpoints(slices, "none") == 0
