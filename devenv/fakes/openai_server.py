"""A fast OpenAI-compatible streaming server with known, injected delays, as its own process.

It is a boundary we own (the HTTP API the load generator speaks), not a model of vLLM: it
answers ``/health``, ``/v1/models``, ``/tokenize``, ``/detokenize``, ``/metrics`` (vLLM's
request gauges and latency sum, from what it serves), ``/v1/completions`` and
``/v1/chat/completions`` (streaming with ``stream_options.include_usage``, or not), and it
keeps a log of what it did, on the host's monotonic clock, for every generation request:
when the request had fully arrived, when each chunk was due and when it was written, when
the response ended. That log is the truth the accuracy tests compare the client's measurements with.

Why a raw asyncio protocol and a separate process:

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
import json
import math
import random
import resource
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from vllm_operator.bench.timing import new_event_loop

MODEL = "fake-model"
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


@dataclass(frozen=True)
class Config:
    ttft: Delay = field(default_factory=Delay)
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

    @classmethod
    def from_json(cls, text: str) -> Config:
        raw: dict[str, Any] = json.loads(text) if text else {}
        ttft = Delay(**raw.pop("ttft", {}))
        itl = Delay(**raw.pop("itl", {}))
        return cls(ttft=ttft, itl=itl, **raw)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


@dataclass
class Entry:
    """What the server did for one generation request (monotonic seconds)."""

    request_id: str
    path: str
    received: float
    prompt_tokens: int
    completion_tokens: int
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


class _State:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.log: list[Entry] = []
        self.count = 0
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

    def token_id(self, word: str) -> int:
        index = self.vocab.get(word)
        if index is None:
            index = self.vocab[word] = len(self.words)
            self.words.append(word)
        return index


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}


def _head(status: int, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}"]
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

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
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
        if path == "/health":
            self._reply(_head(200, [("Content-Length", "0")]))
        elif path == "/v1/models":
            data = [{"id": MODEL, "object": "model", "max_model_len": MAX_MODEL_LEN}]
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
            text = req.get("prompt")
            if text is None:
                text = " ".join(str(m.get("content", "")) for m in req.get("messages", []))
            ids = [state.token_id(w) for w in str(text).split()]
            self._reply(
                _json_response(
                    200, {"count": len(ids), "tokens": ids, "max_model_len": MAX_MODEL_LEN}
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
        n = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        entry = Entry(rid, path, received, prompt_tokens, n)
        if config.log:
            state.log.append(entry)
        self._count(rid, received)
        if config.fail_every and state.count % config.fail_every == 0:
            entry.status = 500
            entry.end = time.monotonic()
            self._reply(_json_response(500, {"error": {"message": "injected failure"}}))
            return
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n,
            "total_tokens": prompt_tokens + n,
        }
        state.started()
        if not req.get("stream"):
            rng = random.Random(f"{config.seed}:{rid}")
            total = config.ttft.draw(rng) + sum(config.itl.draw(rng) for _ in range(n - 1))
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": " x" * n}}
                if chat
                else {"index": 0, "text": " x" * n}
            )

            def answer() -> None:
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
        first = config.ttft.draw(rng)
        gaps = [config.itl.draw(rng) for _ in range(len(sizes) - 1)]
        head_chunks = chunks[: len(chunks) - len(sizes)]
        token_chunks = chunks[len(chunks) - len(sizes) :]
        if first == 0 and not any(gaps):
            # Fast path: the whole response in one write.
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
