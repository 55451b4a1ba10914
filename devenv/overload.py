"""``python -m devenv.overload``: the load generator at and past its maximum rate.

Issue 21: asked for more than it could send, ``vllm-operator bench`` collapsed instead of
levelling off (16,000 req/s asked, 0.4-1.9k delivered, most requests failing on connect
timeouts: a new connection for every due request that found none idle, thousands of
them). A load generator asked for too much must deliver its maximum, say how far behind
it fell, and keep its connections bounded. This command shows whether it does: a
benchmark with a report, not a timed test, since every figure depends on the machine.

What it does:

- starts one fast local streaming server on 127.0.0.1 (``devenv/fakes/openai_server.py``,
  its own process: zero delays, the whole response in one write, counters only, no
  per-request log), which counts the generation requests it received, the span of their
  arrivals, and the connections that carried them (opened, most open at once);
- for each repeat and each rate of ``--rates`` (in rotating order, so that a noisy minute
  of the shared machine does not always hit the same rate), runs ``vllm-operator bench``
  of ``--tree`` (this checkout by default; another one, e.g. a ``git worktree`` of an
  older commit, to compare) as a user would, one level of ``rate x --seconds`` requests;
- records, per run: the rate the client delivered (completed requests per second of the
  level, the client's view) and the rate the server saw arrive, errors by kind, requests
  never sent, requests sent more than 10 ms late, connections, the schedule lag's P50,
  P99, P99.9 and maximum (the client's own record: send instant minus scheduled instant),
  the client's CPU use, its exit code, and the 1-minute load average (``os.getloadavg``)
  when the run started and when it ended;
- prints a Markdown table of the medians per rate, the load average beside each row, and
  writes every run to a JSON report (the Markdown next to it).

The client's flags are those every version since the bench existed understands, plus
``--client-args`` for newer ones.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from devenv.fakes.openai_server import Config, FakeServerProcess

REPO = Path(__file__).resolve().parents[1]
PROMPT_TOKENS = 16
OUTPUT_TOKENS = 8
# A request sent later than this after its scheduled instant counts as late.
LATE_S = 0.010
DEFAULT_RATES = (2000.0, 4000.0, 8000.0, 16000.0, 32000.0)


@dataclass
class Run:
    """One invocation of the client at one rate."""

    rate: float
    repeat: int
    requests: int
    exit_code: int | None = None
    wall_s: float = 0.0
    load_before: float = 0.0
    load_after: float = 0.0
    completed: int = 0
    delivered_per_s: float | None = None
    server_requests: int = 0
    server_per_s: float | None = None
    send_per_s: float | None = None
    errors: dict[str, int] = field(default_factory=dict)
    unsent: int = 0
    late: int = 0
    connections: int = 0
    connections_peak: int = 0
    lag_p50_ms: float | None = None
    lag_p99_ms: float | None = None
    lag_p999_ms: float | None = None
    lag_max_ms: float | None = None
    client_cpu: float | None = None
    verdict: str = ""
    note: str = ""


def _rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of numbers: {text!r}") from None
    if not rates or any(r <= 0 for r in rates):
        raise argparse.ArgumentTypeError(f"rates must be positive numbers: {text!r}")
    return rates


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m devenv.overload", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--rates",
        type=_rates,
        default=list(DEFAULT_RATES),
        help="offered rates, req/s (default: %(default)s)",
    )
    p.add_argument("--seconds", type=_positive, default=3.0, help="seconds of schedule per run")
    p.add_argument("--repeats", type=_count, default=3, help="runs per rate (median reported)")
    p.add_argument(
        "--arrival", choices=["constant", "poisson"], default="poisson", help="arrival process"
    )
    p.add_argument("--tree", type=Path, default=REPO, help="checkout whose client runs")
    p.add_argument("--label", default="", help="title of the report (e.g. before, after)")
    p.add_argument(
        "--client-args", default="", help="extra flags for the client, one string (split on spaces)"
    )
    p.add_argument(
        "--drain-timeout",
        type=_positive,
        default=60.0,
        help="the client's --request-timeout and --drain-timeout: a client far behind its "
        "schedule needs time to send what it owes (default: %(default)s)",
    )
    p.add_argument(
        "--timeout", type=_positive, default=180.0, help="seconds before a run is killed"
    )
    p.add_argument("--report", type=Path, help="JSON report (Markdown beside it, .md)")
    return p


def _results(out: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((out / "results.json").read_text())
    except (OSError, ValueError):
        return None
    return data


def _ms(summary: Mapping[str, Any] | None, key: str) -> float | None:
    if not summary or summary.get(key) is None:
        return None
    return float(summary[key]) * 1e3


def run_once(
    server: FakeServerProcess,
    tree: Path,
    rate: float,
    repeat: int,
    opts: argparse.Namespace,
) -> Run:
    n = max(20, round(rate * opts.seconds))
    run = Run(rate=rate, repeat=repeat, requests=n)
    server.take_stats()  # start from zero
    paths = [str(tree / "operator"), str(tree), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    with tempfile.TemporaryDirectory(prefix="bench-overload-") as tmp:
        out = Path(tmp)
        command = [
            sys.executable, "-m", "vllm_operator.bench.cli", "--endpoint", server.url,
            "--model", "fake-model", "--api", "completions", "--arrival", opts.arrival,
            "--rate", f"{rate:g}", "--requests", str(n), "--prompt-tokens", str(PROMPT_TOKENS),
            "--output-tokens", str(OUTPUT_TOKENS), "--output-dir", str(out), "--no-html",
            "--no-progress", "--request-timeout", f"{opts.drain_timeout:g}",
            "--drain-timeout", f"{opts.drain_timeout:g}",
            *opts.client_args.split(),
        ]  # fmt: skip
        run.load_before = os.getloadavg()[0]
        started = time.monotonic()
        try:
            done = subprocess.run(
                command,
                cwd=tmp,
                env=env,
                capture_output=True,
                text=True,
                timeout=opts.timeout,
                check=False,
            )
            run.exit_code = done.returncode
            if done.returncode not in (0, 4):
                run.note = (done.stderr or done.stdout)[-300:].strip().replace("\n", " ")
        except subprocess.TimeoutExpired:
            run.note = f"killed after {opts.timeout:g} s"
        run.wall_s = time.monotonic() - started
        run.load_after = os.getloadavg()[0]
        data = _results(out)
    seen = server.take_stats()
    run.server_requests = int(seen["requests"])
    first, last = seen.get("first_received"), seen.get("last_received")
    if run.server_requests >= 2 and first is not None and last is not None and last > first:
        run.server_per_s = (run.server_requests - 1) / (last - first)
    run.connections = int(seen["generation_connections"])
    run.connections_peak = int(seen["generation_peak"])
    if data is None or not data.get("levels"):
        return run
    level = data["levels"][0]
    stats = level["stats"]
    run.completed = int(stats["completed"])
    run.delivered_per_s = float(stats["requests_per_second"])
    run.send_per_s = stats.get("send_rate_per_second")
    run.errors = {k: int(v) for k, v in stats["errors_by_kind"].items()}
    lag = stats.get("schedule_lag")
    run.lag_p50_ms, run.lag_p99_ms = _ms(lag, "p50"), _ms(lag, "p99")
    run.lag_p999_ms, run.lag_max_ms = _ms(lag, "p999"), _ms(lag, "max")
    run.client_cpu = stats.get("client_cpu_utilization")
    run.verdict = str(stats.get("verdict", ""))
    for r in level["requests"]:
        if r["sent"] is None:
            run.unsent += 1
        elif r["sent"] - r["scheduled"] > LATE_S:
            run.late += 1
    return run


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize(runs: Sequence[Run], rates: Sequence[float]) -> list[dict[str, Any]]:
    """Medians of every figure per rate (errors: the median count of each kind)."""
    out = []
    for rate in rates:
        rs = [r for r in runs if r.rate == rate]
        if not rs:
            continue
        kinds = sorted({k for r in rs for k in r.errors})
        errors = {k: _median([float(r.errors.get(k, 0)) for r in rs]) for k in kinds}
        out.append(
            {
                "rate": rate,
                "runs": len(rs),
                "requests": rs[0].requests,
                "delivered_per_s": _median([r.delivered_per_s for r in rs]),
                "server_per_s": _median([r.server_per_s for r in rs]),
                "send_per_s": _median([r.send_per_s for r in rs]),
                "completed": _median([float(r.completed) for r in rs]),
                "errors": {k: v for k, v in errors.items() if v},
                "unsent": _median([float(r.unsent) for r in rs]),
                "late": _median([float(r.late) for r in rs]),
                "connections": _median([float(r.connections) for r in rs]),
                "connections_peak": _median([float(r.connections_peak) for r in rs]),
                "lag_p99_ms": _median([r.lag_p99_ms for r in rs]),
                "lag_p999_ms": _median([r.lag_p999_ms for r in rs]),
                "lag_max_ms": _median([r.lag_max_ms for r in rs]),
                "client_cpu": _median([r.client_cpu for r in rs]),
                "exit_codes": dict(Counter(str(r.exit_code) for r in rs)),
                "load": _median([r.load_before for r in rs]),
                "load_range": [min(r.load_before for r in rs), max(r.load_after for r in rs)],
            }
        )
    return out


def _n(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _f(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.3g}" if v < 1000 else f"{v:,.0f}"


def markdown(report: Mapping[str, Any]) -> str:
    s = report["settings"]
    title = f"## Load generator past its maximum{': ' + s['label'] if s['label'] else ''}"
    lines = [
        title,
        "",
        f"`python -m devenv.overload` on {report['date']}: client of {report['tree']} "
        f"(commit {report['commit']}), {s['arrival']} arrivals, {s['seconds']:g} s of "
        f"schedule per run, {s['repeats']} runs per rate (medians), prompts of "
        f"{PROMPT_TOKENS} tokens, {OUTPUT_TOKENS} output tokens, zero-delay fake server on "
        f"127.0.0.1. Machine: {report['machine']['cpus']} cores, "
        f"{report['machine']['python']}; wall time {report['wall_s']:.0f} s.",
        "",
        "| offered req/s | delivered req/s | server saw req/s | ok | errors | unsent "
        "| late >10 ms | connections (peak) | lag P99 ms | lag P99.9 ms | lag max ms "
        "| exit | load avg 1 min |",
        "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for e in report["summary"]:
        errors = ", ".join(f"{k} {_n(v)}" for k, v in e["errors"].items()) or "-"
        exits = ", ".join(f"{k} ({v} runs)" if v > 1 else k for k, v in e["exit_codes"].items())
        lo, hi = e["load_range"]
        lines.append(
            f"| {_n(e['rate'])} | {_n(e['delivered_per_s'])} | {_n(e['server_per_s'])} "
            f"| {_n(e['completed'])}/{_n(e['requests'])} | {errors} | {_n(e['unsent'])} "
            f"| {_n(e['late'])} | {_n(e['connections'])} ({_n(e['connections_peak'])}) "
            f"| {_f(e['lag_p99_ms'])} | {_f(e['lag_p999_ms'])} | {_f(e['lag_max_ms'])} "
            f"| {exits} | {e['load']:.2f} ({lo:.2f}-{hi:.2f}) |"
        )
    lines += [
        "",
        "Delivered: completed requests per second of the level (the client's view); server "
        "saw: generation requests the server received per second between the first and the "
        "last; connections: those that carried a generation request, opened during the run "
        "(most open at once); lag: send instant minus scheduled instant, the client's own "
        "record; load average: the median at the start of the runs (lowest at a start to "
        "highest at an end).",
        "",
    ]
    return "\n".join(lines)


def _commit(tree: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "?"


def main(argv: Sequence[str] | None = None) -> int:
    opts = parser().parse_args(argv)
    tree = opts.tree.resolve()
    if not (tree / "operator" / "vllm_operator" / "bench" / "cli.py").is_file():
        print(f"{tree} is not a checkout with the bench client", file=sys.stderr)
        return 2
    stamp = datetime.datetime.now(datetime.UTC)
    report_path = opts.report or Path(f"bench-overload-{stamp:%Y%m%d-%H%M%S}.json")
    started = time.monotonic()
    runs: list[Run] = []
    with FakeServerProcess(Config(log=False), cwd=str(REPO)) as server:
        for repeat in range(opts.repeats):
            shift = repeat % len(opts.rates)
            for rate in opts.rates[shift:] + opts.rates[:shift]:
                run = run_once(server, tree, rate, repeat, opts)
                runs.append(run)
                print(
                    f"repeat {repeat + 1} rate {rate:g}: delivered {_n(run.delivered_per_s)}/s, "
                    f"errors {sum(run.errors.values())}, unsent {run.unsent}, connections "
                    f"{run.connections}, lag P99.9 {_f(run.lag_p999_ms)} ms, exit "
                    f"{run.exit_code}, load {run.load_before:.2f} {run.note}",
                    file=sys.stderr,
                    flush=True,
                )
    report = {
        "date": stamp.isoformat(timespec="seconds"),
        "tree": str(tree),
        "commit": _commit(tree),
        "settings": {
            "label": opts.label,
            "rates": opts.rates,
            "seconds": opts.seconds,
            "repeats": opts.repeats,
            "arrival": opts.arrival,
            "client_args": opts.client_args,
            "drain_timeout": opts.drain_timeout,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "python": f"Python {platform.python_version()}",
            "host": platform.node(),
        },
        "wall_s": time.monotonic() - started,
        "summary": summarize(runs, opts.rates),
        "runs": [asdict(r) for r in runs],
    }
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    report_path.with_suffix(".md").write_text(text)
    print(text)
    print(f"Report: {report_path} (and {report_path.with_suffix('.md')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
