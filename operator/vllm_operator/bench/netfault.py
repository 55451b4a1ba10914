"""Network faults between the load generator and the server, without privileges.

The chaos layer of a benchmark (issue 22) asks what the tail does when the network between
clients and the server misbehaves: latency, jitter, loss. ``tc netem`` needs NET_ADMIN,
which the restricted Pod Security profile forbids a load Job, so the faults are made here,
in user space: :class:`FaultProxy` listens on loopback inside the load generator's own
process, the client sends to it, and it relays every connection to the target, holding each
piece of data back for the impairment's delay before passing it on. Both directions are
delayed, so a request's TTFT grows by two delays (a round trip), its ITL by the jitter.

What a proxy above TCP can and cannot imitate:

- **Delay and jitter**: each read is passed on at its arrival plus the delay plus a uniform
  jitter in ``[-jitter, +jitter]`` (never before its arrival). TCP delivers a byte stream in
  order, so a piece is never passed on before the piece read before it: jitter that would
  reorder shows as a piece held until its predecessor has gone, as a real stream would.
- **Loss**: a lost segment reaches the application only when TCP has sent it again, and
  everything behind it waits (head-of-line blocking). With probability ``loss`` a read is
  held back one retransmission timeout more (``retransmit_s``, default 0.2 s: Linux's
  minimum RTO); nothing is ever dropped from the stream. Real loss on a long-lived
  connection is often repaired faster (fast retransmit after three duplicate ACKs, about
  one round trip); ``retransmit_s`` sets that.

The reads are what the kernel hands the proxy: a response's chunks arrive as separate reads
when the server writes them apart in time (every token of a streamed completion), so each
is impaired on its own, as packets of a real network would be.
"""

from __future__ import annotations

import asyncio
import collections
import math
import random
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

# Linux's minimum retransmission timeout (TCP_RTO_MIN, 200 ms).
DEFAULT_RETRANSMIT_S = 0.2
# Above this many bytes held for one direction, the proxy stops reading that side until
# they have gone (the flow control a real path's window gives).
HIGH_WATER_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Impairment:
    """What the network between the client and the server does to each direction."""

    delay_s: float = 0.0
    jitter_s: float = 0.0
    loss: float = 0.0
    retransmit_s: float = DEFAULT_RETRANSMIT_S
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("delay_s", "jitter_s", "retransmit_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number of seconds >= 0, not {value}")
        if not math.isfinite(self.loss) or not 0 <= self.loss < 1:
            raise ValueError(f"loss must be a fraction in [0, 1), not {self.loss}")

    @classmethod
    def from_milliseconds(
        cls, delay: float, jitter: float, loss: float, retransmit: float, seed: int = 0
    ) -> Impairment:
        """The impairment of the spec's and the flags' units (milliseconds)."""
        return cls(delay / 1e3, jitter / 1e3, loss, retransmit / 1e3, seed)

    @property
    def active(self) -> bool:
        return bool(self.delay_s or self.jitter_s or self.loss)

    def describe(self) -> str:
        parts = []
        if self.delay_s:
            parts.append(f"delay {self.delay_s * 1e3:g} ms")
        if self.jitter_s:
            parts.append(f"jitter ±{self.jitter_s * 1e3:g} ms")
        if self.loss:
            parts.append(f"loss {self.loss:.3g} (retransmit {self.retransmit_s * 1e3:g} ms)")
        return (", ".join(parts) or "none") + " each way"


class Schedule:
    """When each read of one direction is passed on: in order, never before it arrived."""

    def __init__(self, impairment: Impairment, rng: random.Random) -> None:
        self.impairment = impairment
        self.rng = rng
        self.last = -math.inf

    def due(self, arrived: float) -> float:
        imp = self.impairment
        at = arrived + imp.delay_s
        if imp.jitter_s:
            at += self.rng.uniform(-imp.jitter_s, imp.jitter_s)
        if imp.loss and self.rng.random() < imp.loss:
            at += imp.retransmit_s
        self.last = max(self.last, arrived, at)
        return self.last


# What a side's queue carries besides data: the end of its stream, and its close.
_EOF = b"EOF"
_CLOSE = b"CLOSE"


class _Side(asyncio.Protocol):
    """One socket of a relayed connection; what it reads goes to its peer, impaired.

    What is read waits in one queue, in order, with the instant it is due; one timer at a
    time passes on everything due. (Timers due at the same instant have no defined order in
    asyncio, and reads held behind a lost one all come due at once.)"""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.queue: collections.deque[tuple[float, bytes, bytes]] = collections.deque()
        self.timer: asyncio.TimerHandle | None = None
        self.held = 0  # bytes read here and not yet written to the peer
        self.closed = False
        self.orphan = False  # the upstream connection could not be made

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def _enqueue(self, kind: bytes, data: bytes = b"") -> None:
        loop = asyncio.get_running_loop()
        self.queue.append((self.schedule.due(loop.time()), kind, data))
        if self.timer is None:
            self._arm(loop)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        self.timer = loop.call_at(self.queue[0][0], self._pass_on) if self.queue else None

    def data_received(self, data: bytes) -> None:
        self.held += len(data)
        if self.held > HIGH_WATER_BYTES and self.transport is not None:
            self.transport.pause_reading()
        self._enqueue(b"", data)

    def eof_received(self) -> bool | None:
        # The end of the stream travels behind its data, with the same delay.
        self._enqueue(_EOF)
        return True  # keep our side open for the peer's answer

    def connection_lost(self, exc: Exception | None) -> None:
        # A close or reset reaches the other side after the data in front of it.
        self.closed = True
        self._enqueue(_CLOSE)

    def _pass_on(self) -> None:
        """Write what is due to the peer (only once the peer is connected)."""
        loop = asyncio.get_running_loop()
        self.timer = None
        peer = self.peer
        if self.orphan:
            self.queue.clear()
            return
        if peer is None or peer.transport is None:
            return  # the upstream connection is still being made: _connect passes it on
        now = loop.time()
        while self.queue and self.queue[0][0] <= now:
            _, kind, data = self.queue.popleft()
            if peer.closed:
                continue
            if kind == _EOF:
                if peer.transport.can_write_eof():
                    try:
                        peer.transport.write_eof()
                    except OSError:
                        peer.transport.close()
                else:
                    peer.transport.close()
            elif kind == _CLOSE:
                peer.transport.close()
            else:
                self.held -= len(data)
                peer.transport.write(data)
        if self.held <= HIGH_WATER_BYTES // 2 and self.transport is not None and not self.closed:
            self.transport.resume_reading()
        self._arm(loop)


def relayed_address(target: str) -> tuple[str, int]:
    """The host and port the relay connects to; ValueError unless ``target`` is http://
    (the relay passes bytes on, so it cannot sit inside TLS)."""
    parts = urlsplit(target)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"network faults need an http:// endpoint, not {target!r}")
    return parts.hostname, parts.port or 80


class FaultProxy:
    """Relay ``target`` (an http:// URL) through a loopback port with ``impairment``.

    ``async with FaultProxy(url, impairment) as proxy``: send to ``proxy.url`` instead of
    ``url``. Every connection gets its own pair of schedules, seeded from the impairment's
    seed and the connection's number, so a run is reproducible for a given arrival order.
    """

    def __init__(self, target: str, impairment: Impairment) -> None:
        self.target = target
        self.target_host, self.target_port = relayed_address(target)
        self.impairment = impairment
        self.connections = 0
        self.server: asyncio.Server | None = None
        self.port = 0
        self.tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        parts = urlsplit(self.target)
        return urlunsplit(parts._replace(netloc=f"127.0.0.1:{self.port}"))

    async def __aenter__(self) -> FaultProxy:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(self._accepted, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in list(self.tasks):
            task.cancel()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    def _accepted(self) -> _Side:
        self.connections += 1
        number = self.connections
        imp = self.impairment
        inbound = _Side(Schedule(imp, random.Random(f"{imp.seed}:{number}:up")))
        task = asyncio.get_running_loop().create_task(self._connect(inbound, number))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return inbound

    async def _connect(self, inbound: _Side, number: int) -> None:
        imp = self.impairment
        loop = asyncio.get_running_loop()
        outbound = _Side(Schedule(imp, random.Random(f"{imp.seed}:{number}:down")))
        try:
            await loop.create_connection(lambda: outbound, self.target_host, self.target_port)
        except OSError:
            # The client sees what it would see of an unreachable server: a closed connection.
            inbound.orphan = True
            if inbound.transport is not None:
                inbound.transport.close()
            return
        inbound.peer, outbound.peer = outbound, inbound
        # What the client sent meanwhile, and one timer for the rest.
        if inbound.timer is not None:
            inbound.timer.cancel()
        inbound._pass_on()
