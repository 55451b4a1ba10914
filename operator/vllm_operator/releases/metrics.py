"""What a vLLM server's ``/metrics`` says, in the Prometheus text format: the series
names, one pod's reading of them, and the load that reading implies.

Names are vLLM's (v1 engine, 0.8 and later): ``vllm:num_requests_running``,
``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``, the histograms
``vllm:time_to_first_token_seconds``, ``vllm:e2e_request_latency_seconds`` and
``vllm:request_queue_time_seconds``, and the counter ``vllm:num_preemptions_total``. A
server with several engines (data parallel) reports one series per engine: counts and
histograms are summed, KV-cache usage averaged.

The request gauges are snapshots, taken when the engine reports its stats; on the CPU
build we test with (vLLM 0.32) they read 0 through most of a steady load of 8 requests in
flight. So the requests running and waiting are also measured as averages over a span of
readings (:func:`load`), by Little's law: the growth of the summed latency of the requests
that finished, divided by the time (``increase(e2e_sum) / Δt`` is the mean number of
requests in the server; the queue-time sum gives the waiting part). The larger of the gauge
and that average is taken, so a long request still running counts as well.

What each pod served over the same readings comes from the counters
``vllm:prompt_tokens_total`` and ``vllm:generation_tokens_total`` (vLLM adds to them at
every engine step, so no request between two readings is missed, however short, and a long
one counts while it runs) and ``vllm:request_success_total``, as rates.

Both the autoscaler (autoscale/) and the benchmark's resource sampler (bench/resources.py)
read the servers through this module, which is why it sits with the other per-release
knowledge, below both. Pure: the text in, the reading out.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Final

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

RUNNING: Final = "vllm:num_requests_running"
WAITING: Final = "vllm:num_requests_waiting"
KV_CACHE_USAGE: Final = "vllm:kv_cache_usage_perc"
TTFT: Final = "vllm:time_to_first_token_seconds"
E2E_SUM: Final = "vllm:e2e_request_latency_seconds_sum"
QUEUE_SUM: Final = "vllm:request_queue_time_seconds_sum"
# vLLM preempts a sequence only when it has no KV block left (a counter).
PREEMPTIONS: Final = "vllm:num_preemptions_total"
# Counters (the samples' names: the families are vllm:prompt_tokens and so on).
PROMPT_TOKENS: Final = "vllm:prompt_tokens_total"
GENERATION_TOKENS: Final = "vllm:generation_tokens_total"
REQUESTS_FINISHED: Final = "vllm:request_success_total"
_TOKENS = (PROMPT_TOKENS, GENERATION_TOKENS)
_COUNTERS = (*_TOKENS, REQUESTS_FINISHED)

# Cumulative histogram: (upper bound, cumulative count), sorted, ending with +Inf.
Buckets = tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class PodReading:
    """One pod's signals at one reading."""

    pod: str
    running: float
    waiting: float
    kv_cache_usage: float
    ttft: Buckets
    # Summed seconds that finished requests spent in the server, and queued (counters).
    e2e_seconds: float = 0.0
    queue_seconds: float = 0.0
    # Tokens processed (prompt and generated) and requests finished, counters since the
    # server started; None when the server does not report them.
    tokens: float | None = None
    finished: float | None = None


@dataclass(frozen=True)
class PodLoad:
    """One pod's load: requests running and waiting (the larger of the gauges and the
    average since a baseline reading), and what it served since that baseline, per second
    (0 without a baseline, or when the server does not report it)."""

    running: float
    waiting: float
    tokens_per_second: float = 0.0
    finished_per_second: float = 0.0

    @property
    def in_flight(self) -> float:
        """Requests the pod holds: the ones a deletion would cut."""
        return self.running + self.waiting


def _went_down(now: float | None, before: float | None) -> bool:
    return now is not None and before is not None and now < before


def restarted(now: PodReading, before: PodReading) -> bool:
    """Whether the server restarted between two readings: a counter went down."""
    return (
        now.e2e_seconds < before.e2e_seconds
        or now.queue_seconds < before.queue_seconds
        or _went_down(now.tokens, before.tokens)
        or _went_down(now.finished, before.finished)
    )


def _rate(now: float | None, before: float | None, seconds: float) -> float:
    if now is None or before is None:
        return 0.0
    return (now - before) / seconds


def load(now: PodReading, before: PodReading | None, seconds: float) -> PodLoad:
    """The pod's load, from this reading and the one ``seconds`` earlier (if any)."""
    if before is None or seconds <= 0 or restarted(now, before):
        return PodLoad(now.running, now.waiting)
    in_server = now.e2e_seconds - before.e2e_seconds
    queued = now.queue_seconds - before.queue_seconds
    if now.finished is not None and before.finished is not None:
        # A request's whole time is added when it finishes, but no request was in the
        # server longer than the span itself: a 70 s request ending now counts as one
        # request over the span, not as 70 s / span of them.
        most = (now.finished - before.finished) * seconds
        in_server, queued = min(in_server, most), min(queued, most)
    return PodLoad(
        max(now.running, (in_server - queued) / seconds),
        max(now.waiting, queued / seconds),
        tokens_per_second=_rate(now.tokens, before.tokens, seconds),
        finished_per_second=_rate(now.finished, before.finished, seconds),
    )


class MetricsError(ValueError):
    """The text is not vLLM's metrics (no request gauges in it)."""


def metric_families(text: str) -> list[Metric]:
    """Prometheus text as metric families. Raises MetricsError when it is not that."""
    try:
        return list(text_string_to_metric_families(text))
    except ValueError as err:
        raise MetricsError(f"unparseable metrics: {err}") from err


def parse_metrics(pod: str, text: str) -> PodReading:
    """Read one pod's /metrics text. Raises MetricsError when it lacks vLLM's gauges."""
    return reading_of(pod, metric_families(text))


def reading_of(pod: str, families: list[Metric]) -> PodReading:
    """One pod's reading from its parsed metrics. Raises MetricsError when they lack vLLM's
    gauges."""
    gauges: dict[str, list[float]] = defaultdict(list)
    sums: dict[str, float] = defaultdict(float)
    counters: dict[str, float] = defaultdict(float)
    buckets: dict[float, float] = defaultdict(float)
    for family in families:
        for sample in family.samples:
            if sample.name in (RUNNING, WAITING, KV_CACHE_USAGE):
                gauges[sample.name].append(float(sample.value))
            elif sample.name == f"{TTFT}_bucket":
                buckets[float(sample.labels["le"])] += float(sample.value)
            elif sample.name in (E2E_SUM, QUEUE_SUM):
                sums[sample.name] += float(sample.value)
            elif sample.name in _COUNTERS:
                counters[sample.name] += float(sample.value)
    if RUNNING not in gauges or WAITING not in gauges:
        raise MetricsError(f"no {RUNNING} / {WAITING} in the metrics")
    kv = gauges.get(KV_CACHE_USAGE, [0.0])
    return PodReading(
        pod=pod,
        running=sum(gauges[RUNNING]),
        waiting=sum(gauges[WAITING]),
        kv_cache_usage=sum(kv) / len(kv),
        ttft=tuple(sorted(buckets.items())),
        e2e_seconds=sums[E2E_SUM],
        queue_seconds=sums[QUEUE_SUM],
        tokens=sum(counters[c] for c in _TOKENS) if any(c in counters for c in _TOKENS) else None,
        finished=counters.get(REQUESTS_FINISHED),
    )
