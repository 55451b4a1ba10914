"""Liveness: stuck means work has waited past the bound and nothing completed in it; an
idle operator is healthy. The decision is a pure function of monotonic times (passed in,
never read from the clock here), and the runtime's inputs to it come from the queue and
the resync; the endpoint answers 200 or 503 with the reason."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.fakes import RecordingCluster
from vllm_operator.constants import API_VERSION, KIND_INFERENCE_SERVICE
from vllm_operator.k8s.api import ApiError
from vllm_operator.models.base import Manifest
from vllm_operator.reconcile.inference_service import Outcome
from vllm_operator.runtime.dispatch import ISVC, Runtime
from vllm_operator.runtime.health import HealthServer, stuck
from vllm_operator.runtime.queue import WorkQueue
from vllm_operator.servers.pods import PodClient
from vllm_operator.settings import OperatorSettings

BOUND = 60.0
DEADLINE_S = 10  # ends a broken run; nothing here is timed


@pytest.mark.parametrize(
    ("waiting_since", "last_progress", "expected_stuck"),
    [
        (None, -3600.0, False),
        (-10.0, -3600.0, False),
        (-100.0, -5.0, False),
        (-100.0, -100.0, True),
        (-100.0, -61.0, True),
    ],
    ids=[
        "idle for an hour with nothing waiting is healthy",
        "work waiting less than the bound is healthy",
        "work waiting long while other work completes is healthy",
        "work waiting past the bound with nothing completed is stuck",
        "the last completion just past the bound is stuck",
    ],
)  # fmt: skip
def test_stuck_needs_waiting_work_and_no_completion_within_the_bound(
    waiting_since: float | None, last_progress: float, expected_stuck: bool
) -> None:
    reason = stuck(0.0, waiting_since=waiting_since, last_progress=last_progress, bound=BOUND)
    assert (reason is not None) == expected_stuck
    if reason:
        assert "the bound is 60 s" in reason


def test_the_queue_waits_since_its_oldest_due_key() -> None:
    queue = WorkQueue[str]()
    assert queue.waiting_since(time.monotonic()) is None, "empty: idle"
    queue.add("later", delay=3600)
    now = time.monotonic()
    assert queue.waiting_since(now) is None, "a key due in an hour is not waiting yet"
    queue.add("now")
    since = queue.waiting_since(now + 1)
    assert since is not None and since <= now + 1


def _service() -> Manifest:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND_INFERENCE_SERVICE,
        "metadata": {"name": "chat", "namespace": "team"},
    }


def _runtime(reconcile: object, **settings: float) -> Runtime:
    api = RecordingCluster()
    api.put(_service())
    return Runtime(
        settings=OperatorSettings(liveness_seconds=BOUND, resync_seconds=120, **settings),
        api=api,
        http=PodClient(),
        reconcile_service=reconcile,  # type: ignore[arg-type]
    )


async def test_a_reconcile_that_never_returns_is_stuck_after_the_bound() -> None:
    started, never = asyncio.Event(), asyncio.Event()

    async def hangs(*_: object, **__: object) -> Outcome:
        started.set()
        await never.wait()
        raise AssertionError("unreachable")

    runtime = _runtime(hangs)
    runtime.queue.add((ISVC, "team", "chat"))
    task = asyncio.create_task(runtime.queue.run(runtime.work, 1))
    try:
        await asyncio.wait_for(started.wait(), DEADLINE_S)
        now = time.monotonic()
        assert runtime.health(now) is None, "running, within the bound"
        reason = runtime.health(now + BOUND + 1)
        assert reason is not None and "nothing completed" in reason
    finally:
        task.cancel()
        await runtime.http.aclose()


async def test_an_idle_operator_stays_healthy_however_long_nothing_happens() -> None:
    async def converges(*_: object, **__: object) -> Outcome:
        return Outcome(ready=True, stalled=False)

    runtime = _runtime(converges)
    await runtime.work((ISVC, "team", "chat"))
    await runtime.resync_once()  # lists the service: its pass is due within the spread
    runtime.queue._due.clear()  # as if that pass ran too
    now = time.monotonic()
    assert runtime.health(now + BOUND + 1) is None, "resync on time, nothing due"
    await runtime.http.aclose()


async def test_a_resync_overdue_past_the_bound_with_every_list_failing_is_stuck() -> None:
    async def converges(*_: object, **__: object) -> Outcome:
        return Outcome(ready=True, stalled=False)

    runtime = _runtime(converges)
    api = runtime.api
    assert isinstance(api, RecordingCluster)
    api.fail[("list", KIND_INFERENCE_SERVICE)] = ApiError(0, "ConnectionFailed", "timed out")
    await runtime.resync_once()
    now = time.monotonic()
    overdue = now + runtime.settings.resync_seconds + BOUND + 1
    assert runtime.health(overdue) is not None
    api.fail.clear()
    await runtime.resync_once()
    assert runtime.health(time.monotonic()) is None, "a resync that lists is progress"
    await runtime.http.aclose()


async def test_the_endpoint_answers_200_or_503_with_the_reason() -> None:
    reason: list[str | None] = [None]
    server = HealthServer(lambda: reason[0], host="127.0.0.1", port=0)
    await server.start()
    try:
        async with httpx.AsyncClient(timeout=DEADLINE_S) as client:
            url = f"http://127.0.0.1:{server.port}/healthz"
            ok = await client.get(url)
            assert ok.status_code == 200 and ok.json() == {"status": "ok"}
            reason[0] = "work has waited 90 s and nothing completed for 90 s"
            bad = await client.get(url)
            assert bad.status_code == 503
            assert bad.json() == {"status": "stuck", "reason": reason[0]}
    finally:
        await server.close()


async def test_ready_means_healthy_and_the_caches_filled() -> None:
    """/readyz: 503 "starting" with the reason while not ready, 503 "stuck" while stuck
    (whatever readiness says), 200 once both are fine; /healthz ignores readiness."""
    stuck_reason: list[str | None] = [None]
    starting: list[str | None] = ["the first LISTs of Pod have not all been answered yet"]
    server = HealthServer(
        lambda: stuck_reason[0], ready=lambda: starting[0], host="127.0.0.1", port=0
    )
    await server.start()
    try:
        async with httpx.AsyncClient(timeout=DEADLINE_S) as client:
            base = f"http://127.0.0.1:{server.port}"
            early = await client.get(f"{base}/readyz")
            assert early.status_code == 503
            assert early.json() == {"status": "starting", "reason": starting[0]}
            assert (await client.get(f"{base}/healthz")).status_code == 200
            starting[0] = None
            ready = await client.get(f"{base}/readyz")
            assert ready.status_code == 200 and ready.json() == {"status": "ok"}
            stuck_reason[0] = "work has waited 90 s and nothing completed for 90 s"
            gone = await client.get(f"{base}/readyz")
            assert gone.status_code == 503 and gone.json()["status"] == "stuck"
    finally:
        await server.close()


async def test_the_runtime_is_ready_once_every_cache_was_listed() -> None:
    api = RecordingCluster()
    runtime = Runtime(settings=OperatorSettings(), api=api, http=PodClient())
    assert "Node, GPUNode" in (runtime.readiness() or "")
    await runtime.fill_caches()
    assert runtime.readiness() is None
