"""An event loop that wakes up on time: sub-millisecond timers for sending on schedule.

A benchmark client must send each request at its scheduled instant; the gap between the two
(schedule lag) is part of what it reports. asyncio's default loop on Linux waits in
``epoll_wait``, whose timeout has a resolution of one millisecond, and the standard library
rounds the timeout *up* (``selectors.EpollSelector.select``), so every timer fires between
0 and 1 ms late: the median lag of an idle client is already ~0.5 ms and its P99 ~1 ms.

:class:`PreciseEpollSelector` keeps epoll for readiness but waits through ``select(2)`` on the
epoll file descriptor itself (an epoll fd is readable when any fd registered with it is
ready), whose timeout is a ``timeval`` with microsecond resolution. The kernel then wakes the
loop within its timer slack (50 µs by default) instead of up to a millisecond late. One
extra cheap system call per timed wait is the whole cost; waits without a timeout, and
polls with a zero timeout, go straight to epoll as before.

Everything measured by the bench package uses ``time.monotonic`` (CLOCK_MONOTONIC), the
clock asyncio's loop uses too, so scheduled, send and receive times share one clock, and a
server on the same host (the accuracy tests) can log times on that clock as well.
"""

from __future__ import annotations

import asyncio
import select
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class PreciseEpollSelector(selectors.EpollSelector):
    """``EpollSelector`` whose timed waits have microsecond, not millisecond, resolution."""

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout > 0:
            # Blocks until an fd is ready or the timeout passes (µs resolution); either way
            # the zero-timeout epoll poll below collects whatever is ready.
            select.select([self.fileno()], [], [], timeout)
            timeout = 0
        return super().select(timeout)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A selector event loop with precise timers (epoll on Linux; the default elsewhere)."""
    if hasattr(selectors, "EpollSelector"):
        return asyncio.SelectorEventLoop(PreciseEpollSelector())
    return asyncio.new_event_loop()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on a loop with precise timers."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)
