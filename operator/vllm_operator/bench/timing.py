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

That wait still ends when the operating system wakes the process, which now and then is
milliseconds late with no work pending: on an idle 16-core machine the bare timers of a
Poisson schedule (nothing sent) fired with a P99.9 lateness of 0.3-3.2 ms at 750 req/s
and 0.3-4.6 ms at 3,750 (repeats of 5 s; issue 21). ``spin_s`` trades CPU for that: the
selector wakes that long before the next timer and polls (epoll with a zero timeout, so
I/O is still served at once) until it is due. Measured the same way, a 0.5 ms spin gave
P99.9 0.03-0.05 ms at 3,750 req/s for 0.8 of a core (0.08 without), a 2 ms spin
0.03-0.04 ms at 750 req/s for 0.75 of a core (0.03 without). Off by default: on a small
shared machine the spinning core is taken from the server or the neighbours.

Everything measured by the bench package uses ``time.monotonic`` (CLOCK_MONOTONIC), the
clock asyncio's loop uses too, so scheduled, send and receive times share one clock, and a
server on the same host (the accuracy tests) can log times on that clock as well.
"""

from __future__ import annotations

import asyncio
import select
import selectors
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class PreciseEpollSelector(selectors.EpollSelector):
    """``EpollSelector`` whose timed waits have microsecond, not millisecond, resolution;
    with ``spin_s``, the last ``spin_s`` of every timed wait is spent polling."""

    def __init__(self, spin_s: float = 0.0) -> None:
        super().__init__()
        self.spin_s = spin_s

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout > 0:
            until = time.monotonic() + timeout
            if timeout > self.spin_s:
                # Blocks until an fd is ready or the timeout passes (µs resolution); either
                # way the zero-timeout epoll poll below collects whatever is ready.
                select.select([self.fileno()], [], [], timeout - self.spin_s)
            ready = super().select(0)
            while not ready and self.spin_s and time.monotonic() < until:
                ready = super().select(0)
            return ready
        return super().select(timeout)


def new_event_loop(spin_s: float = 0.0) -> asyncio.AbstractEventLoop:
    """A selector event loop with precise timers (epoll on Linux; the default elsewhere)."""
    if hasattr(selectors, "EpollSelector"):
        return asyncio.SelectorEventLoop(PreciseEpollSelector(spin_s))
    return asyncio.new_event_loop()


def run(coro: Coroutine[Any, Any, T], *, spin_s: float = 0.0) -> T:
    """``asyncio.run`` on a loop with precise timers (``spin_s``: see the module)."""
    with asyncio.Runner(loop_factory=lambda: new_event_loop(spin_s)) as runner:
        return runner.run(coro)
