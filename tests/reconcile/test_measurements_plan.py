"""The InferenceService's plan learns from the measurements store: the reconcile reads the
ConfigMap vllm-operator-measurements (through the reader the runtime passes) and its
status.tuning notes the records of its shape; a missing, unreadable or broken store is
never an error for the service; the runtime's read is shared and goes out once a
minute at most."""

from __future__ import annotations

import copy
import json
from typing import Any

from tests.fakes import RecordingCluster
from tests.reconcile.test_inference_service import NOW, SETTINGS, _cluster, _node, _stored
from vllm_operator.constants import MEASUREMENTS_CONFIG_MAP, TESTED_VLLM_VERSION
from vllm_operator.k8s.api import ApiError
from vllm_operator.k8s.measurements import StoredMeasurements, read_for_plans
from vllm_operator.reconcile.inference_service import reconcile_inference_service
from vllm_operator.runtime.measurements import MeasurementsCache
from vllm_operator.tuning.measurements import Measurement, Measurements

OWN = "vllm-operator"
RECORD: dict[str, Any] = {
    "model": "Qwen/Qwen2.5-0.5B-Instruct",
    "vllmVersion": TESTED_VLLM_VERSION,
    "gpuProduct": "NVIDIA-GeForce-RTX-4090",
    "gpuCount": 1,
    "goodputPerSecond": 13.5,
    "ttft": {"p50": 80, "p99": 250},
    "tpot": {"p50": 6, "p99": 9},
    "sloAttainment": 0.99,
    "slo": {"ttftP99Milliseconds": 300},
    "workload": {"promptTokensMean": 550, "outputTokensMean": 150, "peakConcurrency": 8},
    "predictedGoodputPerSecond": 9.1,
    "measuredAt": "2026-12-07T10:00:00Z",
    "tuning": {"namespace": "team-a", "name": "chat-tune", "trial": "seqs-8"},
    "arguments": {"max-num-seqs": "8"},
}


def store(api: RecordingCluster, *records: dict[str, Any], broken: str | None = None) -> None:
    data = Measurements.of(Measurement.model_validate(r) for r in records).data()
    if broken is not None:
        data[broken] = json.dumps({**RECORD, "gpuCount": 0})
    api.put(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": MEASUREMENTS_CONFIG_MAP, "namespace": OWN},
            "data": data,
        }
    )


def reader(api: RecordingCluster) -> Any:
    return lambda: read_for_plans(api, OWN)


def notes(api: RecordingCluster, body: dict[str, Any]) -> list[str]:
    found: list[str] = _stored(api, body)["status"]["tuning"]["notes"]
    return found


async def test_the_plan_notes_a_record_of_its_shape_read_from_the_config_map() -> None:
    api, body = _cluster()
    store(api, RECORD, {**RECORD, "gpuProduct": "NVIDIA-A100-SXM4-80GB", "goodputPerSecond": 99})
    outcome = await reconcile_inference_service(
        api, body, settings=SETTINGS, now=NOW, measurements=reader(api)
    )
    assert ("get", "ConfigMap", MEASUREMENTS_CONFIG_MAP) in api.calls
    (note,) = [n for n in notes(api, body) if n.startswith("measured:")]
    assert "13.5 req/s meeting TTFT P99 300 ms with max-num-seqs 8" in note
    assert "tuning team-a/chat-tune trial seqs-8, 2026-12-07" in note
    assert "predicted 9.1 (error +48 %)" in note
    assert "not used: measured with other arguments" in note
    assert not outcome.stalled


async def test_a_record_of_the_services_question_decides_its_slo_answer() -> None:
    """A replica measured holding more than the peak within TTFT P99 300 ms: the status
    says the target is met as measured, and the record is used."""
    workload = {
        "promptTokens": {"type": "Uniform", "min": 100, "max": 1000},
        "outputTokens": {"type": "Uniform", "min": 100, "max": 200},
        "peakConcurrency": 8,
    }
    api, body = _cluster(workload=workload, slo={"ttftP99Milliseconds": 300})
    store(api, {**RECORD, "arguments": {}, "goodputPerSecond": 50})
    await reconcile_inference_service(
        api, body, settings=SETTINGS, now=NOW, measurements=reader(api)
    )
    found = notes(api, body)
    assert any("used for the SLO answer" in n for n in found), found
    assert any("TTFT P99 target 300 ms" in n and "held ~" in n for n in found), found


async def test_a_missing_store_is_no_error_and_no_note() -> None:
    api, body = _cluster()
    without_store = copy.deepcopy(body)
    outcome = await reconcile_inference_service(
        api, body, settings=SETTINGS, now=NOW, measurements=reader(api)
    )
    assert not outcome.stalled
    assert not any(n.startswith(("measured:", "measurements:")) for n in notes(api, body))
    # The same status as a pass that reads no store at all.
    plain, plain_body = _cluster()
    await reconcile_inference_service(plain, plain_body, settings=SETTINGS, now=NOW)
    assert notes(plain, plain_body) == notes(api, without_store)


async def test_an_unreadable_store_is_a_note_not_an_error() -> None:
    for status in (403, 503):
        api, body = _cluster()
        api.fail[("get", "ConfigMap")] = ApiError(status, "Forbidden", "no")
        outcome = await reconcile_inference_service(
            api, body, settings=SETTINGS, now=NOW, measurements=reader(api)
        )
        assert not outcome.stalled
        assert api.applied("Deployment") == ["chat"]
        assert any(
            f"ConfigMap {OWN}/{MEASUREMENTS_CONFIG_MAP} could not be read ({status}" in n
            for n in notes(api, body)
        )


async def test_a_broken_record_is_skipped_with_a_note_naming_its_key() -> None:
    api, body = _cluster()
    store(api, RECORD, broken="0badc0ffee000000")
    outcome = await reconcile_inference_service(
        api, body, settings=SETTINGS, now=NOW, measurements=reader(api)
    )
    assert not outcome.stalled
    found = notes(api, body)
    assert any("data.0badc0ffee000000" in n and "gpuCount" in n and "skipped" in n for n in found)
    assert any(n.startswith("measured: 13.5 req/s") for n in found)  # the good one is read


async def test_the_runtime_reads_the_store_once_a_minute_for_every_service() -> None:
    api = RecordingCluster()
    store(api, RECORD)
    clock = [100.0]
    cache = MeasurementsCache(OWN, clock=lambda: clock[0])
    first = await cache.read(api)
    again = await cache.read(api)
    clock[0] += 59
    within = await cache.read(api)
    assert first is again is within
    assert api.calls == [("get", "ConfigMap", MEASUREMENTS_CONFIG_MAP)]
    clock[0] += 2
    later = await cache.read(api)
    assert len(api.calls) == 2
    assert isinstance(later, StoredMeasurements) and len(later.measurements) == 1


async def test_a_failed_read_is_kept_for_the_minute_too() -> None:
    api = RecordingCluster()
    api.fail[("get", "ConfigMap")] = ApiError(503, "ServiceUnavailable", "down")
    cache = MeasurementsCache(OWN, clock=lambda: 0.0)
    for _ in range(3):
        read = await cache.read(api)
        assert read.unread and "could not be read" in read.unread[0]
    assert len(api.calls) == 1


async def test_two_nodes_of_other_products_see_only_their_own_records() -> None:
    """Records are of a GPU product: a 4090's record is not an A100's plan's."""
    api, body = _cluster(_node("a", 2, "NVIDIA-A100-SXM4-80GB"))
    store(api, RECORD)
    await reconcile_inference_service(
        api, body, settings=SETTINGS, now=NOW, measurements=reader(api)
    )
    assert not any(n.startswith("measured:") for n in notes(api, body))
