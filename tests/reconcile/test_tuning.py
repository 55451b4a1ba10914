"""The InferenceTuning reconcile against the recording ClusterAPI: a whole Beside run pass
by pass, with a fresh call each time (as a restarted operator makes it), the objects it
leaves to garbage collection, and what it refuses to apply over."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml

from tests.fakes import RecordingCluster
from tests.reconcile.test_tuning_step import TUNING, _level, _ready, _target_body
from vllm_operator.models import InferenceService, InferenceTuning
from vllm_operator.models.base import Manifest
from vllm_operator.models.inference_tuning import InferenceTuningStatus
from vllm_operator.reconcile.tuning import _record, measurement_records, reconcile_inference_tuning
from vllm_operator.settings import OperatorSettings
from vllm_operator.tuning.measurements import Measurements

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
SETTINGS = OperatorSettings()
API = "inference.vllm-operator.dev/v1alpha1"
NS = "team-a"


def _cluster(spec: dict[str, Any] | None = None) -> RecordingCluster:
    api = RecordingCluster()
    api.put(_target_body())
    tuning = copy.deepcopy(TUNING)
    tuning["spec"].update(
        {
            "candidates": [{"name": "seqs-8", "overrides": {"max-num-seqs": "8"}}],
            "includeDefaults": False,
            "remeasureIncumbent": False,
            **(spec or {}),
        }
    )
    api.put(tuning)
    return api


def _tuning(api: RecordingCluster) -> Manifest:
    return api.objects[(API, "InferenceTuning", NS, "fast")]


async def _pass(api: RecordingCluster, minutes: int = 0) -> str:
    step = await reconcile_inference_tuning(
        api, _tuning(api), settings=SETTINGS, nodes=[], gpu_nodes=[],
        now=NOW + timedelta(minutes=minutes),
    )  # fmt: skip
    return step.phase


def _make_ready(api: RecordingCluster, name: str) -> None:
    child = api.objects[(API, "InferenceService", NS, name)]
    child["metadata"]["generation"] = 1
    child["status"] = {
        "observedGeneration": 1,
        "conditions": [_ready()],
        "tuning": {"plannedBy": "Tuner", "vllmVersion": "0.32.0", "gpusPerReplica": 1},
    }


def _finish(api: RecordingCluster, name: str, levels: list[dict[str, Any]]) -> None:
    api.objects[(API, "InferenceBenchmark", NS, name)]["status"] = {
        "phase": "Succeeded",
        "levels": levels,
    }


def _trials(api: RecordingCluster) -> list[tuple[str, str]]:
    return [(t["name"], t["state"]) for t in _tuning(api)["status"]["trials"]]


async def test_a_beside_run_measures_each_trial_in_turn_and_names_the_winner() -> None:
    api = _cluster()
    assert await _pass(api) == "Running"
    assert _trials(api) == [("incumbent", "Starting"), ("seqs-8", "Pending")]
    assert (API, "InferenceService", NS, "fast-incumbent") in api.objects
    _make_ready(api, "fast-incumbent")
    await _pass(api, 1)
    assert (API, "InferenceBenchmark", NS, "fast-incumbent") in api.objects
    _finish(api, "fast-incumbent", [_level(1.0, "Met"), _level(2.0, "Met"), _level(4.0, "Missed")])
    await _pass(api, 5)
    assert _trials(api) == [("incumbent", "Succeeded"), ("seqs-8", "Pending")]
    assert (API, "InferenceService", NS, "fast-incumbent") not in api.objects
    # The benchmark stays: the trial's record, owned by the tuning.
    assert (API, "InferenceBenchmark", NS, "fast-incumbent") in api.objects
    await _pass(api, 6)
    assert _trials(api)[1] == ("seqs-8", "Starting")
    _make_ready(api, "fast-seqs-8")
    await _pass(api, 7)
    bench = api.objects[(API, "InferenceBenchmark", NS, "fast-seqs-8")]
    assert bench["spec"]["search"]["minRatePerSecond"] == 2.0  # the incumbent's goodput
    _finish(api, "fast-seqs-8", [_level(2.0, "Met"), _level(4.0, "Met"), _level(8.0, "Missed")])
    assert await _pass(api, 11) == "Succeeded"
    status = _tuning(api)["status"]
    assert status["winner"]["trial"] == "seqs-8"
    assert status["winner"]["marginOverIncumbent"] == 1.0
    # No spread measured (remeasureIncumbent false): a margin above 10 % counts.
    assert status["winner"]["distinguishable"] is True
    assert not [k for k in api.objects if k[1] == "InferenceService" and k[3] != "chat"]
    # The target's spec is never written.
    assert api.objects[(API, "InferenceService", NS, "chat")]["spec"] == _target_body()["spec"]


async def test_everything_the_run_creates_goes_with_the_tuning() -> None:
    """Deleting the tuning mid-trial leaves nothing: every object it made names the tuning
    as its controller, which garbage collection follows (the recording fake has none)."""
    api = _cluster({"strategy": "InPlace"})
    await _pass(api)
    api2 = _cluster()
    await _pass(api2)
    _make_ready(api2, "fast-incumbent")
    await _pass(api2, 1)
    made = [
        o
        for a in (api, api2)
        for (av, kind, _, name), o in a.objects.items()
        if not (kind == "InferenceService" and name == "chat") and kind != "InferenceTuning"
    ]
    assert {o["kind"] for o in made} == {"Job", "InferenceService", "InferenceBenchmark"}
    for obj in made:
        (owner,) = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("InferenceTuning", "fast", "t-1")
        assert owner["controller"] is True and owner["blockOwnerDeletion"] is True
        assert obj["metadata"]["labels"]["inference.vllm-operator.dev/tuning"] == "fast"


async def test_a_same_named_service_of_someone_else_is_not_applied_over() -> None:
    api = _cluster()
    theirs = _target_body()
    theirs["metadata"] = {"name": "fast-incumbent", "namespace": NS, "uid": "x"}
    api.put(theirs)
    await _pass(api)
    assert api.objects[(API, "InferenceService", NS, "fast-incumbent")]["metadata"]["uid"] == "x"
    assert ("apply", "InferenceService", "fast-incumbent") not in api.calls
    assert _trials(api)[0] == ("incumbent", "Failed")


async def test_a_refused_run_writes_only_its_status() -> None:
    api = _cluster({"candidates": [{"name": "typo", "overrides": {"max-num-seqz": "8"}}]})
    assert await _pass(api) == "Failed"
    writes = [c for c in api.calls if c[0] in ("apply", "delete", "patch")]
    assert writes == [("apply", "InferenceTuning/status", "fast")]
    ready = _tuning(api)["status"]["conditions"][0]
    assert ready["reason"] == "InvalidOverride"
    assert "spec.candidates[0].overrides.max-num-seqz" in ready["message"]


async def test_a_succeeded_run_files_its_measured_trials_in_the_measurements_config_map() -> None:
    tuning = InferenceTuning.model_validate(TUNING)
    target = InferenceService.model_validate(_target_body())
    figures = {"p50": 20.0, "p90": 30.0, "p99": 40.0}
    measured = {"ttft": figures, "tpot": {"p50": 5.0, "p99": 9.0}, "sloAttainment": 1.0}
    status = InferenceTuningStatus.model_validate(
        {
            "phase": "Succeeded",
            "completionTime": "2026-12-07T12:10:00Z",
            "fingerprint": {"image": "vllm:x", "model": "org/m", "gpuProduct": "NVIDIA-L4",
                            "gpuCount": 1},
            "trials": [
                {"name": "incumbent", "role": "Incumbent", "state": "Succeeded",
                 "arguments": ["--max-num-seqs", "4"], "measuredGoodputPerSecond": 3.0,
                 **measured},
                {"name": "seqs-8", "role": "Candidate", "state": "Succeeded",
                 "arguments": ["--max-num-seqs", "8", "--enable-prefix-caching"],
                 "measuredGoodputPerSecond": 6.0, "predictedGoodputPerSecond": 5.0,
                 **measured},
                {"name": "slow", "role": "Candidate", "state": "StoppedEarly",
                 "arguments": ["--max-num-seqs", "2"], **measured},
            ],
        }
    )  # fmt: skip
    records = measurement_records(tuning, status, target)
    assert [r.tuning.trial for r in records if r.tuning] == ["incumbent", "seqs-8"]
    assert records[1].arguments["max-num-seqs"] == "8"
    assert records[1].arguments["enable-prefix-caching"] == "true"
    assert records[1].goodput_per_second == 6.0 and records[1].gpu_product == "NVIDIA-L4"

    api = RecordingCluster()
    await _record(api, SETTINGS, tuning, status, target)
    stored = api.objects[("v1", "ConfigMap", SETTINGS.own_namespace, "vllm-operator-measurements")]
    kept = Measurements.parse(yaml.safe_dump(stored))
    assert sorted(r.goodput_per_second for r in kept.records.values()) == [3.0, 6.0]
    # Without a GPU product there is no shape to file them under: nothing is written.
    status.fingerprint.gpu_product = None  # type: ignore[union-attr]
    assert measurement_records(tuning, status, target) == []
