"""InferenceTuning on the real node: measured tuning runs, each trial a real pod.

Two kinds of target. The fault-server image (devenv/cluster/fault_server.py) spends the
CPU that its start arguments ask for on every request (``$VLLM_FAULT_LATENCY``), so a
trial's goodput follows its arguments as a real server's would, but the trials start in
seconds: the search order, the early stop, the budget, auto-apply, stale marking, the
scale-down lock, deletion and an operator stopped mid-trial are shown on it. The CPU vLLM
image then shows that a measured run finds a better configuration of a real server than a
deliberately poor one, by more than the run-to-run spread it measures itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.cluster.cluster import ClusterHandle
from devenv.cluster.images import Images
from e2e.framework import GROUP, condition, fault_isvc, fetch, wait_for
from e2e.real_node_fixtures import ChartOperator, PodOperator

TUNING_LABEL = f"{GROUP}/tuning"

# The fault server's latency by the trial's --max-num-seqs (devenv/cluster/fault_server.py):
# each request in flight adds to a new one's first token, 80 ms for the incumbent (4),
# 5 ms for "fast" (16), so "fast" meets the TTFT target at several times the incumbent's
# rate; "slow" (2) takes half a second to any first token and meets it at no rate.
FAULT_LATENCY = {
    "max-num-seqs=16": {
        "ttftSeconds": 0.02, "ttftSecondsPerRequestInFlight": 0.005, "tokenSeconds": 0.005
    },
    "max-num-seqs=2": {"ttftSeconds": 0.5, "tokenSeconds": 0.01},
    "default": {"ttftSeconds": 0.03, "ttftSecondsPerRequestInFlight": 0.08, "tokenSeconds": 0.01},
}  # fmt: skip


@pytest.fixture
def ns(chart_operator: ChartOperator, real_namespace: Callable[..., str]) -> str:
    return real_namespace()


def _cpu_target(name: str, image: str, **spec: Any) -> dict[str, Any]:
    """A fault-server InferenceService whose latency FAULT_LATENCY sets by its arguments."""
    body = fault_isvc(name, "ok", image, warmup={"enabled": False}, **spec)
    body["spec"]["podTemplate"]["env"].append(
        {"name": "VLLM_FAULT_LATENCY", "value": json.dumps(FAULT_LATENCY)}
    )
    body["spec"]["tuning"] = {"overrides": {"max-num-seqs": "4"}}
    return body


def _tuning(name: str, target: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "InferenceTuning",
        "metadata": {"name": name},
        "spec": {
            "targetRef": {"name": target},
            "measure": {
                "workload": {
                    "promptTokens": {"type": "Fixed", "value": 16},
                    "outputTokens": {"type": "Fixed", "value": 4},
                },
                "slo": {"ttftP99Milliseconds": 400},
                "search": {"minRatePerSecond": 2, "maxRatePerSecond": 40, "maxProbes": 4},
                "durationSeconds": 4,
                "endpoint": {"api": "Completions", "stream": True},
                "seed": 1,
            },
        },
    }
    body["spec"].update(spec)
    return body


def _ready(cluster: ClusterHandle, ns: str, name: str, timeout: float = 180) -> None:
    wait_for(
        lambda: condition(fetch(cluster, ns, "vis", name), "Ready").get("status") == "True",
        f"{name} Ready",
        timeout=timeout,
    )


def _status(cluster: ClusterHandle, ns: str, name: str) -> dict[str, Any]:
    return dict((fetch(cluster, ns, "inferencetuning", name) or {}).get("status") or {})


def _ended(cluster: ClusterHandle, ns: str, name: str, timeout: float) -> dict[str, Any]:
    wait_for(
        lambda: _status(cluster, ns, name).get("phase") in ("Succeeded", "Failed"),
        f"tuning {name} to end",
        timeout=timeout,
    )
    return _status(cluster, ns, name)


def _trial(status: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [t for t in status.get("trials", []) if t["name"] == name]
    return dict(found)


def _measuring(cluster: ClusterHandle, ns: str, name: str) -> dict[str, Any] | None:
    for t in _status(cluster, ns, name).get("trials", []):
        if t.get("state") == "Measuring":
            return dict(t)
    return None


def _args(cluster: ClusterHandle, ns: str, service: str) -> list[str]:
    found = fetch(cluster, ns, "deployments", "-l", f"{GROUP}/inference-service={service}") or {}
    items = found.get("items", [])
    assert len(items) == 1, [d["metadata"]["name"] for d in items]
    return list(items[0]["spec"]["template"]["spec"]["containers"][0]["args"])


def _flag(args: list[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == f"--{flag}" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(f"--{flag}="):
            return a.split("=", 1)[1]
    return None


def _children(cluster: ClusterHandle, ns: str, tuning: str) -> list[str]:
    """Everything left in ``ns`` that a tuning made: trial services, benchmarks, their
    Deployments and Jobs."""
    left = []
    for kind in ("vis", "inferencebenchmarks", "deployments", "jobs"):
        found = fetch(cluster, ns, kind, "-l", f"{TUNING_LABEL}={tuning}") or {}
        left += [f"{kind}/{o['metadata']['name']}" for o in found.get("items", [])]
    for kind in ("inferencebenchmarks", "jobs"):
        found = fetch(cluster, ns, kind) or {}
        left += [
            f"{kind}/{o['metadata']['name']}"
            for o in found.get("items", [])
            if o["metadata"]["name"].startswith(f"{tuning}-")
        ]
    return sorted(set(left))


def _print_trials(status: dict[str, Any]) -> None:
    for t in status.get("trials", []):
        print(
            f"  {t['name']:16} {t.get('state', ''):12} predicted "
            f"{t.get('predictedGoodputPerSecond')} measured {t.get('measuredGoodputPerSecond')} "
            f"req/s; TTFT p99 {(t.get('ttft') or {}).get('p99')} ms; {t.get('reason', '')}"
        )
    print("  winner:", status.get("winner"), "spread:", status.get("spread"))


def _scale_refused(cluster: ClusterHandle, ns: str, name: str, replicas: int) -> bool:
    proc = cluster.kubectl("scale", "vis", name, "-n", ns, f"--replicas={replicas}", check=False)
    return proc.returncode != 0


# --------------------------------------------------------------------------- fault server


def test_a_beside_run_measures_by_prediction_stops_a_loser_early_and_applies_the_winner(
    cluster: ClusterHandle, real_images: Images, ns: str
) -> None:
    cluster.apply(_cpu_target("svc", real_images.fault_server), namespace=ns)
    _ready(cluster, ns, "svc")
    assert _flag(_args(cluster, ns, "svc"), "max-num-seqs") == "4"
    tuning = _tuning(
        "run",
        "svc",
        strategy="Beside",
        autoApply=True,
        includeDefaults=False,
        remeasureIncumbent=False,
        budget={"maxTrials": 3},
        # Given in no order: the run measures them by the tuner's prediction (more
        # sequences in flight, more goodput predicted), and the budget of three trials
        # leaves the one predicted worst unmeasured.
        candidates=[
            {"name": "slow", "overrides": {"max-num-seqs": "2"}},
            {"name": "last", "overrides": {"max-num-seqs": "1"}},
            {"name": "fast", "overrides": {"max-num-seqs": "16"}},
        ],
    )
    started = time.monotonic()
    cluster.apply(tuning, namespace=ns)

    # While a trial is measured, its service is under the scale-down lock.
    trial = wait_for(lambda: _measuring(cluster, ns, "run"), "a trial measuring", timeout=180)
    child = f"run-{trial['name']}"
    assert fetch(cluster, ns, "vis", child) is not None
    assert _scale_refused(cluster, ns, child, 0), f"{child} scaled down mid-trial"

    status = _ended(cluster, ns, "run", timeout=420)
    print(f"beside run: {time.monotonic() - started:.0f} s")
    _print_trials(status)
    assert status["phase"] == "Succeeded", status
    names = [t["name"] for t in status["trials"]]
    assert names == ["incumbent", "fast", "slow", "last"], names
    predicted = [_trial(status, n)["predictedGoodputPerSecond"] for n in names[1:]]
    assert predicted == sorted(predicted, reverse=True), predicted
    incumbent, fast, slow = (_trial(status, n) for n in ("incumbent", "fast", "slow"))
    # The budget (3 trials) left the candidate predicted worst unmeasured, and said why.
    last = _trial(status, "last")
    assert last["state"] == "Skipped" and "budget" in last["reason"].lower(), last
    # The slow candidate missed the SLO at a load the incumbent met: stopped there.
    assert slow["state"] == "StoppedEarly", slow
    assert "incumbent" in slow["reason"], slow
    # The fast one won, by far more than the incumbent's own figure.
    assert fast["state"] == "Succeeded", fast
    assert fast["measuredGoodputPerSecond"] > 1.5 * incumbent["measuredGoodputPerSecond"]
    for t in (incumbent, fast):
        assert t["ttft"]["p99"] is not None and t["ttft"]["p50"] <= t["ttft"]["p99"]
        assert t["sloAttainment"] is not None and t["benchmark"]
        assert "--max-num-seqs" in t["arguments"]
    winner = status["winner"]
    assert winner["trial"] == "fast" and winner["overrides"] == {"max-num-seqs": "16"}
    assert winner["marginOverIncumbent"] > 0.5, winner
    # Nothing of the trials is left; the target was never touched by them.
    assert _children(cluster, ns, "run") == []

    # autoApply: the target's arguments now come from the winner; its spec is unchanged.
    wait_for(
        lambda: _flag(_args(cluster, ns, "svc"), "max-num-seqs") == "16",
        "the winner rolled out",
        timeout=120,
    )
    isvc = fetch(cluster, ns, "vis", "svc") or {}
    assert isvc["spec"]["tuning"]["overrides"] == {"max-num-seqs": "4"}
    measured = isvc["status"]["measuredFrom"]
    assert measured["name"] == "run" and measured["trial"] == "fast" and measured["applied"]

    # The workload the result was measured for changes: the result is stale, and the
    # target goes back to its own arguments.
    cluster.kubectl(
        "patch", "vis", "svc", "-n", ns, "--type=merge",
        "-p", json.dumps({"spec": {"workload": {"peakConcurrency": 9}}}),
    )  # fmt: skip
    stale = wait_for(
        lambda: (
            (c := condition(fetch(cluster, ns, "inferencetuning", "run"), "Stale"))
            and c.get("status") == "True"
            and c
        ),
        "the result marked stale",
        timeout=60,
    )
    assert stale["reason"] == "WorkloadChanged", stale
    wait_for(
        lambda: _flag(_args(cluster, ns, "svc"), "max-num-seqs") == "4",
        "the target back on its own arguments",
        timeout=120,
    )
    measured = (fetch(cluster, ns, "vis", "svc") or {})["status"]["measuredFrom"]
    assert not measured["applied"] and "stale" in measured["reason"].lower(), measured


def test_bad_input_is_named_and_starts_nothing(
    cluster: ClusterHandle, real_images: Images, ns: str
) -> None:
    target = _cpu_target("svc", real_images.fault_server)
    del target["spec"]["workload"]
    cluster.apply(target, namespace=ns)
    _ready(cluster, ns, "svc")

    # A budget of zero: the API server refuses it and names the field.
    zero = _tuning("zero", "svc", budget={"maxTrials": 0})
    proc = cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(zero), check=False)
    assert proc.returncode != 0 and "budget.maxTrials" in proc.stderr, proc.stderr

    missing = _tuning("missing", "nosuch")
    flag = _tuning(
        "flag", "svc", candidates=[{"name": "bad", "overrides": {"max-num-sequences": "8"}}]
    )
    noload = _tuning("noload", "svc")
    del noload["spec"]["measure"]["workload"]
    for body in (missing, flag, noload):
        cluster.apply(body, namespace=ns)
    expected = {
        "missing": ("TargetNotFound", "spec.targetRef.name"),
        "flag": ("InvalidOverride", "spec.candidates[0].overrides.max-num-sequences"),
        "noload": ("NoWorkload", "spec.measure.workload"),
    }
    for name, (reason, field) in expected.items():
        ready = wait_for(
            lambda n=name, r=reason: (
                (c := condition(fetch(cluster, ns, "inferencetuning", n), "Ready"))
                and c.get("reason") == r
                and c
            ),
            f"{name}: {reason}",
            timeout=60,
        )
        assert ready["status"] == "False" and field in ready["message"], ready
        assert _children(cluster, ns, name) == [], name
    assert _flag(_args(cluster, ns, "svc"), "max-num-seqs") == "4"


def _in_place(name: str, *candidates: tuple[str, str]) -> dict[str, Any]:
    return _tuning(
        name,
        "svc",
        strategy="InPlace",
        includeDefaults=False,
        remeasureIncumbent=False,
        candidates=[{"name": n, "overrides": {"max-num-seqs": v}} for n, v in candidates],
    )


def test_an_in_place_run_survives_its_operator_and_a_deletion_mid_trial_leaves_nothing(
    cluster: ClusterHandle, real_images: Images, chart_operator: ChartOperator, ns: str
) -> None:
    operator: PodOperator = chart_operator.process
    cluster.apply(_cpu_target("svc", real_images.fault_server, replicas=1), namespace=ns)
    _ready(cluster, ns, "svc")

    # In place: the target's own pod takes the candidate; the operator is stopped while
    # the candidate is measured, and the restarted one carries the run to its end.
    cluster.apply(_in_place("once", ("fast", "16")), namespace=ns)
    wait_for(
        lambda: (t := _measuring(cluster, ns, "once")) and t["name"] == "fast",
        "the candidate measured in place",
        timeout=240,
    )
    assert _flag(_args(cluster, ns, "svc"), "max-num-seqs") == "16"
    operator.stop()
    try:
        # The lock holds without the operator: the target cannot scale down mid-trial.
        assert _scale_refused(cluster, ns, "svc", 0)
    finally:
        operator.start()
    status = _ended(cluster, ns, "once", timeout=300)
    _print_trials(status)
    assert status["phase"] == "Succeeded", status
    assert [t["state"] for t in status["trials"]] == ["Succeeded", "Succeeded"], status
    assert not status.get("inPlace"), status
    # Not applied (no autoApply, no reference): the target is back on its own arguments.
    wait_for(
        lambda: _flag(_args(cluster, ns, "svc"), "max-num-seqs") == "4",
        "the target back on its own arguments",
        timeout=120,
    )

    # Deleted mid-trial with the operator down: nothing of it is left once it is back.
    cluster.apply(_in_place("gone", ("fast", "16")), namespace=ns)
    wait_for(lambda: _measuring(cluster, ns, "gone"), "a trial measuring", timeout=240)
    operator.stop()
    try:
        cluster.kubectl("delete", "inferencetuning", "gone", "-n", ns, "--wait=false")
    finally:
        operator.start()
    wait_for(lambda: fetch(cluster, ns, "inferencetuning", "gone") is None, "the tuning gone")
    wait_for(
        lambda: _flag(_args(cluster, ns, "svc"), "max-num-seqs") == "4",
        "the target back on its own arguments",
        timeout=120,
    )
    wait_for(lambda: _children(cluster, ns, "gone") == [], "no trial object left", timeout=90)
    _ready(cluster, ns, "svc")
    # No lock left behind: the target scales down.
    assert not _scale_refused(cluster, ns, "svc", 0)


# --------------------------------------------------------------------------- CPU vLLM

SAMPLE = Path(__file__).parents[1] / "examples" / "dev-sample.yaml"


def test_a_measured_run_on_the_cpu_vllm_beats_a_poor_incumbent_by_more_than_its_spread(
    cluster: ClusterHandle, ns: str
) -> None:
    """The sample's model on the CPU vLLM image with one sequence at a time (a poor
    incumbent: every request waits for the one before to finish decoding), tuned in place
    over three batch sizes; the incumbent is measured again at the end, and the winner
    must beat it by more than the two incumbent runs differ."""
    target: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    target["metadata"]["name"] = "svc"
    target["spec"]["tuning"] = {"overrides": {"max-num-seqs": "1"}}
    cluster.apply(target, namespace=ns)
    _ready(cluster, ns, "svc", timeout=480)
    tuning = _tuning(
        "cpu",
        "svc",
        strategy="InPlace",
        includeDefaults=False,
        remeasureIncumbent=True,
        candidates=[
            {"name": "seqs-2", "overrides": {"max-num-seqs": "2"}},
            {"name": "seqs-8", "overrides": {"max-num-seqs": "8"}},
            {"name": "seqs-32", "overrides": {"max-num-seqs": "32"}},
        ],
    )
    tuning["spec"]["measure"].update(
        workload={
            "promptTokens": {"type": "Uniform", "min": 16, "max": 128},
            "outputTokens": {"type": "Fixed", "value": 32},
        },
        slo={"ttftP99Milliseconds": 300},
        search={
            "minRatePerSecond": 2,
            "maxRatePerSecond": 64,
            "maxProbes": 5,
            "targetAttainment": 0.95,
        },
        durationSeconds=5,
    )
    started = time.monotonic()
    cluster.apply(tuning, namespace=ns)
    status = _ended(cluster, ns, "cpu", timeout=900)
    took = time.monotonic() - started
    print(f"in-place run on the CPU vLLM: {took:.0f} s")
    _print_trials(status)
    assert status["phase"] == "Succeeded", status
    names = [t["name"] for t in status["trials"]]
    assert names[0] == "incumbent" and names[-1] == "incumbent-again", names
    first, again = _trial(status, "incumbent"), _trial(status, "incumbent-again")
    for t in status["trials"]:
        assert t["state"] in ("Succeeded", "StoppedEarly"), t
        assert _flag(t["arguments"], "max-num-seqs") == t["overrides"].get("max-num-seqs", "1")
    winner = status["winner"]
    assert winner["trial"] not in ("incumbent", "incumbent-again"), winner
    won = _trial(status, winner["trial"])
    spread = abs(first["measuredGoodputPerSecond"] - again["measuredGoodputPerSecond"]) / (
        (first["measuredGoodputPerSecond"] + again["measuredGoodputPerSecond"]) / 2
    )
    assert status["spread"] == pytest.approx(spread, rel=0.01), status
    margin = won["measuredGoodputPerSecond"] / first["measuredGoodputPerSecond"] - 1
    print(f"winner {winner['trial']}: margin {margin:.0%} over the incumbent, spread {spread:.0%}")
    assert margin > spread and winner["distinguishable"], (margin, spread)
    # Not applied: the target is back on its own arguments, and nothing of the run is left.
    wait_for(
        lambda: _flag(_args(cluster, ns, "svc"), "max-num-seqs") == "1",
        "the target back on its own arguments",
        timeout=240,
    )
    assert _children(cluster, ns, "cpu") == []
