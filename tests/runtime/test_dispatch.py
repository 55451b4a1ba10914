"""The runtime's dispatch: which reconcile a key runs, what a gone object, a failure or a
pending benchmark make of the key, and which events and resyncs add which keys. The
reconciles are stand-ins that record their calls (the reconciles themselves are tested in
tests/reconcile); the cluster is the recording fake of the ``k8s`` layer."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from tests.fakes import RecordingCluster
from vllm_operator.constants import (
    API_VERSION,
    KIND_INFERENCE_BENCHMARK,
    KIND_INFERENCE_SERVICE,
    KIND_MODEL_CACHE,
    LABEL_BENCHMARK,
    LABEL_LOCK_TARGET,
    LABEL_SERVICE,
    LABEL_WARMUP_FOR,
    MEASUREMENTS_CONFIG_MAP,
)
from vllm_operator.k8s.api import ApiError
from vllm_operator.models.base import Manifest
from vllm_operator.reconcile.inference_service import Outcome
from vllm_operator.runtime.cache import CachedAPI
from vllm_operator.runtime.dispatch import (
    BENCH,
    CACHE,
    ISVC,
    PENDING_BENCHMARK_SECONDS,
    SCALE,
    TUNE,
    Runtime,
)
from vllm_operator.servers.pods import PodClient
from vllm_operator.settings import OperatorSettings


def _obj(kind: str, name: str = "chat", ns: str = "team", **extra: Any) -> Manifest:
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "metadata": {"name": name, "namespace": ns, **extra.pop("metadata", {})},
        **extra,
    }


class Calls:
    def __init__(self) -> None:
        self.made: list[tuple[str, str]] = []
        self.fail: ApiError | None = None
        self.phase = "Running"
        self.again: float | None = 2.0
        self.measurements: Any = None
        self.api: Any = None

    async def service(
        self,
        api: Any,
        body: Manifest,
        *,
        settings: Any,
        view: Any = None,
        applied: Any = None,
        http: Any = None,
        measurements: Any = None,
    ) -> Outcome:
        self.made.append(("service", body["metadata"]["name"]))
        self.api = api
        self.http = http
        self.measurements = measurements
        if self.fail:
            raise self.fail
        return Outcome(ready=True, stalled=False)

    async def benchmark(self, api: Any, body: Manifest, *, settings: Any) -> str:
        self.made.append(("benchmark", body["metadata"]["name"]))
        if self.fail:
            raise self.fail
        return self.phase

    async def cache(self, api: Any, body: Manifest, **_: Any) -> float | None:
        self.made.append(("cache", body["metadata"]["name"]))
        return self.again

    async def autoscale(self, api: Any, body: Manifest, **_: Any) -> float | None:
        self.made.append(("autoscale", body["metadata"]["name"]))
        return self.again


@pytest.fixture
def calls() -> Calls:
    return Calls()


@pytest.fixture
async def runtime(calls: Calls) -> Runtime:
    return Runtime(
        settings=OperatorSettings(max_retry_seconds=60),
        api=RecordingCluster(),
        http=PodClient(),
        reconcile_service=calls.service,
        reconcile_benchmark=calls.benchmark,
        reconcile_cache=calls.cache,
        autoscale=calls.autoscale,
    )


def _cluster(runtime: Runtime) -> RecordingCluster:
    assert isinstance(runtime.api, RecordingCluster)
    return runtime.api


def _due(runtime: Runtime) -> set[tuple[str, str, str]]:
    return set(runtime.queue._due)


async def test_each_kind_of_key_runs_its_own_reconcile(runtime: Runtime, calls: Calls) -> None:
    _cluster(runtime).put(_obj(KIND_INFERENCE_SERVICE))
    _cluster(runtime).put(_obj(KIND_INFERENCE_BENCHMARK, "load"))
    assert await runtime.work((ISVC, "team", "chat")) is None
    assert await runtime.work((BENCH, "team", "load")) is None
    assert await runtime.work((SCALE, "team", "chat")) == 2.0
    assert calls.made == [("service", "chat"), ("benchmark", "load"), ("autoscale", "chat")]


async def test_every_service_pass_reads_the_measurements_through_one_shared_read(
    runtime: Runtime, calls: Calls
) -> None:
    """The runtime hands each service pass a reader of the measurements store in its own
    namespace, shared by every service: two services' passes send one GET."""
    _cluster(runtime).put(_obj(KIND_INFERENCE_SERVICE, "chat"))
    _cluster(runtime).put(_obj(KIND_INFERENCE_SERVICE, "code"))
    readers = []
    for name in ("chat", "code"):
        await runtime.work((ISVC, "team", name))
        readers.append(calls.measurements)
    _cluster(runtime).calls.clear()
    for read in readers:
        await read()
    assert _cluster(runtime).calls == [("get", "ConfigMap", MEASUREMENTS_CONFIG_MAP)]
    assert runtime.measurements.namespace == runtime.settings.own_namespace


async def test_a_model_cache_is_reconciled_while_it_is_deleted_and_its_users_follow_it(
    runtime: Runtime, calls: Calls
) -> None:
    """Its finalizer is ours to remove: a cache being deleted still gets its turn."""
    going = {"deletionTimestamp": "2026-12-02T09:00:00Z", "finalizers": ["x"]}
    _cluster(runtime).put(_obj(KIND_MODEL_CACHE, "tiny", metadata=going))
    assert await runtime.work((CACHE, "team", "tiny")) == 2.0
    assert calls.made == [("cache", "tiny")]
    assert await runtime.work((CACHE, "team", "gone")) is None
    service = _obj(KIND_INFERENCE_SERVICE, spec={"model": {"source": {"cache": {"name": "tiny"}}}})
    runtime.on_inference_service("ADDED", service)
    runtime.on_model_cache("MODIFIED", _obj(KIND_MODEL_CACHE, "tiny"))
    assert {(CACHE, "team", "tiny"), (ISVC, "team", "chat")} <= _due(runtime)


async def test_each_service_pass_is_one_debug_line_naming_the_object(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """What the cluster tests await instead of sleeping: a pass ran for that object."""
    _cluster(runtime).put(_obj(KIND_INFERENCE_SERVICE))
    with caplog.at_level(logging.DEBUG, logger="vllm_operator"):
        await runtime.work((ISVC, "team", "chat"))
    assert [r.getMessage() for r in caplog.records] == [
        "Reconciled InferenceService team/chat: ok."
    ]


async def test_a_gone_or_going_object_is_dropped_and_its_back_off_forgotten(
    runtime: Runtime, calls: Calls
) -> None:
    key = (ISVC, "team", "chat")
    runtime.queue.backoff(key)
    assert await runtime.work(key) is None  # not there at all
    _cluster(runtime).put(_obj(KIND_INFERENCE_SERVICE, metadata={"deletionTimestamp": "now"}))
    assert await runtime.work(key) is None
    assert calls.made == []
    assert runtime.queue.backoff(key) == 1.0, "forgotten"
    scale = (SCALE, "team", "chat")
    runtime.scaling.add(scale)
    assert await runtime.work(scale) is None
    assert scale not in runtime.scaling, "its readings end with it"


async def test_an_api_error_comes_back_with_growing_back_off(
    runtime: Runtime, calls: Calls
) -> None:
    _cluster(runtime).put(_obj(KIND_INFERENCE_SERVICE))
    calls.fail = ApiError(503, "ServiceUnavailable", "etcd is down")
    key = (ISVC, "team", "chat")
    assert [await runtime.work(key) for _ in range(3)] == [1.0, 2.0, 4.0]
    calls.fail = None
    assert await runtime.work(key) is None
    assert runtime.queue.backoff(key) == 1.0, "a success forgets the failures"


async def test_a_pending_benchmark_is_looked_at_again_soon(runtime: Runtime, calls: Calls) -> None:
    _cluster(runtime).put(_obj(KIND_INFERENCE_BENCHMARK, "load"))
    calls.phase = "Pending"
    assert await runtime.work((BENCH, "team", "load")) == PENDING_BENCHMARK_SECONDS
    calls.phase = "Succeeded"
    assert await runtime.work((BENCH, "team", "load")) is None


async def test_an_autoscaler_that_is_done_stops_its_readings(
    runtime: Runtime, calls: Calls
) -> None:
    _cluster(runtime).put(_obj(KIND_INFERENCE_SERVICE))
    runtime.schedule_autoscaler("team", "chat")
    runtime.schedule_autoscaler("team", "chat")
    assert _due(runtime) == {(SCALE, "team", "chat")}, "scheduled once"
    calls.again = None
    assert await runtime.work((SCALE, "team", "chat")) is None
    assert (SCALE, "team", "chat") not in runtime.scaling


async def test_service_events_add_its_key_when_what_the_reconcile_reads_changed(
    runtime: Runtime,
) -> None:
    body = _obj(KIND_INFERENCE_SERVICE, spec={"replicas": 1}, status={})
    runtime.on_inference_service("ADDED", body)
    runtime.queue._due.clear()
    runtime.on_inference_service("MODIFIED", body | {"status": {"autoscaling": {"v": 1}}})
    assert (ISVC, "team", "chat") not in _due(runtime), "the autoscaler's own write"
    # ... which still schedules the autoscaler (its status to clear).
    assert (SCALE, "team", "chat") in _due(runtime)
    runtime.on_inference_service("MODIFIED", body | {"spec": {"replicas": 2}})
    assert (ISVC, "team", "chat") in _due(runtime)
    runtime.queue._due.clear()
    runtime.on_inference_service("DELETED", body)
    assert _due(runtime) == {(ISVC, "team", "chat")}
    assert ("team", "chat") not in runtime.seen


@pytest.mark.parametrize(
    ("labels", "keys"),
    [
        ({LABEL_SERVICE: "chat"}, {(ISVC, "team", "chat")}),
        ({LABEL_WARMUP_FOR: "chat"}, {(ISVC, "team", "chat")}),
        ({LABEL_BENCHMARK: "load"}, {(BENCH, "team", "load")}),
        (
            {LABEL_BENCHMARK: "load", LABEL_LOCK_TARGET: "chat"},
            {(BENCH, "team", "load"), (ISVC, "team", "chat")},
        ),
        ({"app": "other"}, set()),
    ],
    ids=["child or pod", "warmup Job", "load Job", "load Job holding a lock", "unrelated"],
)
def test_labelled_objects_add_their_owners_keys(
    runtime: Runtime, labels: dict[str, str], keys: set[tuple[str, str, str]]
) -> None:
    runtime.on_labelled(_obj("Job", "x", metadata={"labels": labels}))
    assert _due(runtime) == keys


@pytest.mark.parametrize("event", ["ADDED", "MODIFIED", "DELETED"])
def test_a_tuning_event_reconciles_the_service_it_targets(runtime: Runtime, event: str) -> None:
    """A tuning labels nothing on its target: its spec.targetRef.name maps its events (an
    in-place trial set or cleared, a winner, its deletion) to the target, and the store
    keeps it for the target's reads."""
    body = _obj("InferenceTuning", "tune", spec={"targetRef": {"name": "chat"}})
    runtime.on_labelled(body, "ADDED", "InferenceTuning")
    runtime.queue._due.clear()
    runtime.on_labelled(body, event, "InferenceTuning")
    assert (ISVC, "team", "chat") in _due(runtime)
    kept = runtime.store.get("InferenceTuning", "team", "tune")
    assert (kept is None) == (event == "DELETED")


async def test_a_resync_adds_every_service_and_schedules_the_autoscaling_ones(
    runtime: Runtime,
) -> None:
    cluster = _cluster(runtime)
    cluster.put(_obj(KIND_INFERENCE_SERVICE, "a"))
    cluster.put(_obj(KIND_INFERENCE_SERVICE, "b", spec={"autoscaling": {"enabled": True}}))
    await runtime.resync_once()
    assert _due(runtime) == {(ISVC, "team", "a"), (ISVC, "team", "b"), (SCALE, "team", "b")}


async def test_a_failed_resync_list_is_logged_and_skipped(runtime: Runtime) -> None:
    _cluster(runtime).fail[("list", KIND_INFERENCE_SERVICE)] = ApiError(500, "Internal", "x")
    await runtime.resync_once()
    assert _due(runtime) == set()


async def test_service_reconciles_read_nodes_from_the_cache_once_it_is_filled(
    runtime: Runtime, calls: Calls
) -> None:
    seen: list[object] = []

    async def service(api: Any, body: Manifest, *, settings: Any, view: Any, **_: Any) -> Outcome:
        seen.append(view)
        return Outcome(ready=True, stalled=False)

    runtime.reconcile_service = service
    cluster = _cluster(runtime)
    cluster.put(_obj(KIND_INFERENCE_SERVICE))
    cluster.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}})
    await runtime.work((ISVC, "team", "chat"))
    assert seen == [None], "no cache yet: the reconcile lists for itself"
    await runtime.refresh_nodes()
    cluster.calls.clear()
    await runtime.work((ISVC, "team", "chat"))
    view = seen[-1]
    assert [n["metadata"]["name"] for n in view.nodes] == ["gpu-1"]  # type: ignore[attr-defined]
    assert view.gpu_nodes == []  # type: ignore[attr-defined]
    assert not [c for c in cluster.calls if c[0] == "list"], "no LIST in the pass"
    # Watch events keep it current between resyncs.
    runtime.nodes.on_event("ADDED", {"metadata": {"name": "gpu-2"}})
    runtime.nodes.on_event("DELETED", {"metadata": {"name": "gpu-1"}})
    await runtime.work((ISVC, "team", "chat"))
    assert [n["metadata"]["name"] for n in seen[-1].nodes] == ["gpu-2"]  # type: ignore[attr-defined]


async def test_the_labelled_watches_fill_the_store_the_service_reconcile_reads(
    runtime: Runtime, calls: Calls
) -> None:
    child = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {
            "name": "chat", "namespace": "team", "labels": {LABEL_SERVICE: "chat"},
            "ownerReferences": [{"controller": True, "uid": "u-1"}],
        },
    }  # fmt: skip
    runtime.on_labelled(child, "ADDED", "Service")
    _cluster(runtime).put(_obj(KIND_INFERENCE_SERVICE))
    await runtime.work((ISVC, "team", "chat"))
    assert isinstance(calls.api, CachedAPI) and calls.api.store is runtime.store
    assert runtime.store.get("Service", "team", "chat") == child
    runtime.on_labelled(child, "DELETED", "Service")
    assert runtime.store.get("Service", "team", "chat") is None


async def test_a_converged_service_costs_one_request_per_pass() -> None:
    """The resync's pass of a converged service, with the watches' store filled: the GET
    of the service itself, and nothing else (issue 15, item 6: at most 3)."""
    from tests.reconcile.test_inference_service import _node
    from tests.specs import BASE

    api = RecordingCluster()
    api.put(_node("gpu-a", 2))
    api.put(BASE)
    runtime = Runtime(
        settings=OperatorSettings(default_image="registry.local/vllm:test"),
        api=api,
        http=PodClient(),
    )
    await runtime.refresh_nodes()
    await runtime.refresh_store()
    key = (ISVC, "team-a", "chat")
    await runtime.work(key)
    for obj in list(api.objects.values()):  # the watch events of what the pass applied
        runtime.on_labelled(obj, "ADDED")
    api.calls.clear()
    await runtime.work(key)
    assert api.calls == [("get", KIND_INFERENCE_SERVICE, "chat")]
    await runtime.http.aclose()


def test_a_benchmark_event_reconciles_the_benchmark_and_its_target(runtime: Runtime) -> None:
    """The target's status shows the last finished benchmark; the benchmark's end is a
    change of the benchmark alone (found on the real node: the target showed it only at
    the next resync)."""
    runtime.on_inference_benchmark("team", "load", "chat")
    assert _due(runtime) == {(BENCH, "team", "load"), (ISVC, "team", "chat")}


def test_a_tuning_event_reconciles_the_tuning_and_its_target(runtime: Runtime) -> None:
    """The target's pods take an InPlace trial from the tuning's status (and go back when
    it is deleted); a later change of the target reaches the tuning (its Stale)."""
    runtime.on_inference_tuning("team", "fast", "chat")
    assert _due(runtime) == {(TUNE, "team", "fast"), (ISVC, "team", "chat")}
    runtime.queue._due.clear()
    runtime.on_inference_service("MODIFIED", _obj(KIND_INFERENCE_SERVICE))
    assert (TUNE, "team", "fast") in _due(runtime)
    runtime.queue._due.clear()
    runtime.on_inference_tuning("team", "fast", "chat", gone=True)
    assert _due(runtime) == {(ISVC, "team", "chat")}
    runtime.queue._due.clear()
    runtime.on_inference_service("MODIFIED", _obj(KIND_INFERENCE_SERVICE) | {"spec": {"x": 1}})
    assert (TUNE, "team", "fast") not in _due(runtime)


@pytest.mark.parametrize(
    ("failing", "words"),
    [
        ("read", "Reading InferenceService team/chat failed: 0 ConnectionFailed"),
        ("reconcile", "Reconcile of InferenceService team/chat failed: 503 ServiceUnavailable"),
    ],
    ids=[
        "the read of the object failing (apiserver away) is one line",
        "the reconcile failing (a 503) is one line",
    ],
)  # fmt: skip
async def test_a_transient_api_error_logs_one_line_with_the_object_and_no_traceback(
    runtime: Runtime, calls: Calls, caplog: pytest.LogCaptureFixture, failing: str, words: str
) -> None:
    """An apiserver restart made 735 tracebacks: the read before the reconcile raised
    out of the key's turn, and the lines that were logged named neither object nor error
    in the plain format (which prints no extras)."""
    _cluster(runtime).put(_obj(KIND_INFERENCE_SERVICE))
    if failing == "read":
        _cluster(runtime).fail[("get", KIND_INFERENCE_SERVICE)] = ApiError(
            0, "ConnectionFailed", "Cannot connect to host 127.0.0.1:6443"
        )
    else:
        calls.fail = ApiError(503, "ServiceUnavailable", "etcd is down")
    with caplog.at_level(logging.DEBUG, logger="vllm_operator"):
        assert await runtime.work((ISVC, "team", "chat")) == 1.0
    assert len(caplog.records) == 1, [r.getMessage() for r in caplog.records]
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert words in record.getMessage() and "retrying in 1 s" in record.getMessage()


async def test_a_key_that_could_not_reach_the_apiserver_is_retried_at_its_first_answer(
    runtime: Runtime,
) -> None:
    """Not after its back-off: an outage of a minute grows that to 32 s and more, and a
    change pending across an apiserver restart waited for it."""
    cluster = _cluster(runtime)
    cluster.put(_obj(KIND_INFERENCE_SERVICE))
    cluster.put(_obj(KIND_INFERENCE_SERVICE, "other"))
    down, away = ("get", KIND_INFERENCE_SERVICE), ApiError(0, "ConnectionFailed", "refused")
    cluster.fail[down] = away
    key = (ISVC, "team", "chat")
    for _ in range(6):
        delay = await runtime.work(key)
    assert delay == 32.0
    runtime.queue.add(key, delay)  # as the queue's worker does with the delay
    cluster.fail.pop(down)
    await runtime.work((ISVC, "team", "other"))  # the apiserver answers again
    assert runtime.queue._due[key] <= time.monotonic(), "due now, not in 32 s"


async def test_a_refused_request_keeps_its_back_off(runtime: Runtime, calls: Calls) -> None:
    """An answer that refuses (a 503) is no outage: its key waits its back-off."""
    cluster = _cluster(runtime)
    cluster.put(_obj(KIND_INFERENCE_SERVICE))
    cluster.put(_obj(KIND_INFERENCE_SERVICE, "other"))
    key = (ISVC, "team", "chat")
    calls.fail = ApiError(503, "ServiceUnavailable", "etcd is down")
    delay = await runtime.work(key)
    assert delay is not None
    runtime.queue.add(key, delay)
    calls.fail = None
    await runtime.work((ISVC, "team", "other"))
    assert runtime.queue._due[key] > time.monotonic()


async def test_a_namespace_being_deleted_ends_the_key_without_a_retry_or_a_warning(
    runtime: Runtime, calls: Calls, caplog: pytest.LogCaptureFixture
) -> None:
    """The garbage collector removes the children before the service; a pass meanwhile is
    refused (403, cause NamespaceTerminating). Found by the scale benchmark: each such
    pass was a ChildRejected status and a failed event per service."""
    _cluster(runtime).put(_obj(KIND_INFERENCE_SERVICE))
    calls.fail = ApiError(
        403, "Forbidden", "namespace team is being terminated", ("NamespaceTerminating",)
    )
    with caplog.at_level(logging.INFO, logger="vllm_operator"):
        assert await runtime.work((ISVC, "team", "chat")) is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not _cluster(runtime).applied(f"{KIND_INFERENCE_SERVICE}/status")


async def test_the_same_internal_error_five_passes_in_a_row_stalls_the_service(
    runtime: Runtime, calls: Calls
) -> None:
    """A 500 is transient until it repeats: the same one for five passes is reported in
    the status and the key stops retrying; another error, or a success, starts over."""
    _cluster(runtime).put(_obj(KIND_INFERENCE_SERVICE, metadata={"generation": 3}))
    key = (ISVC, "team", "chat")
    calls.fail = ApiError(500, "InternalError", "Deployment.apps is invalid: env[1]: dup")
    assert [await runtime.work(key) for _ in range(4)] == [1.0, 2.0, 4.0, 8.0]
    cluster = _cluster(runtime)
    assert not cluster.applied(f"{KIND_INFERENCE_SERVICE}/status")
    assert await runtime.work(key) is None, "stalled: no retry"
    assert cluster.applied(f"{KIND_INFERENCE_SERVICE}/status") == ["chat"]
    (stored,) = cluster.objects.values()
    conditions = {c["type"]: c for c in stored["status"]["conditions"]}
    assert conditions["Stalled"]["status"] == "True"
    assert conditions["Stalled"]["reason"] == "ApiServerError"
    assert "5 times in a row" in conditions["Ready"]["message"]
    assert "env[1]: dup" in conditions["Ready"]["message"]
    assert runtime.queue.backoff(key) == 1.0, "its back-off forgotten"
    # A 503 between two 500s, or another 500, starts the count again.
    runtime.queue.forget(key)
    for fail in (ApiError(500, "InternalError", "a"), ApiError(503, "Unavailable", "b")) * 3:
        calls.fail = fail
        assert await runtime.work(key) is not None
    calls.fail = None
    assert await runtime.work(key) is None and key not in runtime.repeated
