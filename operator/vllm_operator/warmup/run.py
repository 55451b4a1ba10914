"""Warm up one vLLM server over HTTP and judge it, all within one time budget.

The order is fixed: wait for ``/health``; learn the served model, its context length and
the tokenizer's tokens-per-word (``/v1/models``, ``/tokenize``); send the *probe* once (its
TTFT is the cold TTFT); send the plan's steps; then repeat the probe until its TTFT settles
(the median of the last window is within a tolerance of the window before it). Warm TTFT is
the median of the last window.

Everything, the health wait included, runs under one deadline, so every way of failing is
reported within the budget: a server that never becomes healthy (``NeverHealthy``), one
that answers with errors (``ServerErrors``), one too slow to answer or whose warm TTFT is
above a limit (``TooSlow``), and one whose TTFT keeps moving (``NotSettled``).

Token counts come from the server's ``usage`` (``stream_options.include_usage`` when
streaming), never from counting chunks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
from collections.abc import Sequence
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from vllm_operator.servers.adapters import AdapterApiError, load_adapter
from vllm_operator.warmup.report import (
    Api,
    Failure,
    Outcome,
    RequestResult,
    WarmupReport,
)
from vllm_operator.warmup.requests import (
    PlanInputs,
    RequestSpec,
    WarmupPlan,
    build_plan,
    calibration_text,
    prompt_text,
)

logger = logging.getLogger(__name__)

# Kept in the report; the count of failures is always complete.
_MAX_REPORTED_FAILURES = 5
_MAX_ERROR_CHARS = 300
_HEALTH_TIMEOUT = httpx.Timeout(5.0)


class WarmupOptions(BaseModel):
    """How to warm up and judge one server; every field maps to a command-line flag."""

    model_config = ConfigDict(frozen=True)

    endpoint: str = Field(description="base URL of the vLLM server, e.g. http://10.0.0.7:8000")
    model: str | None = Field(default=None, description="served model; first of /v1/models")
    budget_s: float = Field(default=600.0, gt=0, description="for everything, health included")
    max_ttft_s: float | None = Field(
        default=None, gt=0, description="warm TTFT above this is TooSlow"
    )
    max_failures: int = Field(default=2, ge=0, description="failed requests tolerated")
    settle_window: int = Field(default=3, ge=1, description="probes per settle window")
    settle_tolerance: float = Field(default=0.25, ge=0, description="relative change allowed")
    settle_floor_s: float = Field(
        default=0.005, ge=0, description="changes below this many seconds count as settled"
    )
    max_settle_probes: int = Field(default=40, ge=2)
    health_interval_s: float = Field(default=0.5, gt=0)
    connect_timeout_s: float = Field(default=5.0, gt=0)
    # Serving settings (PlanInputs); max_model_len defaults to what /v1/models reports.
    max_model_len: int | None = Field(default=None, ge=32)
    max_num_seqs: int = Field(default=256, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    max_tokens: int = Field(default=8, ge=1)
    max_concurrency: int = Field(default=16, ge=1)
    apis: tuple[Api, ...] = (Api.COMPLETIONS, Api.CHAT)
    # LoRA adapters to load before the warmup, (name, path) each; each gets one request.
    adapters: tuple[tuple[str, str], ...] = ()

    def plan_inputs(self, max_model_len: int) -> PlanInputs:
        return PlanInputs(
            max_model_len=max_model_len,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            cudagraph_capture_sizes=self.cudagraph_capture_sizes,
            max_tokens=self.max_tokens,
            max_concurrency=self.max_concurrency,
            apis=self.apis,
        )


class _TooManyFailures(Exception):
    pass


class _Unsettled(Exception):
    pass


class _Runner:
    """The state of one warmup; :meth:`verdict` turns it into a report at any point."""

    def __init__(self, options: WarmupOptions, client: httpx.AsyncClient) -> None:
        self.options = options
        self.client = client
        self.started = time.monotonic()
        self.stage = "health"
        self.healthy_after: float | None = None
        self.last_health_error = "no answer yet"
        self.model: str | None = options.model
        self.tokens_per_word = 2.0
        self.results: list[RequestResult] = []
        self.failures: list[Failure] = []
        self.failed = 0
        self.cold_ttft: float | None = None
        self.settle_ttfts: list[float] = []
        self.settled = False
        self.in_flight: dict[int, tuple[str, float]] = {}
        self.serial = 0
        self.adapters_loaded: list[str] = []
        self.adapter_failures: dict[str, str] = {}

    # ---- stages -------------------------------------------------------------------------

    async def run(self) -> None:
        await self._wait_healthy()
        self.stage = "discovery"
        plan = await self._discover()
        if self.options.adapters:
            self.stage = "adapters"
            await self._load_adapters()
        self.stage = "probe"
        self.cold_ttft = (await self._send(plan.probe, phase="probe", concurrency=1)).ttft_s
        self._check_failures()
        for name in self.adapters_loaded:
            # One request through each adapter: its kernels and weights are warm too.
            await self._send(plan.probe, phase="adapter", concurrency=1, model=name)
            self._check_failures()
        self.stage = "sweep"
        for step in plan.steps:
            logger.info("Sending warmup step %s (%d requests)", step.name, step.concurrency)
            await asyncio.gather(
                *(
                    self._send(r, phase=step.name, concurrency=step.concurrency)
                    for r in step.requests
                )
            )
            self._check_failures()
        self.stage = "settle"
        await self._settle(plan.probe)

    async def _wait_healthy(self) -> None:
        while True:
            try:
                response = await self.client.get("/health", timeout=_HEALTH_TIMEOUT)
                if response.status_code == 200:
                    self.healthy_after = time.monotonic() - self.started
                    logger.info("Server became healthy after %.1fs", self.healthy_after)
                    return
                self.last_health_error = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                self.last_health_error = _describe(exc)
            await asyncio.sleep(self.options.health_interval_s)

    async def _discover(self) -> WarmupPlan:
        max_model_len = self.options.max_model_len
        if self.model is None or max_model_len is None:
            data = await self._get_json("/v1/models")
            entries = data.get("data") or []
            if not entries:
                raise self._fail("discovery", None, "/v1/models lists no model")
            if self.model is None:
                self.model = str(entries[0]["id"])
            entry = next((e for e in entries if e.get("id") == self.model), entries[0])
            if max_model_len is None:
                max_model_len = int(entry.get("max_model_len") or 2048)
        try:
            text = calibration_text()
            response = await self.client.post(
                "/tokenize",
                json={"model": self.model, "prompt": text, "add_special_tokens": False},
            )
            if response.status_code == 200:
                count = int(response.json()["count"])
                self.tokens_per_word = max(1.0, count / len(text.split()))
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            logger.warning("Could not calibrate prompt sizes with /tokenize: %s", exc)
        logger.info(
            "Planned warmup for model %s, max_model_len %d, %.2f tokens per word",
            self.model,
            max_model_len,
            self.tokens_per_word,
        )
        return build_plan(self.options.plan_inputs(max_model_len))

    async def _load_adapters(self) -> None:
        """Load every adapter of the service before the server counts as warmed up. One
        that fails to load is reported and left out: the base model still serves, and the
        operator's status names the adapter and the server's words."""
        endpoint = str(self.client.base_url).rstrip("/")
        for name, path in self.options.adapters:
            try:
                await load_adapter(self.client, endpoint, name, path)
            except AdapterApiError as err:
                logger.warning("Loading adapter %s from %s failed: %s", name, path, err)
                self.adapter_failures[name] = str(err)[:_MAX_ERROR_CHARS]
                continue
            logger.info("Loaded adapter %s from %s", name, path)
            self.adapters_loaded.append(name)

    async def _get_json(self, path: str) -> dict[str, Any]:
        try:
            response = await self.client.get(path)
        except httpx.HTTPError as exc:
            raise self._fail("discovery", None, f"GET {path}: {_describe(exc)}") from exc
        if response.status_code != 200:
            raise self._fail(
                "discovery",
                response.status_code,
                f"GET {path} answered HTTP {response.status_code}: {response.text}",
            )
        try:
            data = response.json()
        except ValueError as exc:
            raise self._fail("discovery", 200, f"GET {path} returned invalid JSON") from exc
        if not isinstance(data, dict):
            raise self._fail("discovery", 200, f"GET {path} returned no JSON object")
        return data

    async def _settle(self, probe: RequestSpec) -> None:
        window = self.options.settle_window
        for _ in range(self.options.max_settle_probes):
            result = await self._send(probe, phase="settle", concurrency=1)
            self._check_failures()
            if result.ttft_s is None:
                continue
            self.settle_ttfts.append(result.ttft_s)
            if len(self.settle_ttfts) >= 2 * window:
                last = statistics.median(self.settle_ttfts[-window:])
                before = statistics.median(self.settle_ttfts[-2 * window : -window])
                allowed = max(self.options.settle_tolerance * before, self.options.settle_floor_s)
                if abs(last - before) <= allowed:
                    self.settled = True
                    return
        raise _Unsettled

    # ---- requests -----------------------------------------------------------------------

    async def _send(
        self, spec: RequestSpec, *, phase: str, concurrency: int, model: str | None = None
    ) -> RequestResult:
        serial = self.serial
        self.serial += 1
        text = prompt_text(spec.prompt_tokens, tokens_per_word=self.tokens_per_word, serial=serial)
        body: dict[str, Any] = {
            "model": model or self.model,
            "max_tokens": self.options.max_tokens,
            "temperature": 0.0,
            "stream": spec.stream,
            # vLLM extension: a fixed output length keeps requests comparable.
            "ignore_eos": True,
        }
        if spec.stream:
            body["stream_options"] = {"include_usage": True}
        if spec.api is Api.CHAT:
            path = "/v1/chat/completions"
            body["messages"] = [{"role": "user", "content": text}]
        else:
            path = "/v1/completions"
            body["prompt"] = text
        sent = time.monotonic()
        self.in_flight[serial] = (phase, sent)
        ttft: float | None = None
        usage: dict[str, Any] = {}
        status: int | None = None
        error: str | None = None
        try:
            if spec.stream:
                async with self.client.stream("POST", path, json=body) as response:
                    status = response.status_code
                    if status != 200:
                        await response.aread()
                        error = f"HTTP {status}: {response.text}"
                    else:
                        ttft, usage, error = await _read_stream(response, sent)
            else:
                response = await self.client.post(path, json=body)
                status = response.status_code
                if status != 200:
                    error = f"HTTP {status}: {response.text}"
                else:
                    usage = response.json().get("usage") or {}
        except httpx.HTTPError as exc:
            error = _describe(exc)
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            error = f"malformed response: {_describe(exc)}"
        # Not in a `finally`: when the budget cancels this request, it stays in flight, so
        # the verdict can say what was still waiting.
        self.in_flight.pop(serial, None)
        result = RequestResult(
            phase=phase,
            api=spec.api,
            stream=spec.stream,
            concurrency=concurrency,
            target_prompt_tokens=spec.prompt_tokens,
            prompt_tokens=usage.get("prompt_tokens"),
            output_tokens=usage.get("completion_tokens"),
            ttft_s=ttft,
            latency_s=time.monotonic() - sent,
            status_code=status,
            error=error,
        )
        self.results.append(result)
        if error is not None:
            self._fail(phase, status, error)
        return result

    def _check_failures(self) -> None:
        if self.failed > self.options.max_failures:
            raise _TooManyFailures

    def _fail(self, phase: str, status: int | None, error: str) -> _TooManyFailures:
        """Record a failure; return the exception that ends the warmup if raised."""
        self.failed += 1
        error = " ".join(error.split())[:_MAX_ERROR_CHARS]
        logger.warning("Warmup request failed in %s: %s", phase, error)
        if len(self.failures) < _MAX_REPORTED_FAILURES:
            self.failures.append(Failure(phase=phase, status_code=status, error=error))
        return _TooManyFailures(error)

    # ---- verdict ------------------------------------------------------------------------

    def verdict(self, *, budget_ran_out: bool, too_many_failures: bool) -> WarmupReport:
        opts = self.options
        warm = self._warm_ttft()
        if too_many_failures:
            last = self.failures[-1].error if self.failures else "unknown error"
            outcome = Outcome.SERVER_ERRORS
            message = (
                f"{self.failed} of {max(len(self.results), 1)} warmup requests failed "
                f"(at most {opts.max_failures} tolerated); last: {last}"
            )
            if self.stage == "discovery":
                message = f"Discovery of the served model failed: {last}"
        elif self.healthy_after is None:
            outcome = Outcome.NEVER_HEALTHY
            message = (
                f"Server at {opts.endpoint} did not answer /health with 200 within "
                f"{opts.budget_s:g}s (last: {self.last_health_error})"
            )
        elif budget_ran_out and (self.stage != "settle" or not self.settle_ttfts):
            outcome = Outcome.TOO_SLOW
            waiting = self._longest_wait()
            message = f"Budget of {opts.budget_s:g}s ran out in the {self.stage} stage"
            if waiting is not None:
                message += (
                    f" while a request ({waiting[0]}) had waited {waiting[1]:.1f}s for its response"
                )
        elif opts.max_ttft_s is not None and warm is not None and warm > opts.max_ttft_s:
            outcome = Outcome.TOO_SLOW
            message = f"Warm TTFT {warm:.3f}s is above the limit of {opts.max_ttft_s:g}s"
        elif not self.settled:
            outcome = Outcome.NOT_SETTLED
            if budget_ran_out:
                end = f"within the budget of {opts.budget_s:g}s"
            else:
                end = f"after {opts.max_settle_probes} probes"
            message = (
                f"TTFT did not settle {end} "
                f"(last TTFTs: {', '.join(f'{t:.3f}s' for t in self.settle_ttfts[-6:])})"
            )
        else:
            outcome = Outcome.SUCCEEDED
            message = (
                f"Warmed up with {len(self.results)} requests in "
                f"{time.monotonic() - self.started:.1f}s: cold TTFT {_fmt(self.cold_ttft)}, "
                f"warm TTFT {_fmt(warm)}"
            )
            if self.options.adapters:
                message += f"; {len(self.adapters_loaded)} of {len(opts.adapters)} adapters loaded"
                if self.adapter_failures:
                    message += " (not: " + ", ".join(sorted(self.adapter_failures)) + ")"
        return WarmupReport(
            outcome=outcome,
            message=message,
            endpoint=opts.endpoint,
            model=self.model,
            cold_ttft_s=self.cold_ttft,
            warm_ttft_s=warm,
            settled=self.settled,
            requests_sent=len(self.results) + len(self.in_flight),
            requests_failed=self.failed,
            health_wait_s=self.healthy_after,
            duration_s=time.monotonic() - self.started,
            budget_s=opts.budget_s,
            failures=self.failures,
            requests=self.results,
            adapters_loaded=self.adapters_loaded,
            adapter_failures=self.adapter_failures,
        )

    def _warm_ttft(self) -> float | None:
        window = self.settle_ttfts[-self.options.settle_window :]
        return statistics.median(window) if window else None

    def _longest_wait(self) -> tuple[str, float] | None:
        if not self.in_flight:
            return None
        phase, sent = min(self.in_flight.values(), key=lambda item: item[1])
        return phase, time.monotonic() - sent


async def _read_stream(
    response: httpx.Response, sent: float
) -> tuple[float | None, dict[str, Any], str | None]:
    """Read an OpenAI server-sent-event stream: (TTFT, usage, error)."""
    ttft: float | None = None
    first_chunk: float | None = None
    usage: dict[str, Any] = {}
    done = False
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            done = True
            break
        chunk = json.loads(data)
        if "error" in chunk:
            return ttft, usage, f"error in stream: {chunk['error']}"
        now = time.monotonic()
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if first_chunk is None:
                first_chunk = now - sent
            delta = choice.get("delta") or {}
            if ttft is None and (choice.get("text") or delta.get("content")):
                ttft = now - sent
    if not done:
        return ttft, usage, "stream ended without [DONE]"
    if ttft is None:
        # Every token decoded to an empty string (possible with random weights): the first
        # chunk that carried a choice is the first token.
        ttft = first_chunk
    if ttft is None:
        return None, usage, "stream carried no tokens"
    return ttft, usage, None


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _fmt(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds:.3f}s"


async def run_warmup(
    options: WarmupOptions, *, transport: httpx.AsyncBaseTransport | None = None
) -> WarmupReport:
    """Warm up the server at ``options.endpoint``; never raises for a server's behaviour."""
    limits = httpx.Limits(max_connections=options.max_concurrency + 4)
    # Only connecting has its own timeout; a slow answer is judged against the budget.
    timeout = httpx.Timeout(None, connect=options.connect_timeout_s)
    async with httpx.AsyncClient(
        base_url=options.endpoint, timeout=timeout, limits=limits, transport=transport
    ) as client:
        runner = _Runner(options, client)
        budget_ran_out = too_many = False
        try:
            async with asyncio.timeout(options.budget_s):
                await runner.run()
        except TimeoutError:
            budget_ran_out = True
        except _TooManyFailures:
            too_many = True
        except _Unsettled:
            pass
        return runner.verdict(budget_ran_out=budget_ran_out, too_many_failures=too_many)


def summarize(results: Sequence[RequestResult]) -> dict[str, int]:
    """Requests per phase, for log lines."""
    counts: dict[str, int] = {}
    for result in results:
        counts[result.phase] = counts.get(result.phase, 0) + 1
    return counts
