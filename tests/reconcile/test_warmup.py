"""Warmup orchestration against the recording ClusterAPI: Jobs per pod incarnation, the
readiness gate on success, the reason on failure, and re-warming after a restart."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from tests.fakes import RecordingCluster
from tests.specs import isvc, plan_for
from vllm_operator.constants import WARMED_UP_CONDITION
from vllm_operator.reconcile.warmup import reconcile_warmups
from vllm_operator.render.warmup import warmup_job_name
from vllm_operator.settings import DEFAULT_WARMUP_RESOURCES

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _pod(
    name: str, *, ready: bool = True, restarts: int = 0, gate: dict[str, Any] | None = None
) -> dict[str, Any]:
    conds: list[dict[str, Any]] = [
        {"type": "ContainersReady", "status": "True" if ready else "False"}
    ]
    if gate:
        conds.append({"type": WARMED_UP_CONDITION, **gate})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}"},
        "status": {
            "podIP": "127.64.0.9",
            "conditions": conds,
            "containerStatuses": [{"name": "vllm", "restartCount": restarts}],
        },
    }


def _job(api: RecordingCluster, name: str, state: str, report: dict[str, Any]) -> None:
    job = api.objects[("batch/v1", "Job", "team-a", name)]
    job["status"] = {"conditions": [{"type": state, "status": "True"}]}
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-x",
                "namespace": "team-a",
                "labels": {"batch.kubernetes.io/job-name": name},
                "creationTimestamp": "2026-11-29T12:00:00Z",
            },
            "status": {
                "containerStatuses": [{"state": {"terminated": {"message": json.dumps(report)}}}]
            },
        }
    )


def _gate(api: RecordingCluster, pod: str) -> dict[str, Any]:
    status = api.objects[("v1", "Pod", "team-a", pod)]["status"]
    found: dict[str, Any] = next(
        c for c in status["conditions"] if c["type"] == WARMED_UP_CONDITION
    )
    return found


async def _run(api: RecordingCluster, svc: Any, pods: list[dict[str, Any]]) -> Any:
    """One pass, with the pods as the apiserver would show them (the fake stores what we
    apply to pods/status without merging, so each test states its pods afresh)."""
    for p in pods:
        api.put(p)
    return await reconcile_warmups(
        api,
        svc,
        plan_for(svc),
        pods,
        image="op:1",
        resources=DEFAULT_WARMUP_RESOURCES.to_wire(),
        now=NOW,
    )


async def test_a_pod_whose_server_is_not_up_gets_no_job_yet() -> None:
    api, svc = RecordingCluster(), isvc()
    seen = await _run(api, svc, [_pod("a", ready=False)])
    assert api.applied("Job") == [] and seen.warmed == 0


async def test_a_ready_server_gets_one_job_and_the_gate_says_warming() -> None:
    api, svc = RecordingCluster(), isvc()
    pod = _pod("a")
    await _run(api, svc, [pod])
    assert _gate(api, "a")["reason"] == "WarmingUp"
    await _run(api, svc, [pod])  # a second reconcile finds the Job and makes no other
    assert api.applied("Job") == [warmup_job_name(svc, pod, 0)]
    job = api.objects[("batch/v1", "Job", "team-a", warmup_job_name(svc, pod, 0))]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["--endpoint", "http://127.64.0.9:8000"]
    assert "--max-num-seqs" in args
    assert job["metadata"]["ownerReferences"][0]["kind"] == "Pod"


async def test_a_successful_job_opens_the_gate_and_reports_ttft() -> None:
    api, svc = RecordingCluster(), isvc()
    pod = _pod("a")
    await _run(api, svc, [pod])
    name = warmup_job_name(svc, pod, 0)
    _job(api, name, "Complete", {"outcome": "Settled", "cold_ttft_s": 0.81, "warm_ttft_s": 0.05})
    seen = await _run(api, svc, [pod])
    gate = _gate(api, "a")
    assert gate["status"] == "True" and gate["reason"] == "WarmedUp" and name in gate["message"]
    assert seen.warmed == 1 and seen.cold_ttft_ms == 810.0 and seen.warm_ttft_ms == 50.0


async def test_a_failed_job_keeps_the_gate_closed_with_the_reason() -> None:
    api, svc = RecordingCluster(), isvc()
    pod = _pod("a")
    await _run(api, svc, [pod])
    name = warmup_job_name(svc, pod, 0)
    _job(api, name, "Failed", {"outcome": "ServerErrors", "message": "500 from /v1/completions"})
    seen = await _run(api, svc, [pod])
    gate = _gate(api, "a")
    assert gate["status"] == "False" and gate["reason"] == "WarmupFailed"
    assert "500 from /v1/completions" in gate["message"]
    assert seen.failures and "ServerErrors" in seen.failures[0]


async def test_a_restarted_container_is_warmed_again() -> None:
    api, svc = RecordingCluster(), isvc()
    first = _pod("a")
    old_job = warmup_job_name(svc, first, 0)
    gate = {"status": "True", "reason": "WarmedUp", "message": f"Job {old_job} warmed it."}
    restarted = _pod("a", restarts=1, gate=gate)
    seen = await _run(api, svc, [restarted])
    new_job = warmup_job_name(svc, restarted, 1)
    assert new_job != old_job
    assert api.applied("Job") == [new_job]
    assert seen.warmed == 0
    assert _gate(api, "a")["status"] == "False"


async def test_a_warmed_pod_is_left_alone() -> None:
    api, svc = RecordingCluster(), isvc()
    pod = _pod("a")
    name = warmup_job_name(svc, pod, 0)
    warmed = _pod("a", gate={"status": "True", "reason": "WarmedUp", "message": f"Job {name} ok"})
    seen = await _run(api, svc, [warmed])
    assert seen.warmed == 1
    assert api.applied("Job") == [] and api.applied("Pod/status") == []


async def test_nothing_happens_with_warmup_disabled() -> None:
    api, svc = RecordingCluster(), isvc(warmup={"enabled": False})
    seen = await _run(api, svc, [_pod("a")])
    assert api.calls == [] and seen.warmed == 0
