"""The load client: sends planned requests on schedule and records when things happened.

How it avoids the mistakes of other benchmark clients (PRODUCT.md, "Lessons from the
anchors"):

- **Absolute send times.** Each request is due at ``start + offset`` on the monotonic clock
  and is started by a timer for that instant (``loop.call_at``), never by sleeping for a
  relative gap, so lateness does not accumulate. The loop's timers have microsecond
  resolution (:mod:`vllm_operator.bench.timing`).
- **Schedule lag is recorded.** Each record keeps the scheduled instant and the instant
  the request was actually handed to the HTTP client; the difference is the client's own
  lag, and latency is reported from both instants. If the client falls behind (CPU-bound,
  or its in-flight cap is reached), latency from the scheduled time shows the queueing
  that latency from the send time hides.
- **Tokens from usage.** Every streaming request asks for ``stream_options.include_usage``
  and takes its token counts from the final usage chunk.
- **Deadlines are hard.** A request that has not produced its first token by
  ``scheduled + TTFT SLO``, or not finished by ``scheduled + E2E SLO`` or by
  ``first token + TPOT SLO x (output tokens - 1)``, is abandoned (its connection closed) and
  recorded as a failure of that kind.

HTTP goes through aiohttp, not httpx: on this project's two-core machines httpx (pure-Python
HTTP/1.1 and pool) streamed 170-950 requests/s against a local server where aiohttp, with
its C parser, streamed 3,000-4,700 (see docs/benchmarks/). A load generator that spends its
CPU on HTTP plumbing saturates before the server does.

The hot path does little: request bodies are serialised before the level starts, a
stream's bytes are split on event boundaries and each event decoded once, and one clock
reading stamps all events that arrived together.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import resource
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Literal

import aiohttp
from yarl import URL

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
    def url(self) -> URL:
        path = "/v1/chat/completions" if self.api == "chat" else "/v1/completions"
        return URL(self.endpoint.rstrip("/") + path)


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
            chunk = json.loads(payload)
        except ValueError:
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


class LoadClient:
    """One HTTP session that runs load levels against a target (``async with``)."""

    def __init__(
        self,
        target: Target,
        *,
        max_in_flight: int | None = None,
        run_id: str = "bench",
    ) -> None:
        self.target = target
        self.max_in_flight = max_in_flight
        self.run_id = run_id
        self._session: aiohttp.ClientSession | None = None
        self._url = target.url

    async def __aenter__(self) -> LoadClient:
        connector = aiohttp.TCPConnector(
            # No connection cap of the library's own: a hidden pool limit would queue
            # requests where the schedule lag cannot see it. Caps are ours, explicit.
            limit=0,
            limit_per_host=0,
            keepalive_timeout=60,
            ttl_dns_cache=300,
        )
        # The send instant is when the request's body is handed to the socket, not when
        # the request object is built: aiohttp prepares a request for ~0.1-0.3 ms and, on
        # Python 3.11, writes the body from a task one loop iteration later. That time is
        # the client's, so it belongs to the schedule lag, not to the server's latency.
        trace = aiohttp.TraceConfig()
        trace.on_request_chunk_sent.append(_on_body_sent)
        self._session = aiohttp.ClientSession(
            trace_configs=[trace],
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.target.connect_timeout_s),
            headers={"Content-Type": "application/json", **self.target.headers},
            auto_decompress=False,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("use LoadClient as an async context manager")
        return self._session

    # ---- one request ------------------------------------------------------------------

    async def send(
        self, rec: RequestRecord, body: bytes, deadlines: Deadlines, request_id: str
    ) -> None:
        """Send one request and fill in ``rec``; never raises except on cancellation."""
        target = self.target
        # Provisional: _on_body_sent replaces it with the instant the body is written.
        rec.sent = sent = time.monotonic()
        # Deadlines as absolute instants; the earliest pending one is the timeout's.
        limit = sent + target.request_timeout_s
        ttft_at = rec.scheduled + deadlines.ttft_s if deadlines.ttft_s is not None else None
        e2e_at = rec.scheduled + deadlines.e2e_s if deadlines.e2e_s is not None else None
        pending = _earliest(
            (limit, kinds.TIMEOUT), (ttft_at, kinds.TTFT_DEADLINE), (e2e_at, kinds.E2E_DEADLINE)
        )
        stream = _Stream(target.api == "chat")
        try:
            async with asyncio.timeout_at(pending[0]) as timeout:
                async with self.session.post(
                    self._url,
                    data=body,
                    headers={"X-Request-Id": request_id},
                    trace_request_ctx=rec,
                ) as response:
                    rec.status = response.status
                    if response.status != 200:
                        detail = await response.content.read(ERROR_DETAIL_BYTES)
                        rec.end = time.monotonic()
                        rec.error = kinds.http_error(response.status)
                        rec.error_detail = detail.decode(errors="replace")
                        return
                    if not target.stream:
                        await self._whole(rec, response)
                        return
                    chunk_times = rec.chunk_times
                    async for data in response.content.iter_any():
                        now = time.monotonic()
                        n = stream.feed(data)
                        if n:
                            if rec.first_token is None:
                                rec.first_token = now
                                tpot_at = (
                                    now + deadlines.tpot_s * max(0, rec.output_tokens_planned - 1)
                                    if deadlines.tpot_s is not None
                                    else None
                                )
                                pending = _earliest(
                                    (limit, kinds.TIMEOUT),
                                    (e2e_at, kinds.E2E_DEADLINE),
                                    (tpot_at, kinds.TPOT_DEADLINE),
                                )
                                timeout.reschedule(pending[0])
                            chunk_times.append(now)
                        if stream.done or stream.error:
                            rec.end = now
                            break
                    if rec.end is None:
                        rec.end = time.monotonic()
        except TimeoutError:
            rec.end = time.monotonic()
            rec.error = pending[1]
            return
        except aiohttp.ClientConnectorError as exc:
            rec.end = time.monotonic()
            rec.error, rec.error_detail = kinds.CONNECT_ERROR, str(exc)[:ERROR_DETAIL_BYTES]
            return
        except (
            aiohttp.ClientPayloadError,
            aiohttp.ServerDisconnectedError,
            ConnectionError,
        ) as exc:
            rec.end = time.monotonic()
            rec.error, rec.error_detail = kinds.CONNECTION_LOST, str(exc)[:ERROR_DETAIL_BYTES]
            return
        except aiohttp.ClientResponseError as exc:  # an unparseable response
            rec.end = time.monotonic()
            rec.error, rec.error_detail = kinds.PROTOCOL_ERROR, str(exc)[:ERROR_DETAIL_BYTES]
            return
        except asyncio.CancelledError:
            rec.end = time.monotonic()
            rec.error = kinds.UNFINISHED
            raise
        except Exception as exc:  # a client bug or an odd server: recorded, never fatal
            rec.end = time.monotonic()
            rec.error = kinds.CLIENT_ERROR
            rec.error_detail = f"{type(exc).__name__}: {exc}"[:ERROR_DETAIL_BYTES]
            return
        if stream.error is not None:
            rec.error = stream.error
        elif stream.usage is None:
            rec.error = kinds.NO_USAGE
        if stream.usage is not None:
            rec.prompt_tokens = _int(stream.usage.get("prompt_tokens"))
            rec.completion_tokens = _int(stream.usage.get("completion_tokens"))

    async def _whole(self, rec: RequestRecord, response: aiohttp.ClientResponse) -> None:
        data = await response.read()
        rec.end = time.monotonic()
        try:
            usage = json.loads(data).get("usage") or {}
        except (ValueError, AttributeError):
            rec.error = kinds.PROTOCOL_ERROR
            return
        if not usage:
            rec.error = kinds.NO_USAGE
            return
        rec.prompt_tokens = _int(usage.get("prompt_tokens"))
        rec.completion_tokens = _int(usage.get("completion_tokens"))

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
        len(plans)]``. Closed loop: each worker sends its next request when its last one
        ended. Then in-flight requests get ``drain_timeout_s`` (default: the request
        timeout) to finish; those still running are recorded as ``Unfinished``.
        """
        if not plans:
            raise ValueError("no requests planned")
        bodies = [request_body(self.target, p) for p in plans]
        loop = asyncio.get_running_loop()
        run = _Level(self, loop, plans, bodies, deadlines, on_done, f"{self.run_id}-{label}")
        drain = self.target.request_timeout_s if drain_timeout_s is None else drain_timeout_s
        # Objects alive now (plans, bodies) never need collecting: move them out of the
        # collector's way so that a full collection mid-level is short.
        gc.collect()
        gc.freeze()
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
            gc.unfreeze()
        end = max((r.end for r in run.records if r.end is not None), default=loop.time())
        return LevelRecording(
            load=load,
            records=tuple(sorted(run.records, key=lambda r: r.index)),
            start=start,
            end=end,
            wall_start=wall_now + START_DELAY_S,
            client_cpu_seconds=_cpu_seconds() - cpu0,
            max_in_flight=self.max_in_flight,
        )

    async def preflight(self, plan: RequestPlan) -> RequestRecord:
        """Send one request outside any level (checks the endpoint, model and usage)."""
        rec = RequestRecord(-1, time.monotonic(), plan.prompt_tokens, plan.output_tokens)
        await self.send(
            rec, request_body(self.target, plan), Deadlines(), f"{self.run_id}-preflight"
        )
        return rec


class _Level:
    """The state of one running level."""

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
        self.loop = loop
        self.plans = plans
        self.bodies = bodies
        self.deadlines = deadlines
        self.on_done = on_done
        self.prefix = prefix
        self.records: list[RequestRecord] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.slots = (
            asyncio.Semaphore(client.max_in_flight) if client.max_in_flight is not None else None
        )
        self.offsets: Sequence[float] = ()
        self.start = 0.0
        self.all_launched = asyncio.Event()

    def _record(self, index: int, scheduled: float) -> RequestRecord:
        plan = self.plans[index % len(self.plans)]
        rec = RequestRecord(index, scheduled, plan.prompt_tokens, plan.output_tokens)
        self.records.append(rec)
        return rec

    async def _one(self, rec: RequestRecord) -> None:
        body = self.bodies[rec.index % len(self.bodies)]
        rid = f"{self.prefix}-{rec.index}"
        try:
            if self.slots is not None:
                async with self.slots:
                    await self.client.send(rec, body, self.deadlines, rid)
            else:
                await self.client.send(rec, body, self.deadlines, rid)
        except asyncio.CancelledError:
            if rec.error is None:
                rec.error = kinds.UNFINISHED
                rec.end = time.monotonic()
            raise
        finally:
            if self.on_done is not None:
                self.on_done(rec)

    # -- open loop: one timer at a time, each launch sets the next

    def _launch(self, index: int) -> None:
        # Everything due by now goes out (a burst, or a timer that fired late), then one
        # timer for the next request: O(1) work per request and a one-entry timer heap.
        # Setting all timers up front, or a second's worth at a time, would stall the loop
        # for milliseconds at high rates, and show as schedule lag.
        offsets, start = self.offsets, self.start
        now = self.loop.time()
        while True:
            at = start + offsets[index]
            task = self.loop.create_task(self._one(self._record(index, at)))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            index += 1
            if index == len(offsets):
                self.all_launched.set()
                return
            if start + offsets[index] > now:
                break
        self.loop.call_at(start + offsets[index], self._launch, index)

    async def open_loop(self, start: float, offsets: Sequence[float]) -> None:
        if not offsets:
            return
        self.offsets, self.start = offsets, start
        self.loop.call_at(start + offsets[0], self._launch, 0)
        await self.all_launched.wait()

    # -- closed loop: workers

    async def closed_loop(self, start: float, schedule: ClosedLoop) -> None:
        count = schedule.count
        stop_at = start + schedule.duration if schedule.duration is not None else None
        counter = iter(range(count if count is not None else 2**62))
        await _sleep_until(self.loop, start)

        async def worker() -> None:
            free = start
            for index in counter:
                if stop_at is not None and time.monotonic() >= stop_at:
                    return
                rec = self._record(index, free)
                await self._one(rec)
                free = rec.end if rec.end is not None else time.monotonic()

        workers = [self.loop.create_task(worker()) for _ in range(schedule.concurrency)]
        self.tasks.update(workers)
        for w in workers:
            w.add_done_callback(self.tasks.discard)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*workers)

    async def drain(self, seconds: float) -> None:
        if self.tasks:
            _done, pending = await asyncio.wait(set(self.tasks), timeout=seconds)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)


async def _on_body_sent(
    _session: aiohttp.ClientSession,
    context: SimpleNamespace,
    _params: aiohttp.TraceRequestChunkSentParams,
) -> None:
    # Called by aiohttp just before it writes the body to the transport.
    rec = context.trace_request_ctx
    if isinstance(rec, RequestRecord):
        rec.sent = time.monotonic()


def _earliest(*candidates: tuple[float | None, str]) -> tuple[float, str]:
    return min(((t, k) for t, k in candidates if t is not None), key=lambda c: c[0])


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
