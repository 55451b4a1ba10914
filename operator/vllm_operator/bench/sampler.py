"""Reads Prometheus endpoints through a level (what bench/resources.py summarizes).

The scrapes use their own connections, never the load's, and parse off the event loop:
the load's sends share that loop, and a parse of a vLLM's /metrics takes milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Sequence

import httpx

from vllm_operator.bench.resources import (
    DEFAULT_INTERVAL_S,
    ResourceStats,
    Sample,
    parse_sample,
    summarize_resources,
)
from vllm_operator.releases.metrics import MetricsError

SCRAPE_TIMEOUT_S = 5.0


class ResourceSampler:
    """Scrapes ``urls`` every ``interval_s`` between ``start()`` and ``stop()``; a scrape
    at each end, so that the level's averages span all of it."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if not urls:
            raise ValueError("no URL to scrape")
        if not interval_s > 0 or not math.isfinite(interval_s):
            raise ValueError(f"the scrape interval must be a positive number, not {interval_s}")
        self.urls = tuple(urls)
        self.interval_s = interval_s
        self._client = client
        self._own_client = client is None
        self._samples: list[list[Sample]] = [[] for _ in self.urls]
        self._errors = 0
        self._last_error: str | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ResourceSampler:
        if self._client is None:
            # One connection per URL at most, none shared with the load.
            self._client = httpx.AsyncClient(
                timeout=SCRAPE_TIMEOUT_S,
                limits=httpx.Limits(max_connections=len(self.urls)),
            )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._cancel()
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _scrape(self, i: int, url: str) -> None:
        assert self._client is not None
        try:
            resp = await self._client.get(url)
            resp.raise_for_status()
            sample = await asyncio.to_thread(parse_sample, url, resp.text, time.monotonic())
        except (httpx.HTTPError, MetricsError) as err:
            self._errors += 1
            self._last_error = f"{url}: {err}"
            return
        self._samples[i].append(sample)

    async def _scrape_all(self) -> None:
        await asyncio.gather(*(self._scrape(i, u) for i, u in enumerate(self.urls)))

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self._scrape_all()

    async def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def start(self) -> None:
        """Forget earlier samples, take one now, and go on every interval."""
        await self._cancel()
        self._samples = [[] for _ in self.urls]
        self._errors, self._last_error = 0, None
        await self._scrape_all()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> ResourceStats | None:
        """The last scrape, and the figures since ``start()``."""
        await self._cancel()
        await self._scrape_all()
        return summarize_resources(self._samples, errors=self._errors, last_error=self._last_error)
