"""The work queue: a key waiting is not added twice, a key added while it runs runs once
more afterwards (never twice at once), the earliest request wins, failures come back with
exponential back-off. Behaviour is asserted, never elapsed time; the waits below are
deadlines that only end a broken run."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from vllm_operator.runtime.queue import WorkQueue

DEADLINE_S = 10


@contextlib.asynccontextmanager
async def running(
    queue: WorkQueue[str], work: Callable[[str], Awaitable[float | None]], workers: int = 4
) -> AsyncIterator[None]:
    task = asyncio.create_task(queue.run(work, workers))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_key_added_many_times_while_waiting_runs_once() -> None:
    queue: WorkQueue[str] = WorkQueue()
    runs: Counter[str] = Counter()
    done = asyncio.Event()

    async def work(key: str) -> None:
        runs[key] += 1
        if key == "last":
            done.set()

    for _ in range(5):
        queue.add("a")
    queue.add("b")
    queue.add("last", delay=0.05)  # due after the others
    async with running(queue, work):
        await asyncio.wait_for(done.wait(), DEADLINE_S)
    assert runs == {"a": 1, "b": 1, "last": 1}


async def test_a_key_added_while_it_runs_runs_again_after_never_beside_itself() -> None:
    queue: WorkQueue[str] = WorkQueue()
    inside = 0
    most_inside = 0
    runs = 0
    second_done = asyncio.Event()

    async def work(key: str) -> None:
        nonlocal inside, most_inside, runs
        inside += 1
        most_inside = max(most_inside, inside)
        runs += 1
        if runs == 1:
            queue.add(key)  # a watch event while this reconcile works
            queue.add(key)
            await asyncio.sleep(0.05)  # more workers than keys: one could pick it up
        inside -= 1
        if runs == 2:
            second_done.set()

    queue.add("a")
    async with running(queue, work, workers=4):
        await asyncio.wait_for(second_done.wait(), DEADLINE_S)
        await asyncio.sleep(0.1)  # room for a wrong third run to happen
    assert runs == 2 and most_inside == 1


async def test_the_earliest_request_wins() -> None:
    queue: WorkQueue[str] = WorkQueue()
    ran = asyncio.Event()

    async def work(key: str) -> None:
        ran.set()

    queue.add("a", delay=3600)
    queue.add("a", delay=0)
    async with running(queue, work):
        await asyncio.wait_for(ran.wait(), DEADLINE_S)


async def test_work_that_asks_to_come_back_is_run_again() -> None:
    queue: WorkQueue[str] = WorkQueue()
    runs = 0
    third = asyncio.Event()

    async def work(key: str) -> float | None:
        nonlocal runs
        runs += 1
        if runs == 3:
            third.set()
            return None
        return 0.01

    queue.add("a")
    async with running(queue, work):
        await asyncio.wait_for(third.wait(), DEADLINE_S)
    assert runs == 3


async def test_a_failure_is_retried_with_back_off() -> None:
    queue: WorkQueue[str] = WorkQueue(base_delay=0.01)
    runs = 0
    recovered = asyncio.Event()

    async def work(key: str) -> None:
        nonlocal runs
        runs += 1
        if runs < 3:
            raise RuntimeError("the apiserver went away")
        recovered.set()

    queue.add("a")
    async with running(queue, work):
        await asyncio.wait_for(recovered.wait(), DEADLINE_S)
    assert runs == 3
    # Two failures were counted: the next back-off is the third step.
    assert queue.backoff("a") == pytest.approx(0.04)


def test_back_off_doubles_up_to_the_cap_and_forget_resets_it() -> None:
    queue: WorkQueue[str] = WorkQueue(base_delay=1.0, max_delay=10.0)
    assert [queue.backoff("a") for _ in range(6)] == [1, 2, 4, 8, 10, 10]
    assert queue.backoff("b") == 1, "per key"
    queue.forget("a")
    assert queue.backoff("a") == 1
