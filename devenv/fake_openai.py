"""A small OpenAI-compatible server on 127.0.0.1 whose misbehaviour the tests choose.

It is a boundary we own (the HTTP API warmup speaks), not a model of vLLM's internals: it
answers ``/health``, ``/v1/models``, ``/tokenize``, ``/v1/completions`` and
``/v1/chat/completions`` (streaming or not) and records what it received. It runs in its
own thread and event loop so that synchronous tests (the CLI calls ``asyncio.run``) can use
it as well as async ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Received:
    path: str
    stream: bool
    words: int
    max_tokens: int


@dataclass
class Behaviour:
    health_status: int = 200
    # Seconds before the first token, given the 0-based index of the generation request.
    ttft: Callable[[int], float] = lambda _n: 0.0
    # HTTP status for generation requests (200: answer normally).
    generate_status: int = 200
    models_status: int = 200
    max_model_len: int = 256
    output_tokens: int = 4
    # CPU seconds of work before the first token (busy, in the serving thread: a server
    # bound by its CPU, whose latency grows when something else takes the CPU).
    cpu_seconds: float = 0.0


def _busy(cpu_seconds: float) -> None:
    """Spend ``cpu_seconds`` of this thread's CPU time: longer in wall time when the CPU
    is shared."""
    end = time.thread_time() + cpu_seconds
    while time.thread_time() < end:
        pass


@dataclass
class FakeOpenAI:
    behaviour: Behaviour = field(default_factory=Behaviour)
    received: list[Received] = field(default_factory=list)
    health_checks: int = 0
    # Where to listen (port 0: any free one); the fault-server image (devenv/images) on 0.0.0.0.
    host: str = "127.0.0.1"
    bind_port: int = 0

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._in_flight = 0
        self._drained: asyncio.Event | None = None  # set when the last one in flight ends
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FakeOpenAI:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def stop(self, drain_s: float = 0.0) -> None:
        """Stop serving; with ``drain_s``, as vLLM's ``--shutdown-timeout`` does: take no new
        connection, and let the generations in flight finish for up to that many seconds."""
        done = asyncio.run_coroutine_threadsafe(self._shutdown(drain_s), self._loop)
        done.result(timeout=drain_s + 10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _shutdown(self, drain_s: float = 0.0) -> None:
        if self._runner is not None and drain_s > 0:
            for site in list(self._runner.sites):
                await site.stop()  # no new connection; the open ones are still served
            if self._in_flight:
                self._drained = asyncio.Event()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._drained.wait(), drain_s)
        if self._runner is not None:
            await self._runner.cleanup()
        # Handlers still sleeping (the "too slow" server) end here, not with the loop.
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        # A slow handler must not hold up the test's teardown.
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.bind_port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _health(self, _request: web.Request) -> web.Response:
        self.health_checks += 1
        return web.Response(status=self.behaviour.health_status)

    async def _models(self, _request: web.Request) -> web.Response:
        if self.behaviour.models_status != 200:
            return web.Response(status=self.behaviour.models_status, text="models broken")
        data = {"data": [{"id": "fake-model", "max_model_len": self.behaviour.max_model_len}]}
        return web.json_response(data)

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"count": len(str(body["prompt"]).split())})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        self._in_flight += 1
        try:
            return await self._answer(request)
        finally:
            self._in_flight -= 1
            if not self._in_flight and self._drained is not None:
                self._drained.set()

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body: dict[str, Any] = await request.json()
        chat = request.path.endswith("/chat/completions")
        text = body["messages"][-1]["content"] if chat else body["prompt"]
        index = len(self.received)
        self.received.append(
            Received(
                path=request.path,
                stream=bool(body.get("stream")),
                words=len(str(text).split()),
                max_tokens=int(body["max_tokens"]),
            )
        )
        if self.behaviour.generate_status != 200:
            return web.json_response(
                {"error": {"message": "engine broken", "code": self.behaviour.generate_status}},
                status=self.behaviour.generate_status,
            )
        await asyncio.sleep(self.behaviour.ttft(index))
        if self.behaviour.cpu_seconds:
            _busy(self.behaviour.cpu_seconds)
        n = self.behaviour.output_tokens
        usage = {"prompt_tokens": len(str(text).split()), "completion_tokens": n}
        if not body.get("stream"):
            choice: dict[str, Any] = (
                {"message": {"role": "assistant", "content": "x" * n}}
                if chat
                else {"text": "x" * n}
            )
            return web.json_response({"choices": [choice], "usage": usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        # The client may have given up (its budget ran out) while this handler slept.
        with contextlib.suppress(ConnectionResetError):
            await response.prepare(request)
            if chat:
                role = {"delta": {"role": "assistant", "content": ""}}
                await _event(response, {"choices": [role]})
            for _ in range(n):
                piece = {"delta": {"content": "x"}} if chat else {"text": "x"}
                await _event(response, {"choices": [piece]})
            await _event(response, {"choices": [], "usage": usage})
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        return response


async def _event(response: web.StreamResponse, data: dict[str, Any]) -> None:
    await response.write(f"data: {json.dumps(data)}\n\n".encode())
