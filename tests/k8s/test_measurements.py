"""k8s/measurements.py: new records are merged into the vllm-operator-measurements
ConfigMap by key, and nothing else in it is lost."""

from __future__ import annotations

import json
from typing import Any

from tests.fakes import RecordingCluster
from tests.tuning.test_measurements import record
from vllm_operator.k8s.measurements import read_measurements, record_measurements
from vllm_operator.tuning.measurements import Measurements, record_key

NS = "vllm-operator"


def stored(cluster: RecordingCluster) -> dict[str, Any]:
    obj = cluster.objects[("v1", "ConfigMap", NS, "vllm-operator-measurements")]
    return obj


async def test_the_first_records_create_the_config_map_labelled_as_the_operators() -> None:
    cluster = RecordingCluster()
    keys = await record_measurements(cluster, NS, [record(), record(gpuCount=2)])
    obj = stored(cluster)
    assert sorted(obj["data"]) == sorted(keys) and len(keys) == 2
    assert obj["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "vllm-operator"}
    assert len(await read_measurements(cluster, NS)) == 2


async def test_new_records_are_patched_in_and_other_keys_stay() -> None:
    cluster = RecordingCluster()
    cluster.put(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "vllm-operator-measurements", "namespace": NS},
            "data": {
                "someone-elses": "kept as it is",
                record_key(record()): json.dumps(record().to_wire()),
            },
        }
    )
    newer = record(goodputPerSecond=20, measuredAt="2027-01-01T00:00:00Z")
    other = record(gpuCount=2)
    keys = await record_measurements(cluster, NS, [newer, other])
    assert ("patch", "ConfigMap", "vllm-operator-measurements") in cluster.calls
    assert not cluster.applied("ConfigMap")
    data = stored(cluster)["data"]
    assert data["someone-elses"] == "kept as it is"
    assert sorted(keys) == sorted([record_key(newer), record_key(other)])
    again = Measurements.from_config_map(
        {"data": {k: v for k, v in data.items() if k != "someone-elses"}}
    )
    assert sorted(r.goodput_per_second for r in again) == [12.5, 20]


async def test_an_older_record_does_not_replace_a_newer_one() -> None:
    cluster = RecordingCluster()
    await record_measurements(
        cluster, NS, [record(goodputPerSecond=20, measuredAt="2027-01-01T00:00:00Z")]
    )
    cluster.calls.clear()
    keys = await record_measurements(
        cluster, NS, [record(goodputPerSecond=1, measuredAt="2026-01-01T00:00:00Z")]
    )
    assert keys == [] and ("patch", "ConfigMap", "vllm-operator-measurements") not in cluster.calls
    (kept,) = await read_measurements(cluster, NS)
    assert kept.goodput_per_second == 20


async def test_no_records_make_no_request() -> None:
    cluster = RecordingCluster()
    assert await record_measurements(cluster, NS, []) == []
    assert cluster.calls == []
