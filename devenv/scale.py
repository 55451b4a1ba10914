"""``python -m devenv.scale``: how long N InferenceServices take to become Ready, and what
API requests the operator sends for them, against N plain Deployments in the same cluster.

Issue 15, item 6: 200 services became Ready 4.4x slower than 200 plain Deployments
created directly in the same cluster, 500 services 6.8x slower. The goal is 500 services
Ready within 2x the raw Deployments' time, at steady state at most 3 requests per service
per resync and no cluster-wide LIST per reconcile. A benchmark with a report, not a timed
test: the figures depend on the machine, and only the ratio of two runs in one cluster
compares like with like.

What it does:

- starts its own local control plane (devenv.cluster) without the real node, with N fake
  GPU nodes of ``--gpus-per-node`` NVIDIA L4s each (16 by default, so 2,000 one-GPU
  services fit on 200 nodes) and one CPU node, all played by kwok; it refuses to run
  beside a cluster that is up already, and always stops its own;
- applies the operator tree's CRDs and runs that tree's operator as a local process
  (devenv/operator_process.py), its metrics on a loopback port;
- for each size and repeat, in fresh namespaces, one after the other in the same cluster:
  **raw**, N Deployments of one replica asking for one GPU on the product the services
  ask for, created 16 at a time, timed from the first create until every one has
  ``availableReplicas == 1``; then **operator**, N InferenceServices created the same way,
  timed until every one has ``Ready=True``, with the operator's request and reconcile
  counters over the roll-in; then **steady state**: from an idle operator (empty queue, no
  reconcile for a few seconds) over exactly one resync (its LIST, the reconciles it spreads
  over half the period) until idle again: requests and reconciles per service per resync,
  the requests by verb and resource, and the apiserver's own count of LISTs (all
  clients) in that window; then **children**, N copies of the Service, PDB and
  Deployment the operator applied for its first service, applied directly and timed as
  the raw Deployments: what the objects alone cost, against which the operator's own
  share of its time shows;
- prints a Markdown summary (medians of the repeats, every run) and writes every figure
  to a JSON report.

The operator's counters are ``vllm_operator_api_requests_total{verb,resource}`` (requests
its reconcilers send; Kopf's watches are not in it) and
``vllm_operator_reconcile_total{kind,result}``. The verb is the HTTP method, or LIST for a
LIST (older operators count a LIST as a GET); the apiserver's
``apiserver_request_total{verb="LIST",scope}`` tells cluster-wide LISTs from namespaced
ones, for every client.

The bench is its own process: its creates and polls (through the operator package's
``KubeClient``, under its own field manager) are not in the operator's counters.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import textwrap
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import yaml
from kubernetes_asyncio import client, config
from prometheus_client.parser import text_string_to_metric_families

from devenv.cluster import node as real_node
from devenv.cluster import nodes as fake_nodes
from devenv.cluster import processes
from devenv.cluster.cluster import ClusterHandle, down, is_healthy, up
from devenv.cluster.components import COMPONENTS
from devenv.cluster.settings import Settings
from devenv.operator_process import OperatorProcess
from vllm_operator.constants import API_VERSION, GROUP, KIND_INFERENCE_SERVICE
from vllm_operator.k8s.api import ApiError
from vllm_operator.k8s.client import KubeClient

REPO: Final = Path(__file__).resolve().parents[1]

# A product the tuner knows (tuning/gpus.py: "L4", 23034 MiB) on which the model fits.
GPU_PRODUCT: Final = "NVIDIA L4"
GPU_MEMORY_MIB: Final = 23034
GPU_LABEL: Final = GPU_PRODUCT.replace(" ", "-")
MODEL: Final = "Qwen/Qwen2.5-0.5B-Instruct"
# kwok pulls nothing: any tag does, and this one names a vLLM release the operator knows.
IMAGE: Final = "vllm/vllm-openai:v0.32.0"
FIELD_MANAGER: Final = "vllm-operator-scale-bench"
RAW_LABEL: Final = "scale.vllm-operator.dev/raw"
# The children phase's copies carry the operator's labels under this prefix instead of
# ours, so that the operator's watches (filtered on the apiserver by our label) never see
# them, as they never see the raw Deployments.
CHILDREN_LABEL_PREFIX: Final = "children.scale.vllm-operator.dev/"
# The kinds the operator applies for a one-GPU service, in the order it applies them.
CHILD_KINDS: Final = (("v1", "Service"), ("policy/v1", "PodDisruptionBudget"),
                      ("apps/v1", "Deployment"))  # fmt: skip
# The name of the first service of a run, whose children the children phase copies.
FIRST_SERVICE: Final = "s-00000"

REQUESTS: Final = "vllm_operator_api_requests_total"
RECONCILES: Final = "vllm_operator_reconcile_total"
QUEUE_DEPTH: Final = "vllm_operator_queue_depth"
APISERVER_REQUESTS: Final = "apiserver_request_total"

# No reconcile finished and the queue empty for this long: the operator is idle.
QUIET_SECONDS: Final = 5.0
# After a resync began, its reconciles are spread over half the period; then this margin.
RESYNC_MARGIN_SECONDS: Final = 5.0
POLL_SECONDS: Final = 1.0


def say(msg: str) -> None:
    print(f"[scale] {msg}", file=sys.stderr, flush=True)


class BenchError(RuntimeError):
    """A phase that did not finish (what timed out, and how far it got)."""


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class Options:
    services: tuple[int, ...]
    repeats: int
    nodes: int
    gpus_per_node: int
    resync_seconds: int
    workers: int | None
    operator_tree: Path
    report: Path | None
    timeout_s: float
    concurrency: int


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of numbers: {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be positive numbers: {text!r}")
    return sizes


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text}")
    return value


def parse_options(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m devenv.scale",
        description="Time N InferenceServices to Ready against N plain Deployments in the "
        "same local cluster of kwok fake GPU nodes, and count the operator's API requests "
        "during the roll-in and over one resync at steady state (docs/scale.md).",
    )
    parser.add_argument(
        "--services",
        type=_sizes,
        default=(200, 500),
        metavar="N,N",
        help="sizes to measure, a comma list (default 200,500)",
    )
    parser.add_argument(
        "--repeats",
        type=_positive,
        default=3,
        help="runs of each size; the summary gives the median (default 3)",
    )
    parser.add_argument("--nodes", type=_positive, default=200, help="fake GPU nodes (default 200)")
    parser.add_argument(
        "--gpus-per-node",
        type=_positive,
        default=16,
        help=f"{GPU_PRODUCT} GPUs on each fake node (default 16)",
    )
    parser.add_argument(
        "--resync-seconds",
        type=_positive,
        default=60,
        help="the operator's VLLM_OPERATOR_RESYNC_SECONDS (default 60)",
    )
    parser.add_argument(
        "--workers",
        type=_positive,
        default=None,
        help="the operator's VLLM_OPERATOR_WORKERS (default: its own default)",
    )
    parser.add_argument(
        "--operator-tree",
        type=Path,
        default=REPO,
        metavar="PATH",
        help="checkout whose operator and CRDs run (default: this one)",
    )
    parser.add_argument(
        "--report",
        type=Path,
        default=None,
        metavar="PATH",
        help="JSON report (default: scale-<time>.json in the cluster's logs)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        dest="timeout_s",
        metavar="SECONDS",
        help="longest wait of each phase (default 1800)",
    )
    parser.add_argument(
        "--concurrency", type=_positive, default=16, help="creates in flight at once (default 16)"
    )
    args = parser.parse_args(argv)
    opts = Options(**vars(args))
    need, have = max(opts.services), opts.nodes * opts.gpus_per_node
    if need > have:
        parser.error(f"{need} one-GPU services need {need} GPUs; the nodes have {have}")
    if not (opts.operator_tree / "operator" / "vllm_operator").is_dir():
        parser.error(f"{opts.operator_tree} has no operator/vllm_operator")
    return opts


# --------------------------------------------------------------------------- fake nodes


def nodes_document(nodes: int, gpus_per_node: int, *, pods: int = 110) -> dict[str, Any]:
    """A nodes file (devenv/cluster/nodes.yaml's shape): ``nodes`` GPU nodes of one product
    and one CPU node."""
    gpu = [
        {
            "name": f"gpu-l4-{i:04d}",
            "cpu": "256",
            "memory": "2Ti",
            "ephemeralStorage": "30Ti",
            "pods": pods,
            "gpu": {
                "product": GPU_PRODUCT,
                "count": gpus_per_node,
                "memoryMiB": GPU_MEMORY_MIB,
                "interconnect": "pcie",
                "topology": "PHB",
            },
        }
        for i in range(1, nodes + 1)
    ]
    cpu = {"name": "cpu-16", "cpu": "16", "memory": "64Gi", "pods": 110}
    return {"nodes": [*gpu, cpu]}


def write_nodes_file(path: Path, nodes: int, gpus_per_node: int, services: int) -> None:
    # Room for every service's pod on its node, whatever the scheduler's spread.
    pods = max(110, math.ceil(services / nodes) * 2)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(nodes_document(nodes, gpus_per_node, pods=pods)))


# --------------------------------------------------------------------------- counters

# A sample: its name and its labels, sorted.
Key = tuple[str, tuple[tuple[str, str], ...]]
Counters = dict[Key, float]


def parse_counters(text: str, names: Collection[str]) -> Counters:
    """The samples of the named metrics in a Prometheus text exposition.

    Only the lines of those samples are parsed (the apiserver's exposition is megabytes)."""
    prefixes = tuple(names)
    lines = [line for line in text.splitlines() if line.startswith(prefixes)]
    out: Counters = {}
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if sample.name in names:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                out[key] = out.get(key, 0.0) + float(sample.value)
    return out


def diff(after: Counters, before: Counters) -> Counters:
    """What each counter gained between two scrapes (those that gained nothing left out)."""
    out: Counters = {}
    for key, value in after.items():
        gained = value - before.get(key, 0.0)
        if gained:
            out[key] = gained
    return out


def summed(counters: Counters, name: str, by: Sequence[str], **match: str) -> dict[str, float]:
    """The samples of ``name`` whose labels match, summed by the labels ``by`` (joined)."""
    out: dict[str, float] = {}
    for (sample, labels), value in counters.items():
        if sample != name:
            continue
        values = dict(labels)
        if any(values.get(k) != v for k, v in match.items()):
            continue
        group = " ".join(values.get(k, "") for k in by)
        out[group] = out.get(group, 0.0) + value
    return dict(sorted(out.items()))


def total(counters: Counters, name: str, **match: str) -> float:
    return sum(summed(counters, name, (), **match).values())


# Answers to a write that say the write was wrong, not that it raced (404, 409).
_REJECTED: Final = frozenset({"400", "403", "422"})
_WRITES: Final = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE"})


def rejected_writes(apiserver: Counters) -> dict[str, float]:
    """The writes the apiserver refused as invalid or forbidden (every client), by verb,
    resource and code: a controller retrying what the apiserver will never take."""
    out: dict[str, float] = {}
    for (sample, labels), value in apiserver.items():
        values = dict(labels)
        if (
            sample == APISERVER_REQUESTS
            and values.get("verb") in _WRITES
            and values.get("code") in _REJECTED
        ):
            key = f"{values['verb']} {values.get('resource', '')} {values['code']}"
            out[key] = out.get(key, 0.0) + value
    return dict(sorted(out.items()))


def gauge(counters: Counters, name: str) -> float | None:
    values = [v for (sample, _), v in counters.items() if sample == name]
    return sum(values) if values else None


def window(
    before: Counters, after: Counters, seconds: float, apiserver: Counters | None = None
) -> dict[str, Any]:
    """The operator's requests and reconciles between two scrapes, and optionally the
    apiserver's LISTs (every client) by resource and scope over the same time."""
    gained = diff(after, before)
    out: dict[str, Any] = {
        "seconds": round(seconds, 2),
        "requests": summed(gained, REQUESTS, ("verb", "resource")),
        "reconciles": summed(gained, RECONCILES, ("result",), kind=KIND_INFERENCE_SERVICE),
    }
    if apiserver is not None:
        out["apiserver_lists"] = summed(
            apiserver, APISERVER_REQUESTS, ("resource", "scope"), verb="LIST"
        )
        out["rejected_writes"] = rejected_writes(apiserver)
    return out


def cpu_seconds(stat: str, ticks_per_second: int) -> float:
    """User and system CPU time from a /proc/<pid>/stat line (fields 14 and 15; the
    command name, field 2, is in parentheses and may hold spaces)."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks_per_second


def cpu_gained(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    return {k: round(v - before[k], 2) for k, v in after.items() if k in before}


# --------------------------------------------------------------------------- summary


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _per(counts: Mapping[str, float], n: float) -> dict[str, float]:
    return {k: v / n for k, v in counts.items()} if n else {}


def _mean_maps(maps: Sequence[Mapping[str, float]]) -> dict[str, float]:
    keys = sorted({k for m in maps for k in m})
    return {k: sum(m.get(k, 0.0) for m in maps) / len(maps) for k in keys} if maps else {}


def run_figures(run: Mapping[str, Any]) -> dict[str, Any]:
    """One operator run's per-service figures, from its counter windows."""
    n = run["services"]
    figures: dict[str, Any] = {}
    for phase in ("rollin", "steady"):
        w = run.get(phase)
        if not w:
            continue
        requests, reconciles = sum(w["requests"].values()), sum(w["reconciles"].values())
        figures[phase] = {
            "requests_per_service": requests / n,
            "reconciles_per_service": reconciles / n,
            "requests_per_reconcile": _ratio(requests, reconciles),
            "requests_by_kind_per_service": _per(w["requests"], n),
        }
    return figures


def summarise(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per size: the medians of the repeats, the ratio operator/raw of the medians, the
    ratio of each repeat, and the requests by verb and resource (mean of the repeats)."""
    sizes = sorted({r["services"] for r in runs})
    out = []
    for n in sizes:
        raw = [r for r in runs if r["services"] == n and r["kind"] == "raw"]
        ops = [r for r in runs if r["services"] == n and r["kind"] == "operator"]
        figures = [run_figures(r) for r in ops]
        children = [r for r in runs if r["services"] == n and r["kind"] == "children"]
        raw_s = _median(r["seconds"] for r in raw)
        op_s = _median(r["seconds"] for r in ops)
        children_s = _median(r["seconds"] for r in children)
        by_repeat = {r["repeat"]: r["seconds"] for r in raw}
        entry: dict[str, Any] = {
            "services": n,
            "raw_median_s": raw_s,
            "operator_median_s": op_s,
            "ratio": _ratio(op_s, raw_s),
            "ratios": [_ratio(r["seconds"], by_repeat.get(r["repeat"])) for r in ops],
            "raw_s": [r["seconds"] for r in raw],
            "operator_s": [r["seconds"] for r in ops],
            "children_median_s": children_s,
            "children_s": [r["seconds"] for r in children],
            # The objects alone against the raw Deployments, and the operator against
            # the objects alone: how much of the ratio is the operator's own.
            "children_ratio": _ratio(children_s, raw_s),
            "ratio_to_children": _ratio(op_s, children_s),
            # By phase: the raw and children roll-ins, and the operator's.
            "rejected_writes": {
                kind: _mean_maps([_rejected(r) for r in group])
                for kind, group in (("raw", raw), ("children", children), ("operator", ops))
                if group
            },
        }
        for phase in ("rollin", "steady"):
            per = [f[phase] for f in figures if phase in f]
            entry[phase] = {
                key: _median(p[key] for p in per)
                for key in (
                    "requests_per_service",
                    "reconciles_per_service",
                    "requests_per_reconcile",
                )
            } | {
                "requests_by_kind_per_service": _mean_maps(
                    [p["requests_by_kind_per_service"] for p in per]
                ),
                "runs": len(per),
            }
        for phase in ("rollin", "steady"):
            entry[phase]["cluster_lists"] = _mean_maps(
                [
                    {k: v for k, v in w.items() if k.endswith(" cluster")}
                    for w in (r[phase].get("apiserver_lists", {}) for r in ops if r.get(phase))
                ]
            )
        steady = [r["steady"] for r in ops if r.get("steady")]
        entry["steady"]["overlapped"] = sum(bool(s.get("overlapped")) for s in steady)
        out.append(entry)
    return out


def _rejected(run: Mapping[str, Any]) -> dict[str, float]:
    found: dict[str, float] = run.get("rejected_writes") or (run.get("rollin") or {}).get(
        "rejected_writes", {}
    )
    return found


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown, lines within 100 columns."""
    s = report["settings"]
    tree, machine = report["operator_tree"], report["machine"]
    dirty = " (dirty)" if tree.get("dirty") else ""
    workers = s["workers"] if s["workers"] is not None else "the operator's default"
    lines = [
        f"## Scale: InferenceServices vs raw Deployments ({report['date']})",
        "",
        f"- operator: `{tree['path']}` at {tree.get('commit', '?')[:12]}{dirty}",
        f"- machine: {machine['nproc']} CPUs, {machine['memory_gib']:.1f} GiB, load "
        f"{machine['loadavg_start']} at the start",
        f"- cluster: {s['nodes']} kwok fake nodes of {s['gpus_per_node']} x {GPU_PRODUCT} each "
        "+ 1 CPU node",
        f"- operator: resync {s['resync_seconds']} s, workers {workers}",
        f"- {s['repeats']} repeat(s) of each size, medians shown; {s['concurrency']} creates "
        "in flight",
        "",
        "Time to Ready from the first create (median of the repeats); the operator's API requests",
        "and reconciles over that time:",
        "",
        "| services | raw s | children s | operator s | ratio | op/children | req/rec | rec/svc |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in report["summary"]:
        r = e["rollin"]
        lines.append(
            f"| {e['services']} | {_f(e['raw_median_s'])} | {_f(e.get('children_median_s'))} | "
            f"{_f(e['operator_median_s'])} | {_f(e['ratio'], 2)} | "
            f"{_f(e.get('ratio_to_children'), 2)} | {_f(r['requests_per_reconcile'], 2)} | "
            f"{_f(r['reconciles_per_service'], 2)} |"
        )
    lines += [
        "",
        *textwrap.wrap(
            "children: the Service, PDB and Deployment the operator applied for one service, "
            "copied for each and applied directly (no InferenceService, status or events), "
            "timed as the raw Deployments; ratio: operator/raw; op/children: operator/children; "
            "req/rec and rec/svc: the operator's requests per reconcile and reconciles per "
            "service.",
            100,
        ),
    ]
    lines += [
        "",
        "Steady state, one resync (from an idle operator through the next resync until idle again;",
        "median of the repeats):",
        "",
        "| services | requests/service | requests/reconcile | reconciles/service |",
        "|---:|---:|---:|---:|",
    ]
    for e in report["summary"]:
        st = e["steady"]
        lines.append(
            f"| {e['services']} | {_f(st['requests_per_service'], 2)} | "
            f"{_f(st['requests_per_reconcile'], 2)} | {_f(st['reconciles_per_service'], 2)} |"
        )
    lines += [
        "",
        "Every run (roll-in, steady: requests per service; op CPU s: the operator process's CPU",
        "seconds during the roll-in):",
        "",
        "| services | repeat | raw s | children s | operator s | ratio | roll-in | "
        "steady | op CPU s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in report["summary"]:
        ops = [r for r in report["runs"] if r["services"] == e["services"]]
        raw = {r["repeat"]: r for r in ops if r["kind"] == "raw"}
        children = {r["repeat"]: r for r in ops if r["kind"] == "children"}
        for r in (r for r in ops if r["kind"] == "operator"):
            fig = run_figures(r)
            rollin, steady = fig.get("rollin", {}), fig.get("steady", {})
            raw_s = raw[r["repeat"]]["seconds"] if r["repeat"] in raw else None
            children_s = children[r["repeat"]]["seconds"] if r["repeat"] in children else None
            lines.append(
                f"| {e['services']} | {r['repeat']} | {_f(raw_s)} | {_f(children_s)} | "
                f"{_f(r['seconds'])} | "
                f"{_f(_ratio(r['seconds'], raw_s), 2)} | "
                f"{_f(rollin.get('requests_per_service'), 1)} | "
                f"{_f(steady.get('requests_per_service'), 2)} | "
                f"{_f((r.get('rollin') or {}).get('cpu_s', {}).get('operator'))} |"
            )
    lines += [
        "",
        "Requests per service by verb and resource (mean of the repeats):",
        "",
        "| services | request | roll-in | steady, one resync |",
        "|---:|---|---:|---:|",
    ]
    for e in report["summary"]:
        rollin = e["rollin"]["requests_by_kind_per_service"]
        steady = e["steady"]["requests_by_kind_per_service"]
        for kind in sorted(set(rollin) | set(steady)):
            lines.append(
                f"| {e['services']} | {kind} | {_f(rollin.get(kind), 2)} | "
                f"{_f(steady.get(kind), 3)} |"
            )
    lines += [
        "",
        "Cluster-scoped LISTs (the apiserver's count, every client; mean of the repeats):",
        "",
    ]
    for e in report["summary"]:
        parts = []
        for phase, name in (("rollin", "roll-in"), ("steady", "one resync")):
            found = e[phase]["cluster_lists"]
            listed = ", ".join(
                f"{k.removesuffix(' cluster')} {round(v, 2):g}" for k, v in found.items()
            )
            reconciles = (e[phase]["reconciles_per_service"] or 0) * e["services"]
            parts.append(f"{name} ({reconciles:g} reconciles): {listed or 'none'}")
        over = e["steady"]["overlapped"]
        if over:
            parts.append(f"{over} steady window(s) overlapped the next resync")
        lines += textwrap.wrap(
            f"- {e['services']} services: " + "; ".join(parts), 100, subsequent_indent="  "
        )
    refused = [
        (e["services"], phase, found)
        for e in report["summary"]
        for phase, found in (e.get("rejected_writes") or {}).items()
        if found
    ]
    if refused:
        lines += [
            "",
            "Writes the apiserver refused as invalid or forbidden in a roll-in (all clients, "
            "repeats' mean):",
            "",
        ]
        for n, phase, found in refused:
            listed = ", ".join(f"{k} {round(v, 1):g}" for k, v in found.items())
            lines += textwrap.wrap(
                f"- {n} services, {phase}: {listed}", 100, subsequent_indent="  "
            )
    if report.get("error"):
        lines += ["", *textwrap.wrap(f"**Stopped early**: {report['error']}", 100)]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- facts


def machine() -> dict[str, Any]:
    mem_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "memory_gib": mem_kib / 1024 / 1024,
        "loadavg_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def tree_facts(tree: Path) -> dict[str, Any]:
    def git(*args: str) -> str:
        proc = subprocess.run(
            ["git", "-C", str(tree), *args], capture_output=True, text=True, check=False
        )
        return proc.stdout.strip() if proc.returncode == 0 else ""

    return {
        "path": str(tree),
        "commit": git("rev-parse", "HEAD") or "unknown",
        "dirty": bool(git("status", "--porcelain")),
        "operator_dirty": bool(git("status", "--porcelain", "--", "operator", "crds")),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# --------------------------------------------------------------------------- the bench


def raw_deployment(name: str, namespace: str) -> dict[str, Any]:
    """A plain Deployment: one replica, one GPU, scheduled on the product the services ask
    for by the same required node affinity the operator renders."""
    labels = {RAW_LABEL: name}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": fake_nodes.LABEL_GPU_PRODUCT,
                                "operator": "In",
                                "values": [GPU_LABEL],
                            }
                        ]
                    }
                ]
            }
        }
    }
    gpu = {fake_nodes.GPU_RESOURCE: "1"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "affinity": affinity,
                    "containers": [
                        {
                            "name": "vllm",
                            "image": IMAGE,
                            "resources": {"requests": gpu, "limits": gpu},
                        }
                    ],
                },
            },
        },
    }


def inference_service(name: str, namespace: str) -> dict[str, Any]:
    """The service of e2e/test_operator.py's ``_isvc``, on the fake nodes' product."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND_INFERENCE_SERVICE,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"source": {"huggingFace": {"repo": MODEL}}},
            "gpu": {"count": 1, "products": [GPU_LABEL]},
            "warmup": {"enabled": False},
        },
    }


_SERVER_FIELDS: Final = ("uid", "resourceVersion", "creationTimestamp", "generation",
                         "managedFields", "ownerReferences")  # fmt: skip


def children_template(objects: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What the operator applied for one service, as a user would apply it by hand: the
    objects without what the apiserver and the controllers added (status, uid, the
    Deployment's revision, the Service's cluster IPs) and without the owner reference."""
    out = []
    for obj in objects:
        copy = json.loads(json.dumps(obj))
        copy.pop("status", None)
        meta = copy["metadata"]
        for key in _SERVER_FIELDS:
            meta.pop(key, None)
        annotations = meta.get("annotations") or {}
        annotations.pop("deployment.kubernetes.io/revision", None)
        if not annotations:
            meta.pop("annotations", None)
        if copy["kind"] == "Service":
            for key in ("clusterIP", "clusterIPs"):
                copy["spec"].pop(key, None)
        out.append(copy)
    order = [kind for _, kind in CHILD_KINDS]
    return sorted(out, key=lambda o: order.index(o["kind"]) if o["kind"] in order else 99)


def children_of(
    template: Sequence[Mapping[str, Any]], service: str, name: str, namespace: str
) -> list[dict[str, Any]]:
    """The template's objects for ``name`` in ``namespace``: every string value that was
    the service's name becomes ``name``, and the operator's label keys move under
    :data:`CHILDREN_LABEL_PREFIX`."""
    text = json.dumps(list(template))
    text = text.replace(json.dumps(service), json.dumps(name))
    text = text.replace(f'"{GROUP}/', f'"{CHILDREN_LABEL_PREFIX}')
    out: list[dict[str, Any]] = json.loads(text)
    for obj in out:
        obj["metadata"]["namespace"] = namespace
    return out


def _available(obj: Mapping[str, Any]) -> bool:
    return (obj.get("status") or {}).get("availableReplicas") == 1


def _ready(obj: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def _not_ready_reasons(items: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    reasons: Counter[str] = Counter()
    for obj in items:
        if _ready(obj):
            continue
        conds = {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}
        reasons[str(conds.get("Ready", {}).get("reason") or "no Ready condition")] += 1
    return dict(reasons)


class Bench:
    """The phases, against one cluster and one running operator."""

    def __init__(
        self,
        opts: Options,
        handle: ClusterHandle,
        kube: KubeClient,
        http: httpx.AsyncClient,
        operator: OperatorProcess,
        metrics_url: str,
    ) -> None:
        self.opts = opts
        self.handle = handle
        self.kube = kube
        self.http = http
        self.operator = operator
        self.metrics_url = metrics_url
        # What the operator applied for its first service (children_template), once an
        # operator run has rolled in: the children phase applies copies of it.
        self.template: list[dict[str, Any]] | None = None

    # ---------------------------------------------------------------- reads

    def _check_operator(self) -> None:
        if not self.operator.alive():
            raise BenchError(f"the operator exited:\n{self.operator.log_tail(40)}")

    async def scrape_operator(self) -> Counters:
        self._check_operator()
        response = await self.http.get(self.metrics_url, timeout=30)
        response.raise_for_status()
        return parse_counters(response.text, (REQUESTS, RECONCILES, QUEUE_DEPTH))

    def cpu(self) -> dict[str, float]:
        """CPU seconds the operator and the apiserver have used so far: on a shared machine
        steadier than their wall time."""
        pids = {"operator": self.operator.proc.pid if self.operator.proc else None}
        if self.handle.settings is not None:
            pidfile = processes.PidFile.read(self.handle.settings, "kube-apiserver")
            pids["apiserver"] = pidfile.pid if pidfile else None
        ticks = os.sysconf("SC_CLK_TCK")
        out = {}
        for name, pid in pids.items():
            try:
                out[name] = cpu_seconds(Path(f"/proc/{pid}/stat").read_text(), ticks)
            except (OSError, IndexError, ValueError):
                continue
        return out

    async def scrape_apiserver(self) -> Counters:
        proc = await asyncio.to_thread(self.handle.kubectl, "get", "--raw", "/metrics")
        return parse_counters(str(proc.stdout), (APISERVER_REQUESTS,))

    async def _retrying(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        for attempt in range(5):
            try:
                return await call()
            except ApiError as err:
                if not err.transient or attempt == 4:
                    raise BenchError(f"{what}: {err}") from err
                await asyncio.sleep(1 + attempt)
        raise AssertionError("unreachable")

    async def until(
        self, what: str, check: Callable[[], Awaitable[bool]], timeout_s: float
    ) -> float:
        """Polls ``check`` every second until it holds; the seconds it took."""
        started = time.monotonic()
        while not await check():
            if time.monotonic() - started > timeout_s:
                raise BenchError(f"timed out after {timeout_s:.0f} s waiting for {what}")
            await asyncio.sleep(POLL_SECONDS)
        return time.monotonic() - started

    # ---------------------------------------------------------------- namespaces

    async def new_namespace(self, name: str) -> None:
        manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        await self._retrying(f"creating namespace {name}", lambda: self.kube.apply(manifest))

        # Pods are refused until the namespace's default ServiceAccount exists; the
        # ReplicaSet controller would retry with back-off and bill that to the run.
        async def account() -> bool:
            return await self.kube.get("v1", "ServiceAccount", "default", name) is not None

        await self.until(f"the default ServiceAccount of {name}", account, 120)

    async def delete_namespace(self, name: str) -> float:
        await self._retrying(
            f"deleting namespace {name}", lambda: self.kube.delete("v1", "Namespace", name)
        )

        async def gone() -> bool:
            return await self.kube.get("v1", "Namespace", name) is None

        return await self.until(f"namespace {name} gone", gone, self.opts.timeout_s)

    async def create_all(self, manifests: Sequence[dict[str, Any]]) -> None:
        """Every manifest, by server-side apply, ``concurrency`` requests in flight."""
        gate = asyncio.Semaphore(self.opts.concurrency)

        async def one(manifest: dict[str, Any]) -> None:
            async with gate:
                name = f"{manifest['kind']} {manifest['metadata']['name']}"
                await self._retrying(f"creating {name}", lambda: self.kube.apply(manifest))

        await asyncio.gather(*(one(m) for m in manifests))

    async def roll_in(
        self,
        what: str,
        manifests: Sequence[dict[str, Any]],
        listing: tuple[str, str, str],
        ready: Callable[[Mapping[str, Any]], bool],
        *,
        expected: int | None = None,
    ) -> dict[str, float]:
        """Creates the objects and polls a LIST of their namespace every second until
        ``expected`` of the listed kind (every manifest, by default) are ready; the seconds
        from the first create to all created and all ready."""
        n = len(manifests) if expected is None else expected
        started = time.monotonic()
        await self.create_all(manifests)
        created = time.monotonic() - started
        deadline = started + self.opts.timeout_s
        while True:
            items = await self._retrying(f"listing {what}", lambda: self.kube.list(*listing))
            count = sum(1 for obj in items if ready(obj))
            now = time.monotonic()
            if count >= n:
                return {"seconds": round(now - started, 2), "created_s": round(created, 2)}
            if now > deadline:
                detail = ""
                if listing[1] == KIND_INFERENCE_SERVICE:
                    detail = f"; not Ready by reason: {_not_ready_reasons(items)}"
                raise BenchError(
                    f"timed out after {self.opts.timeout_s:.0f} s waiting for {n} {what}: "
                    f"{count} ready{detail}"
                )
            self._check_operator()
            await asyncio.sleep(max(0.0, POLL_SECONDS - (time.monotonic() - now)))

    # ---------------------------------------------------------------- the operator

    async def idle(self, timeout_s: float, *, quiet_s: float = QUIET_SECONDS) -> Counters:
        """Until the operator's queue is empty and no reconcile finished for ``quiet_s``:
        the scrape that showed it."""
        started = time.monotonic()
        last: float | None = None
        since = started
        while True:
            scrape = await self.scrape_operator()
            depth = gauge(scrape, QUEUE_DEPTH) or 0.0
            reconciles = total(scrape, RECONCILES)
            now = time.monotonic()
            if depth > 0 or reconciles != last:
                last, since = reconciles, now
            elif now - since >= quiet_s:
                return scrape
            if now - started > timeout_s:
                raise BenchError(
                    f"the operator was not idle within {timeout_s:.0f} s (queue depth {depth:g})"
                )
            await asyncio.sleep(POLL_SECONDS)

    async def steady(self) -> dict[str, Any]:
        """Counters over one resync: from an idle operator, through the next resync (its
        LIST and the reconciles it spreads over half the period), until idle again."""
        resync = float(self.opts.resync_seconds)
        before = await self.idle(self.opts.timeout_s)
        t0, cpu = time.monotonic(), self.cpu()
        api_before = await self.scrape_apiserver()
        reconciles = total(before, RECONCILES)
        while True:
            scrape = await self.scrape_operator()
            if (gauge(scrape, QUEUE_DEPTH) or 0) > 0 or total(scrape, RECONCILES) != reconciles:
                began = time.monotonic()
                break
            if time.monotonic() - t0 > resync * 1.5 + 30:
                raise BenchError(f"no resync began within {resync * 1.5 + 30:.0f} s")
            await asyncio.sleep(POLL_SECONDS / 2)
        await asyncio.sleep(max(0.0, began + resync / 2 + RESYNC_MARGIN_SECONDS - time.monotonic()))
        after = await self.idle(self.opts.timeout_s)
        t1, cpu = time.monotonic(), cpu_gained(self.cpu(), cpu)
        api_after = await self.scrape_apiserver()
        out = window(before, after, t1 - t0, diff(api_after, api_before))
        out["cpu_s"] = cpu
        out["resync_began_s"] = round(began - t0, 2)
        # Idle again only after the next resync began: the window holds part of that one.
        out["overlapped"] = t1 - began > resync - 2 * POLL_SECONDS
        return out

    # ---------------------------------------------------------------- the runs

    async def _children(self, ns: str, service: str) -> list[dict[str, Any]]:
        """The Service, PDB and Deployment the operator applied for ``service``."""
        found = []
        for api_version, kind in CHILD_KINDS:

            async def read(api_version: str = api_version, kind: str = kind) -> Any:
                return await self.kube.get(api_version, kind, service, ns)

            obj = await self._retrying(f"reading {kind} {ns}/{service}", read)
            if obj is not None:
                found.append(obj)
        return found

    async def run_raw(self, n: int, repeat: int) -> dict[str, Any]:
        ns = f"scale-raw-{n}-{repeat}"
        await self.new_namespace(ns)
        manifests = [raw_deployment(f"d-{i:05d}", ns) for i in range(n)]
        run = await self._plain_roll_in("raw", ns, manifests, n, repeat)
        say(f"{n} raw Deployments available in {run['seconds']:.1f} s (repeat {repeat})")
        run["deleted_s"] = round(await self.delete_namespace(ns), 2)
        return run

    async def run_children(self, n: int, repeat: int) -> dict[str, Any] | None:
        """N copies of what the operator applied for one service (its Service, PDB and
        Deployment, without the InferenceService, its status or its events), applied
        directly and timed as the raw Deployments are: the floor of the operator's time,
        set by the objects it must create. None before an operator run rolled in."""
        if not self.template:
            return None
        ns = f"scale-children-{n}-{repeat}"
        await self.new_namespace(ns)
        manifests = [
            obj
            for i in range(n)
            for obj in children_of(self.template, FIRST_SERVICE, f"c-{i:05d}", ns)
        ]
        run = await self._plain_roll_in("children", ns, manifests, n, repeat)
        say(
            f"{n} services' children (Service, PDB, Deployment) applied directly: "
            f"Deployments available in {run['seconds']:.1f} s (repeat {repeat})"
        )
        run["deleted_s"] = round(await self.delete_namespace(ns), 2)
        return run

    async def _plain_roll_in(
        self, kind: str, ns: str, manifests: Sequence[dict[str, Any]], n: int, repeat: int
    ) -> dict[str, Any]:
        """A roll-in without the operator: timed until every Deployment of ``ns`` is
        available, with the CPU and the apiserver's refused writes over that time."""
        api_before = await self.scrape_apiserver()
        load, cpu = os.getloadavg()[0], self.cpu()
        timing = await self.roll_in(
            "Deployments available", manifests, ("apps/v1", "Deployment", ns), _available,
            expected=n,
        )  # fmt: skip
        cpu = cpu_gained(self.cpu(), cpu)
        api_gained = diff(await self.scrape_apiserver(), api_before)
        return {
            "kind": kind,
            "services": n,
            "repeat": repeat,
            **timing,
            "cpu_s": cpu,
            "rejected_writes": rejected_writes(api_gained),
            "loadavg": round(load, 2),
        }

    async def run_operator(self, n: int, repeat: int) -> dict[str, Any]:
        ns = f"scale-op-{n}-{repeat}"
        await self.new_namespace(ns)
        await self.idle(self.opts.timeout_s)
        manifests = [inference_service(f"s-{i:05d}", ns) for i in range(n)]
        op_before, api_before = await self.scrape_operator(), await self.scrape_apiserver()
        load, cpu = os.getloadavg()[0], self.cpu()
        timing = await self.roll_in(
            "InferenceServices Ready", manifests, (API_VERSION, KIND_INFERENCE_SERVICE, ns), _ready
        )
        cpu = cpu_gained(self.cpu(), cpu)
        op_after, api_after = await self.scrape_operator(), await self.scrape_apiserver()
        rollin = window(op_before, op_after, timing["seconds"], diff(api_after, api_before))
        rollin["cpu_s"] = cpu
        # The bench's own polls are namespaced LISTs: only the cluster-scoped ones are the
        # operator's (or Kopf's, or another controller's).
        rollin["apiserver_lists"] = {
            k: v for k, v in rollin["apiserver_lists"].items() if k.endswith(" cluster")
        }
        say(
            f"{n} InferenceServices Ready in {timing['seconds']:.1f} s (repeat {repeat}); "
            "measuring one resync at steady state"
        )
        if self.template is None:
            self.template = children_template(await self._children(ns, FIRST_SERVICE))
        steady = await self.steady()
        say(
            f"steady state: {sum(steady['requests'].values()) / n:.2f} requests and "
            f"{sum(steady['reconciles'].values()) / n:.2f} reconciles per service per resync"
        )
        deleted = await self.delete_namespace(ns)
        # The operator drains the deletions' watch events before the next raw run.
        await self.idle(self.opts.timeout_s)
        return {
            "kind": "operator",
            "services": n,
            "repeat": repeat,
            **timing,
            "loadavg": round(load, 2),
            "deleted_s": round(deleted, 2),
            "rollin": rollin,
            "steady": steady,
        }


# --------------------------------------------------------------------------- main


def _report(
    opts: Options, facts: dict[str, Any], runs: list[dict[str, Any]], error: str | None
) -> dict[str, Any]:
    settings = {
        k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(opts).items()
    }
    settings |= {"gpu_product": GPU_PRODUCT, "model": MODEL, "image": IMAGE}
    return {**facts, "settings": settings, "summary": summarise(runs), "runs": runs, "error": error}


async def _kube(kubeconfig: Path, pool: int) -> KubeClient:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    # kubernetes_asyncio's default pool is 5 connections per CPU: 10 here, fewer than the
    # creates in flight.
    configuration.connection_pool_maxsize = pool
    return KubeClient(
        client.ApiClient(configuration=configuration), field_manager=FIELD_MANAGER, timeout=120
    )


async def _measure(
    opts: Options,
    handle: ClusterHandle,
    operator: OperatorProcess,
    metrics_url: str,
    runs: list[dict[str, Any]],
) -> None:
    kube = await _kube(handle.kubeconfig, opts.concurrency + 4)
    try:
        async with httpx.AsyncClient() as http:
            bench = Bench(opts, handle, kube, http, operator, metrics_url)

            async def answering() -> bool:
                try:
                    await bench.scrape_operator()
                except httpx.HTTPError:
                    return False
                return True

            await bench.until(f"the operator's metrics at {metrics_url}", answering, 60)
            for n in opts.services:
                for repeat in range(1, opts.repeats + 1):
                    runs.append(await bench.run_raw(n, repeat))
                    runs.append(await bench.run_operator(n, repeat))
                    children = await bench.run_children(n, repeat)
                    if children is not None:
                        runs.append(children)
    finally:
        await kube.close()


def wait_served(handle: ClusterHandle, crds: Path) -> None:
    """Until a LIST of every CRD's objects succeeds. Established is not enough: the
    apiserver answers 429 "storage is (re)initializing" for a moment after, and an
    operator started then found its first LIST of GPUNodes refused."""
    for path in sorted(crds.glob("*.yaml")):
        name = yaml.safe_load(path.read_text())["metadata"]["name"]

        def served(name: str = name) -> bool:
            proc = handle.kubectl("get", name, "-A", "-o", "name", check=False)
            return proc.returncode == 0

        processes.wait_until(f"LISTs of {name} served", served, 60)


def _loaded_from(operator: OperatorProcess) -> str:
    """Where the operator process imports its package from (the tree asked for?)."""
    proc = subprocess.run(
        [sys.executable, "-c", "import vllm_operator; print(vllm_operator.__file__)"],
        capture_output=True,
        text=True,
        env=operator.env(),
        cwd=operator.tree or REPO,
        check=True,
    )
    return proc.stdout.strip()


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_options(argv)
    # The cluster's settings come from the environment: no real node (nothing here runs a
    # container), and this run's nodes file.
    os.environ["VLLM_OP_REAL_NODE"] = "0"
    base = Settings.from_env()
    if (
        is_healthy(base)
        or any(processes.running(base, COMPONENTS).values())
        or any(real_node.running(base).values())
    ):
        print(
            f"error: a cluster runs already in {base.state_dir} (ports {base.etcd_port}, "
            f"{base.apiserver_port}, ...); the benchmark starts its own: stop that one "
            "(python -m devenv.cluster down) or point VLLM_OP_CLUSTER_DIR and the ports "
            "elsewhere",
            file=sys.stderr,
        )
        return 1
    nodes_file = base.logs_dir / "scale-nodes.yaml"
    write_nodes_file(nodes_file, opts.nodes, opts.gpus_per_node, max(opts.services))
    os.environ["VLLM_OP_CLUSTER_NODES"] = str(nodes_file)
    settings = Settings.from_env()

    stamp = datetime.datetime.now(datetime.UTC)
    report_path = opts.report or settings.logs_dir / f"scale-{stamp:%Y%m%d-%H%M%S}.json"
    facts: dict[str, Any] = {
        "date": stamp.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "operator_tree": tree_facts(opts.operator_tree),
        "pod_cidr": settings.pod_cidr,
    }
    runs: list[dict[str, Any]] = []
    error: str | None = None
    started = time.monotonic()
    operator: OperatorProcess | None = None
    try:
        handle = up(settings, owner="bench")
        crds = str(opts.operator_tree / "crds")
        handle.kubectl("apply", "--server-side", "--force-conflicts", "-f", crds)
        handle.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", crds)
        wait_served(handle, opts.operator_tree / "crds")
        port = free_port()
        env = {
            "VLLM_OPERATOR_RESYNC_SECONDS": str(opts.resync_seconds),
            "VLLM_OPERATOR_METRICS_PORT": str(port),
            "VLLM_OPERATOR_LOG_LEVEL": "info",
            "VLLM_OPERATOR_DEFAULT_IMAGE": IMAGE,
        }
        if opts.workers is not None:
            env["VLLM_OPERATOR_WORKERS"] = str(opts.workers)
        operator = OperatorProcess(
            handle, settings.logs_dir, name="operator-scale", env=env, tree=opts.operator_tree
        )
        facts["operator_tree"]["module"] = _loaded_from(operator)
        facts["operator_log"] = str(operator.log_path)
        mark = operator.log_mark()
        operator.start()
        operator.wait_started(mark)
        say(f"operator from {facts['operator_tree']['module']} started; log {operator.log_path}")
        asyncio.run(_measure(opts, handle, operator, f"http://127.0.0.1:{port}/metrics", runs))
    except KeyboardInterrupt:
        error = "interrupted"
    except Exception as exc:
        # Reported with what was measured so far; a traceback only for the unexpected.
        error = str(exc) if isinstance(exc, BenchError) else f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, BenchError | processes.ClusterError):
            traceback.print_exc()
        say(f"stopped: {error}")
    finally:
        if operator is not None:
            operator.stop()
        down(settings)
    facts["wall_s"] = round(time.monotonic() - started, 1)
    report = _report(opts, facts, runs, error)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(report))
    print(f"Report: {report_path}; wall time {facts['wall_s']:.0f} s")
    return 1 if error else 0


if __name__ == "__main__":
    sys.exit(main())
