"""``vllm-operator bench``: load-test an OpenAI-compatible endpoint and report what it did.

Standalone, the run is described by flags::

    vllm-operator bench --endpoint http://127.0.0.1:8000 --model m \\
        --prompt-tokens lognormal:300,0.9,10,2000 --output-tokens uniform:50-1500 \\
        --arrival pulse --rate 4 --pulse 0.4,10,60 --duration 120 --slo-ttft-ms 500

As the InferenceBenchmark Job, by the object's spec::

    vllm-operator bench --spec-file spec.json --endpoint URL --model NAME --output-dir DIR \\
        [--dataset-file F] [--trace-file F] [--termination-log /dev/termination-log] \\
        [--results-config-map NAME --results-namespace NS]

Both paths build the same :class:`~vllm_operator.models.inference_benchmark.InferenceBenchmarkSpec`
and run it (:func:`vllm_operator.bench.run.run_benchmark`). Outputs land in ``--output-dir``:
``results.json`` (every request), ``status.json`` (the InferenceBenchmark status) and
``report.html``; a table goes to the terminal, and with ``--termination-log`` a compact
status (at most 4 KiB, the Kubernetes limit) goes to that file, or the error when the run
failed. With ``--results-config-map`` the results are also written, gzipped, into that
ConfigMap (:mod:`vllm_operator.bench.upload`); nothing else here needs a cluster.

``--from-results`` redraws the report without running: from a ``results.json``, a
``results.json.gz``, or an InferenceBenchmark's results ConfigMap as ``kubectl get -o json``
(or ``-o yaml``) prints it; ``-`` reads standard input::

    kubectl get configmap NAME-results -o json | vllm-operator bench --from-results - \\
        --output-dir report      # writes report/results.json and report/report.html

Length distributions: ``N`` or ``fixed:N``; ``uniform:MIN-MAX``; ``normal:MEAN,STDDEV[,MIN,MAX]``;
``lognormal:MEDIAN,SIGMA[,MIN,MAX]``; ``buckets:MIN-MAX:WEIGHT,MIN-MAX:WEIGHT,...``.

Exit codes: 0 the benchmark ran; 1 it could not run (server unreachable, preflight
failed); 2 bad arguments; 3 it ran but, with ``--fail-on-slo``, the headline level missed
the SLO or the client was the bottleneck; 4 it ran but at some level more than
``--max-error-fraction`` (default 0.05) of the requests got no answer for a reason other
than a deadline, or were never sent (the termination log then names the failure, which
the benchmark's phase Failed carries).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import ValidationError

if TYPE_CHECKING:
    from rich.console import Console

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_SLO = 3
EXIT_ERRORS = 4

TERMINATION_MESSAGE_LIMIT = 4096
# Open files kept free of connections (the results, logs, the tokenizer's client).
SPARE_FILES = 64
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

# Flags that describe the run; they conflict with --spec-file (which describes it too).
_SPEC_FLAGS = (
    "prompt_tokens", "output_tokens", "dataset_spec", "arrival", "rate", "burstiness", "pulse",
    "concurrency", "requests", "duration", "slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms",
    "sweep_rates", "sweep_concurrencies", "search", "target_attainment", "max_probes", "api",
    "no_stream", "seed", "max_error_fraction",
)  # fmt: skip


def parse_distribution(text: str) -> dict[str, Any]:
    """A length distribution flag → the API's LengthDistribution (wire form)."""
    kind, _, rest = text.partition(":")
    if not rest:
        kind, rest = "fixed", kind
    kind = kind.lower()
    try:
        if kind == "fixed":
            return {"type": "Fixed", "value": int(rest)}
        if kind == "uniform":
            lo, hi = _range(rest)
            return {"type": "Uniform", "min": lo, "max": hi}
        if kind in ("normal", "lognormal"):
            parts = rest.split(",")
            if len(parts) not in (2, 4):
                raise ValueError("need 2 or 4 values")
            if kind == "normal":
                out: dict[str, Any] = {
                    "type": "Normal",
                    "mean": int(parts[0]),
                    "stddev": int(parts[1]),
                }
            else:
                out = {"type": "LogNormal", "median": int(parts[0]), "sigma": float(parts[1])}
            if len(parts) == 4:
                out["min"], out["max"] = int(parts[2]), int(parts[3])
            return out
        if kind == "buckets":
            buckets = []
            for item in rest.split(","):
                span, _, weight = item.rpartition(":")
                lo, hi = _range(span)
                buckets.append({"min": lo, "max": hi, "weight": float(weight)})
            return {"type": "Buckets", "buckets": buckets}
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad distribution {text!r}: {exc}") from exc
    raise argparse.ArgumentTypeError(
        f"bad distribution {text!r}: use fixed, uniform, normal, lognormal or buckets"
    )


def _range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.replace(",", "-").partition("-")
    if not sep:
        raise ValueError(f"not a range MIN-MAX: {text}")
    return int(lo), int(hi)


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text}") from exc


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text}") from exc


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _fraction(text: str) -> float:
    value = _number(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def _milliseconds(text: str) -> float:
    value = _number(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of ms >= 0, got {text}")
    return value


def _interval(text: str) -> float:
    value = _number(text)
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"must be between 0 and 3600 seconds, got {text}")
    return value


def _loss(text: str) -> float:
    value = _fraction(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"must be below 1 (1 loses everything), got {text}")
    return value


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _spin(text: str) -> float:
    value = _number(text)
    if not 0 <= value <= 10:
        raise argparse.ArgumentTypeError(f"must be between 0 and 10 ms, got {text}")
    return value


def metrics_urls_of(given: list[str], endpoint: str) -> tuple[str, ...]:
    """``--metrics-url`` values as URLs ('server': the endpoint's /metrics), each once."""
    from vllm_operator.bench.client import server_root

    urls: list[str] = []
    for item in given:
        url = f"{server_root(endpoint)}/metrics" if item == "server" else item
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"--metrics-url needs an http(s) URL or 'server', got {item!r}")
        if url not in urls:
            urls.append(url)
    return tuple(urls)


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the bench flags to ``parser``; its ``func`` default runs the benchmark."""
    from vllm_operator.bench.resources import DEFAULT_INTERVAL_S as DEFAULT_METRICS_INTERVAL_S

    target = parser.add_argument_group("target")
    target.add_argument("--endpoint", help="server base URL, e.g. http://127.0.0.1:8000")
    target.add_argument("--model", help="served model name (default: first of /v1/models)")
    target.add_argument(
        "--api", choices=["completions", "chat"], help="OpenAI API to call (default: chat)"
    )
    target.add_argument("--no-stream", action="store_true", help="do not stream (no TTFT/ITL)")
    target.add_argument(
        "--tokenizer",
        help="local tokenizer (folder or tokenizer.json) for exact prompt lengths "
        "(default: the server's /tokenize)",
    )
    target.add_argument(
        "--allow-eos",
        action="store_true",
        help="let the model stop early (default: ignore_eos, so outputs have the planned length)",
    )
    target.add_argument(
        "--header", action="append", default=[], metavar="NAME:VALUE", help="extra HTTP header"
    )

    spec = parser.add_argument_group("run description (or --spec-file)")
    spec.add_argument("--spec-file", help="InferenceBenchmark spec (or whole object), JSON or YAML")
    spec.add_argument("--prompt-tokens", type=parse_distribution, help="prompt length distribution")
    spec.add_argument("--output-tokens", type=parse_distribution, help="output length distribution")
    spec.add_argument(
        "--dataset",
        dest="dataset_spec",
        action="store_true",
        help="take prompts from --dataset-file instead of length distributions",
    )
    spec.add_argument(
        "--arrival",
        choices=["constant", "poisson", "gamma", "pulse", "closed", "trace"],
        help="arrival process (default: poisson)",
    )
    spec.add_argument("--rate", type=float, help="mean request rate (req/s), open loop")
    spec.add_argument("--burstiness", type=float, help="gamma shape (1: Poisson; <1 burstier)")
    spec.add_argument(
        "--pulse",
        type=_floats,
        metavar="FRACTION,WINDOW,PERIOD",
        help="pulse: FRACTION of each PERIOD's requests in its first WINDOW seconds",
    )
    spec.add_argument("--concurrency", type=int, help="requests in flight, closed loop")
    spec.add_argument("--requests", type=int, help="requests per level")
    spec.add_argument("--duration", type=int, help="seconds per level")
    spec.add_argument("--slo-ttft-ms", type=int, help="TTFT deadline (ms from scheduled send)")
    spec.add_argument("--slo-tpot-ms", type=int, help="time per output token deadline (ms)")
    spec.add_argument("--slo-e2e-ms", type=int, help="end-to-end deadline (ms from scheduled)")
    spec.add_argument("--sweep-rates", type=_floats, help="sweep: comma-separated rates")
    spec.add_argument("--sweep-concurrencies", type=_ints, help="sweep: concurrencies")
    spec.add_argument(
        "--search",
        type=_floats,
        metavar="MIN,MAX",
        help="search the highest rate in [MIN, MAX] that meets the SLO",
    )
    spec.add_argument("--target-attainment", type=float, help="search: share meeting the SLO")
    spec.add_argument("--max-probes", type=int, help="search: most levels to run")
    spec.add_argument("--seed", type=int, help="seed (default 0)")
    spec.add_argument(
        "--max-error-fraction",
        type=_fraction,
        metavar="FRACTION",
        help="exit 4 when, at any level, more than this share of the requests got no answer "
        "(connection or HTTP errors, timeouts; deadline misses are SLO failures) or were "
        "never sent (default 0.05; 1: never)",
    )

    files = parser.add_argument_group("inputs and outputs")
    files.add_argument("--dataset-file", help="JSONL prompts (prompt or messages per line)")
    files.add_argument("--trace-file", help="JSONL trace (timestamp, optional lengths)")
    files.add_argument(
        "--output-dir", default="bench-results", help="where results go (default: %(default)s)"
    )
    files.add_argument("--no-html", action="store_true", help="skip report.html")
    files.add_argument(
        "--termination-log", help="also write a compact status here (e.g. /dev/termination-log)"
    )
    files.add_argument(
        "--from-results",
        metavar="FILE",
        help="do not run: redraw the HTML from an earlier results.json (or .json.gz, or a "
        "results ConfigMap as JSON/YAML; - for stdin)",
    )
    files.add_argument(
        "--results-config-map",
        metavar="NAME",
        help="also write the results (gzipped) into this existing ConfigMap (needs get and "
        "patch on it; credentials: in-cluster ServiceAccount, else KUBECONFIG)",
    )
    files.add_argument(
        "--results-namespace",
        metavar="NS",
        help="namespace of --results-config-map (default: the ServiceAccount's, else default)",
    )

    client = parser.add_argument_group("client")
    client.add_argument(
        "--max-in-flight",
        type=int,
        help="cap on requests in flight (queueing beyond it shows as schedule lag)",
    )
    client.add_argument(
        "--max-connections",
        type=_at_least_one,
        help="cap on connections open at once; due requests beyond it wait for a free one, "
        "shown as schedule lag and reported (default: 4096, bench/client.py's "
        "DEFAULT_MAX_CONNECTIONS; a closed loop: at least its concurrency)",
    )
    client.add_argument(
        "--request-timeout", type=float, default=600.0, help="seconds per request without SLO"
    )
    client.add_argument(
        "--drain-timeout", type=float, help="seconds to let a level's last requests finish"
    )
    client.add_argument(
        "--lag-limit-ms",
        type=float,
        default=5.0,
        help="schedule lag P99 above which the client is the bottleneck (default: %(default)s)",
    )
    client.add_argument(
        "--spin-ms",
        type=_spin,
        default=0.0,
        help="poll for this long before each send instead of sleeping: a schedule lag P99.9 "
        "of tens of microseconds, not milliseconds, for most of a core (bench/timing.py; "
        "default 0, at most 10)",
    )
    client.add_argument("--no-progress", action="store_true", help="no progress bar")
    client.add_argument("--fail-on-slo", action="store_true", help="exit 3 when the SLO is missed")
    client.add_argument("-v", "--verbose", action="store_true", help="debug logging")

    net = parser.add_argument_group(
        "network faults",
        "requests pass through a loopback relay in this process that delays both directions "
        "(bench/netfault.py): no privileges needed; a TTFT grows by two delays",
    )
    net.add_argument(
        "--net-delay-ms", type=_milliseconds, default=0.0, help="delay each way (default 0)"
    )
    net.add_argument(
        "--net-jitter-ms",
        type=_milliseconds,
        default=0.0,
        help="uniform jitter of ± this each way, never reordering the stream (default 0)",
    )
    net.add_argument(
        "--net-loss",
        type=_loss,
        default=0.0,
        metavar="FRACTION",
        help="share of reads held back one retransmission, as TCP delivers a lost segment "
        "(default 0)",
    )
    net.add_argument(
        "--net-retransmit-ms",
        type=_milliseconds,
        default=200.0,
        help="what a lost read costs (default 200: Linux's minimum retransmission timeout)",
    )
    net.add_argument("--net-seed", type=int, default=0, help="seed of jitter and loss")

    res = parser.add_argument_group(
        "resources",
        "read Prometheus endpoints through every level, so that the report sets latency "
        "against KV-cache usage, queueing, preemptions and GPU figures (bench/resources.py)",
    )
    res.add_argument(
        "--metrics-url",
        action="append",
        default=[],
        metavar="URL",
        help="a server's /metrics, or a DCGM exporter's; 'server' is the endpoint's own "
        "/metrics; repeat for several (default: none read)",
    )
    res.add_argument(
        "--metrics-interval",
        type=_interval,
        default=DEFAULT_METRICS_INTERVAL_S,
        metavar="SECONDS",
        help=f"seconds between reads (default {DEFAULT_METRICS_INTERVAL_S:g})",
    )
    restart = parser.add_argument_group(
        "chaos restart",
        "the pods spec.chaos.restart may evict, through the Eviction API (bench/restart.py; "
        "credentials as for --results-config-map)",
    )
    restart.add_argument(
        "--restart-pod",
        action="append",
        default=[],
        metavar="NAME",
        help="a pod of the target; the first the API evicts is the one; repeat for several",
    )
    restart.add_argument(
        "--restart-namespace",
        metavar="NS",
        help="namespace of --restart-pod (default: the ServiceAccount's, else default)",
    )
    neighbour = parser.add_argument_group(
        "chaos noisy neighbour",
        "the ConfigMap through which spec.chaos.noisyNeighbour's neighbour takes its orders "
        "(bench/neighbour.py; credentials as for --results-config-map)",
    )
    neighbour.add_argument("--neighbour-config-map", metavar="NAME", help="its ConfigMap")
    neighbour.add_argument(
        "--neighbour-namespace",
        metavar="NS",
        help="its namespace (default: the ServiceAccount's, else default)",
    )
    parser.set_defaults(func=_cmd_bench)
    return parser


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``bench`` on the top-level CLI's subparsers."""
    parser = subparsers.add_parser(
        "bench",
        help="Load-test an OpenAI-compatible endpoint (the InferenceBenchmark Job).",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return configure(parser)


def spec_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The InferenceBenchmark spec (wire form) that the flags describe."""
    process = {
        None: "Poisson",
        "constant": "Constant",
        "poisson": "Poisson",
        "gamma": "Gamma",
        "pulse": "Pulse",
        "closed": "ClosedLoop",
        "trace": "Trace",
    }[args.arrival]
    if args.arrival is None and args.concurrency is not None and args.rate is None:
        process = "ClosedLoop"
    arrival: dict[str, Any] = {"process": process}
    if args.rate is not None:
        arrival["ratePerSecond"] = args.rate
    if args.burstiness is not None:
        arrival["burstiness"] = args.burstiness
    if args.concurrency is not None:
        arrival["concurrency"] = args.concurrency
    if args.pulse is not None:
        if len(args.pulse) != 3:
            raise ValueError("--pulse needs FRACTION,WINDOW,PERIOD")
        f, w, p = args.pulse
        arrival["pulse"] = {"fraction": f, "windowSeconds": w, "periodSeconds": p}
    if process == "Trace":
        arrival["trace"] = {"name": "trace-file", "key": "trace.jsonl"}
    workload: dict[str, Any] = {}
    if args.dataset_spec or (args.dataset_file and args.prompt_tokens is None):
        workload["dataset"] = {"name": "dataset-file", "key": "dataset.jsonl"}
    else:
        workload["promptTokens"] = args.prompt_tokens or {"type": "Fixed", "value": 128}
        workload["outputTokens"] = args.output_tokens or {"type": "Fixed", "value": 128}
    if "dataset" in workload and args.output_tokens is not None:
        raise ValueError(
            "--output-tokens does not combine with a dataset (set output_tokens per line)"
        )
    if args.requests is None and args.duration is None:
        args.requests = 100
    spec: dict[str, Any] = {
        "targetRef": {"name": "standalone"},
        "workload": workload,
        "arrival": arrival,
        "endpoint": {
            "api": "Completions" if args.api == "completions" else "ChatCompletions",
            "stream": not args.no_stream,
        },
        "seed": args.seed or 0,
    }
    if args.requests is not None:
        spec["requests"] = args.requests
    if args.max_error_fraction is not None:
        spec["maxErrorFraction"] = args.max_error_fraction
    if args.duration is not None:
        spec["durationSeconds"] = args.duration
    slo = {
        k: v
        for k, v in {
            "ttftP99Milliseconds": args.slo_ttft_ms,
            "tpotP99Milliseconds": args.slo_tpot_ms,
            "e2eP99Milliseconds": args.slo_e2e_ms,
        }.items()
        if v is not None
    }
    if slo:
        spec["slo"] = slo
    if args.sweep_rates or args.sweep_concurrencies:
        spec["mode"] = "Sweep"
        spec["sweep"] = {
            "ratesPerSecond": args.sweep_rates or [],
            "concurrencies": args.sweep_concurrencies or [],
        }
        if args.rate is None and process not in ("ClosedLoop", "Trace"):
            arrival["ratePerSecond"] = (args.sweep_rates or [1.0])[0]
    if args.search is not None:
        if len(args.search) != 2:
            raise ValueError("--search needs MIN,MAX")
        spec["mode"] = "Search"
        search: dict[str, Any] = {
            "minRatePerSecond": args.search[0],
            "maxRatePerSecond": args.search[1],
        }
        if args.target_attainment is not None:
            search["targetAttainment"] = args.target_attainment
        if args.max_probes is not None:
            search["maxProbes"] = args.max_probes
        spec["search"] = search
        if args.rate is None and process not in ("ClosedLoop", "Trace"):
            arrival["ratePerSecond"] = args.search[0]
    if process not in ("ClosedLoop", "Trace") and "ratePerSecond" not in arrival:
        raise ValueError("an open-loop arrival process needs --rate (or --sweep-rates/--search)")
    return spec


def read_spec(path: Path) -> dict[str, Any]:
    """A spec file: JSON or YAML, either the spec or a whole InferenceBenchmark."""
    import yaml

    text = path.read_text()
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not an object")
    if data.get("kind") == "InferenceBenchmark" or "apiVersion" in data:
        data = data.get("spec") or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: spec is not an object")
    return data


def compact_status(status: dict[str, Any], limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
    """The status as JSON within ``limit`` bytes, dropping detail until it fits: first the
    per-bucket breakdowns (the chaos runs never keep theirs), then all but the key numbers
    of each level, of the headline and then of the chaos runs, then the levels."""
    levels = status.get("levels", [])

    def unbucketed(level: Any) -> Any:
        return (
            {k: v for k, v in level.items() if k != "buckets"} if isinstance(level, dict) else level
        )

    chaos = status.get("chaos") or []
    if chaos:
        status = {
            **status,
            "chaos": [
                {
                    **c,
                    "baseline": unbucketed(c.get("baseline")),
                    "perturbed": unbucketed(c.get("perturbed")),
                }
                for c in chaos
            ],
        }
    # A chaos phase keeps its latency percentiles from the send too: the verdict and
    # `kubectl get -o yaml` compare the two phases' medians and tails.
    slim_chaos = [
        {
            **c,
            "baseline": _slim(c.get("baseline"), phase=True),
            "perturbed": _slim(c.get("perturbed"), phase=True),
        }
        for c in chaos
    ]
    slim_levels = [_slim(lv) for lv in levels]
    slim_headline = _slim(status.get("headline"))
    candidates = [
        status,
        {**status, "levels": [unbucketed(lv) for lv in levels]},
        # Every level kept, with its key numbers only: a sweep's levels are what tell a
        # run without a headline from one that measured nothing.
        {**status, "levels": slim_levels},
        {**status, "levels": slim_levels, "headline": slim_headline},
        {
            **status,
            "levels": slim_levels,
            "headline": slim_headline,
            **({"chaos": slim_chaos} if chaos else {}),
        },
        {**{k: v for k, v in status.items() if k != "levels"}},
        {
            **{k: v for k, v in status.items() if k not in ("levels", "headline")},
            "headline": slim_headline,
            **({"chaos": slim_chaos} if chaos else {}),
        },
    ]
    for candidate in candidates:
        text = json.dumps(candidate, separators=(",", ":"))
        if len(text.encode()) <= limit:
            return text
    last: dict[str, Any] = {"truncated": True}
    if isinstance(status.get("failure"), dict):
        failure = status["failure"]
        last["failure"] = {"reason": failure.get("reason"), "message": failure.get("message")}
        last["failure"]["message"] = str(last["failure"]["message"])[: limit // 2]
    return json.dumps(last, separators=(",", ":"))


def _slim(level: Any, *, phase: bool = False) -> Any:
    """A level's key numbers: counts, attainment, the client's lag and verdict, and the
    TTFT and E2E P99s from the scheduled send; a chaos ``phase`` keeps the P50, P90 and
    P99 of both TTFT and E2E, from the send and from the schedule."""
    if not isinstance(level, dict):
        return level
    keep = ("ratePerSecond", "concurrency", "requests", "succeeded", "failed",
            "requestsPerSecond", "sloAttainment", "scheduleLagP99Milliseconds",
            "unsent", "errored", "clientSaturated", "sloVerdict")  # fmt: skip
    slim = {k: level[k] for k in keep if k in level}
    # The P99s from the scheduled send: the TTFT column of `kubectl get` and the verdicts.
    wanted = ("p50", "p90", "p99") if phase else ("p99",)
    for source in ("fromScheduled", "fromSend") if phase else ("fromScheduled",):
        latencies = level.get(source)
        if not isinstance(latencies, dict):
            continue
        kept = {
            name: {p: value[p] for p in wanted if p in value}
            for name, value in latencies.items()
            if name in ("ttft", "e2e") and isinstance(value, dict)
        }
        kept = {name: value for name, value in kept.items() if value}
        if kept:
            slim[source] = kept
    return slim


def _cmd_bench(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # One line per /tokenize call would drown the output.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from rich.console import Console

    # Logs and files are wider than the 80 columns rich assumes without a terminal.
    console = Console(width=None if sys.stdout.isatty() else 200)
    if args.from_results:
        return _redraw(args.from_results, Path(args.output_dir), console)
    return _run(args, console)


def read_results(source: str) -> tuple[dict[str, Any], bool]:
    """A run's JSON form from ``source`` (a path, or ``-`` for stdin): a results.json, a
    gzipped one, or a results ConfigMap in JSON or YAML. Also whether it was anything but
    a plain results.json."""
    import gzip

    import yaml

    from vllm_operator.bench.archive import unpack

    raw = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    packed = raw[:2] == b"\x1f\x8b"
    if packed:
        raw = gzip.decompress(raw)
    try:
        data = json.loads(raw)
    except ValueError:
        data = yaml.safe_load(raw)  # kubectl get -o yaml
    if not isinstance(data, dict):
        raise ValueError(f"{source}: not a JSON or YAML object")
    if data.get("kind") == "ConfigMap":
        return unpack(data), True
    if "levels" not in data:
        raise ValueError(f"{source}: neither a results.json nor a results ConfigMap")
    return data, packed


def _redraw(source: str, out_dir: Path, console: Console) -> int:
    from vllm_operator.bench.report import render_html

    try:
        data, unpacked = read_results(source)
    except (ValueError, OSError) as exc:
        print(f"vllm-operator bench: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out_dir.mkdir(parents=True, exist_ok=True)
    if unpacked:
        (out_dir / "results.json").write_text(json.dumps(data, indent=1) + "\n")
        console.print(f"Wrote {out_dir / 'results.json'}")
    if data.get("requests_dropped"):
        console.print(
            f"{data['requests_dropped']} requests were dropped to fit the ConfigMap; the "
            "level summaries still count every request."
        )
    (out_dir / "report.html").write_text(render_html(data))
    console.print(f"Wrote {out_dir / 'report.html'}")
    return EXIT_OK


def _service_account_namespace() -> str:
    try:
        return Path(SERVICE_ACCOUNT_NAMESPACE).read_text().strip() or "default"
    except OSError:
        return "default"


def _write_termination_log(path: str | None, text: str) -> None:
    if not path:
        return
    try:
        Path(path).write_text(text[:TERMINATION_MESSAGE_LIMIT])
    except OSError as exc:
        logging.getLogger(__name__).warning("Could not write the termination log: %s", exc)


def _fail(args: argparse.Namespace, message: str, code: int) -> int:
    """Report a run that could not start or finish: on stderr, and (for the operator,
    which shows it in the benchmark's status) in the termination log."""
    print(f"vllm-operator bench: {message}", file=sys.stderr)
    _write_termination_log(args.termination_log, message)
    return code


def _run(args: argparse.Namespace, console: Console) -> int:
    from vllm_operator.bench import timing
    from vllm_operator.bench.client import DEFAULT_MAX_CONNECTIONS, raise_open_file_limit
    from vllm_operator.bench.netfault import FaultProxy, Impairment, relayed_address
    from vllm_operator.bench.report import (
        ConsoleReporter,
        print_summary,
        result_json,
        write_outputs,
    )
    from vllm_operator.bench.result import BenchmarkResult, error_failure, passed, to_status
    from vllm_operator.bench.run import (
        BenchmarkError,
        RunInputs,
        RunOptions,
        run_benchmark,
    )
    from vllm_operator.bench.workload import parse_dataset, parse_trace
    from vllm_operator.models.inference_benchmark import (
        REASON_TOO_MANY_REQUEST_ERRORS,
        InferenceBenchmarkSpec,
    )

    if not args.endpoint:
        return _fail(args, "--endpoint is required", EXIT_USAGE)
    try:
        if args.spec_file:
            given = [f for f in _SPEC_FLAGS if getattr(args, f) not in (None, False)]
            if given:
                flags = ", ".join("--" + f.replace("_", "-") for f in given)
                raise ValueError(f"{flags} conflict with --spec-file (the spec describes the run)")
            raw = read_spec(Path(args.spec_file))
        else:
            raw = spec_from_args(args)
        spec = InferenceBenchmarkSpec.model_validate(raw)
        dataset = (
            parse_dataset(Path(args.dataset_file).read_text().splitlines())
            if args.dataset_file
            else None
        )
        trace = (
            parse_trace(Path(args.trace_file).read_text().splitlines()) if args.trace_file else None
        )
        headers = {}
        for item in args.header:
            name, sep, value = item.partition(":")
            if not sep:
                raise ValueError(f"--header needs NAME:VALUE, got {item!r}")
            headers[name.strip()] = value.strip()
        impairment = Impairment.from_milliseconds(
            args.net_delay_ms, args.net_jitter_ms, args.net_loss, args.net_retransmit_ms,
            args.net_seed,
        )  # fmt: skip
        if impairment.active:
            try:
                relayed_address(args.endpoint)
            except ValueError:
                raise ValueError("--net-* faults need an http:// --endpoint") from None
        metrics_urls = metrics_urls_of(args.metrics_url, args.endpoint)
    except (ValueError, ValidationError, OSError) as exc:
        return _fail(args, str(exc), EXIT_USAGE)
    max_connections = args.max_connections or DEFAULT_MAX_CONNECTIONS
    files = raise_open_file_limit()
    if 0 < files - SPARE_FILES < max_connections:
        logging.getLogger(__name__).warning(
            "Capped the connections at %d: the open-file limit is %d (--max-connections %d)",
            files - SPARE_FILES,
            files,
            max_connections,
        )
        max_connections = files - SPARE_FILES
    options = RunOptions(
        endpoint=args.endpoint,
        model=args.model,
        tokenizer=args.tokenizer,
        max_in_flight=args.max_in_flight,
        max_connections=max_connections,
        request_timeout_s=args.request_timeout,
        drain_timeout_s=args.drain_timeout,
        lag_limit_s=args.lag_limit_ms / 1e3,
        ignore_eos=not args.allow_eos,
        headers=headers,
        metrics_urls=metrics_urls,
        metrics_interval_s=args.metrics_interval,
        restart_pods=tuple(args.restart_pod),
        restart_namespace=args.restart_namespace or _service_account_namespace(),
        neighbour_config_map=args.neighbour_config_map,
        neighbour_namespace=args.neighbour_namespace or _service_account_namespace(),
    )
    inputs = RunInputs(dataset=dataset, trace=trace)
    reporter = ConsoleReporter(console, progress=not args.no_progress)

    async def go() -> BenchmarkResult:
        if not impairment.active:
            return await run_benchmark(spec, options, inputs, reporter)
        async with FaultProxy(options.endpoint, impairment) as proxy:
            console.print(f"Network faults: {impairment.describe()}, through {proxy.url}")
            result = await run_benchmark(
                spec, dataclasses.replace(options, endpoint=proxy.url), inputs, reporter
            )
        # The report names the server, and says what stood between it and the client.
        client = {**(result.client or {}), "network_faults": impairment.describe()}
        return dataclasses.replace(result, endpoint=options.endpoint, client=client)

    try:
        result = timing.run(go(), spin_s=args.spin_ms / 1e3)
    except BenchmarkError as exc:
        return _fail(args, str(exc), EXIT_FAILED)
    finally:
        reporter.close()
    print_summary(result, console)
    paths = write_outputs(result, Path(args.output_dir), html_report=not args.no_html)
    for path in paths.values():
        console.print(f"Wrote {path}")
    status = to_status(result).to_wire()
    if args.results_config_map and _upload(args, result_json(result), console):
        status["resultsConfigMap"] = args.results_config_map
    failure = error_failure(result)
    if failure is not None:
        status["failure"] = {"reason": REASON_TOO_MANY_REQUEST_ERRORS, "message": failure}
    _write_termination_log(args.termination_log, compact_status(status))
    if failure is not None:
        console.print(f"[bold red]Failed: {failure}[/]")
        print(f"vllm-operator bench: {failure}", file=sys.stderr)
        return EXIT_ERRORS
    if args.fail_on_slo:
        head = result.headline
        if head is None or not passed(head.stats, spec.target_attainment()):
            return EXIT_SLO
    return EXIT_OK


def _upload(args: argparse.Namespace, results: dict[str, Any], console: Console) -> bool:
    """Write the results into ``--results-config-map``; False (and a warning) when that
    failed: the run itself still counts, its headline numbers are in the status."""
    import asyncio

    from vllm_operator.bench.upload import UploadError, upload

    namespace = args.results_namespace or _service_account_namespace()
    try:
        packed = asyncio.run(upload(results, name=args.results_config_map, namespace=namespace))
    except UploadError as exc:
        logging.getLogger(__name__).warning("Could not write the results ConfigMap: %s", exc)
        return False
    console.print(
        f"Wrote ConfigMap {namespace}/{args.results_config_map}: {packed.kept} of "
        f"{packed.requests} requests ({packed.dropped} dropped to fit 1 MiB)"
    )
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vllm_operator.bench.cli``: the bench command on its own."""
    parser = configure(
        argparse.ArgumentParser(
            prog="vllm-operator bench",
            description=__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
