"""A work queue of object keys: many triggers, one reconcile at a time per object.

Watch events of an InferenceService and of its children, and the periodic resync, all
just add the object's key. A key waiting is not added twice; a key being reconciled is
run again afterwards if it was added meanwhile; failures come back with exponential
back-off. This is the controller-runtime pattern, in about eighty lines, because Kopf's
per-handler retries keep state in annotations on the user's object, which a GitOps tool
would then see as drift.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from vllm_operator.metrics import QUEUE_DEPTH

log = logging.getLogger(__name__)
K = TypeVar("K")


class WorkQueue(Generic[K]):
    def __init__(self, *, base_delay: float = 1.0, max_delay: float = 300.0) -> None:
        self._due: dict[K, float] = {}
        self._running: set[K] = set()
        # When each running key's turn began (what liveness asks of the queue).
        self._started: dict[K, float] = {}
        self._again: set[K] = set()
        self._failures: dict[K, int] = {}
        self._wake = asyncio.Event()
        self._base = base_delay
        self._max = max_delay

    def add(self, key: K, delay: float = 0.0) -> None:
        """Ask for a reconcile of ``key`` in ``delay`` seconds (earliest request wins)."""
        if key in self._running:
            self._again.add(key)
            return
        due = time.monotonic() + delay
        self._due[key] = min(self._due.get(key, due), due)
        QUEUE_DEPTH.set(len(self._due))
        self._wake.set()

    def backoff(self, key: K) -> float:
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        return float(min(self._max, self._base * 2**n))

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def waiting_since(self, now: float) -> float | None:
        """Since when work has waited at ``now``: the earliest due time of a key that is
        due, or start of a turn still running; None when nothing waits (idle)."""
        times = [due for due in self._due.values() if due <= now]
        times += self._started.values()
        return min(times, default=None)

    async def _next(self) -> K:
        while True:
            now = time.monotonic()
            ready = [k for k, due in self._due.items() if due <= now and k not in self._running]
            if ready:
                key = min(ready, key=lambda k: self._due[k])
                del self._due[key]
                QUEUE_DEPTH.set(len(self._due))
                return key
            self._wake.clear()
            timeout = min((d - now for d in self._due.values()), default=None)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def run(self, work: Callable[[K], Awaitable[float | None]], workers: int) -> None:
        """Run ``work`` for keys as they come due; it returns a delay to requeue or None."""

        async def worker() -> None:
            while True:
                key = await self._next()
                self._running.add(key)
                self._started[key] = time.monotonic()
                try:
                    again = await work(key)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    # Unexpected, so with its traceback (an API error is one line, logged
                    # by the work function itself).
                    again = self.backoff(key)
                    log.exception(
                        "Reconcile of %s failed; retrying in %.0f s.", key, again,
                        extra={"key": key},
                    )  # fmt: skip
                finally:
                    self._running.discard(key)
                    self._started.pop(key, None)
                if again is not None:
                    self.add(key, again)
                if key in self._again:
                    self._again.discard(key)
                    self.add(key)

        await asyncio.gather(*(worker() for _ in range(workers)))
