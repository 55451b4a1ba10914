"""The service reconcile with InferenceTunings in its namespace, against the recording fake
of the k8s layer: the measured flags reach the rendered arguments over the user's
overrides, the status says where they come from, an in-place trial's flags last as long
as the tuning has them, a trial child ignores tunings, and nothing of the user's (nor of
the tuning's) is ever written."""

from __future__ import annotations

from typing import Any

from tests.fakes import RecordingCluster
from tests.reconcile.test_inference_service import NOW, SETTINGS, _cluster, _node, _stored
from tests.reconcile.test_measured import WIN, tuning
from vllm_operator.constants import (
    API_VERSION,
    LABEL_LOCK_TARGET,
    LABEL_SCALE_DOWN_LOCK,
    LABEL_TUNING,
)
from vllm_operator.reconcile.inference_service import reconcile_inference_service

USER = {"max-num-seqs": "64", "max-model-len": "2048"}


def _args(api: RecordingCluster) -> list[str]:
    dep = api.objects[("apps/v1", "Deployment", "team-a", "chat")]
    args: list[str] = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def _flag(args: list[str], name: str) -> str | None:
    return args[args.index(f"--{name}") + 1] if f"--{name}" in args else None


def _conditions(api: RecordingCluster, body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in _stored(api, body)["status"]["conditions"]}


def _writes(api: RecordingCluster) -> list[tuple[str, str, str]]:
    """Every write the pass made, but the children's applies and the status's."""
    return [
        call
        for call in api.calls
        if call[0] in ("apply", "patch", "delete")
        and call[1] not in ("Deployment", "Service", "PodDisruptionBudget")
        and call[1] != "InferenceService/status"
    ]


async def _pass(api: RecordingCluster, body: dict[str, Any]) -> dict[str, Any]:
    body = _stored(api, body)
    await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    return body


async def test_the_winner_is_rendered_over_the_users_overrides_and_reported() -> None:
    api, body = _cluster(_node("a", 2), tuning={"overrides": USER, "measuredRef": {"name": "tune"}})
    spec_before = _stored(api, body)["spec"]
    api.put(tuning(winner=WIN))
    await _pass(api, body)
    args = _args(api)
    assert _flag(args, "max-num-seqs") == "8", "the measured winner over the user's 64"
    assert _flag(args, "max-model-len") == "2048", "the user's other overrides stay"
    status = _stored(api, body)["status"]
    assert status["measuredFrom"] == {
        "name": "tune",
        "trial": "seqs-8",
        "applied": True,
        "reason": "WinnerApplied",
        "message": status["measuredFrom"]["message"],
    }
    tuned = _conditions(api, body)["Tuned"]
    assert (tuned["status"], tuned["reason"]) == ("True", "WinnerApplied")
    seqs = next(a for a in status["tuning"]["arguments"] if a["name"] == "max-num-seqs")
    assert seqs["source"] == "Measured" and "spec.tuning.overrides says 64" in seqs["reason"]
    assert _stored(api, body)["spec"] == spec_before, "the user's spec is never written"
    assert _writes(api) == [], "nothing but the children and the status is written"


async def test_a_stale_result_is_not_applied_and_says_why() -> None:
    api, body = _cluster(_node("a", 2), tuning={"overrides": USER, "measuredRef": {"name": "tune"}})
    api.put(tuning(winner=WIN, stale=("GPUChanged", "NVIDIA-L4 then, NVIDIA-L40S now")))
    await _pass(api, body)
    assert _flag(_args(api), "max-num-seqs") == "64"
    status = _stored(api, body)["status"]
    assert status["measuredFrom"]["applied"] is False
    assert status["measuredFrom"]["reason"] == "Stale"
    tuned = _conditions(api, body)["Tuned"]
    assert tuned["status"] == "False" and "GPUChanged" in tuned["message"]
    assert ("Stale", tuned["message"], True) in api.events


async def test_an_in_place_trial_wins_while_it_runs_and_is_gone_with_the_tuning() -> None:
    api, body = _cluster(_node("a", 2), tuning={"overrides": USER})
    await _pass(api, body)
    assert _flag(_args(api), "max-num-seqs") == "64"
    first = _stored(api, body)["status"]
    assert "measuredFrom" not in first and "Tuned" not in _conditions(api, body)

    probe = tuning(
        "probe",
        phase="Running",
        in_place={"trial": "seqs-16", "overrides": {"max-num-seqs": "16"}},
    )
    api.put(probe)
    await _pass(api, body)
    assert _flag(_args(api), "max-num-seqs") == "16", "the trial's flags roll out"
    assert _stored(api, body)["status"]["measuredFrom"]["reason"] == "InPlaceTrial"

    del api.objects[(probe["apiVersion"], probe["kind"], "team-a", "probe")]
    await _pass(api, body)
    assert _flag(_args(api), "max-num-seqs") == "64", "back to the user's once it is gone"
    status = _stored(api, body)["status"]
    assert "measuredFrom" not in status and "Tuned" not in _conditions(api, body)
    assert _writes(api) == []


async def test_a_trial_child_reads_no_tunings_and_renders_its_own_overrides() -> None:
    api, body = _cluster(_node("a", 2), tuning={"overrides": USER})
    stored = _stored(api, body)
    stored["metadata"]["labels"] = {LABEL_TUNING: "tune"}
    api.put(tuning(auto=True, winner=WIN))
    api.put(tuning("probe", phase="Running", in_place={"trial": "x", "overrides": {}}))
    await reconcile_inference_service(api, stored, settings=SETTINGS, now=NOW)
    assert _flag(_args(api), "max-num-seqs") == "64"
    assert not [c for c in api.calls if c[1] == "InferenceTuning"], "no tuning is even read"
    assert "measuredFrom" not in _stored(api, body)["status"]


def _lock(name: str, target: str, *, tuning_name: str | None = None) -> dict[str, Any]:
    labels = {LABEL_SCALE_DOWN_LOCK: "true", LABEL_LOCK_TARGET: target}
    if tuning_name is not None:
        labels[LABEL_TUNING] = tuning_name
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "team-a", "labels": labels},
        "spec": {"suspend": True},
        "status": {},
    }


async def test_an_in_place_trial_rolls_out_under_its_own_tunings_lock_but_not_under_another() -> (
    None
):
    api, body = _cluster(_node("a", 2), tuning={"overrides": USER})
    await _pass(api, body)
    name = body["metadata"]["name"]
    api.put(_lock("probe-lock", name, tuning_name="probe"))
    api.put(
        tuning(
            "probe",
            phase="Running",
            in_place={"trial": "seqs-16", "overrides": {"max-num-seqs": "16"}},
        )
    )
    await _pass(api, body)
    assert _flag(_args(api), "max-num-seqs") == "16", "its own lock holds no trial back"

    # Another benchmark's lock holds the next change of the pods (the trial gone).
    api.put(_lock("other-load", name))
    del api.objects[("batch/v1", "Job", "team-a", "probe-lock")]
    del api.objects[(API_VERSION, "InferenceTuning", "team-a", "probe")]
    await _pass(api, body)
    assert _flag(_args(api), "max-num-seqs") == "16", "held by the other benchmark"
    assert _stored(api, body)["status"]["rollout"]["message"].startswith("Held: ")
