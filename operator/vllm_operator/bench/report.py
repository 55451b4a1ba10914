"""Reports of a benchmark run: progress and a table on the terminal, JSON, and HTML.

- **Terminal** (rich): a progress bar per level while it runs, then one table row per level.
  Rich's live display normally redraws from a background thread ten times a second; here it
  is redrawn only from the sending loop, in the schedule's quiet moments
  (:mod:`vllm_operator.bench.run`), because a thread contending for the GIL would delay
  sends and show up as schedule lag.
- **JSON** (``results.json``): the spec, every level's summary, and every request's raw
  instants (seconds from the level's start), so a run can be re-summarised or re-plotted.
  ``status.json`` is the same run as the InferenceBenchmark status (milliseconds).
- **HTML** (``report.html``): one self-contained file, no scripts, no external assets.
  Plots are inline SVG drawn here (a plotting library would add a large dependency for
  three charts): latency percentiles against load with the knee marked, P99 latency per
  prompt-length bucket, and a timeline of every request of one level (latency from the
  scheduled time against the scheduled time; failures in red).

The HTML and the tables are rendered from the JSON form, so ``vllm-operator bench
--from-results results.json`` (or the benchmark's results ConfigMap, see
:mod:`vllm_operator.bench.archive`) can redraw the HTML later.
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from vllm_operator.bench.records import Load, RequestRecord
from vllm_operator.bench.result import (
    BenchmarkResult,
    LevelOutcome,
    judge,
    knee_resource,
    to_status,
)
from vllm_operator.bench.stats import LevelStats

JSON_VERSION = 1
# The timeline plots at most this many requests (evenly spaced by index).
TIMELINE_POINTS = 4000


# --- terminal ----------------------------------------------------------------------------


class ConsoleReporter:
    """Progress on a rich console, redrawn only when :meth:`refresh` is called.

    Each level has its own bar; its last frame, drawn when the level ends, shows every
    request counted (the last redraw in a quiet moment of the schedule was often short
    of the total, 810/838) and stays on the screen above the level's result line.
    """

    def __init__(self, console: Console, *, progress: bool = True) -> None:
        self.console = console
        self.show_progress = progress and console.is_terminal
        self.progress: Progress | None = None
        self.task: Any = None
        self.done = 0
        self.errors = 0

    def level_started(self, load: Load, total: int | None) -> None:
        self.done = self.errors = 0
        if not self.show_progress:
            self.console.print(f"Running level {load.label()} ({total or '?'} requests)")
            return
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("errors {task.fields[errors]}"),
            TimeElapsedColumn(),
            console=self.console,
            auto_refresh=False,
        )
        self.progress.start()
        self.task = self.progress.add_task(load.label(), total=total, errors=0)
        self.progress.refresh()

    def request_done(self, rec: RequestRecord) -> None:
        # Counting only: drawing happens in refresh().
        self.done += 1
        self.errors += rec.error is not None

    def refresh(self) -> None:
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, completed=self.done, errors=self.errors)
            self.progress.refresh()

    def level_finished(self, stats: LevelStats) -> None:
        if self.progress is not None and self.task is not None:
            self.refresh()  # the last frame: every request of the level
            self.progress.stop()
            self.progress = self.task = None
        self.console.print(_level_line(stats))

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def _level_line(stats: LevelStats) -> str:
    ttft = stats.from_scheduled.ttft
    lag = stats.schedule_lag
    return (
        f"{_load_label(stats)}: {stats.completed}/{stats.requests} completed, "
        f"{stats.requests_per_second:.3g} req/s, TTFT P99 {_ms(ttft.p99 if ttft else None)} ms "
        f"(from scheduled), lag P99 {_ms(lag.p99 if lag else None)} ms; {stats.verdict}"
    )


def _load_label(stats: LevelStats) -> str:
    if stats.concurrency is not None:
        return f"concurrency {stats.concurrency}"
    if stats.rate_per_second is not None:
        return f"{stats.rate_per_second:.4g} req/s ({stats.process})"
    return stats.process


# Below this many columns the table of every figure would be cut (rich shortens cells to
# "3…"): the narrow table keeps the figures a reader compares, units in the headers.
WIDE_COLUMNS = 190


def _figures(s: LevelStats) -> dict[str, str]:
    """Every figure of one level, by column name (latencies in ms)."""
    lat = s.from_scheduled
    return {
        "load": _load_label(s),
        "req": str(s.requests),
        "ok": str(s.completed),
        "fail": str(s.failed),
        "req/s": f"{s.requests_per_second:.3g}",
        "tok/s": f"{s.output_tokens_per_second:.4g}",
        "TTFT p50 ms": _ms(lat.ttft.p50 if lat.ttft else None),
        "TTFT p99 ms": _ms(lat.ttft.p99 if lat.ttft else None),
        "TPOT p50 ms": _ms(lat.tpot.p50 if lat.tpot else None),
        "TPOT p99 ms": _ms(lat.tpot.p99 if lat.tpot else None),
        "ITL p99 ms": _ms(lat.itl.p99 if lat.itl else None),
        "E2E p50 ms": _ms(lat.e2e.p50 if lat.e2e else None),
        "E2E p99 ms": _ms(lat.e2e.p99 if lat.e2e else None),
        "SLO": "-" if s.slo_attainment is None else f"{s.slo_attainment:.1%}",
        "errored": str(s.errored),
        "conns": "-" if s.connections_opened is None else str(s.connections_opened),
        "lag p99 ms": _ms(s.schedule_lag.p99 if s.schedule_lag else None),
        "lag p99.9 ms": _ms(s.schedule_lag.p999 if s.schedule_lag else None),
        "client": "SATURATED" if s.client_saturated else "ok",
    }


_NARROW = ("load", "ok/req", "req/s", "TTFT p99 ms", "TPOT p99 ms", "E2E p99 ms", "SLO")


def summary_table(result: BenchmarkResult, width: int = WIDE_COLUMNS) -> Table:
    """The levels' figures, latencies from the scheduled time in milliseconds: one row per
    level with every figure on a wide terminal; below ``WIDE_COLUMNS``, one level as a
    figure-per-line table, several with the figures compared most (the rest are in
    results.json, status.json and the HTML report)."""
    title = f"{result.model} at {result.endpoint}"
    rows = [_figures(lv.stats) for lv in result.levels]
    if width < WIDE_COLUMNS and len(rows) == 1:
        table = Table(title=title, title_justify="left", show_header=False)
        table.add_column("figure")
        table.add_column("value", justify="right")
        for name, value in rows[0].items():
            table.add_row(name, value)
        return table
    table = Table(title=title, title_justify="left")
    names = list(rows[0]) if rows and width >= WIDE_COLUMNS else list(_NARROW)
    for name in names:
        table.add_column(name, justify="left" if name in ("load", "client") else "right")
    for row in rows:
        row["ok/req"] = f"{row['ok']}/{row['req']}"
        table.add_row(*(row[name] for name in names))
    return table


# Below this saturation no resource the metrics show explains a knee.
NEAR_SATURATION = 0.5


def knee_cause_words(resource: str, saturation: float) -> str:
    """What the metrics say caused the knee: the resource nearest saturation, or, when even
    that one was far from it, that the limit is one they do not measure."""
    if saturation >= NEAR_SATURATION:
        return f"nearest saturation {resource} ({saturation:.0%})"
    return (
        f"no measured resource near saturation (nearest {resource}, {saturation:.0%}): the "
        "limit is one the metrics do not show (CPU, network, the client)"
    )


def print_summary(result: BenchmarkResult, console: Console) -> None:
    console.print(summary_table(result, console.width))
    knee = result.knee
    if knee is not None:
        console.print(f"Knee: {knee[0]:.4g} {knee[1]} (P99 TTFT climbs 3x faster beyond it)")
    cause = knee_resource(result)
    if cause is not None:
        console.print(f"At the knee: {knee_cause_words(cause[0], cause[1])}")
    for lv in result.levels:
        if lv.resources is not None and lv.resources.samples == 0 and lv.resources.last_error:
            console.print(f"[yellow]Resources not read: {lv.resources.last_error}[/]")
            break
    if result.spec.mode == "Search":
        best = result.best_rate_per_second
        console.print(
            f"Highest rate meeting the SLO: {best:.4g} req/s"
            if best is not None
            else "No probed rate met the SLO."
        )
    target = result.spec.target_attainment()
    for lv in result.levels:
        if lv.stats.client_saturated:
            counted = {
                "met": "it still met the SLO, its lag inside the latencies measured",
                "missed": "it missed the SLO even from the send, so the miss is the server's",
                "client": "the lag could have decided it, so it counts neither way",
            }[judge(lv.stats, target)]
            console.print(f"[bold red]{_load_label(lv.stats)}: {lv.stats.verdict}; {counted}[/]")
    for c in result.chaos:
        console.print(f"Chaos at {c.rate_per_second:.4g} req/s, {c.perturbation}: {c.verdict}")
    if result.chaos_note:
        console.print(f"[bold yellow]{result.chaos_note}[/]")


# --- JSON --------------------------------------------------------------------------------


def result_json(result: BenchmarkResult, *, requests: bool = True) -> dict[str, Any]:
    """The whole run as JSON-ready data (latencies in seconds; instants relative)."""
    knee = result.knee
    cause = knee_resource(result)
    return {
        "version": JSON_VERSION,
        "spec": result.spec.to_wire(),
        "endpoint": result.endpoint,
        "model": result.model,
        "tokenizer": result.tokenizer,
        "client": result.client,
        "start_time": result.start_time.isoformat(),
        "end_time": result.end_time.isoformat(),
        "knee": None if knee is None else {"load": knee[0], "unit": knee[1]},
        "knee_rate_per_second": result.knee_rate_per_second,
        "knee_resource": (
            None
            if cause is None
            else {"resource": cause[0], "saturation": cause[1], "load": cause[2]}
        ),
        "best_rate_per_second": result.best_rate_per_second,
        "levels": [
            {
                "passed": lv.passed,
                "wall_start": lv.recording.wall_start,
                "max_in_flight": lv.recording.max_in_flight,
                "stats": dataclasses.asdict(lv.stats),
                "resources": _resources_json(lv),
                "requests": (
                    [r.to_json(lv.recording.start) for r in lv.recording.records]
                    if requests
                    else []
                ),
            }
            for lv in result.levels
        ],
        # The chaos phase: its levels' summaries (their requests are not kept: the
        # ConfigMap's room goes to the levels).
        "chaos": [
            {
                "perturbation": c.perturbation,
                "rate_per_second": c.rate_per_second,
                "verdict": c.verdict,
                "baseline": {
                    "passed": c.baseline.passed,
                    "stats": dataclasses.asdict(c.baseline.stats),
                    "resources": _resources_json(c.baseline),
                },
                "perturbed": {
                    "passed": c.perturbed.passed,
                    "stats": dataclasses.asdict(c.perturbed.stats),
                    "resources": _resources_json(c.perturbed),
                },
            }
            for c in result.chaos
        ],
        "chaos_note": result.chaos_note,
    }


def _resources_json(level: LevelOutcome) -> dict[str, Any] | None:
    return None if level.resources is None else dataclasses.asdict(level.resources)


def write_outputs(
    result: BenchmarkResult, out_dir: Path, *, html_report: bool = True
) -> dict[str, Path]:
    """Write results.json, status.json and (optionally) report.html; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    data = result_json(result)
    paths = {"results": out_dir / "results.json", "status": out_dir / "status.json"}
    paths["results"].write_text(json.dumps(data, indent=1) + "\n")
    status = to_status(result).to_wire()
    paths["status"].write_text(json.dumps(status, indent=2) + "\n")
    if html_report:
        paths["html"] = out_dir / "report.html"
        paths["html"].write_text(render_html(data))
    return paths


# --- HTML and SVG ------------------------------------------------------------------------

_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#7f7f7f")
_W, _H = 720, 340
_ML, _MR, _MT, _MB = 64, 150, 32, 48


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi] (the last one at or above hi)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step + 1e-9)
    last = math.ceil(hi / step - 1e-9)
    return [round(k * step, 12) for k in range(first, last + 1)]


def _fmt(v: float) -> str:
    return f"{v:.4g}"


class _Plot:
    """A minimal SVG x/y plot: axes with ticks, lines, points, a legend."""

    def __init__(
        self, title: str, xlabel: str, ylabel: str, xs: Sequence[float], ys: Sequence[float]
    ) -> None:
        self.parts: list[str] = []
        self.legend: list[tuple[str, str, str]] = []
        xlo, xhi = (min(xs), max(xs)) if xs else (0.0, 1.0)
        if xhi == xlo:
            xlo, xhi = xlo - 1, xhi + 1
        ylo, yhi = 0.0, (max(ys) if ys else 1.0)
        if yhi <= ylo:
            yhi = ylo + 1
        self.xt = _nice_ticks(xlo, xhi)
        self.yt = _nice_ticks(ylo, yhi)
        self.x0, self.x1 = self.xt[0], self.xt[-1]
        self.y0, self.y1 = 0.0, self.yt[-1]
        self.title, self.xlabel, self.ylabel = title, xlabel, ylabel

    def sx(self, x: float) -> float:
        return _ML + (x - self.x0) / (self.x1 - self.x0) * (_W - _ML - _MR)

    def sy(self, y: float) -> float:
        return _H - _MB - (y - self.y0) / (self.y1 - self.y0) * (_H - _MT - _MB)

    def line(self, pts: Sequence[tuple[float, float]], color: str, label: str) -> None:
        if not pts:
            return
        path = " ".join(f"{self.sx(x):.1f},{self.sy(y):.1f}" for x, y in pts)
        self.parts.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}"/>'
        )
        for x, y in pts:
            self.parts.append(
                f'<circle cx="{self.sx(x):.1f}" cy="{self.sy(y):.1f}" r="3" fill="{color}">'
                f"<title>{html.escape(label)}: {_fmt(x)}, {_fmt(y)}</title></circle>"
            )
        self.legend.append((color, label, "line"))

    def points(self, pts: Sequence[tuple[float, float]], color: str, label: str) -> None:
        if not pts:
            return
        self.parts.append(
            "".join(
                f'<circle cx="{self.sx(x):.1f}" cy="{self.sy(y):.1f}" r="1.6" fill="{color}" '
                'fill-opacity="0.6"/>'
                for x, y in pts
            )
        )
        self.legend.append((color, label, "dot"))

    def vline(self, x: float, label: str) -> None:
        px = self.sx(x)
        self.parts.append(
            f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{_MT}" y2="{_H - _MB}" stroke="#d62728" '
            f'stroke-dasharray="5,4" stroke-width="1.5"/>'
            f'<text x="{px + 4:.1f}" y="{_MT + 12}" fill="#d62728" font-size="12">'
            f"{html.escape(label)}</text>"
        )

    def svg(self) -> str:
        out = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
            f'viewBox="0 0 {_W} {_H}" font-family="sans-serif" font-size="11">',
            f'<text x="{_ML}" y="14" font-size="13" font-weight="bold">'
            f"{html.escape(self.title)}</text>",
        ]
        for t in self.yt:
            y = self.sy(t)
            out.append(
                f'<line x1="{_ML}" x2="{_W - _MR}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>'
                f'<text x="{_ML - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>'
            )
        for t in self.xt:
            x = self.sx(t)
            out.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_H - _MB}" y2="{_H - _MB + 4}" '
                f'stroke="#333"/><text x="{x:.1f}" y="{_H - _MB + 16}" text-anchor="middle">'
                f"{_fmt(t)}</text>"
            )
        out.append(
            f'<line x1="{_ML}" x2="{_W - _MR}" y1="{_H - _MB}" y2="{_H - _MB}" stroke="#333"/>'
            f'<line x1="{_ML}" x2="{_ML}" y1="{_MT}" y2="{_H - _MB}" stroke="#333"/>'
            f'<text x="{(_ML + _W - _MR) / 2}" y="{_H - 10}" text-anchor="middle">'
            f"{html.escape(self.xlabel)}</text>"
            f'<text transform="translate(14,{(_MT + _H - _MB) / 2}) rotate(-90)" '
            f'text-anchor="middle">{html.escape(self.ylabel)}</text>'
        )
        out += self.parts
        for i, (color, label, kind) in enumerate(self.legend):
            y = _MT + 10 + i * 16
            x = _W - _MR + 12
            mark = (
                f'<line x1="{x}" x2="{x + 18}" y1="{y}" y2="{y}" stroke="{color}" '
                f'stroke-width="2"/>'
                if kind == "line"
                else f'<circle cx="{x + 9}" cy="{y}" r="3" fill="{color}"/>'
            )
            out.append(mark + f'<text x="{x + 24}" y="{y + 4}">{html.escape(label)}</text>')
        out.append("</svg>")
        return "".join(out)


def _bar_chart(title: str, groups: Sequence[str], series: dict[str, Sequence[float | None]]) -> str:
    values = [v for vs in series.values() for v in vs if v is not None]
    top = _nice_ticks(0, max(values) if values else 1)
    ymax = top[-1] or 1
    inner_w = _W - _ML - _MR
    gw = inner_w / max(1, len(groups))
    bw = gw * 0.8 / max(1, len(series))

    def sy(v: float) -> float:
        return _H - _MB - v / ymax * (_H - _MT - _MB)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
        f'viewBox="0 0 {_W} {_H}" font-family="sans-serif" font-size="11">',
        f'<text x="{_ML}" y="14" font-size="13" font-weight="bold">{html.escape(title)}</text>',
    ]
    for t in top:
        out.append(
            f'<line x1="{_ML}" x2="{_W - _MR}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" '
            f'stroke="#e5e5e5"/><text x="{_ML - 6}" y="{sy(t) + 4:.1f}" text-anchor="end">'
            f"{_fmt(t)}</text>"
        )
    for gi, group in enumerate(groups):
        gx = _ML + gi * gw + gw * 0.1
        out.append(
            f'<text x="{gx + gw * 0.4:.1f}" y="{_H - _MB + 16}" text-anchor="middle">'
            f"{html.escape(group)}</text>"
        )
        for si, (name, vals) in enumerate(series.items()):
            v = vals[gi]
            if v is None:
                continue
            color = _COLORS[si % len(_COLORS)]
            out.append(
                f'<rect x="{gx + si * bw:.1f}" y="{sy(v):.1f}" width="{bw * 0.95:.1f}" '
                f'height="{_H - _MB - sy(v):.1f}" fill="{color}"><title>{html.escape(name)} '
                f"{html.escape(group)}: {_fmt(v)} ms</title></rect>"
            )
    out.append(
        f'<line x1="{_ML}" x2="{_W - _MR}" y1="{_H - _MB}" y2="{_H - _MB}" stroke="#333"/>'
        f'<text x="{(_ML + _W - _MR) / 2}" y="{_H - 10}" text-anchor="middle">prompt tokens</text>'
        f'<text transform="translate(14,{(_MT + _H - _MB) / 2}) rotate(-90)" '
        f'text-anchor="middle">P99 ms (from scheduled)</text>'
    )
    for si, name in enumerate(series):
        y = _MT + 10 + si * 16
        x = _W - _MR + 12
        out.append(
            f'<rect x="{x}" y="{y - 5}" width="12" height="10" '
            f'fill="{_COLORS[si % len(_COLORS)]}"/>'
            f'<text x="{x + 18}" y="{y + 4}">{html.escape(name)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def _get(stats: dict[str, Any], *path: str) -> float | None:
    cur: Any = stats
    for key in path:
        if not isinstance(cur, dict) or cur.get(key) is None:
            return None
        cur = cur[key]
    return float(cur) if isinstance(cur, int | float) else None


def _load_of(stats: dict[str, Any]) -> tuple[float | None, str]:
    if stats.get("concurrency") is not None:
        return float(stats["concurrency"]), "concurrency"
    if stats.get("rate_per_second") is not None:
        return float(stats["rate_per_second"]), "offered rate (req/s)"
    return None, ""


def latency_vs_load_svg(data: dict[str, Any]) -> str:
    levels = [lv["stats"] for lv in data["levels"]]
    loads = [(x, unit, s) for s in levels for x, unit in [_load_of(s)] if x is not None]
    unit = loads[0][1] if loads else "load"
    pts = sorted(((x, s) for x, u, s in loads if u == unit), key=lambda p: p[0])
    series = {
        "TTFT P50": ("from_scheduled", "ttft", "p50"),
        "TTFT P90": ("from_scheduled", "ttft", "p90"),
        "TTFT P99": ("from_scheduled", "ttft", "p99"),
        "E2E P50": ("from_scheduled", "e2e", "p50"),
        "E2E P99": ("from_scheduled", "e2e", "p99"),
        "TPOT P99": ("from_scheduled", "tpot", "p99"),
    }
    lines = {
        name: [(x, v * 1e3) for x, s in pts if (v := _get(s, *path)) is not None]
        for name, path in series.items()
    }
    ys = [y for line in lines.values() for _, y in line]
    plot = _Plot(
        "Latency from the scheduled send time vs load",
        unit,
        "milliseconds",
        [x for x, _ in pts],
        ys,
    )
    for i, (name, line) in enumerate(lines.items()):
        plot.line(line, _COLORS[i % len(_COLORS)], name)
    knee = data.get("knee")
    if knee and (knee["unit"] == "req/s") == (unit != "concurrency"):
        plot.vline(float(knee["load"]), f"knee {knee['load']:.4g}")
    return plot.svg()


def buckets_svg(level: dict[str, Any]) -> str:
    buckets = level["stats"].get("buckets") or []
    groups = [f"{b['min_tokens']}-{b['max_tokens']}" for b in buckets]
    ttft = [_get(b, "ttft", "p99") for b in buckets]
    e2e = [_get(b, "e2e", "p99") for b in buckets]
    return _bar_chart(
        "P99 latency by prompt length",
        groups,
        {
            "TTFT P99": [None if v is None else v * 1e3 for v in ttft],
            "E2E P99": [None if v is None else v * 1e3 for v in e2e],
        },
    )


def timeline_svg(level: dict[str, Any]) -> str:
    reqs = level["requests"]
    step = max(1, math.ceil(len(reqs) / TIMELINE_POINTS))
    sample = reqs[::step]
    ttft_ok, e2e_ok, failed, lag = [], [], [], []
    for r in sample:
        sched = r["scheduled"]
        if r.get("sent") is not None:
            lag.append((sched, (r["sent"] - sched) * 1e3))
        if r.get("end") is None:
            continue
        if r.get("error"):
            failed.append((sched, (r["end"] - sched) * 1e3))
            continue
        if r.get("first_token") is not None:
            ttft_ok.append((sched, (r["first_token"] - sched) * 1e3))
        e2e_ok.append((sched, (r["end"] - sched) * 1e3))
    all_pts = ttft_ok + e2e_ok + failed + lag
    plot = _Plot(
        f"Timeline at {level['stats_label']}" + (f" (every {step}th request)" if step > 1 else ""),
        "scheduled send time (s from level start)",
        "ms from scheduled send",
        [x for x, _ in all_pts],
        [y for _, y in all_pts],
    )
    plot.points(e2e_ok, _COLORS[0], "E2E")
    plot.points(ttft_ok, _COLORS[1], "TTFT")
    plot.points(lag, _COLORS[2], "schedule lag")
    plot.points(failed, "#d62728", "failed")
    return plot.svg()


def _stats_label(stats: dict[str, Any]) -> str:
    if stats.get("concurrency") is not None:
        return f"concurrency {stats['concurrency']}"
    if stats.get("rate_per_second") is not None:
        return f"{stats['rate_per_second']:.4g} req/s"
    return str(stats.get("process"))


def _cell(v: float | None, scale: float = 1e3) -> str:
    return "-" if v is None else _fmt(v * scale)


def render_html(data: dict[str, Any]) -> str:
    """A self-contained HTML report of a run's JSON form."""
    levels = data["levels"]
    for lv in levels:
        lv["stats_label"] = _stats_label(lv["stats"])
    # The level shown in detail: the highest that passed, else the last one.
    passed = [lv for lv in levels if lv.get("passed")]
    focus = passed[-1] if passed else (levels[-1] if levels else None)
    rows = []
    for lv in levels:
        s = lv["stats"]
        rows.append(
            "<tr>"
            + "".join(
                f"<td>{html.escape(str(c))}</td>"
                for c in (
                    lv["stats_label"],
                    s["requests"],
                    s["completed"],
                    s["failed"],
                    _fmt(s["requests_per_second"]),
                    _fmt(s["output_tokens_per_second"]),
                    _cell(_get(s, "from_scheduled", "ttft", "p50")),
                    _cell(_get(s, "from_scheduled", "ttft", "p99")),
                    _cell(_get(s, "from_send", "ttft", "p99")),
                    _cell(_get(s, "from_scheduled", "tpot", "p99")),
                    _cell(_get(s, "from_scheduled", "itl", "p99")),
                    _cell(_get(s, "from_scheduled", "e2e", "p99")),
                    "-" if s["slo_attainment"] is None else f"{s['slo_attainment']:.1%}",
                    _cell(_get(s, "schedule_lag", "p99")),
                    s["verdict"],
                )
            )
            + "</tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "load", "requests", "ok", "failed", "req/s", "out tok/s", "TTFT p50", "TTFT p99",
            "TTFT p99 (from send)", "TPOT p99", "ITL p99", "E2E p99", "SLO attainment",
            "lag p99", "client",
        )
    )  # fmt: skip
    knee = data.get("knee")
    facts = [
        f"Model <b>{html.escape(data['model'])}</b> at {html.escape(data['endpoint'])}",
        f"{html.escape(data['start_time'])} to {html.escape(data['end_time'])}",
        f"mode {html.escape(str(data['spec'].get('mode', 'Single')))}, "
        f"prompt lengths from the {html.escape(data['tokenizer'])} tokenizer",
        "knee: " + (f"{knee['load']:.4g} {html.escape(knee['unit'])}" if knee else "none found"),
    ]
    if data.get("best_rate_per_second") is not None:
        facts.append(f"highest rate meeting the SLO: {data['best_rate_per_second']:.4g} req/s")
    plots = [latency_vs_load_svg(data)] if len(levels) > 1 else []
    if focus is not None:
        plots += [buckets_svg(focus), timeline_svg(focus)]
    spec = html.escape(json.dumps(data["spec"], indent=2))
    chaos = _chaos_html(data)
    resources = _resources_html(data)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>vllm-operator bench: {html.escape(data["model"])}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; font-size: 13px; }}
th, td {{ border: 1px solid #ccc; padding: 3px 6px; text-align: right; }}
td:first-child, td:last-child {{ text-align: left; }}
figure {{ margin: 1.5em 0; }}
pre {{ background: #f5f5f5; padding: 1em; }}
</style></head><body>
<h1>Benchmark report</h1>
<p>{"<br>".join(facts)}</p>
<p>Latencies in milliseconds, measured from the <b>scheduled</b> send time unless marked;
the client's schedule lag is how late it sent. Tokens come from the server's usage.</p>
<table><tr>{head}</tr>{"".join(rows)}</table>
{"".join(f"<figure>{p}</figure>" for p in plots)}
{resources}
{chaos}
<details><summary>Spec</summary><pre>{spec}</pre></details>
</body></html>
"""


_RESOURCE_LABELS = {
    "kv-cache": "KV cache",
    "queue": "queue (waiting share)",
    "gpu": "GPU utilisation",
    "memory-bandwidth": "memory bandwidth",
    "power": "power (of the limit)",
}


def _heat(fraction: float) -> str:
    """White at 0, through amber, to red at 1."""
    f = min(1.0, max(0.0, fraction))
    if f < 0.5:
        g = 255 - int(80 * f * 2)
        return f"rgb(255,{g},{255 - int(255 * f * 2)})"
    return f"rgb({255 - int(55 * (f - 0.5) * 2)},{175 - int(175 * (f - 0.5) * 2)},0)"


def resources_heatmap_svg(data: dict[str, Any]) -> str:
    """P99 against load, each level a column whose cells are coloured by how near
    saturation each resource was; the knee's column is outlined, with its resource."""
    cols = []
    for lv in data["levels"]:
        x, unit = _load_of(lv["stats"])
        if x is not None and lv.get("resources"):
            cols.append((x, unit, lv))
    cols.sort(key=lambda c: c[0])
    names = [n for n in _RESOURCE_LABELS if any(n in c[2]["resources"]["saturation"] for c in cols)]
    if not cols or not names:
        return ""
    unit = cols[0][1]
    left, top, cw, ch = 170, 56, 64, 26
    width, height = left + cw * len(cols) + 20, top + ch * (len(names) + 1) + 40
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        f'<text x="{left}" y="16" font-size="13">P99 latency against {html.escape(unit)}, '
        "each resource coloured by its saturation</text>",
    ]
    knee = data.get("knee")
    cause = data.get("knee_resource") or {}
    for i, (x, _u, lv) in enumerate(cols):
        cx = left + i * cw
        y99 = knee_metric_of(lv["stats"])
        out.append(f'<text x="{cx + cw / 2}" y="{top - 22}" text-anchor="middle">{_fmt(x)}</text>')
        p99 = "-" if y99 is None else f"{y99 * 1e3:.4g} ms"
        out.append(f'<text x="{cx + cw / 2}" y="{top - 6}" text-anchor="middle">{p99}</text>')
        sat = lv["resources"]["saturation"]
        for j, name in enumerate(names):
            y = top + j * ch
            value = sat.get(name)
            fill = "#eee" if value is None else _heat(value)
            out.append(
                f'<rect x="{cx}" y="{y}" width="{cw - 2}" height="{ch - 2}" fill="{fill}">'
                f"<title>{html.escape(_RESOURCE_LABELS[name])} at {_fmt(x)}: "
                f"{'-' if value is None else f'{value:.0%}'}</title></rect>"
            )
            label = "-" if value is None else f"{value:.0%}"
            bold = ' font-weight="bold"' if name == lv["resources"].get("nearest") else ""
            out.append(
                f'<text x="{cx + cw / 2 - 1}" y="{y + ch / 2 + 3}" text-anchor="middle"{bold}>'
                f"{label}</text>"
            )
        if cause and cause.get("load") == x:
            out.append(
                f'<rect x="{cx - 1}" y="{top - 36}" width="{cw}" height="{ch * len(names) + 38}" '
                'fill="none" stroke="#000" stroke-width="2"/>'
            )
    for j, name in enumerate(names):
        out.append(
            f'<text x="{left - 8}" y="{top + j * ch + ch / 2 + 3}" text-anchor="end">'
            f"{html.escape(_RESOURCE_LABELS[name])}</text>"
        )
    out.append(f'<text x="{left - 8}" y="{top - 22}" text-anchor="end">{html.escape(unit)}</text>')
    out.append(f'<text x="{left - 8}" y="{top - 6}" text-anchor="end">P99 (knee metric)</text>')
    foot = top + ch * len(names) + 18
    if knee and cause:
        out.append(
            f'<text x="{left}" y="{foot}">knee {knee["load"]:.4g} {html.escape(knee["unit"])}: '
            + html.escape(
                knee_cause_words(_RESOURCE_LABELS.get(cause["resource"], ""), cause["saturation"])
            )
            + " in the outlined level</text>"
        )
    out.append("</svg>")
    return "".join(out)


def knee_metric_of(stats: dict[str, Any]) -> float | None:
    """The knee's P99 (TTFT from the scheduled send, else E2E) from a level's JSON."""
    got = _get(stats, "from_scheduled", "ttft", "p99")
    return got if got is not None else _get(stats, "from_scheduled", "e2e", "p99")


def _resources_html(data: dict[str, Any]) -> str:
    """The resource figures of each level read, and their heat map."""
    levels = [lv for lv in data["levels"] if lv.get("resources")]
    if not levels:
        return ""
    rows = []
    for lv in levels:
        r = lv["resources"]

        def f(key: str, scale: float = 1.0, digits: str = ".3g", r: dict[str, Any] = r) -> str:
            v = r.get(key)
            return "-" if v is None else format(v * scale, digits)

        cells = [
            lv["stats_label"], f("running_mean"), f("waiting_mean"),
            f("kv_cache_usage_mean", 100, ".1f"), f("kv_cache_usage_max", 100, ".1f"),
            f("preemptions", 1, ".0f"), f("gpu_utilization_mean", 100, ".1f"),
            f("memory_bandwidth_mean", 100, ".1f"), f("power_watts_mean", 1, ".0f"),
            _RESOURCE_LABELS.get(r.get("nearest") or "", "-"),
            f"{r['samples']} ({r['scrape_errors']} failed)",
        ]  # fmt: skip
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    head = "".join(
        f"<th>{h}</th>"
        for h in ("load", "running", "waiting", "KV % mean", "KV % max", "preemptions",
                  "GPU %", "mem BW %", "power W", "nearest saturation", "reads")
    )  # fmt: skip
    heat = resources_heatmap_svg(data)
    return (
        "<h2>Latency against resources</h2><p>What the server reported while each level ran: "
        "requests running and waiting per server (means by Little's law), KV-cache usage, "
        "preemptions, and GPU figures where a DCGM exporter was read.</p>"
        f"<table><tr>{head}</tr>{''.join(rows)}</table>"
        + (f"<figure>{heat}</figure>" if heat else "")
    )


def _chaos_html(data: dict[str, Any]) -> str:
    """The chaos phase: per perturbation, the plain and the perturbed run side by side."""
    entries = data.get("chaos") or []
    note = data.get("chaos_note")
    if not entries and not note:
        return ""
    cols = [("ttft", "p50"), ("ttft", "p99"), ("ttft", "p999"), ("e2e", "p50"), ("e2e", "p99"),
            ("e2e", "p999")]  # fmt: skip
    rows = []
    for c in entries:
        for label, run in (("plain", c["baseline"]), ("perturbed", c["perturbed"])):
            st = run["stats"]
            cells = [
                c["perturbation"] if label == "plain" else "",
                f"{c['rate_per_second']:.4g}" if label == "plain" else "",
                label,
                *(_cell(_get(st, "from_scheduled", m, q)) for m, q in cols),
                "-" if st["slo_attainment"] is None else f"{st['slo_attainment']:.1%}",
                st["errored"],
            ]
            rows.append(
                "<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in cells) + "</tr>"
            )
        rows.append(f'<tr><td colspan="12">{html.escape(c["verdict"])}</td></tr>')
    head = "".join(
        f"<th>{h}</th>"
        for h in ("perturbation", "req/s", "run", "TTFT p50", "TTFT p99", "TTFT p99.9",
                  "E2E p50", "E2E p99", "E2E p99.9", "SLO attainment", "errors")
    )  # fmt: skip
    body = f"<table><tr>{head}</tr>{''.join(rows)}</table>" if rows else ""
    extra = f"<p>{html.escape(note)}</p>" if note else ""
    return (
        "<h2>Chaos</h2><p>Each perturbation against the plain run at the same load, just "
        f"before it (milliseconds, from the scheduled send).</p>{body}{extra}"
    )
