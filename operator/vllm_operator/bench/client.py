"""The load client: sends planned requests on schedule and records when things happened.

How it avoids the mistakes other benchmark clients make:

- **Absolute send times.** Each request is due at ``start + offset`` on the monotonic clock
  and is written by a timer callback for that instant (``loop.call_at``), never after
  sleeping for a relative gap, so lateness does not accumulate. The loop's timers have
  microsecond resolution (:mod:`vllm_operator.bench.timing`).
- **Schedule lag is recorded.** Each record keeps the scheduled instant and the instant the
  request was written to its connection; the difference is the client's own lag, and
  latency is reported from both instants. If the client falls behind (CPU-bound, or its
  in-flight cap is reached), latency from the scheduled time shows the queueing that
  latency from the send time hides.
- **Tokens from usage.** Every streaming request asks for ``stream_options.include_usage``
  and takes its token counts from the final usage chunk.
- **Deadlines are hard.** A request that has not produced its first token by
  ``scheduled + TTFT SLO``, or not finished by ``scheduled + E2E SLO`` or by
  ``first token + TPOT SLO x (output tokens - 1)``, is abandoned (its connection closed)
  and recorded as a failure of that kind.

**HTTP is hand-written on asyncio's protocol layer, with httptools (the C HTTP parser of
uvicorn) for responses.** A general-purpose client costs too much per request for a load
generator on a small machine, and hides when a request really leaves. Measured on the
project's two-core machine against a local server (docs/benchmarks/), httpx streamed
190-1,160 requests/s through one event loop; aiohttp did far better, but the client built
on it still used ~0.26 ms of CPU per request, wrote each request body from a separate task
one or two loop iterations after the send was due (Python 3.11), woke a task for every
chunk, and showed a P99 schedule lag of 4.8 ms at half its maximum rate. Here:

- a due request is written to an idle keep-alive connection *inside the timer callback*,
  and the send instant is stamped there;
- each read from a socket is stamped once, when it arrives (``data_received``), and parsed
  in place: no task wakes up per chunk, and chunks that arrived together share their
  arrival instant;
- no task exists per request at all: a request is a small state object driven by parser
  callbacks, a deadline timer and a future for whoever waits on it.

The HTTP handled is what OpenAI-compatible servers speak: HTTP/1.1 requests with a
``Content-Length`` body, responses with ``Content-Length`` or chunked bodies, keep-alive,
``https`` through the standard ``ssl`` module. No proxies, redirects or compression (none
is asked for).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import resource
import ssl
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import httptools

from vllm_operator.bench import records as kinds
from vllm_operator.bench.arrivals import ClosedLoop, OpenLoop, Schedule
from vllm_operator.bench.records import LevelRecording, Load, RequestRecord
from vllm_operator.bench.workload import RequestPlan

Api = Literal["completions", "chat"]

# The first request of a level is due this long after the level is set up, so that it
# is not late by construction.
START_DELAY_S = 0.05
# Bytes of an error response kept in the record.
ERROR_DETAIL_BYTES = 300
# A non-streaming response body larger than this is a protocol error (runaway server).
MAX_BODY_BYTES = 64 * 2**20
# Connections to one server open at once at most (a closed-loop level raises it to its
# concurrency). Beyond it, due requests wait for a free connection: the lag shows it and
# the level reports it. 4,096 is far above what a server with a few hundred sequences in
# flight can use, and within the open-file limit of a container (the hard limit is lifted
# to; raise_open_file_limit).
DEFAULT_MAX_CONNECTIONS = 4096
# Connections being opened at once at most: paces a burst of new connections so that the
# server's accept queue (often 128 to 4,096 long) never overflows into SYN retransmits,
# which are seconds long.
MAX_CONNECTING = 64


@dataclass(frozen=True)
class Target:
    """Where and how to send: an OpenAI-compatible server and the request shape."""

    endpoint: str
    model: str
    api: Api = "completions"
    stream: bool = True
    # vLLM extension: generate exactly max_tokens, so output lengths follow the workload.
    ignore_eos: bool = True
    headers: Mapping[str, str] = field(default_factory=dict)
    # Give up on a request after this long even without an SLO.
    request_timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    # Extra fields merged into every request body (temperature, ...).
    extra_body: Mapping[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> str:
        prefix = urlsplit(self.endpoint).path.rstrip("/")
        return prefix + ("/v1/chat/completions" if self.api == "chat" else "/v1/completions")

    @property
    def url(self) -> str:
        parts = urlsplit(self.endpoint)
        return f"{parts.scheme}://{parts.netloc}{self.path}"


def server_root(endpoint: str) -> str:
    """The server's base URL as the requests' paths expect it (they add /v1/...): without
    a trailing slash, and without the /v1 of the OpenAI clients' ``base_url`` convention
    (http://host:8000/v1 asked for /v1/v1/models)."""
    root = endpoint.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


@dataclass(frozen=True)
class Deadlines:
    """Per-request deadlines in seconds (None: none). TTFT and E2E count from the scheduled
    instant; TPOT bounds the time from the first token to the last."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None


def request_body(target: Target, plan: RequestPlan) -> bytes:
    """The JSON body of one request."""
    body: dict[str, Any] = {"model": target.model, "max_tokens": plan.output_tokens}
    if target.api == "chat":
        messages = (
            list(plan.messages)
            if plan.messages is not None
            else [{"role": "user", "content": plan.prompt or ""}]
        )
        body["messages"] = messages
    else:
        if plan.prompt is None and plan.messages is not None:
            # A chat dataset sent to the completions API: the messages' text, in order.
            body["prompt"] = "\n".join(str(m.get("content", "")) for m in plan.messages)
        else:
            body["prompt"] = plan.prompt or ""
    if target.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    if target.ignore_eos:
        body["ignore_eos"] = True
    body.update(target.extra_body)
    return json.dumps(body, separators=(",", ":")).encode()


class _Stream:
    """Incremental parser of one server-sent-event stream of OpenAI chunks."""

    __slots__ = ("buffer", "chat", "done", "error", "usage")

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.buffer = b""
        self.done = False
        self.usage: dict[str, Any] | None = None
        self.error: str | None = None

    def feed(self, data: bytes) -> int:
        """Consume bytes; return how many content-carrying chunks completed in them."""
        buffer = self.buffer + data
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        tokens = 0
        while True:
            end = buffer.find(b"\n\n")
            if end < 0:
                break
            event, buffer = buffer[:end], buffer[end + 2 :]
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue  # comments, event names, ids
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.done = True
                    continue
                tokens += self._chunk(payload)
        self.buffer = buffer
        return tokens

    def _chunk(self, payload: bytes) -> int:
        try:
            chunk = json.loads(payload.decode())
        except ValueError:  # UnicodeDecodeError included
            self.error = kinds.PROTOCOL_ERROR
            return 0
        if not isinstance(chunk, dict):
            self.error = kinds.PROTOCOL_ERROR
            return 0
        if chunk.get("error"):
            self.error = kinds.STREAM_ERROR
            return 0
        usage = chunk.get("usage")
        if usage:
            self.usage = usage
        carried = 0
        for choice in chunk.get("choices") or ():
            if self.chat:
                delta = choice.get("delta") or {}
                # The first chat chunk may carry only the role: not a token.
                if (
                    delta.get("content")
                    or delta.get("reasoning_content")
                    or delta.get("reasoning")
                    or delta.get("tool_calls")
                ):
                    carried = 1
            # vLLM sends a chunk per generation step even when the step's text is empty
            # (bytes of an unfinished UTF-8 character); a final chunk with only a finish
            # reason is not a token.
            elif choice.get("text") or choice.get("finish_reason") is None:
                carried = 1
        return carried


class _Exchange:
    """One request: its bytes, its record, its deadline, and the parsing of its response.

    Driven by the connection's parser callbacks; ``future`` completes when the record is
    final (answered, failed or abandoned).
    """

    __slots__ = (
        "body", "conn", "deadlines", "future", "kind", "limit", "on_done", "payload", "rec",
        "retried", "status", "stream", "timer", "waiting_since",
    )  # fmt: skip

    def __init__(
        self,
        rec: RequestRecord,
        payload: bytes,
        deadlines: Deadlines,
        *,
        stream: _Stream | None,
        request_timeout_s: float,
        loop: asyncio.AbstractEventLoop,
        on_done: Callable[[_Exchange], None] | None = None,
    ) -> None:
        self.rec = rec
        self.payload = payload
        self.deadlines = deadlines
        self.stream = stream
        self.on_done = on_done
        self.conn: _Connection | None = None
        self.status = 0
        self.body = bytearray()
        self.future: asyncio.Future[None] = loop.create_future()
        self.limit = time.monotonic() + request_timeout_s
        self.timer: asyncio.TimerHandle | None = None
        self.kind = kinds.TIMEOUT
        self.retried = False
        # When it began waiting for a connection (monotonic), if it did.
        self.waiting_since = 0.0
        # Deadlines count from the schedule, so they run while waiting for a connection.
        sched = rec.scheduled
        self._arm(
            loop,
            (self.limit, kinds.TIMEOUT),
            (None if deadlines.ttft_s is None else sched + deadlines.ttft_s, kinds.TTFT_DEADLINE),
            (None if deadlines.e2e_s is None else sched + deadlines.e2e_s, kinds.E2E_DEADLINE),
        )

    @property
    def finished(self) -> bool:
        return self.future.done()

    def _arm(self, loop: asyncio.AbstractEventLoop, *candidates: tuple[float | None, str]) -> None:
        when, kind = min(((t, k) for t, k in candidates if t is not None), key=lambda c: c[0])
        if self.timer is not None:
            self.timer.cancel()
        self.kind = kind
        self.timer = loop.call_at(when, self._expire)

    def _expire(self) -> None:
        self.timer = None
        conn = self.conn
        self.fail(self.kind)
        if conn is not None:
            conn.abort()  # the server sees the request cancelled

    def start(self, conn: _Connection) -> None:
        """Write the request now, on ``conn`` (idle, connected)."""
        self.conn = conn
        conn.exchange = self
        if not self.retried:
            self.rec.sent = time.monotonic()
        conn.requests += 1
        conn.write(self.payload)

    # -- parser callbacks, via the connection

    def headers_complete(self, status: int) -> None:
        self.status = self.rec.status = status

    def body_received(self, data: bytes, now: float) -> None:
        if self.finished:
            return
        rec = self.rec
        if self.status != 200 or self.stream is None:
            if len(self.body) + len(data) > MAX_BODY_BYTES:
                self.fail(kinds.PROTOCOL_ERROR, "response body too large", abort=True)
                return
            self.body += data
            return
        stream = self.stream
        if stream.feed(data):
            if rec.first_token is None:
                rec.first_token = now
                d = self.deadlines
                tpot_at = (
                    now + d.tpot_s * max(0, rec.output_tokens_planned - 1)
                    if d.tpot_s is not None
                    else None
                )
                e2e_at = rec.scheduled + d.e2e_s if d.e2e_s is not None else None
                self._arm(
                    asyncio.get_running_loop(),
                    (self.limit, kinds.TIMEOUT),
                    (e2e_at, kinds.E2E_DEADLINE),
                    (tpot_at, kinds.TPOT_DEADLINE),
                )
            rec.chunk_times.append(now)
        if stream.done and rec.end is None:
            rec.end = now
        if stream.error is not None:
            self.fail(stream.error, abort=True)

    def message_complete(self, now: float) -> None:
        if self.finished:
            return
        rec = self.rec
        if rec.end is None:
            rec.end = now
        if self.status != 200:
            rec.error = kinds.http_error(self.status)
            rec.error_detail = bytes(self.body[:ERROR_DETAIL_BYTES]).decode(errors="replace")
        elif self.stream is not None:
            usage = self.stream.usage
            if usage is None:
                rec.error = kinds.NO_USAGE
            else:
                rec.prompt_tokens = _int(usage.get("prompt_tokens"))
                rec.completion_tokens = _int(usage.get("completion_tokens"))
        else:
            try:
                data = json.loads(bytes(self.body).decode())
                usage = data.get("usage") if isinstance(data, dict) else None
            except ValueError:
                rec.error = kinds.PROTOCOL_ERROR
            else:
                if not usage:
                    rec.error = kinds.NO_USAGE
                else:
                    rec.prompt_tokens = _int(usage.get("prompt_tokens"))
                    rec.completion_tokens = _int(usage.get("completion_tokens"))
        self._finish()

    def fail(self, kind: str, detail: str | None = None, *, abort: bool = False) -> None:
        """Record a failure (first one wins) and finish; ``abort`` closes the connection."""
        if self.finished:
            return
        rec = self.rec
        rec.end = time.monotonic()
        rec.error = kind
        if detail:
            rec.error_detail = detail[:ERROR_DETAIL_BYTES]
        conn = self.conn
        self._finish()
        if abort and conn is not None:
            conn.abort()

    def _finish(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.conn is not None and self.conn.exchange is self:
            self.conn.exchange = None
        self.future.set_result(None)
        if self.on_done is not None:
            self.on_done(self)


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection carrying one request at a time."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.exchange: _Exchange | None = None
        self.closed = False
        self.now = 0.0
        self.requests = 0
        # Body pieces of the current read: an SSE stream arrives as one HTTP chunk per
        # event, and handing them over once per read halves the work per request.
        self.pieces: list[bytes] = []

    # -- transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            self.pool.forget(self)
            if self.transport is not None:
                self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        ex = self.exchange
        if ex is None:
            return
        self.exchange = None
        if self.requests > 1 and ex.status == 0 and not ex.retried and not ex.finished:
            # A kept-alive connection the server closed (its idle timeout) just as the
            # request was written: the server never read it. Send it once more on a new
            # connection; the send instant stays the first one, so the latency includes
            # the retry.
            ex.retried = True
            ex.conn = None
            self.pool.start(ex, fresh=True)
            return
        ex.fail(kinds.CONNECTION_LOST, str(exc) if exc else "server closed the connection")

    def data_received(self, data: bytes) -> None:
        # One clock reading per read: everything in it arrived at this instant.
        self.now = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.pieces.clear()
            ex = self.exchange
            if ex is not None:
                ex.fail(kinds.PROTOCOL_ERROR, f"{type(exc).__name__}: {exc}")
            self.abort()
            return
        self._flush()

    def _flush(self) -> None:
        if self.pieces:
            data = self.pieces[0] if len(self.pieces) == 1 else b"".join(self.pieces)
            self.pieces.clear()
            if self.exchange is not None:
                self.exchange.body_received(data, self.now)

    # -- httptools callbacks

    def on_headers_complete(self) -> None:
        if self.exchange is not None:
            self.exchange.headers_complete(self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        self.pieces.append(body)

    def on_message_complete(self) -> None:
        self._flush()
        ex = self.exchange
        keep = self.parser.should_keep_alive() and not self.closed
        if ex is not None:
            ex.message_complete(self.now)
        if keep and self.exchange is None:
            self.pool.release(self)
        else:
            self.abort()


class _Pool:
    """Keep-alive connections to one server, bounded: a due request takes an idle
    connection, or waits for one.

    A request that finds no idle connection waits in line, and the pool opens a new
    connection for it only while fewer than ``max_connecting`` are being opened and fewer
    than ``max_connections`` are open or opening. A connection that becomes free, or is
    newly opened, takes the first request in line. The wait is part of the request's
    schedule lag (its send instant is stamped when it is written), and every level
    reports the connections it opened, the most open at once, and the requests that
    found the pool at its cap, so the bound is never hidden.

    Why bounded (issue 21): without a bound, a client past its limit (its loop late, so
    responses that had arrived were not read yet and no connection was idle) opened a new
    connection for every due request: 8,197 connections for 10,699 requests in one run.
    Each connection costs both ends more than a request on a kept-alive one, so the
    client fell further behind and opened more; the server's accept queue overflowed, and
    47-83 % of the requests failed on connect timeouts while 0.4-1.9k req/s of 16k asked
    were delivered. Bounded, a client past its limit sends at its maximum on the
    connections it has and falls behind its schedule, which the lag shows.
    """

    def __init__(
        self,
        endpoint: str,
        connect_timeout_s: float,
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_connecting: int = MAX_CONNECTING,
    ) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoint must be an http(s) URL, got {endpoint!r}")
        if max_connections < 1 or max_connecting < 1:
            raise ValueError("max_connections and max_connecting must be at least 1")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.netloc = parts.netloc
        self.connect_timeout_s = connect_timeout_s
        self.max_connections = max_connections
        self.max_connecting = max_connecting
        self.idle: list[_Connection] = []
        self.all: set[_Connection] = set()
        self.connecting: set[asyncio.Task[None]] = set()
        # Requests due with no idle connection, in the order they became due.
        self.waiting: deque[_Exchange] = deque()
        # Counters (a level reads the difference over its run; it resets the peak).
        self.opened = 0
        self.peak = 0
        self.at_cap = 0

    @property
    def size(self) -> int:
        """Connections open or being opened."""
        return len(self.all) + len(self.connecting)

    def start(self, ex: _Exchange, *, fresh: bool = False) -> None:
        """Write ``ex`` now on an idle connection, or as soon as one is free or newly
        opened (``fresh``: at the head of the line, and not on an idle connection)."""
        while self.idle and not fresh:
            conn = self.idle.pop()
            if not conn.closed:
                ex.start(conn)
                return
        ex.waiting_since = time.monotonic()
        if fresh:
            self.waiting.appendleft(ex)
        else:
            self.waiting.append(ex)
        if self.size >= self.max_connections:
            self.at_cap += 1
        self._grow()

    def _grow(self) -> None:
        """Open connections for the requests in line, within both bounds."""
        loop = asyncio.get_running_loop()
        while (
            len(self.waiting) > len(self.connecting)
            and len(self.connecting) < self.max_connecting
            and self.size < self.max_connections
        ):
            task = loop.create_task(self._connect(time.monotonic()))
            self.connecting.add(task)
            task.add_done_callback(self._connected)
            self.peak = max(self.peak, self.size)

    def _connected(self, task: asyncio.Task[None]) -> None:
        self.connecting.discard(task)
        if self.waiting:
            self._grow()

    async def _connect(self, began: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self),
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl else None,
                )
        except (OSError, TimeoutError) as exc:
            # Everyone who was waiting when this attempt began has waited for a
            # connection as long as it took to fail: they fail with it (the first one at
            # least), the later ones wait for the next attempt.
            detail = f"{type(exc).__name__}: {exc}"
            first = True
            while self.waiting and (first or self.waiting[0].waiting_since <= began):
                ex = self.waiting.popleft()
                if not ex.finished:
                    ex.fail(kinds.CONNECT_ERROR, detail)
                    first = False
            return
        self.opened += 1
        self.all.add(conn)
        self.release(conn)

    def release(self, conn: _Connection) -> None:
        """``conn`` is free: the first request in line takes it, else it goes idle."""
        if conn.closed:
            return
        waiting = self.waiting
        while waiting:
            ex = waiting.popleft()
            if not ex.finished:  # not given up on (a deadline) while it waited
                ex.start(conn)
                return
        self.idle.append(conn)

    def forget(self, conn: _Connection) -> None:
        self.all.discard(conn)
        if self.waiting:  # a place under the cap came free
            self._grow()

    async def close(self) -> None:
        self.waiting.clear()
        for task in list(self.connecting):
            task.cancel()
        await asyncio.gather(*self.connecting, return_exceptions=True)
        for conn in list(self.all):
            conn.abort()
        self.idle.clear()


class LoadClient:
    """Connections to one target that run load levels against it (``async with``)."""

    def __init__(
        self,
        target: Target,
        *,
        max_in_flight: int | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        run_id: str = "bench",
    ) -> None:
        self.target = target
        self.max_in_flight = max_in_flight
        self.max_connections = max_connections
        self.run_id = run_id
        self._pool: _Pool | None = None
        extra = "".join(f"{k}: {v}\r\n" for k, v in target.headers.items())
        netloc = urlsplit(target.endpoint).netloc
        self._head = (
            f"POST {target.path} HTTP/1.1\r\nHost: {netloc}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream, application/json"
            f"\r\nUser-Agent: vllm-operator-bench\r\n{extra}"
        )

    async def __aenter__(self) -> LoadClient:
        self._pool = _Pool(
            self.target.endpoint,
            self.target.connect_timeout_s,
            max_connections=self.max_connections,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @property
    def pool(self) -> _Pool:
        if self._pool is None:
            raise RuntimeError("use LoadClient as an async context manager")
        return self._pool

    def payload(self, body: bytes, request_id: str) -> bytes:
        """The request's bytes on the wire."""
        head = f"{self._head}X-Request-Id: {request_id}\r\nContent-Length: {len(body)}\r\n\r\n"
        return head.encode("latin-1") + body

    def exchange(
        self,
        rec: RequestRecord,
        body: bytes,
        deadlines: Deadlines,
        request_id: str,
        on_done: Callable[[_Exchange], None] | None = None,
    ) -> _Exchange:
        return _Exchange(
            rec,
            self.payload(body, request_id),
            deadlines,
            stream=_Stream(self.target.api == "chat") if self.target.stream else None,
            request_timeout_s=self.target.request_timeout_s,
            loop=asyncio.get_running_loop(),
            on_done=on_done,
        )

    async def send(
        self, rec: RequestRecord, body: bytes, deadlines: Deadlines, request_id: str
    ) -> None:
        """Send one request now and fill in ``rec``; request failures are recorded, not
        raised. Cancelling it abandons the request (recorded as ``Unfinished``)."""
        ex = self.exchange(rec, body, deadlines, request_id)
        self.pool.start(ex)
        try:
            await asyncio.shield(ex.future)
        except asyncio.CancelledError:
            ex.fail(kinds.UNFINISHED, abort=True)
            raise

    async def preflight(self, plan: RequestPlan) -> RequestRecord:
        """Send one request outside any level (checks the endpoint, model and usage)."""
        rec = RequestRecord(-1, time.monotonic(), plan.prompt_tokens, plan.output_tokens)
        body = request_body(self.target, plan)
        await self.send(rec, body, Deadlines(), f"{self.run_id}-preflight")
        return rec

    # ---- one level --------------------------------------------------------------------

    async def run_level(
        self,
        load: Load,
        schedule: Schedule,
        plans: Sequence[RequestPlan],
        deadlines: Deadlines,
        *,
        drain_timeout_s: float | None = None,
        on_done: Callable[[RequestRecord], None] | None = None,
        label: str = "0",
    ) -> LevelRecording:
        """Run one load level to its end and return what was recorded.

        Open loop: request ``i`` is due at ``start + offsets[i]`` and uses ``plans[i %
        len(plans)]``. Closed loop: each slot sends its next request as soon as its last
        one ended. Then in-flight requests get ``drain_timeout_s`` (default: the request
        timeout) to finish; those still running are recorded as ``Unfinished``.
        """
        if not plans:
            raise ValueError("no requests planned")
        bodies = [request_body(self.target, p) for p in plans]
        loop = asyncio.get_running_loop()
        run = _Level(self, loop, plans, bodies, deadlines, on_done, f"{self.run_id}-{label}")
        drain = self.target.request_timeout_s if drain_timeout_s is None else drain_timeout_s
        # Objects alive now (plans, bodies) never need collecting: move them out of the
        # collector's way; and no collection at all while the level runs. Measured on an
        # idle 16-core machine at 3,750 req/s (half the maximum there; issue 21), the
        # collector paused the loop about 100 times in 6 s, its 8-9 second-generation
        # passes for 1.2-3.6 ms each (every request retained grows what they scan): one
        # late request in a thousand, the P99.9, comes from those. A level makes little
        # cyclic garbage (100-1,700 objects for 4,500-22,500 requests, counted by a
        # collection after levels run without one), collected when it ends.
        gc.collect()
        gc.freeze()
        collecting = gc.isenabled()
        gc.disable()
        pool = self.pool
        # A closed loop keeps its concurrency in flight, whatever the cap.
        cap = self.max_connections
        if isinstance(schedule, ClosedLoop):
            cap = max(cap, schedule.concurrency)
        pool.max_connections = cap
        opened0, at_cap0 = pool.opened, pool.at_cap
        pool.peak = pool.size
        cpu0 = _cpu_seconds()
        wall_now, now = time.time(), loop.time()
        start = now + START_DELAY_S
        try:
            if isinstance(schedule, OpenLoop):
                await run.open_loop(start, schedule.offsets)
            else:
                await run.closed_loop(start, schedule)
            await run.drain(drain)
        finally:
            if collecting:
                gc.enable()
            gc.unfreeze()
            pool.max_connections = self.max_connections
        end = max((r.end for r in run.records if r.end is not None), default=loop.time())
        return LevelRecording(
            load=load,
            records=tuple(sorted(run.records, key=lambda r: r.index)),
            start=start,
            end=end,
            wall_start=wall_now + START_DELAY_S,
            client_cpu_seconds=_cpu_seconds() - cpu0,
            max_in_flight=self.max_in_flight,
            connections_opened=pool.opened - opened0,
            connections_peak=pool.peak,
            max_connections=cap,
            requests_at_connection_cap=pool.at_cap - at_cap0,
        )


class _Level:
    """The state of one running level: no task per request, callbacks only."""

    def __init__(
        self,
        client: LoadClient,
        loop: asyncio.AbstractEventLoop,
        plans: Sequence[RequestPlan],
        bodies: Sequence[bytes],
        deadlines: Deadlines,
        on_done: Callable[[RequestRecord], None] | None,
        prefix: str,
    ) -> None:
        self.client = client
        self.pool = client.pool
        self.loop = loop
        self.plans = plans
        self.bodies = bodies
        self.deadlines = deadlines
        self.on_done = on_done
        self.prefix = prefix
        self.records: list[RequestRecord] = []
        self.pending: set[_Exchange] = set()
        self.cap = client.max_in_flight
        self.in_flight = 0
        self.queued: deque[_Exchange] = deque()
        self.offsets: Sequence[float] = ()
        self.start = 0.0
        self.all_launched = loop.create_future()
        # Closed loop state.
        self.next_index = 0
        self.count: int | None = None
        self.stop_at: float | None = None

    def _launch(self, index: int, scheduled: float) -> None:
        plan = self.plans[index % len(self.plans)]
        rec = RequestRecord(index, scheduled, plan.prompt_tokens, plan.output_tokens)
        self.records.append(rec)
        ex = self.client.exchange(
            rec,
            self.bodies[index % len(self.bodies)],
            self.deadlines,
            f"{self.prefix}-{index}",
            self._done,
        )
        self.pending.add(ex)
        if self.cap is not None and self.in_flight >= self.cap:
            self.queued.append(ex)  # waits for a slot; the lag will show it
            return
        self.in_flight += 1
        self.pool.start(ex)

    def _done(self, ex: _Exchange) -> None:
        self.pending.discard(ex)
        if ex in self.queued:  # abandoned at a deadline before it was ever sent
            self.queued.remove(ex)
        else:
            self.in_flight -= 1
            while self.queued and (self.cap is None or self.in_flight < self.cap):
                nxt = self.queued.popleft()
                if not nxt.finished:
                    self.in_flight += 1
                    self.pool.start(nxt)
        if self.on_done is not None:
            self.on_done(ex.rec)
        if self.count is not None or self.stop_at is not None:
            # Closed loop: this slot's next request, once the parser callback that ended
            # this one has returned.
            self.loop.call_soon(self._next_closed, ex.rec.end or time.monotonic())

    # -- open loop: one timer at a time, each launch sets the next

    def _tick(self, index: int) -> None:
        # Everything due by now goes out (a burst, or a timer that fired late), then one
        # timer for the next request: O(1) work per request and a one-entry timer heap.
        offsets, start = self.offsets, self.start
        now = self.loop.time()
        while True:
            self._launch(index, start + offsets[index])
            index += 1
            if index == len(offsets):
                if not self.all_launched.done():
                    self.all_launched.set_result(None)
                return
            if start + offsets[index] > now:
                break
        self.loop.call_at(start + offsets[index], self._tick, index)

    async def open_loop(self, start: float, offsets: Sequence[float]) -> None:
        if not offsets:
            return
        self.offsets, self.start = offsets, start
        self.loop.call_at(start + offsets[0], self._tick, 0)
        await self.all_launched

    # -- closed loop: each finished request starts the next

    def _next_closed(self, free_at: float) -> None:
        if self.all_launched.done():
            return
        if (self.count is not None and self.next_index >= self.count) or (
            self.stop_at is not None and time.monotonic() >= self.stop_at
        ):
            self.all_launched.set_result(None)
            return
        index = self.next_index
        self.next_index += 1
        self._launch(index, free_at)

    async def closed_loop(self, start: float, schedule: ClosedLoop) -> None:
        self.count = schedule.count if schedule.count is not None else 2**62
        self.stop_at = start + schedule.duration if schedule.duration is not None else None
        await _sleep_until(self.loop, start)
        for _ in range(schedule.concurrency):
            self._next_closed(start)
        await self.all_launched

    async def drain(self, seconds: float) -> None:
        pending = [ex.future for ex in self.pending]
        if pending:
            await asyncio.wait(pending, timeout=seconds)
        for ex in list(self.pending):
            ex.fail(kinds.UNFINISHED, abort=True)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def _sleep_until(loop: asyncio.AbstractEventLoop, when: float) -> None:
    if when <= loop.time():
        return
    future: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not future.done():
            future.set_result(None)

    handle = loop.call_at(when, wake)
    try:
        await future
    finally:
        handle.cancel()


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def raise_open_file_limit() -> int:
    """Lift this process's soft limit on open files to the hard limit (an open loop holds
    a connection per request in flight); return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
