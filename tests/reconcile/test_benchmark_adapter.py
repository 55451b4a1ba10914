"""An InferenceBenchmark of one of its target's LoRA adapters (spec.adapter)."""

from __future__ import annotations

import copy
from typing import Any

from tests.fakes import RecordingCluster
from tests.reconcile.test_benchmark import BENCH, KEY, _phase, _run, _target


def _cluster(adapter: str, loaded: int | None, ready: int = 1) -> RecordingCluster:
    api = RecordingCluster()
    target = _target(ready=True)
    target["spec"]["adapters"] = [{"name": "sql", "source": {"image": {"path": "/opt/a/sql"}}}]
    target["status"]["readyReplicas"] = ready
    if loaded is not None:
        target["status"]["adapters"] = [
            {"name": "sql", "path": "/opt/a/sql", "loadedReplicas": loaded}
        ]
    api.put(target)
    bench: dict[str, Any] = copy.deepcopy(BENCH)
    bench["spec"]["adapter"] = adapter
    api.put(bench)
    return api


def _message(api: RecordingCluster) -> str:
    status = api.objects[KEY]["status"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    return str(ready["message"])


def _load_args(api: RecordingCluster) -> list[str]:
    job = api.objects[("batch/v1", "Job", "team-a", "load-load")]
    args: list[str] = job["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


async def test_an_adapter_the_target_does_not_declare_holds_the_benchmark() -> None:
    api = _cluster("nope", loaded=1)
    assert await _run(api) == "Pending"
    assert _phase(api) == ("Pending", "AdapterNotFound")
    message = _message(api)
    assert "spec.adapter nope is not an adapter of InferenceService chat" in message
    assert "sql" in message
    assert ("batch/v1", "Job", "team-a", "load-load") not in api.objects


async def test_the_benchmark_waits_until_every_ready_server_has_the_adapter() -> None:
    api = _cluster("sql", loaded=1, ready=2)
    assert await _run(api) == "Pending"
    assert _phase(api) == ("Pending", "AdapterNotLoaded")
    assert "(1 of 2)" in _message(api)


async def test_a_loaded_adapter_is_the_model_of_every_request() -> None:
    api = _cluster("sql", loaded=1)
    assert await _run(api) == "Running"
    args = _load_args(api)
    assert args[args.index("--model") + 1] == "sql"
