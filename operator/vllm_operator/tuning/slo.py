"""The plan answers the SLO: TTFT, TPOT and E2E P99 predicted at the peak concurrency for
each candidate shape, and the cheapest shape that meets every target.

**Candidates.** A shape is a tensor-parallel size (every size that fits this GPU set and
divides the model, over NVLink or PCIe alike: the step model charges PCIe its all-reduces)
times a replica count from the one asked (``spec.replicas``, a floor) upwards; each
replica sees its share of ``spec.workload.peakConcurrency`` and gets the settings the tuner
gives that share (``--max-num-seqs`` 1.5x it, the batch budget a TTFT target needs,
CUDA graphs). The cheapest shape that meets every target wins: fewest GPUs in all, then
most goodput per GPU. Shapes are searched up to the GPUs of this shape the cluster has
(``vllm-operator tune``: the ``--count`` given); when none there meets a target, the plan
keeps the shape it had without targets, and the answer gives the best prediction within
those GPUs and what would meet the targets: more GPUs (the search goes on to
:data:`MAX_SEARCH_GPUS`), a quantized model (FP8, then 4-bit), an FP8 KV cache, or requests
half as long.

**One replica at concurrency n** (the step model of :mod:`~vllm_operator.tuning.performance`):
``running = min(n, max-num-seqs, the typical requests the KV cache holds)`` sequences decode
together; each finishes after the mean output, and brings a new prompt, so a step carries
``running x mean prompt / mean output`` prompt tokens on average beside the decodes (within
the chunk ``--max-num-batched-tokens`` leaves them).

- **TPOT P99**: a request's TPOT is the mean of its steps. During one mean output the
  prompts that arrive are about Poisson with mean ``running``; the p99 request sees
  ``running + 2.33 sqrt(running)`` of them (the normal approximation's 99th percentile),
  so its TPOT is one step with that many prompts' tokens spread over its output.
- **TTFT P99**: :func:`~vllm_operator.tuning.performance.ttft_p99` (the p99 prompt's own
  chunks plus the M/M/1 wait behind other prompts), plus, when ``n`` exceeds ``running``,
  the wait for a free sequence slot: ``(n - running) / running`` request durations.
- **E2E P99**: TTFT P99 plus the p99 output's tokens at the mean TPOT (a sum of two tails:
  an upper bound rather than an estimate of the joint percentile).
- **Goodput**: ``running / (mean request duration)`` requests per second at the highest
  concurrency whose predictions meet every target (Little's law), times the replicas; with
  no target, at the largest batch. It is the model's counterpart of the benchmark's search.

**Achievable rates.** Decode reads run at the node agent's measured copy rate x
``MEASURED_EFFICIENCY`` (0.95) where a GPUNode reported one, else the datasheet bandwidth x
``SPEC_EFFICIENCY`` (0.85); prefill GEMMs at ``PREFILL_EFFICIENCY`` (0.5) of the datasheet's
dense tensor FLOP/s. A measured decode rate of this model on this shape (:class:`Measured`)
replaces the fraction: the share of the bandwidth it implies is used instead; a measured
goodput with the requests one replica held within the targets decides, for shapes of the
GPUs per replica it was measured on, whether the targets are met at the peak
(:func:`measured_misses`; tuning/learned.py derives both from the kept records). Eager mode
pays :data:`~vllm_operator.tuning.performance.EAGER_LAUNCH_SECONDS_PER_LAYER` per layer on
steps CUDA graphs would cover (an assumption, stated there).

Without a declared peak concurrency there is no load to predict at: the plan keeps the
tuner's batch-1 TPOT check (:func:`~vllm_operator.tuning.choose.for_tpot`) and says the
replicas cannot be sized. Multi-node groups are not predicted here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator
from typing import Final, Literal

from vllm_operator.models.workload import SLO
from vllm_operator.tuning.candidate import Candidate, GpuChoices, candidate, fits, gpu_choices
from vllm_operator.tuning.choose import (
    Choice,
    PrefillLoad,
    meet_ttft,
    prefill_load,
    replica_model,
    sizes,
)
from vllm_operator.tuning.gpus import GPUProfile
from vllm_operator.tuning.performance import (
    MEASURED_EFFICIENCY,
    SPEC_EFFICIENCY,
    ttft_p99,
)
from vllm_operator.tuning.quantization import WeightFormat
from vllm_operator.tuning.request import Ask, Context, context_of
from vllm_operator.tuning.results import SloAnswer
from vllm_operator.tuning.workload import LengthStats

__all__ = [
    "MAX_SEARCH_GPUS",
    "Answered",
    "Measured",
    "PlanInputs",
    "Prediction",
    "Targets",
    "answer",
    "goodput",
    "measured_holds",
    "measured_misses",
    "predict",
    "replica_model",
    "shaped",
]

Metric = Literal["TTFT", "TPOT", "E2E"]

# The 99th percentile of the standard normal (the Poisson tail of prompt arrivals).
P99_Z: Final = 2.33
# How far the search for "what would meet it" goes in GPUs (and replicas).
MAX_SEARCH_GPUS: Final = 64


@dataclasses.dataclass(frozen=True)
class Targets:
    """The P99 targets of ``spec.slo``, in milliseconds (None: none set)."""

    ttft: int | None = None
    tpot: int | None = None
    e2e: int | None = None

    @classmethod
    def of(cls, slo: SLO) -> Targets:
        return cls(slo.ttft_p99_milliseconds, slo.tpot_p99_milliseconds, slo.e2e_p99_milliseconds)

    def items(self) -> list[tuple[Metric, int]]:
        found: list[tuple[Metric, int | None]] = [
            ("TTFT", self.ttft),
            ("TPOT", self.tpot),
            ("E2E", self.e2e),
        ]
        return [(m, v) for m, v in found if v is not None]

    def any(self) -> bool:
        return bool(self.items())


def cite(metric: str, target: int) -> str:
    """How every reason names a target: ``TPOT P99 target 10 ms``."""
    return f"{metric} P99 target {target:,} ms"


@dataclasses.dataclass(frozen=True)
class Measured:
    """A measured figure for this model on this GPU shape (kept by the measured tuning
    runs): the decode rate of one sequence at the plan's typical context, and/or the
    goodput of one replica at the SLO. Either replaces the tuner's own figure.

    ``concurrency``: the requests one replica held in flight at that goodput with every
    target met (Little's law over the measured latencies, tuning/learned.py). Where set, it
    decides whether a shape of ``tensor_parallel`` GPUs per replica meets the targets at
    its share of the peak, in place of the predicted latencies (:func:`measured_misses`)."""

    decode_tokens_per_second: float | None = None
    goodput_per_second: float | None = None  # one replica
    tensor_parallel: int = 1  # the shape measured: GPUs per replica
    source: str = "a measurement"
    concurrency: float | None = None  # one replica, with every target met


@dataclasses.dataclass(frozen=True)
class PlanInputs:
    """What a plan was made from, kept on it (``Plan.inputs``) so that variants of it can
    be predicted (tuning/trials.py) and measurements compared with it
    (tuning/learned.py): the ask (for the replicas planned), its context, and the
    measured figure it used. (Here rather than in tuning/plan.py, which re-exports it, so
    that tuning/learned.py can read it below the planner.)"""

    ask: Ask
    context: Context
    measured: Measured | None = None


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One replica at ``concurrency`` requests in flight (seconds; throughput per second)."""

    concurrency: int
    running: int
    ttft: float
    tpot: float  # P99
    tpot_mean: float
    e2e: float
    throughput: float  # requests per second of one replica

    def milliseconds(self, metric: Metric) -> float:
        value = {"TTFT": self.ttft, "TPOT": self.tpot, "E2E": self.e2e}[metric]
        return value * 1000

    def misses(self, targets: Targets) -> list[Metric]:
        return [m for m, t in targets.items() if not self.milliseconds(m) <= t]

    def worst(self, targets: Targets) -> float:
        """The largest predicted/target ratio (<= 1: every target met)."""
        ratios = [self.milliseconds(m) / t for m, t in targets.items()]
        return max(ratios, default=0.0)


def measured_misses(s: Shaped, targets: Targets, measured: Measured | None) -> list[Metric]:
    """The targets shape ``s`` misses at its share of the peak: as measured where a
    measurement of its GPUs per replica says how many requests one replica holds within
    them (none missed when its share is within that; when not, the targets the roofline
    says it misses, or every target when the roofline says it meets them: the measurement
    does not say which one broke), else as predicted."""
    held = measured_holds(s, measured)
    if held is None:
        return s.prediction.misses(targets)
    if held:
        return []
    return s.prediction.misses(targets) or [m for m, _ in targets.items()]


def measured_holds(s: Shaped, measured: Measured | None) -> bool | None:
    """Whether a measurement says one replica of ``s`` holds its share of the peak within
    every target; None: no measurement of that many GPUs per replica."""
    if measured is None or measured.concurrency is None or measured.tensor_parallel != s.tp:
        return None
    return s.prediction.concurrency <= measured.concurrency


def _efficiency(ask: Ask, g: GpuChoices, c: Candidate, measured: Measured | None) -> float | None:
    """The share of the bandwidth a measured decode rate implies (None: no measurement)."""
    if measured is None or not measured.decode_tokens_per_second:
        return None
    base = replica_model(ask, g, c)
    if base is None:
        return None
    typical = context_of(ask).typical
    # The rate was measured at its own TP size: the share of the bandwidth it implies is
    # read there and carried to this candidate's.
    tp = max(1, measured.tensor_parallel)
    base = dataclasses.replace(
        base,
        tensor_parallel=tp,
        kv_bytes_per_token_gpu=base.kv_bytes_per_token_gpu * c.tp // tp,
        link=base.link if tp > 1 else None,
    )
    predicted = base.step_seconds(0, decodes=1, context=typical)
    share = MEASURED_EFFICIENCY if base.measured else SPEC_EFFICIENCY
    # Step time scales as 1 / efficiency on the memory-bound decode of one sequence.
    return share * predicted * measured.decode_tokens_per_second


def _budget(g: GpuChoices) -> int:
    return int(g.batched.value) if g.batched.value.isdigit() else 8192


def _running_cap(ask: Ask, g: GpuChoices, ctx: Context, c: Candidate) -> int:
    """Sequences one replica runs at once: max-num-seqs, bounded by the KV cache."""
    room = c.kv_token_room(ask.model.architecture) // max(1, ctx.typical)
    return max(1, min(g.seqs_target, room))


def predict(
    ask: Ask,
    g: GpuChoices,
    ctx: Context,
    c: Candidate,
    concurrency: int,
    *,
    measured: Measured | None = None,
) -> Prediction | None:
    """One replica of ``c`` at ``concurrency`` requests in flight (the module docstring);
    None without the GPU's bandwidth and FLOP/s figures or the workload's lengths."""
    r = replica_model(ask, g, c, efficiency=_efficiency(ask, g, c, measured))
    base = prefill_load(ask, g, ctx, c) or _assumed_load(ask, ctx)
    if r is None:
        return None
    n = max(1, concurrency)
    running = min(n, _running_cap(ask, g, ctx, c))
    chunked = ask.pins.enable_chunked_prefill is not False
    budget = _budget(g)
    # Without chunked prefill a prompt goes into one step whole.
    room = max(1, budget - running) if chunked else max(budget, base.prompt_p99)
    per_step = running * base.prompt_mean / max(1.0, base.output_mean)
    tail = (running + P99_Z * math.sqrt(running)) * base.prompt_mean / max(1.0, base.output_mean)
    context = base.context
    tpot_mean = r.step_seconds(min(room, math.ceil(per_step)), decodes=running, context=context)
    tpot = r.step_seconds(min(room, math.ceil(tail)), decodes=running, context=context)
    ttft = ttft_p99(
        r,
        prompt_p99=base.prompt_p99,
        prompt_mean=base.prompt_mean,
        output_mean=base.output_mean,
        batched_tokens=budget if chunked else max(budget, base.prompt_p99 + running - 1),
        decodes=running - 1,
        context=context,
        concurrency=running if running > 1 else None,
    )
    prefill = r.prefill_seconds(
        max(1, round(base.prompt_mean)),
        chunk=room,
        decodes=0,
        context=context,
    )
    duration = prefill + base.output_mean * tpot_mean
    waiting = (n - running) / running * duration
    output_p99 = ask.output_p99 or max(1, round(base.output_mean))
    first = ttft.seconds + waiting
    return Prediction(
        concurrency=n,
        running=running,
        ttft=first,
        tpot=tpot,
        tpot_mean=tpot_mean,
        e2e=first + max(0, output_p99 - 1) * tpot_mean,
        throughput=running / duration if duration > 0 else 0.0,
    )


def _assumed_load(ask: Ask, ctx: Context) -> PrefillLoad:
    """The lengths context_of assumes when the workload declares none."""
    prompt = ask.prompt.mean if ask.prompt else min(ctx.wanted / 2, 1024)
    output = ask.output.mean if ask.output else max(1.0, ctx.typical - prompt)
    return PrefillLoad(
        prompt_p99=ask.prompt_p99 or max(1, round(prompt)),
        prompt_mean=prompt,
        output_mean=output,
        decodes=0,
        context=ctx.typical,
        concurrency=None,
    )


def goodput(
    ask: Ask,
    g: GpuChoices,
    ctx: Context,
    c: Candidate,
    targets: Targets,
    *,
    measured: Measured | None = None,
) -> float | None:
    """Requests per second one replica of ``c`` serves with every target met: the highest
    concurrency whose predictions meet them (bisection: predictions grow with it); 0.0
    when not even one request alone meets them; None when nothing can be predicted."""
    if (
        measured is not None
        and measured.goodput_per_second is not None
        and measured.tensor_parallel == c.tp
    ):
        return measured.goodput_per_second
    cap = _running_cap(ask, g, ctx, c)
    top = predict(ask, g, ctx, c, cap, measured=measured)
    if top is None:
        return None
    if not top.misses(targets):
        return top.throughput
    low = predict(ask, g, ctx, c, 1, measured=measured)
    if low is None or low.misses(targets):
        return 0.0
    good, bad = 1, cap
    best = low
    while bad - good > 1:
        mid = (good + bad) // 2
        p = predict(ask, g, ctx, c, mid, measured=measured)
        if p is not None and not p.misses(targets):
            good, best = mid, p
        else:
            bad = mid
    return best.throughput


# --- shapes -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Shaped:
    """One shape (tp GPUs per replica x replicas) with the settings the tuner gives it,
    and its prediction at the peak."""

    tp: int
    replicas: int
    ask: Ask
    g: GpuChoices
    choice: Choice
    prediction: Prediction

    @property
    def gpus(self) -> int:
        return self.tp * self.replicas

    def describe(self, gpu: GPUProfile) -> str:
        each = "GPU" if self.tp == 1 else f"{gpu.name} GPUs"
        one = f"1 {gpu.name}" if self.tp == 1 else f"{self.tp} {each}"
        replicas = "1 replica" if self.replicas == 1 else f"{self.replicas} replicas"
        return f"{replicas} of {one} ({self.prediction.concurrency} requests each)"


def _for_replicas(ask: Ask, replicas: int) -> Ask:
    peak = ask.peak
    share = math.ceil(peak / replicas) if peak else ask.peak_per_replica
    return dataclasses.replace(ask, replicas=replicas, peak_per_replica=share)


def shaped(
    ask: Ask,
    gpu: GPUProfile,
    ctx: Context,
    tp: int,
    replicas: int,
    *,
    source: Literal["Tuner", "Spec", "Override"] = "Tuner",
    reason: str = "",
    measured: Measured | None = None,
) -> Shaped | None:
    """``replicas`` replicas of ``tp`` GPUs with the tuner's settings for their share of
    the peak (a TTFT target's batch budget included); None if it does not fit."""
    ask_r = _for_replicas(ask, replicas)
    g = gpu_choices(ask_r, gpu)
    c = candidate(ask_r, g, tp, ask_r.pins.pipeline_parallel_size or 1)
    if c is None or not fits(c, ask.model.architecture, max(1, min(ctx.typical, ctx.wanted))):
        return None
    choice = meet_ttft(ask_r, g, ctx, Choice(c, source, reason))
    g = choice.gpu_choices or g
    p = predict(ask_r, g, ctx, choice.candidate, ask_r.peak_per_replica or 1, measured=measured)
    if p is None:
        return None
    return Shaped(tp, replicas, ask_r, g, choice, p)


def _shapes(ask: Ask, tps: Iterable[int], limit: int) -> Iterator[tuple[int, int]]:
    """(tp, replicas) with tp x replicas <= limit, cheapest first (then fewer replicas)."""
    peak = ask.peak or 1
    floor = max(1, ask.replicas)
    pairs = [
        (tp, r)
        for tp in tps
        for r in range(floor, max(floor, min(peak, limit // tp)) + 1)
        if tp * r <= limit or r == floor
    ]
    yield from sorted(pairs, key=lambda p: (p[0] * p[1], p[1]))


@dataclasses.dataclass(frozen=True)
class Search:
    """Every shape evaluated within a GPU limit, and the cheapest that meets the targets."""

    evaluated: tuple[Shaped, ...]
    meeting: Shaped | None


def search(
    ask: Ask,
    gpu: GPUProfile,
    ctx: Context,
    tps: Iterable[int],
    targets: Targets,
    *,
    limit: int,
    measured: Measured | None = None,
) -> Search:
    """The cheapest shape within ``limit`` GPUs meeting every target: fewest GPUs, then
    most goodput per GPU among those of that cost."""
    evaluated: list[Shaped] = []
    winners: list[Shaped] = []
    cost: int | None = None
    for tp, r in _shapes(ask, list(tps), limit):
        if cost is not None and tp * r > cost:
            break
        s = shaped(ask, gpu, ctx, tp, r, measured=measured)
        if s is None:
            continue
        evaluated.append(s)
        if not measured_misses(s, targets, measured):
            winners.append(s)
            cost = s.gpus
    if not winners:
        return Search(tuple(evaluated), None)

    def per_gpu(s: Shaped) -> float:
        rate = goodput(s.ask, s.g, ctx, s.choice.candidate, targets, measured=measured)
        return (rate or 0.0) / s.tp

    return Search(tuple(evaluated), max(winners, key=per_gpu))


# --- the answer -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Answered:
    """The plan's ask, GPU choices and TP choice after the SLO answer, and the answer."""

    ask: Ask
    g: GpuChoices
    choice: Choice
    answer: SloAnswer


def _figures(p: Prediction, targets: Targets) -> str:
    return ", ".join(f"{m} ~{p.milliseconds(m):,.1f} ms" for m, _ in targets.items())


def answer(
    ask: Ask,
    gpu: GPUProfile,
    ctx: Context,
    choice: Choice,
    *,
    tp_fixed: bool,
    available: int,
    measured: Measured | None = None,
) -> Answered | None:
    """Answer ``ask.slo`` for a plan whose TP choice (without targets) is ``choice``; None
    when there is no target or no declared peak (the caller keeps ``choice``)."""
    targets = Targets.of(ask.slo)
    if not targets.any() or not ask.peak or choice.nodes > 1 or choice.candidate.pp > 1:
        return None
    g0 = gpu_choices(ask, gpu)
    tps = [choice.candidate.tp] if tp_fixed else [c.tp for c in sizes(ask, g0, ctx).fitting]
    if choice.candidate.tp not in tps:
        tps.append(choice.candidate.tp)
    limit = max(available, choice.candidate.tp * max(1, ask.replicas))
    source = choice.source
    found = search(ask, gpu, ctx, tps, targets, limit=limit, measured=measured)
    deployed = shaped(
        ask,
        gpu,
        ctx,
        choice.candidate.tp,
        max(1, ask.replicas),
        source=source,
        reason=choice.reason,
        measured=measured,
    )
    if deployed is None:
        return None
    if found.meeting is not None:
        return _met(ask, gpu, ctx, choice, found.meeting, deployed, targets, measured)
    return _missed(ask, gpu, ctx, choice, found, deployed, targets, tps, limit, measured)


def _met(
    ask: Ask,
    gpu: GPUProfile,
    ctx: Context,
    choice: Choice,
    s: Shaped,
    deployed: Shaped,
    targets: Targets,
    measured: Measured | None,
) -> Answered:
    p = s.prediction
    where = s.describe(gpu)
    roofline_misses = p.misses(targets)
    lines = [
        f"{cite(m, t)}: met as measured (the roofline predicted ~{p.milliseconds(m):,.1f} ms) "
        f"at the peak of {ask.peak} requests with {where}"
        if m in roofline_misses
        else f"{cite(m, t)}: met, ~{p.milliseconds(m):,.1f} ms predicted at the peak of "
        f"{ask.peak} requests with {where}"
        for m, t in targets.items()
    ]
    lines += _measured_lines(ask, s, targets, measured)
    c = s.choice.candidate
    reason = choice.reason
    if s.tp != choice.candidate.tp:
        before = deployed.prediction
        missed = measured_misses(deployed, targets, measured)
        named = "; ".join(
            f"{cite(m, t)}: ~{before.milliseconds(m):,.1f} ms"
            for m, t in targets.items()
            if m in missed
        )
        reason = (
            f"{named or 'the SLO'} with {choice.candidate.tp} GPU(s) per replica; "
            f"{s.tp} per replica ({c.link or 'one GPU'}) meets every target at the fewest "
            f"GPUs: {_figures(p, targets)}"
        )
        s = dataclasses.replace(
            s, choice=dataclasses.replace(s.choice, reason=reason, source="Tuner")
        )
    elif s.choice.reason == "":
        s = dataclasses.replace(s, choice=dataclasses.replace(s.choice, reason=reason))
    if s.replicas > max(1, ask.replicas):
        lines.append(
            f"the workload needs {s.replicas} replicas of {s.tp} GPU(s) ({s.gpus} GPUs) for "
            f"{_targets_text(targets)} at the peak of {ask.peak}; {max(1, ask.replicas)} "
            "asked for (spec.replicas, --replicas): with those, each replica would see "
            f"{deployed.prediction.concurrency} requests ({_figures(deployed.prediction, targets)})"
        )
    lines += _assumed(ask, ctx, targets)
    rate = goodput(s.ask, s.g, ctx, s.choice.candidate, targets, measured=measured)
    result = SloAnswer(
        targets=tuple(targets.items()),
        predicted=tuple((m, round(p.milliseconds(m), 1)) for m, _ in targets.items()),
        met=True,
        peak_concurrency=ask.peak or 0,
        replicas=s.replicas,
        replicas_asked=max(1, ask.replicas),
        gpus_per_replica=s.tp,
        goodput_per_second=None if rate is None else round(rate * s.replicas, 2),
        lines=tuple(lines),
    )
    notes = _notes(choice, s.choice)
    return Answered(s.ask, s.g, dataclasses.replace(s.choice, notes=notes), result)


def _measured_lines(ask: Ask, s: Shaped, targets: Targets, measured: Measured | None) -> list[str]:
    """A line when a measurement, not the roofline, decided whether ``s`` meets the
    targets."""
    held = measured_holds(s, measured)
    if held is None or measured is None or measured.concurrency is None:
        return []
    replicas = "1 replica" if s.replicas == 1 else f"each of {s.replicas} replicas"
    verdict = "within it: met" if held else "more than it: not met"
    return [
        f"{_targets_text(targets)}: one replica of {s.tp} GPU(s) held ~"
        f"{measured.concurrency:,.1f} requests in flight within them as measured "
        f"({measured.source}); {replicas} sees {s.prediction.concurrency} at the peak of "
        f"{ask.peak}, {verdict} (the measurement decides, not the roofline)"
    ]


def _assumed(ask: Ask, ctx: Context, targets: Targets) -> list[str]:
    """A line when the predictions rest on assumed request lengths."""
    if ask.prompt is not None and ask.output is not None:
        return []
    load = _assumed_load(ask, ctx)
    return [
        f"{_targets_text(targets)}: predicted with assumed lengths (prompt ~"
        f"{load.prompt_mean:,.0f}, output ~{load.output_mean:,.0f} tokens); declare "
        "spec.workload's prompt and output lengths to predict from them"
    ]


def _notes(before: Choice, after: Choice) -> tuple[str, ...]:
    """The choice's notes for the shape answered: the batch-1 TPOT note gives way to the
    answer, and the TTFT budget's notes are those of the shape taken (made again for it)."""
    kept = [n for n in before.notes if "P99 objective" not in n]
    fresh = [n for n in after.notes if "TPOT P99 objective" not in n and n not in kept]
    return (*kept, *fresh)


def _targets_text(targets: Targets) -> str:
    return " and ".join(cite(m, t) for m, t in targets.items())


def _missed(
    ask: Ask,
    gpu: GPUProfile,
    ctx: Context,
    choice: Choice,
    found: Search,
    deployed: Shaped,
    targets: Targets,
    tps: list[int],
    limit: int,
    measured: Measured | None,
) -> Answered:
    """No shape within ``limit`` GPUs meets every target: the plan keeps its shape; each
    missed target gets the best prediction and what would meet it."""
    evaluated = found.evaluated or (deployed,)
    best = min(evaluated, key=lambda s: (s.prediction.worst(targets), s.gpus))
    d, b = deployed.prediction, best.prediction
    options = _would_meet(ask, gpu, ctx, tps, targets, limit, best, measured)
    lines = []
    deployed_misses = measured_misses(deployed, targets, measured)
    for m, t in targets.items():
        if m not in deployed_misses:
            lines.append(
                f"{cite(m, t)}: met, ~{d.milliseconds(m):,.1f} ms predicted at the peak of "
                f"{ask.peak} requests with {deployed.describe(gpu)}"
            )
            continue
        text = (
            f"{cite(m, t)}: no candidate on the {limit} {gpu.name} GPUs available meets it; "
            f"the best prediction is ~{b.milliseconds(m):,.1f} ms with {best.describe(gpu)}"
        )
        if (best.tp, best.replicas) != (deployed.tp, deployed.replicas):
            text += (
                f" (the plan as deployed, {deployed.describe(gpu)}: ~{d.milliseconds(m):,.1f} ms)"
            )
        text += "; would meet it: " + (
            "; ".join(options)
            if options
            else f"nothing the tuner tried (up to {MAX_SEARCH_GPUS} GPUs, FP8 or 4-bit "
            "weights, an FP8 KV cache, requests half as long)"
        )
        lines.append(text)
    lines += _measured_lines(ask, deployed, targets, measured)
    lines += _assumed(ask, ctx, targets)
    result = SloAnswer(
        targets=tuple(targets.items()),
        predicted=tuple((m, round(d.milliseconds(m), 1)) for m, _ in targets.items()),
        met=False,
        peak_concurrency=ask.peak or 0,
        replicas=deployed.replicas,
        replicas_asked=max(1, ask.replicas),
        gpus_per_replica=deployed.tp,
        goodput_per_second=_service_goodput(deployed, ctx, targets, measured),
        lines=tuple(lines),
        would_meet=tuple(options),
    )
    notes = _notes(choice, deployed.choice)
    return Answered(
        deployed.ask,
        deployed.g,
        dataclasses.replace(deployed.choice, notes=notes, reason=choice.reason),
        result,
    )


def _service_goodput(
    s: Shaped, ctx: Context, targets: Targets, measured: Measured | None
) -> float | None:
    rate = goodput(s.ask, s.g, ctx, s.choice.candidate, targets, measured=measured)
    return None if rate is None else round(rate * s.replicas, 2)


def _would_meet(
    ask: Ask,
    gpu: GPUProfile,
    ctx: Context,
    tps: list[int],
    targets: Targets,
    limit: int,
    best: Shaped,
    measured: Measured | None,
) -> list[str]:
    """What would meet every target: more GPUs, a quantized model, an FP8 KV cache,
    shorter requests; each with its prediction."""
    options: list[str] = []
    more = search(ask, gpu, ctx, tps, targets, limit=MAX_SEARCH_GPUS, measured=measured)
    if more.meeting is not None and more.meeting.gpus > limit:
        s = more.meeting
        options.append(f"{s.gpus} GPUs ({s.describe(gpu)}: {_figures(s.prediction, targets)})")
    for label, variant in _variants(ask, gpu, ctx):
        ask_v, ctx_v = variant
        g_v = gpu_choices(ask_v, gpu)
        tps_v = [c.tp for c in sizes(ask_v, g_v, ctx_v).fitting] or [best.tp]
        found = search(ask_v, gpu, ctx_v, tps_v, targets, limit=limit, measured=measured)
        if found.meeting is not None:
            s = found.meeting
            options.append(f"{label} ({s.describe(gpu)}: {_figures(s.prediction, targets)})")
    return options


def _variants(ask: Ask, gpu: GPUProfile, ctx: Context) -> list[tuple[str, tuple[Ask, Context]]]:
    """The same ask with a quantized model, an FP8 KV cache, or requests half as long."""
    found: list[tuple[str, tuple[Ask, Context]]] = []
    if not ask.fmt.quantized and ask.pins.quantization is None:
        fp8 = WeightFormat(method="FP8", bits=8, origin="an FP8 checkpoint (what if)")
        found.append(("an FP8-quantized model", (dataclasses.replace(ask, fmt=fp8), ctx)))
        awq = WeightFormat(method="AWQ", bits=4, group_size=128, origin="a 4-bit AWQ (what if)")
        found.append(("a 4-bit (AWQ) model", (dataclasses.replace(ask, fmt=awq), ctx)))
    cc = gpu.compute_capability
    if ask.pins.kv_cache_dtype is None and cc is not None and cc >= (8, 9):
        pins = dataclasses.replace(ask.pins, kv_cache_dtype="fp8")
        kv = dataclasses.replace(
            ask, pins=pins, overrides={**ask.overrides, "kv-cache-dtype": "fp8"}
        )
        found.append(("kv-cache-dtype fp8", (kv, ctx)))
    short = _halved(ask)
    if short is not None:
        found.append(
            (
                f"requests half as long (p99 prompt {short.prompt_p99 or 0:,} tokens)",
                (short, context_of(short)),
            )
        )
    return found


def _halved(ask: Ask) -> Ask | None:
    """The ask with prompts and outputs half as long (a shorter context); None when the
    workload declares no prompt lengths (the context is the model's maximum)."""
    if ask.prompt is None or ask.pins.max_model_len is not None:
        return None

    def half(s: LengthStats | None) -> LengthStats | None:
        if s is None:
            return None
        return LengthStats(max(1.0, s.mean / 2), max(1, s.longest // 2), s.bounded)

    return dataclasses.replace(
        ask,
        prompt=half(ask.prompt),
        output=half(ask.output),
        prompt_p99=max(1, (ask.prompt_p99 or 2) // 2),
        output_p99=max(1, ask.output_p99 // 2) if ask.output_p99 else None,
    )
