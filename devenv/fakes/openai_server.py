"""The one fake OpenAI-compatible server: known, injected delays and failures.

It is a boundary we own (the HTTP API that the load generator and warmup speak), not a
model of vLLM: it answers ``/health``, ``/v1/models``, ``/tokenize``, ``/detokenize``,
``/metrics`` (vLLM's request gauges and latency sum, from what it serves),
``/v1/completions`` and ``/v1/chat/completions`` (streaming with
``stream_options.include_usage``, or not), and it keeps a log of what it did, on the host's
monotonic clock, for every generation request: when the request had fully arrived, what it
asked for, when each chunk was due and when it was written, when the response ended. That
log is the truth the accuracy tests compare the client's measurements with.

Two ways to run it, one server:

- ``FakeServerProcess``: its own process (the load generator's tests, the overload
  benchmark, the client comparison), configured by a ``Config`` sent as JSON.
- ``FakeOpenAI``: a thread and event loop of this process, so that synchronous tests (the
  CLI calls ``asyncio.run``) can use it as well as async ones (warmup's tests, and the
  fault-server image of the cluster tier, ``devenv/cluster/fault_server.py``). Its
  ``Config`` is read live: a test may change it mid-run, and may give the time to the first
  token as a function of the request's index. It records what it received
  (``FakeOpenAI.received``), counts its health checks, and stops as vLLM does with
  ``--shutdown-timeout`` (no new connection; the generations in flight finish for up to
  that many seconds).

Why a raw asyncio protocol, and a separate process for the load generator:

- Precision. Delays are scheduled at absolute times on a loop with microsecond timers
  (``vllm_operator.bench.timing``); a server thread inside the test process would share the
  GIL with the client and delay its writes (or the client's reads) by up to the
  interpreter's 5 ms switch interval.
- Speed. The client comparison (``scripts/bench_compare.py``) needs a server that is not
  the bottleneck; a hand-written HTTP/1.1 responder that writes a whole zero-delay response
  in one ``write`` is several times faster per request than a web framework. It speaks just
  enough HTTP/1.1: ``Content-Length`` request bodies, keep-alive, chunked responses.

Delays come from a seeded distribution keyed by the request's ``X-Request-Id`` header (or
arrival order without one), so they do not depend on the order in which requests arrive.
Tokens are words: ``/tokenize`` splits on whitespace; usage counts words and tokens.

Run: ``python -m devenv.fakes.openai_server --config '{"ttft": {"kind": "fixed", "value": 0.02}}'``
prints ``PORT <n>`` on stdout once listening and serves until stdin closes or SIGTERM.
``GET /_log`` returns the log as JSON and clears it. ``GET /_stats`` returns counters and
resets them: generation requests (a client's preflight, whose request id ends in
``preflight``, apart), the first and last arrival instants, and connections: accepted in
all, and those that carried a generation request (opened, and the most open at once).
With ``"log": false`` the server keeps only these counters (no per-request log, whose
growth would slow a server taking tens of thousands of requests a second).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from typing import Any

from vllm_operator.bench.timing import new_event_loop

MODEL = "fake-model"
# The context length /v1/models reports unless a Config says otherwise.
MAX_MODEL_LEN = 4096
# Requests the KV cache /metrics reports holds (its usage: requests in flight over this).
KV_REQUESTS = 16


@dataclass(frozen=True)
class Delay:
    """Seconds to wait: fixed, or drawn from a heavy-tailed distribution."""

    kind: str = "fixed"  # fixed | lognormal | pareto
    value: float = 0.0  # fixed
    median: float = 0.0  # lognormal
    sigma: float = 1.0  # lognormal
    scale: float = 0.0  # pareto: smallest value
    alpha: float = 2.0  # pareto: tail index (smaller: heavier)
    max: float = 10.0  # cap for the heavy-tailed kinds

    def draw(self, rng: random.Random) -> float:
        if self.kind == "fixed":
            return self.value
        if self.kind == "lognormal":
            return min(self.max, rng.lognormvariate(math.log(self.median), self.sigma))
        if self.kind == "pareto":
            return min(self.max, self.scale * rng.paretovariate(self.alpha))
        raise ValueError(f"unknown delay kind {self.kind}")


@dataclass
class Config:
    """What the server does. Mutable: a ``FakeOpenAI`` reads it live, so a test may change
    it while the server runs; a ``FakeServerProcess`` gets a copy, as JSON, at its start."""

    # Seconds before the first token: a Delay, or (``FakeOpenAI`` only: a function does not
    # cross to another process) a function of the generation request's 0-based index.
    ttft: Delay | Callable[[int], float] = field(default_factory=Delay)
    itl: Delay = field(default_factory=Delay)
    seed: int = 0
    # Tokens per streamed chunk: >1 checks that the client counts tokens from usage.
    tokens_per_chunk: int = 1
    # Every n-th generation request (1-based) answers HTTP 500; 0: never.
    fail_every: int = 0
    # Close a kept-alive connection when its second request arrives, unanswered: what a
    # server's idle timeout does when it races a client's next request.
    drop_reused: bool = False
    # Keep the per-request log (GET /_log); the counters of GET /_stats are kept always.
    log: bool = True
    # HTTP status of /health, of /v1/models and of every generation request (200: answer
    # normally; else an OpenAI error body, "engine broken", as vLLM's engine errors read).
    health_status: int = 200
    models_status: int = 200
    generate_status: int = 200
    # The context length /v1/models and /tokenize report.
    max_model_len: int = MAX_MODEL_LEN
    # Tokens in every answer; None: as many as the request's max_tokens.
    output_tokens: int | None = None
    # CPU seconds of work before the first token (busy, in the serving thread: a server
    # bound by its CPU, whose latency grows when something else takes the CPU).
    cpu_seconds: float = 0.0
    # Seconds added to the first token per other generation in flight when a request
    # arrives: latency that grows with the load, as a server's queue makes it (0: none).
    # Each request's delays are its own timers, so requests in flight overlap either way.
    ttft_per_in_flight: float = 0.0

    @classmethod
    def from_json(cls, text: str) -> Config:
        raw: dict[str, Any] = json.loads(text) if text else {}
        ttft = Delay(**raw.pop("ttft", {}))
        itl = Delay(**raw.pop("itl", {}))
        return cls(ttft=ttft, itl=itl, **raw)

    def to_json(self) -> str:
        if not isinstance(self.ttft, Delay):
            raise ValueError("a ttft function runs in this process only (FakeOpenAI)")
        return json.dumps(asdict(self))

    def first_token(self, rng: random.Random, index: int) -> float:
        """Seconds before the first token of generation request ``index`` (0-based)."""
        if isinstance(self.ttft, Delay):
            return self.ttft.draw(rng)
        return self.ttft(index)


@dataclass
class Entry:
    """What the server did for one generation request (monotonic seconds)."""

    request_id: str
    path: str
    received: float
    prompt_tokens: int
    completion_tokens: int
    # What the request asked for: a streamed answer, and at most this many tokens.
    stream: bool = False
    max_tokens: int = 0
    chunk_times: list[float] = field(default_factory=list)
    # When each chunk was due (its timer's instant): chunk_times minus due is how late this
    # process woke, the machine's own scheduling noise, measured beside the client's.
    due: list[float] = field(default_factory=list)
    end: float = 0.0
    status: int = 200
    aborted: bool = False


@dataclass
class _Counters:
    """What GET /_stats reports (and then resets)."""

    requests: int = 0
    preflights: int = 0
    first_received: float | None = None
    last_received: float | None = None
    connections_accepted: int = 0
    # Connections that carried a generation request: opened, open now, most open at once.
    generation_connections: int = 0
    generation_open: int = 0
    generation_peak: int = 0

    def fresh(self) -> _Counters:
        """Zeroed counters that still count the connections open now."""
        return _Counters(generation_open=self.generation_open, generation_peak=self.generation_open)


@dataclass(frozen=True)
class Received:
    """A generation request as ``FakeOpenAI.received`` lists it: its path, whether it asked
    for a stream, its prompt's words (tokens here) and its max_tokens."""

    path: str
    stream: bool
    words: int
    max_tokens: int


def _busy(cpu_seconds: float) -> None:
    """Spend ``cpu_seconds`` of this thread's CPU time: longer in wall time when the CPU
    is shared."""
    end = time.thread_time() + cpu_seconds
    while time.thread_time() < end:
        pass


class _State:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.log: list[Entry] = []
        self.count = 0
        self.health_checks = 0
        self.connections: set[_Protocol] = set()
        # Set when the last generation in flight ends, while a FakeOpenAI drains.
        self.drained: asyncio.Event | None = None
        self.dropped = 0
        self.vocab: dict[str, int] = {}
        self.words: list[str] = []
        self.stats = _Counters()
        # What GET /metrics reports, as vLLM names it: generation requests in flight, and
        # the finished ones' count and summed seconds in the server (never reset).
        self.in_flight = 0
        self.finished = 0
        self.e2e_seconds = 0.0

    def started(self) -> None:
        self.in_flight += 1

    def ended(self, received: float, now: float) -> None:
        self.in_flight -= 1
        self.finished += 1
        self.e2e_seconds += now - received
        if not self.in_flight and self.drained is not None:
            self.drained.set()

    def token_id(self, word: str) -> int:
        index = self.vocab.get(word)
        if index is None:
            index = self.vocab[word] = len(self.words)
            self.words.append(word)
        return index


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def _head(status: int, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {_reason(status)}"]
    lines += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _json_response(status: int, body: Any) -> bytes:
    data = json.dumps(body).encode()
    head = _head(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return head + data


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: dict[str, Any]) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


_DONE = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
_STREAM_HEAD = _head(
    200,
    [("Content-Type", "text/event-stream"), ("Transfer-Encoding", "chunked")],
)


class _Protocol(asyncio.Protocol):
    """One connection: requests one after another (keep-alive), no pipelining."""

    def __init__(self, state: _State) -> None:
        self.state = state
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False
        self.closed = False
        self.timers: list[asyncio.TimerHandle] = []
        self.current: Entry | None = None
        self.requests = 0
        self.generated = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.state.stats.connections_accepted += 1
        self.state.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.state.connections.discard(self)
        if self.generated:
            self.state.stats.generation_open -= 1
        for timer in self.timers:
            timer.cancel()
        if self.current is not None and not self.current.end:
            self.current.aborted = True
            self.current.end = time.monotonic()
            self.state.ended(self.current.received, self.current.end)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._next()

    def _next(self) -> None:
        if self.busy:
            return
        head_end = self.buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = self.buffer[:head_end].decode("latin-1")
        request_line, *header_lines = head.split("\r\n")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        if len(self.buffer) < head_end + 4 + length:
            return
        body = self.buffer[head_end + 4 : head_end + 4 + length]
        self.buffer = self.buffer[head_end + 4 + length :]
        received = time.monotonic()
        method, path, _ = request_line.split(" ", 2)
        self.requests += 1
        if self.state.config.drop_reused and self.requests > 1 and path.startswith("/v1/"):
            self.state.dropped += 1
            assert self.transport is not None
            self.transport.close()
            return
        self.busy = True
        self._handle(method, path.split("?")[0], headers, body, received)

    def _finish(self) -> None:
        self.busy = False
        self.current = None
        self.timers.clear()
        if self.buffer:
            self._next()

    def _send(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def _reply(self, data: bytes) -> None:
        self._send(data)
        self._finish()

    def _handle(
        self, method: str, path: str, headers: dict[str, str], body: bytes, received: float
    ) -> None:
        state = self.state
        config = state.config
        if path == "/health":
            state.health_checks += 1
            self._reply(_head(config.health_status, [("Content-Length", "0")]))
        elif path == "/v1/models" and config.models_status != 200:
            broken = b"models broken"
            head = [("Content-Type", "text/plain"), ("Content-Length", str(len(broken)))]
            self._reply(_head(config.models_status, head) + broken)
        elif path == "/v1/models":
            data = [{"id": MODEL, "object": "model", "max_model_len": config.max_model_len}]
            self._reply(_json_response(200, {"object": "list", "data": data}))
        elif path == "/_log":
            log = [asdict(e) for e in state.log]
            state.log = []
            self._reply(_json_response(200, log))
        elif path == "/_stats":
            counters = asdict(state.stats)
            state.stats = state.stats.fresh()
            self._reply(_json_response(200, counters))
        elif path == "/metrics":
            # One engine with room for KV_BLOCKS requests, none ever queued.
            text = (
                f"vllm:num_requests_running {state.in_flight}\n"
                "vllm:num_requests_waiting 0\n"
                f"vllm:kv_cache_usage_perc {min(1.0, state.in_flight / KV_REQUESTS)}\n"
                f"vllm:e2e_request_latency_seconds_sum {state.e2e_seconds}\n"
                "vllm:request_queue_time_seconds_sum 0.0\n"
                f"vllm:request_success_total {state.finished}\n"
                "vllm:num_preemptions_total 0\n"
            ).encode()
            head = [("Content-Type", "text/plain; version=0.0.4"),
                    ("Content-Length", str(len(text)))]  # fmt: skip
            self._reply(_head(200, head) + text)
        elif path == "/_dropped":
            self._reply(_json_response(200, {"dropped": state.dropped}))
        elif path == "/tokenize":
            req = json.loads(body)
            prompt = req.get("prompt")
            if prompt is None:
                prompt = " ".join(str(m.get("content", "")) for m in req.get("messages", []))
            ids = [state.token_id(w) for w in str(prompt).split()]
            self._reply(
                _json_response(
                    200, {"count": len(ids), "tokens": ids, "max_model_len": config.max_model_len}
                )
            )
        elif path == "/detokenize":
            req = json.loads(body)
            words = [state.words[i] if i < len(state.words) else f"t{i}" for i in req["tokens"]]
            self._reply(_json_response(200, {"prompt": " ".join(words)}))
        elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            self._generate(path, headers, json.loads(body), received)
        else:
            self._reply(_json_response(404, {"error": {"message": f"no route {path}"}}))

    def _generate(
        self, path: str, headers: dict[str, str], req: dict[str, Any], received: float
    ) -> None:
        state = self.state
        config = state.config
        state.count += 1
        rid = headers.get("x-request-id") or f"n{state.count}"
        chat = path.endswith("/chat/completions")
        text = (
            " ".join(str(m.get("content", "")) for m in req.get("messages", []))
            if chat
            else str(req.get("prompt", ""))
        )
        prompt_tokens = len(text.split())
        max_tokens = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        n = max_tokens if config.output_tokens is None else config.output_tokens
        stream = bool(req.get("stream"))
        entry = Entry(rid, path, received, prompt_tokens, n, stream=stream, max_tokens=max_tokens)
        if config.log:
            state.log.append(entry)
        self._count(rid, received)
        if config.fail_every and state.count % config.fail_every == 0:
            entry.status = 500
            entry.end = time.monotonic()
            self._reply(_json_response(500, {"error": {"message": "injected failure"}}))
            return
        if config.generate_status != 200:
            entry.status = config.generate_status
            entry.end = time.monotonic()
            error = {"message": "engine broken", "code": config.generate_status}
            self._reply(_json_response(config.generate_status, {"error": error}))
            return
        index = state.count - 1
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n,
            "total_tokens": prompt_tokens + n,
        }
        queued = config.ttft_per_in_flight * state.in_flight
        state.started()
        if not stream:
            rng = random.Random(f"{config.seed}:{rid}")
            total = (
                queued
                + config.first_token(rng, index)
                + sum(config.itl.draw(rng) for _ in range(n - 1))
            )
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": " x" * n}}
                if chat
                else {"index": 0, "text": " x" * n}
            )

            def answer() -> None:
                if config.cpu_seconds:
                    _busy(config.cpu_seconds)
                entry.end = time.monotonic()
                state.ended(received, entry.end)
                entry.chunk_times.append(entry.end)
                entry.due.append(received + total)
                self._reply(_json_response(200, {"choices": [choice], "usage": usage}))

            self.current = entry
            self.timers.append(asyncio.get_running_loop().call_at(received + total, answer))
            return
        include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        obj = "chat.completion.chunk" if chat else "text_completion"
        per = max(1, config.tokens_per_chunk)
        chunks: list[bytes] = []
        if chat:
            role = {"index": 0, "delta": {"role": "assistant", "content": ""}}
            chunks.append(_event({"id": rid, "object": obj, "choices": [role], "usage": None}))
        sizes = [min(per, n - i) for i in range(0, n, per)]
        for k, size in enumerate(sizes):
            piece = " x" * size
            last = k == len(sizes) - 1
            choice = (
                {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
            )
            choice["finish_reason"] = "length" if last else None
            chunks.append(_event({"id": rid, "object": obj, "choices": [choice], "usage": None}))
        tail = b""
        if include_usage:
            tail = _event({"id": rid, "object": obj, "choices": [], "usage": usage})
        tail += _DONE
        self.current = entry
        rng = random.Random(f"{config.seed}:{rid}")
        first = queued + config.first_token(rng, index)
        gaps = [config.itl.draw(rng) for _ in range(len(sizes) - 1)]
        head_chunks = chunks[: len(chunks) - len(sizes)]
        token_chunks = chunks[len(chunks) - len(sizes) :]
        if first == 0 and not any(gaps):
            # Fast path: the whole response in one write.
            if config.cpu_seconds:
                _busy(config.cpu_seconds)
            now = time.monotonic()
            entry.chunk_times = [now] * len(sizes)
            entry.due = [now] * len(sizes)
            entry.end = now
            state.ended(received, now)
            self._reply(_STREAM_HEAD + b"".join(chunks) + tail)
            return
        self._send(_STREAM_HEAD + b"".join(head_chunks))
        # Absolute instants (received + cumulative delays), so that timer lateness does not
        # accumulate. Each write schedules the next: timers due at the same instant have no
        # defined order, and a chunk written after the stream's end would corrupt the next
        # response on the connection.
        instants = [received + first]
        for gap in gaps:
            instants.append(instants[-1] + gap)
        self._schedule_token(entry, list(zip(instants, token_chunks, strict=True)), tail)

    def _count(self, request_id: str, received: float) -> None:
        stats = self.state.stats
        if request_id.endswith("preflight"):
            stats.preflights += 1
            return
        stats.requests += 1
        if stats.first_received is None:
            stats.first_received = received
        stats.last_received = received
        if not self.generated:
            self.generated = True
            stats.generation_connections += 1
            stats.generation_open += 1
            stats.generation_peak = max(stats.generation_peak, stats.generation_open)

    def _schedule_token(
        self, entry: Entry, pending: list[tuple[float, bytes]], tail: bytes
    ) -> None:
        at = pending[0][0]
        self.timers.append(
            asyncio.get_running_loop().call_at(at, self._write_token, entry, pending, tail)
        )

    def _write_token(self, entry: Entry, pending: list[tuple[float, bytes]], tail: bytes) -> None:
        if self.closed:
            return
        at, data = pending[0]
        last = len(pending) == 1
        if not entry.chunk_times and self.state.config.cpu_seconds:
            _busy(self.state.config.cpu_seconds)
        self._send(data + tail if last else data)
        now = time.monotonic()
        entry.chunk_times.append(now)
        entry.due.append(at)
        if last:
            entry.end = now
            self.state.ended(entry.received, now)
            self._finish()
        else:
            self._schedule_token(entry, pending[1:], tail)


class FakeServerProcess:
    """Run the server as a child process (``with FakeServerProcess(config) as server``)."""

    def __init__(self, config: Config | None = None, *, cwd: str | None = None) -> None:
        import subprocess

        self.config = config or Config()
        self._subprocess = subprocess
        self.process: subprocess.Popen[str] | None = None
        self.port = 0
        self.cwd = cwd

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeServerProcess:
        import os
        from pathlib import Path

        root = self.cwd or str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [root, str(Path(root) / "operator"), env.get("PYTHONPATH", "")]
        )
        self.process = self._subprocess.Popen(
            [sys.executable, "-m", "devenv.fakes.openai_server", "--config", self.config.to_json()],
            cwd=root,
            stdin=self._subprocess.PIPE,
            stdout=self._subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("PORT "):
            self.stop()
            raise RuntimeError(f"fake server did not start: {line!r}")
        self.port = int(line.split()[1])
        return self

    def take_stats(self) -> dict[str, Any]:
        """The counters of GET /_stats (reset by reading them)."""
        import httpx

        response = httpx.get(f"{self.url}/_stats", timeout=30)
        response.raise_for_status()
        counters: dict[str, Any] = response.json()
        return counters

    def take_log(self) -> list[dict[str, Any]]:
        import httpx

        response = httpx.get(f"{self.url}/_log", timeout=30)
        response.raise_for_status()
        entries: list[dict[str, Any]] = response.json()
        return entries

    def stop(self) -> None:
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except self._subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        self.process = None

    def __enter__(self) -> FakeServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class FakeOpenAI:
    """Run the server in a thread of this process (``FakeOpenAI(config).start()``, then
    ``stop()``), with its own event loop: a synchronous test can call it too."""

    def __init__(
        self, behaviour: Config | None = None, *, host: str = "127.0.0.1", bind_port: int = 0
    ) -> None:
        # Read live by the server: a test may change it while the server runs.
        self.behaviour = behaviour or Config()
        # Where to listen (port 0: any free one); the fault-server image on 0.0.0.0.
        self.host = host
        self.bind_port = bind_port
        self.port = 0
        self._state = _State(self.behaviour)
        self._loop = new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def received(self) -> list[Received]:
        """The generation requests received so far, in order of arrival (from the log: none
        with ``Config.log`` off)."""
        return [
            Received(path=e.path, stream=e.stream, words=e.prompt_tokens, max_tokens=e.max_tokens)
            for e in list(self._state.log)
        ]

    @property
    def health_checks(self) -> int:
        return self._state.health_checks

    def start(self) -> FakeOpenAI:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    async def _start(self) -> None:
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Protocol(self._state), self.host, self.bind_port, backlog=1024
        )
        self.port = self._server.sockets[0].getsockname()[1]

    def stop(self, drain_s: float = 0.0) -> None:
        """Stop serving; with ``drain_s``, as vLLM's ``--shutdown-timeout`` does: take no new
        connection, and let the generations in flight finish for up to that many seconds.
        Then every connection is closed, and with it what was still in flight."""
        done = asyncio.run_coroutine_threadsafe(self._shutdown(drain_s), self._loop)
        done.result(timeout=drain_s + 10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _shutdown(self, drain_s: float) -> None:
        if self._server is not None:
            self._server.close()  # no new connection; the open ones are still served
        if self._state.in_flight and drain_s > 0:
            self._state.drained = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._state.drained.wait(), drain_s)
        for connection in list(self._state.connections):
            if connection.transport is not None:
                connection.transport.close()
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)


async def serve(config: Config, host: str, port: int, ready: Callable[[int], None]) -> None:
    loop = asyncio.get_running_loop()
    state = _State(config)
    server = await loop.create_server(lambda: _Protocol(state), host, port, backlog=1024)
    ready(server.sockets[0].getsockname()[1])
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    # Parent gone (stdin closed): stop too, so no server outlives its test.
    loop.add_reader(sys.stdin.fileno(), lambda: stop.set() if not sys.stdin.read(1) else None)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="", help="JSON Config")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    config = Config.from_json(args.config)
    # A client past its limit may hold thousands of connections: lift the soft limit on
    # open files (often 1,024) to the hard one, as servers in production run.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    def ready(port: int) -> None:
        print(f"PORT {port}", flush=True)

    loop = new_event_loop()
    try:
        loop.run_until_complete(serve(config, args.host, args.port, ready))
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
