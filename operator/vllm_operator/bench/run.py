"""Run a benchmark described by an InferenceBenchmark spec against one endpoint.

The spec is the single description of a run, whether it comes from a cluster object (the
InferenceBenchmark Job passes ``--spec-file``) or from command-line flags (the CLI builds a
spec from them). This module turns it into load levels and runs them one after another:

- ``Single``: one level at ``arrival.ratePerSecond`` (or ``arrival.concurrency``).
- ``Sweep``: every rate of ``sweep.ratesPerSecond`` with the spec's arrival process, then
  every concurrency of ``sweep.concurrencies`` (closed loop).
- ``Search``: rates chosen by :class:`~vllm_operator.bench.search.RateSearch` between
  ``search.minRatePerSecond`` and ``search.maxRatePerSecond``; a probe passes when at least
  ``search.targetAttainment`` of its requests met the SLO and the client kept up. A
  level the load client decided (neither met nor missed) is measured once more at the
  same rate before the search moves on.

Each level runs for ``durationSeconds`` and/or ``requests``. Every level sends the same
sequence of request lengths and prompts (seeded by ``seed`` only), so levels differ only
in load; arrivals are seeded by ``seed`` and the level's load. A ``Trace`` run replays the
trace's timestamps; given a rate, it replays them scaled to that mean rate.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import logging
import platform
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from vllm_operator.bench import arrivals
from vllm_operator.bench.client import (
    DEFAULT_MAX_CONNECTIONS,
    Deadlines,
    LoadClient,
    Target,
    server_root,
)
from vllm_operator.bench.neighbour import (
    Board,
    ConfigMapBoard,
    NeighbourState,
    start_burn,
)
from vllm_operator.bench.neighbour import order as neighbour_order
from vllm_operator.bench.netfault import FaultProxy, Impairment, relayed_address
from vllm_operator.bench.records import Load, RequestRecord
from vllm_operator.bench.resources import DEFAULT_INTERVAL_S as DEFAULT_METRICS_INTERVAL_S
from vllm_operator.bench.restart import Eviction, PodEvictor
from vllm_operator.bench.result import (
    BenchmarkResult,
    ChaosOutcome,
    LevelOutcome,
    chaos_verdict,
    judge,
    knee_of,
    passed,
)
from vllm_operator.bench.sampler import ResourceSampler
from vllm_operator.bench.search import RateSearch
from vllm_operator.bench.stats import DEFAULT_LAG_LIMIT_S, LevelStats, Slo, summarize
from vllm_operator.bench.tokenizer import choose_tokenizer
from vllm_operator.bench.workload import (
    DatasetEntry,
    PromptBuilder,
    RequestPlan,
    Tokenizer,
    TraceEntry,
    bucket_edges,
    plan_requests,
)
from vllm_operator.models.inference_benchmark import ChaosSpec, InferenceBenchmarkSpec

logger = logging.getLogger(__name__)

# Distinct prompts built per run at most; longer runs reuse them in order. (Millions of
# prompts would not fit in memory; a server's prefix cache may then serve repeats.)
MAX_DISTINCT_PROMPTS = 20_000
# A closed loop bounded only by time cycles through this many planned requests per worker.
CLOSED_LOOP_POOL_PER_WORKER = 16
# Progress is redrawn only when no request is due for this long (a redraw costs the loop
# about a millisecond, which would show as schedule lag), or after MAX_QUIET_S regardless.
QUIET_GAP_S = 0.01
MAX_QUIET_S = 2.0


@dataclass(frozen=True)
class RunOptions:
    """How to reach the server and how the client behaves; not part of the spec."""

    endpoint: str
    model: str | None = None
    tokenizer: str | None = None
    max_in_flight: int | None = None
    # Connections open at once at most (a closed-loop level: at least its concurrency).
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    request_timeout_s: float = 600.0
    drain_timeout_s: float | None = None
    lag_limit_s: float = DEFAULT_LAG_LIMIT_S
    ignore_eos: bool = True
    headers: Mapping[str, str] = field(default_factory=dict)
    default_output_tokens: int = 128
    # Send one small request first: a wrong model or a server without stream usage fails
    # fast instead of after a whole level.
    preflight: bool = True
    run_id: str = "bench"
    # Prometheus endpoints read during every level (bench.resources): the servers' /metrics,
    # a DCGM exporter's; none, none read.
    metrics_urls: tuple[str, ...] = ()
    metrics_interval_s: float = DEFAULT_METRICS_INTERVAL_S
    # The chaos phase's restart: the pods it may evict, first that goes (bench.restart).
    restart_pods: tuple[str, ...] = ()
    restart_namespace: str = "default"
    # The chaos phase's noisy neighbour: the ConfigMap it takes orders from (bench.neighbour).
    neighbour_config_map: str | None = None
    neighbour_namespace: str = "default"


# Evicts the first of the pods (in the namespace) that goes, ``at_s`` into the run.
Evictor = Callable[[Sequence[str], str, float], Awaitable[Eviction]]


@dataclass(frozen=True)
class RunInputs:
    """Contents the spec refers to by ConfigMap (mounted as files in the Job)."""

    dataset: Sequence[DatasetEntry] | None = None
    trace: Sequence[TraceEntry] | None = None


class Reporter(Protocol):
    """Progress sink; every method must be cheap (it runs on the sending loop)."""

    def level_started(self, load: Load, total: int | None) -> None: ...

    def request_done(self, rec: RequestRecord) -> None: ...

    def refresh(self) -> None: ...

    def level_finished(self, stats: LevelStats) -> None: ...


class BenchmarkError(RuntimeError):
    """The run cannot start (bad inputs, unreachable server, failed preflight)."""


def slo_of(spec: InferenceBenchmarkSpec) -> Slo:
    s = spec.slo

    def sec(ms: int | None) -> float | None:
        return None if ms is None else ms / 1e3

    return Slo(
        ttft_s=sec(s.ttft_p99_milliseconds),
        tpot_s=sec(s.tpot_p99_milliseconds),
        e2e_s=sec(s.e2e_p99_milliseconds),
    )


def schedule_for(spec: InferenceBenchmarkSpec, load: Load, inputs: RunInputs) -> arrivals.Schedule:
    """The arrival schedule of one level (seeded by the spec's seed and the load)."""
    count, duration = spec.requests, spec.duration_seconds
    dur = None if duration is None else float(duration)
    if load.concurrency is not None:
        return arrivals.ClosedLoop(load.concurrency, count=count, duration=dur)
    arrival = spec.arrival
    rng = random.Random(f"{spec.seed}:arrivals:{load.process}:{load.rate_per_second!r}")
    rate = load.rate_per_second
    match load.process:
        case "Trace":
            if not inputs.trace:
                raise BenchmarkError("arrival process Trace needs the trace (--trace-file)")
            offsets = [e.offset for e in inputs.trace]
            native = arrivals.offered_rate(arrivals.OpenLoop(tuple(offsets)))
            speedup = rate / native if rate is not None and native else 1.0
            return arrivals.replay(offsets, count=count, duration=dur, speedup=speedup)
        case "Constant":
            assert rate is not None
            return arrivals.constant(rate, count=count, duration=dur)
        case "Poisson":
            assert rate is not None
            return arrivals.poisson(rate, rng, count=count, duration=dur)
        case "Gamma":
            assert rate is not None and arrival.burstiness is not None
            return arrivals.gamma(rate, arrival.burstiness, rng, count=count, duration=dur)
        case "Pulse":
            assert rate is not None and arrival.pulse is not None
            p = arrival.pulse
            return arrivals.pulse(
                rate,
                p.fraction,
                p.window_seconds,
                p.period_seconds,
                rng,
                count=count,
                duration=dur,
            )
    raise BenchmarkError(f"no schedule for process {load.process}")


def fixed_loads(spec: InferenceBenchmarkSpec) -> list[Load]:
    """The levels of a Single or Sweep run (a Search chooses its own)."""
    arrival = spec.arrival
    if spec.mode == "Sweep":
        assert spec.sweep is not None
        process = "Poisson" if arrival.process == "ClosedLoop" else arrival.process
        loads = [Load(rate_per_second=r, process=process) for r in spec.sweep.rates_per_second]
        loads += [Load(concurrency=c, process="ClosedLoop") for c in spec.sweep.concurrencies]
        return loads
    if arrival.process == "ClosedLoop":
        return [Load(concurrency=arrival.concurrency, process="ClosedLoop")]
    return [Load(rate_per_second=arrival.rate_per_second, process=arrival.process)]


class _Prompts:
    """Request plans with prompt text, built once and extended as levels need more."""

    def __init__(
        self,
        spec: InferenceBenchmarkSpec,
        inputs: RunInputs,
        tokenizer: Tokenizer,
        default_output_tokens: int,
    ) -> None:
        self.spec = spec
        self.inputs = inputs
        self.builder = PromptBuilder(tokenizer)
        self.default_output_tokens = default_output_tokens
        self.plans: list[RequestPlan] = []
        self.calibrated = False
        self.mismatched = 0

    def _build(self, n: int) -> None:
        spec, inputs = self.spec, self.inputs
        rng = random.Random(f"{spec.seed}:lengths")
        planned = plan_requests(
            n,
            rng,
            prompt_tokens=spec.workload.prompt_tokens,
            output_tokens=spec.workload.output_tokens,
            dataset=inputs.dataset,
            trace=inputs.trace,
            default_output_tokens=self.default_output_tokens,
        )
        if not self.calibrated and any(p.prompt is None and p.messages is None for p in planned):
            self.builder.calibrate(random.Random(f"{spec.seed}:calibration"))
            self.calibrated = True
        for plan in planned[len(self.plans) :]:
            if plan.prompt is None and plan.messages is None:
                text, count = self.builder.build(
                    plan.prompt_tokens, random.Random(f"{spec.seed}:prompt:{plan.index}")
                )
                self.mismatched += count != plan.prompt_tokens
                plan = RequestPlan(plan.index, count, plan.output_tokens, prompt=text)
            self.plans.append(plan)

    async def take(self, n: int) -> list[RequestPlan]:
        n = max(1, min(n, MAX_DISTINCT_PROMPTS))
        if n > len(self.plans):
            # The tokenizer may block (HTTP); keep the loop free.
            await asyncio.to_thread(self._build, n)
        return self.plans[:n]


async def _discover_model(endpoint: str) -> str:
    import httpx

    async with httpx.AsyncClient(base_url=endpoint.rstrip("/"), timeout=30) as http:
        try:
            response = await http.get("/v1/models")
            response.raise_for_status()
            return str(response.json()["data"][0]["id"])
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
            raise BenchmarkError(
                f"could not learn the model from {endpoint}/v1/models ({exc}); pass --model"
            ) from exc


def _client_facts(options: RunOptions) -> dict[str, object]:
    import os

    import httptools

    return {
        "host": platform.node(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "httptools": httptools.__version__,
        "cpus": os.cpu_count(),
        "max_in_flight": options.max_in_flight,
        "max_connections": options.max_connections,
    }


def check_inputs(
    spec: InferenceBenchmarkSpec,
    options: RunOptions,
    inputs: RunInputs,
    endpoint: str,
    *,
    has_board: bool,
) -> None:
    """Refuse a run that cannot start: a dataset or trace named but not passed, a chaos
    phase with nothing to perturb. Raises :class:`BenchmarkError`."""
    if spec.workload.dataset is not None and not inputs.dataset:
        raise BenchmarkError("the workload names a dataset; pass its content (--dataset-file)")
    if spec.arrival.process == "Trace" and not inputs.trace:
        raise BenchmarkError("arrival process Trace needs the trace (--trace-file)")
    chaos = spec.chaos
    if chaos is None:
        return
    if chaos.network is not None:
        # Checked before any level: the relay speaks plain HTTP only.
        try:
            relayed_address(endpoint)
        except ValueError as exc:
            raise BenchmarkError(f"spec.chaos.network: {exc}") from None
    if chaos.restart is not None and not options.restart_pods:
        raise BenchmarkError(
            "spec.chaos.restart: no pod to evict; name the target's pods (--restart-pod)"
        )
    if chaos.noisy_neighbour is not None and not has_board and not options.neighbour_config_map:
        raise BenchmarkError(
            "spec.chaos.noisyNeighbour: no neighbour to order; name its ConfigMap "
            "(--neighbour-config-map)"
        )


def target_of(
    spec: InferenceBenchmarkSpec, options: RunOptions, endpoint: str, model: str
) -> Target:
    """What every request goes to, and how it is sent."""
    return Target(
        endpoint=endpoint,
        model=model,
        api="chat" if spec.endpoint.api == "ChatCompletions" else "completions",
        stream=spec.endpoint.stream,
        ignore_eos=options.ignore_eos,
        headers=dict(options.headers),
        request_timeout_s=options.request_timeout_s,
    )


@dataclass(frozen=True)
class Judging:
    """How a level's requests are judged: the SLO, the client's deadlines for it, the
    attainment a level must reach, and the prompt-length buckets results are broken by."""

    slo: Slo
    deadlines: Deadlines
    attainment: float
    edges: tuple[tuple[int, int], ...]

    @property
    def has_slo(self) -> bool:
        return any((self.slo.ttft_s, self.slo.tpot_s, self.slo.e2e_s))


def judging_of(spec: InferenceBenchmarkSpec) -> Judging:
    slo = slo_of(spec)
    return Judging(
        slo=slo,
        deadlines=Deadlines(ttft_s=slo.ttft_s, tpot_s=slo.tpot_s, e2e_s=slo.e2e_s),
        attainment=spec.target_attainment(),
        edges=tuple(bucket_edges(spec.workload.prompt_tokens)),
    )


def rated(spec: InferenceBenchmarkSpec, rate: float) -> Load:
    """A load of ``rate`` (a closed-loop spec's search and chaos run Poisson)."""
    process = "Poisson" if spec.arrival.process == "ClosedLoop" else spec.arrival.process
    return Load(rate_per_second=rate, process=process)


@dataclass(frozen=True)
class Session:
    """What every level of one run shares: the spec, the client's options, the prompts,
    how levels are judged, the progress sink, and the resource sampler (if any)."""

    spec: InferenceBenchmarkSpec
    options: RunOptions
    inputs: RunInputs
    prompts: _Prompts
    judging: Judging
    reporter: Reporter | None
    sampler: ResourceSampler | None


@dataclass(frozen=True)
class Levels:
    """The levels run, in order, and the rate a search found best (None: no search)."""

    outcomes: tuple[LevelOutcome, ...]
    best: float | None


@dataclass(frozen=True)
class Chaos:
    """The chaos phase's outcomes, or why it did not run."""

    outcomes: tuple[ChaosOutcome, ...] = ()
    note: str | None = None


async def run_benchmark(
    spec: InferenceBenchmarkSpec,
    options: RunOptions,
    inputs: RunInputs | None = None,
    reporter: Reporter | None = None,
    evictor: Evictor | None = None,
    neighbour_board: Board | None = None,
) -> BenchmarkResult:
    """Run every level of ``spec`` against ``options.endpoint``; see the module docstring.

    Raises :class:`BenchmarkError` when the run cannot start. Request failures never raise:
    they are recorded and counted.
    """
    inputs = inputs or RunInputs()
    endpoint = server_root(options.endpoint)
    check_inputs(spec, options, inputs, endpoint, has_board=neighbour_board is not None)
    model = options.model or await _discover_model(endpoint)
    tokenizer, tokenizer_kind = await asyncio.to_thread(
        choose_tokenizer, endpoint, model, options.tokenizer
    )
    target = target_of(spec, options, endpoint, model)
    prompts = _Prompts(spec, inputs, tokenizer, options.default_output_tokens)
    started = datetime.now(UTC)
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(_load_client(target, options))
        sampler = (
            await stack.enter_async_context(
                ResourceSampler(options.metrics_urls, interval_s=options.metrics_interval_s)
            )
            if options.metrics_urls
            else None
        )
        evictor = await _evictor(stack, spec, evictor)
        board = await _board(stack, spec, options, neighbour_board)
        if options.preflight:
            await _preflight(client, prompts, target)
        session = Session(spec, options, inputs, prompts, judging_of(spec), reporter, sampler)
        levels = await _run_levels(session, client)
        chaos = await _run_chaos(session, client, target, levels, board, evictor)
    if prompts.mismatched:
        logger.warning(
            "Built %d prompts whose token count differs from the plan (tokenizer: %s)",
            prompts.mismatched,
            tokenizer_kind,
        )
    return BenchmarkResult(
        spec=spec,
        endpoint=endpoint,
        model=model,
        levels=levels.outcomes,
        start_time=started,
        end_time=datetime.now(UTC),
        tokenizer=tokenizer_kind,
        best_rate_per_second=levels.best,
        client=_client_facts(options),
        chaos=chaos.outcomes,
        chaos_note=chaos.note,
    )


def _load_client(target: Target, options: RunOptions) -> LoadClient:
    return LoadClient(
        target,
        max_in_flight=options.max_in_flight,
        max_connections=options.max_connections,
        run_id=options.run_id,
    )


async def _evictor(
    stack: contextlib.AsyncExitStack, spec: InferenceBenchmarkSpec, evictor: Evictor | None
) -> Evictor | None:
    """The evictor of a chaos restart: the one passed, else the Kubernetes API's."""
    if evictor is None and spec.chaos is not None and spec.chaos.restart is not None:
        return await stack.enter_async_context(PodEvictor())
    return evictor


async def _board(
    stack: contextlib.AsyncExitStack,
    spec: InferenceBenchmarkSpec,
    options: RunOptions,
    board: Board | None,
) -> Board | None:
    """The noisy neighbour's orders: the board passed, else its ConfigMap; however the run
    ends, the neighbour stops (bench.neighbour)."""
    if board is None and spec.chaos is not None and spec.chaos.noisy_neighbour is not None:
        assert options.neighbour_config_map is not None
        board = await stack.enter_async_context(
            ConfigMapBoard(options.neighbour_config_map, options.neighbour_namespace)
        )
    if board is not None:
        stack.push_async_callback(_dismiss, board)
    return board


async def _preflight(client: LoadClient, prompts: _Prompts, target: Target) -> None:
    """One small request first: a wrong model or a server without stream usage fails fast."""
    first = (await prompts.take(1))[0]
    probe = RequestPlan(
        -1, first.prompt_tokens, min(4, first.output_tokens), first.prompt, first.messages
    )
    rec = await client.preflight(probe)
    if rec.error is not None:
        raise BenchmarkError(
            f"preflight request to {target.url} failed: {rec.error}"
            + (f" ({rec.error_detail})" if rec.error_detail else "")
        )


async def _run_levels(session: Session, client: LoadClient) -> Levels:
    """Every level of a Single or Sweep run, or the rates a Search chooses, in order."""
    spec = session.spec
    outcomes: list[LevelOutcome] = []
    if spec.mode != "Search":
        for load in fixed_loads(spec):
            outcomes.append(await measure(session, client, load, str(len(outcomes))))
        return Levels(tuple(outcomes), None)
    assert spec.search is not None
    s = spec.search
    search = RateSearch(s.min_rate_per_second, s.max_rate_per_second, max_probes=s.max_probes)

    async def at(rate: float) -> LevelOutcome:
        return await measure(session, client, rated(spec, rate), str(len(outcomes)))

    # A cap on the requests in flight limits the client by design, the same way each time.
    again = session.options.max_in_flight is None
    await search_levels(search, at, session.judging.attainment, outcomes, again=again)
    return Levels(tuple(outcomes), search.best)


async def search_levels(
    search: RateSearch,
    measure_at: Callable[[float], Awaitable[LevelOutcome]],
    attainment: float,
    outcomes: list[LevelOutcome],
    *,
    again: bool = True,
) -> None:
    """Probe the rates ``search`` asks for, appending each level to ``outcomes``. With
    ``again``, a level the load client decided (``judge``: "client", neither met nor
    missed) without waiting for a connection of its cap is measured once more at the same
    rate, and the second verdict counts: a client starved for a few seconds on a busy node
    says nothing about the server, and taking it as a miss would end the search at its
    lowest rate. Both levels stay in the results."""
    while (rate := search.next_rate()) is not None:
        outcome = await measure_at(rate)
        outcomes.append(outcome)
        capped = bool(outcome.stats.requests_at_connection_cap)
        if again and not capped and judge(outcome.stats, attainment) == "client":
            outcome = await measure_at(rate)
            outcomes.append(outcome)
        search.record(rate, outcome.passed)


async def measure(session: Session, via: LoadClient, load: Load, label: str) -> LevelOutcome:
    """One level of ``load`` through ``via``, sampled and reported as it runs."""
    schedule = schedule_for(session.spec, load, session.inputs)
    if isinstance(schedule, arrivals.OpenLoop):
        total: int | None = len(schedule.offsets)
        needed = len(schedule.offsets)
    else:
        total = schedule.count
        needed = schedule.count or schedule.concurrency * CLOSED_LOOP_POOL_PER_WORKER
    plans = await session.prompts.take(needed)
    reporter, sampler, judging = session.reporter, session.sampler, session.judging
    if reporter is not None:
        reporter.level_started(load, total)
    ticker = _start_ticker(reporter, schedule)
    resources = None
    if sampler is not None:
        await sampler.start()
    try:
        recording = await via.run_level(
            load,
            schedule,
            plans,
            judging.deadlines,
            drain_timeout_s=session.options.drain_timeout_s,
            on_done=reporter.request_done if reporter is not None else None,
            label=label,
        )
    finally:
        if ticker is not None:
            ticker.cancel()
        if sampler is not None:
            resources = await sampler.stop()
    stats = summarize(
        recording,
        slo=judging.slo,
        buckets=list(judging.edges),
        lag_limit_s=session.options.lag_limit_s,
    )
    if reporter is not None:
        reporter.level_finished(stats)
    return LevelOutcome(recording, stats, passed(stats, judging.attainment), resources)


async def _run_chaos(
    session: Session,
    client: LoadClient,
    target: Target,
    levels: Levels,
    board: Board | None,
    evictor: Evictor | None,
) -> Chaos:
    """The chaos phase: each perturbation's run beside a baseline at the same rate."""
    spec = session.spec
    if spec.chaos is None:
        return Chaos()
    rate, note = chaos_rate(spec, levels.outcomes, levels.best)
    if rate is None:
        return Chaos(note=note)
    load = rated(spec, rate)
    outcomes = []
    for n, p in enumerate(perturbations(spec.chaos, spec.seed)):
        baseline = await measure(session, client, load, f"chaos{n}-base")
        label = f"chaos{n}-{p.kind}"
        if p.impairment is not None:
            perturbed, what = await impaired(session, target, p, load, label)
        elif p.kind == "neighbour":
            assert board is not None
            perturbed, what = await beside_neighbour(session, client, board, load, label)
        else:
            assert p.after_s is not None and evictor is not None
            perturbed, what = await restarted(session, client, evictor, load, label, p.after_s)
        verdict = chaos_verdict(baseline.stats, perturbed.stats, has_slo=session.judging.has_slo)
        outcomes.append(ChaosOutcome(what, rate, baseline, perturbed, verdict))
    return Chaos(tuple(outcomes), note)


async def impaired(
    session: Session, target: Target, p: Perturbation, load: Load, label: str
) -> tuple[LevelOutcome, str]:
    """A run of ``load`` through a relay that impairs the network (bench.netfault)."""
    assert p.impairment is not None
    async with (
        FaultProxy(target.endpoint, p.impairment) as proxy,
        _load_client(dataclasses.replace(target, endpoint=proxy.url), session.options) as faulty,
    ):
        return await measure(session, faulty, load, label), p.what


async def beside_neighbour(
    session: Session, client: LoadClient, board: Board, load: Load, label: str
) -> tuple[LevelOutcome, str]:
    """A run of ``load`` while the neighbour burns (bench.neighbour)."""
    seconds = _expected_seconds(session.spec, load) + NEIGHBOUR_MARGIN_S
    try:
        got: NeighbourState | str = await start_burn(board, seconds=seconds)
    except Exception as exc:
        got = f"its orders could not be written: {exc}"
    what = (
        got.describe()
        if isinstance(got, NeighbourState)
        else f"noisy neighbour: not burning: {got}"
    )
    try:
        return await measure(session, client, load, label), what
    finally:
        with contextlib.suppress(Exception):
            await neighbour_order(board, burn=False)


async def restarted(
    session: Session, client: LoadClient, evictor: Evictor, load: Load, label: str, after_s: float
) -> tuple[LevelOutcome, str]:
    """A run of ``load`` during which one target pod is evicted ``after_s`` in."""
    began = time.monotonic()
    due = asyncio.Event()
    options = session.options

    async def evict_later() -> Eviction:
        await asyncio.sleep(after_s)
        due.set()
        at_s = time.monotonic() - began
        return await evictor(options.restart_pods, options.restart_namespace, at_s)

    task = asyncio.create_task(evict_later())
    try:
        outcome = await measure(session, client, load, label)
    finally:
        if not due.is_set():
            task.cancel()
    if not due.is_set():
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return outcome, (
            f"restart: no pod evicted: the run ended {time.monotonic() - began:.3g} s "
            f"in, before the eviction was due at {after_s:g} s"
        )
    # An eviction under way when the run ended is let finish: it was due.
    return outcome, f"restart: {(await task).outcome}"


DEFAULT_KNEE_FRACTION = 0.8


def chaos_rate(
    spec: InferenceBenchmarkSpec, outcomes: Sequence[LevelOutcome], best: float | None
) -> tuple[float | None, str | None]:
    """The load of the chaos phase, or None and why there is none: ``chaos.ratePerSecond``,
    else ``chaos.kneeFraction`` (default 0.8) of the knee the levels found, else of the
    search's best rate, else of the highest rate that met the SLO."""
    assert spec.chaos is not None
    if spec.chaos.rate_per_second is not None:
        return spec.chaos.rate_per_second, None
    fraction = spec.chaos.knee_fraction or DEFAULT_KNEE_FRACTION
    stats = tuple(o.stats for o in outcomes)
    found = knee_of(stats)
    if found is not None and found[1] == "req/s":
        return round(found[0] * fraction, 6), None
    if best is not None:
        return round(best * fraction, 6), None
    rates = [o.stats.rate_per_second for o in outcomes if o.passed and o.stats.rate_per_second]
    if rates:
        return round(max(rates) * fraction, 6), None
    return None, (
        "the chaos phase did not run: no knee was found and no rate level met the SLO, so "
        "there is no load to take a fraction of; set spec.chaos.ratePerSecond"
    )


@dataclass(frozen=True)
class Perturbation:
    """One perturbation of the chaos phase: a network impairment, or a restart."""

    kind: str
    what: str
    impairment: Impairment | None = None
    # restart: seconds into the run at which a pod is evicted
    after_s: float | None = None


def perturbations(chaos: ChaosSpec, seed: int) -> list[Perturbation]:
    """Each perturbation of the phase, the restart last: the pod it evicts is replaced
    after the run, so nothing may run after it."""
    out = []
    if chaos.network is not None:
        net = chaos.network
        impairment = Impairment.from_milliseconds(
            net.delay_milliseconds, net.jitter_milliseconds, net.loss,
            net.retransmit_milliseconds, seed,
        )  # fmt: skip
        out.append(Perturbation("network", f"network {impairment.describe()}", impairment))
    if chaos.noisy_neighbour is not None:
        share = chaos.noisy_neighbour.cpu_share
        out.append(Perturbation("neighbour", f"noisy neighbour: {share:.0%} of a node's CPUs"))
    if chaos.restart is not None:
        after = chaos.restart.after_seconds
        out.append(Perturbation("restart", f"restart: a pod evicted {after:g} s in", None, after))
    return out


# How long past a perturbed run's expected end the neighbour may still burn, were the
# load Job to die without stopping it.
NEIGHBOUR_MARGIN_S = 60.0


def _expected_seconds(spec: InferenceBenchmarkSpec, load: Load) -> float:
    """How long a run of ``load`` should last: its duration, else its requests at its rate."""
    if spec.duration_seconds is not None:
        return float(spec.duration_seconds)
    if spec.requests is not None and load.rate_per_second:
        return spec.requests / load.rate_per_second
    return 600.0


async def _dismiss(board: Board) -> None:
    try:
        await neighbour_order(board, burn=False, done=True)
    except Exception as exc:
        logger.warning("Could not dismiss the noisy neighbour: %s", exc)


def _start_ticker(
    reporter: Reporter | None, schedule: arrivals.Schedule
) -> asyncio.Task[None] | None:
    """Redraw progress in the schedule's quiet moments (see QUIET_GAP_S)."""
    if reporter is None:
        return None
    offsets = schedule.offsets if isinstance(schedule, arrivals.OpenLoop) else ()
    origin = time.monotonic()

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            i = bisect.bisect_left(offsets, now - origin)
            quiet = i >= len(offsets) or offsets[i] - (now - origin) > QUIET_GAP_S
            if quiet or now - last > MAX_QUIET_S:
                reporter.refresh()
                last = now

    return asyncio.get_running_loop().create_task(tick())
