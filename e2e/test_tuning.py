"""InferenceTuning on the real node: measured tuning runs, each trial a real pod.

Two kinds of target. The fault-server image (devenv/cluster/fault_server.py) spends the
CPU that its start arguments ask for on every request (``$VLLM_FAULT_LATENCY``), so a
trial's goodput follows its arguments as a real server's would, but the trials start in
seconds: the search order, the early stop, the budget, auto-apply, stale marking, the
scale-down lock, deletion and an operator stopped mid-trial are shown on it. The CPU vLLM
image shows the rest in e2e/test_tuning_vllm.py: that a measured run finds a better
configuration of a real server than a deliberately poor one, by more than the run-to-run
spread it measures itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from devenv.cluster.cluster import ClusterHandle
from devenv.cluster.images import Images
from e2e.framework import (
    condition,
    fault_isvc,
    fetch,
    flag_value,
    live_children,
    measuring,
    print_trials,
    service_args,
    service_ready,
    trial_of,
    tuning_children,
    tuning_ended,
    tuning_manifest,
    wait_for,
)
from e2e.real_node_fixtures import ChartOperator, PodOperator

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


def _scale_refused(cluster: ClusterHandle, ns: str, name: str, replicas: int) -> bool:
    proc = cluster.kubectl("scale", "vis", name, "-n", ns, f"--replicas={replicas}", check=False)
    return proc.returncode != 0


# --------------------------------------------------------------------------- fault server


def _measured_from(cluster: ClusterHandle, ns: str, name: str, *, applied: bool) -> Any:
    """The InferenceService's ``status.measuredFrom`` once its ``applied`` is ``applied``.
    The status is written after the Deployment, in the same reconcile a moment later: a
    test that saw the arguments change waits for it rather than reading it once (a CI run
    read the old one, 2026-12-07)."""
    seen: list[Any] = [None]

    def said() -> Any:
        status = (fetch(cluster, ns, "vis", name) or {}).get("status") or {}
        seen.append(status.get("measuredFrom"))
        return seen[-1] and bool(seen[-1].get("applied")) == applied and seen[-1]

    try:
        return wait_for(said, f"status.measuredFrom with applied {applied}", timeout=30)
    except AssertionError as err:
        raise AssertionError(f"{err}; status.measuredFrom: {seen[-1]}") from None


def test_a_beside_run_measures_by_prediction_stops_a_loser_early_and_applies_the_winner(
    cluster: ClusterHandle, real_images: Images, chart_operator: ChartOperator, ns: str
) -> None:
    cluster.apply(_cpu_target("svc", real_images.fault_server), namespace=ns)
    service_ready(cluster, ns, "svc")
    assert flag_value(service_args(cluster, ns, "svc"), "max-num-seqs") == "4"
    body = tuning_manifest(
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
    cluster.apply(body, namespace=ns)

    # While a trial is measured, its service is under the scale-down lock.
    trial = wait_for(lambda: measuring(cluster, ns, "run"), "a trial measuring", timeout=180)
    child = f"run-{trial['name']}"
    assert fetch(cluster, ns, "vis", child) is not None
    # The lock is the trial benchmark's load Job: held once the benchmark runs.
    wait_for(
        lambda: (
            ((fetch(cluster, ns, "inferencebenchmark", child) or {}).get("status") or {}).get(
                "phase"
            )
            == "Running"
        ),
        f"benchmark {child} running",
        timeout=60,
    )
    assert _scale_refused(cluster, ns, child, 0), f"{child} scaled down mid-trial"

    status = tuning_ended(cluster, ns, "run", timeout=420)
    print(f"beside run: {time.monotonic() - started:.0f} s")
    print_trials(status)
    assert status["phase"] == "Succeeded", status
    names = [t["name"] for t in status["trials"]]
    assert names == ["incumbent", "fast", "slow", "last"], names
    predicted = [trial_of(status, n)["predictedGoodputPerSecond"] for n in names[1:]]
    assert predicted == sorted(predicted, reverse=True), predicted
    incumbent, fast, slow = (trial_of(status, n) for n in ("incumbent", "fast", "slow"))
    # The budget (3 trials) left the candidate predicted worst unmeasured, and said why.
    last = trial_of(status, "last")
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
    assert live_children(cluster, ns, "run") == []
    # The measured trials are filed for later plans, in the operator's namespace.
    store = fetch(cluster, chart_operator.namespace, "configmap", "vllm-operator-measurements")
    records = [json.loads(v) for v in ((store or {}).get("data") or {}).values()]
    filed = {
        r["tuning"]["trial"]: r
        for r in records
        if r.get("tuning", {}).get("namespace") == ns and r["tuning"]["name"] == "run"
    }
    assert sorted(filed) == ["fast", "incumbent"], records
    assert filed["fast"]["goodputPerSecond"] == fast["measuredGoodputPerSecond"]
    assert filed["fast"]["arguments"]["max-num-seqs"] == "16"

    # autoApply: the target's arguments now come from the winner; its spec is unchanged.
    wait_for(
        lambda: flag_value(service_args(cluster, ns, "svc"), "max-num-seqs") == "16",
        "the winner rolled out",
        timeout=120,
    )
    isvc = fetch(cluster, ns, "vis", "svc") or {}
    assert isvc["spec"]["tuning"]["overrides"] == {"max-num-seqs": "4"}
    measured = _measured_from(cluster, ns, "svc", applied=True)
    assert measured["name"] == "run" and measured["trial"] == "fast", measured

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
        lambda: flag_value(service_args(cluster, ns, "svc"), "max-num-seqs") == "4",
        "the target back on its own arguments",
        timeout=120,
    )
    measured = _measured_from(cluster, ns, "svc", applied=False)
    assert "stale" in measured["reason"].lower(), measured


def test_bad_input_is_named_and_starts_nothing(
    cluster: ClusterHandle, real_images: Images, ns: str
) -> None:
    target = _cpu_target("svc", real_images.fault_server)
    del target["spec"]["workload"]
    cluster.apply(target, namespace=ns)
    service_ready(cluster, ns, "svc")

    # A budget of zero: the API server refuses it and names the field.
    zero = tuning_manifest("zero", "svc", budget={"maxTrials": 0})
    proc = cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(zero), check=False)
    assert proc.returncode != 0 and "budget.maxTrials" in proc.stderr, proc.stderr

    missing = tuning_manifest("missing", "nosuch")
    flag = tuning_manifest(
        "flag", "svc", candidates=[{"name": "bad", "overrides": {"max-num-sequences": "8"}}]
    )
    noload = tuning_manifest("noload", "svc")
    del noload["spec"]["measure"]["workload"]
    for body in (missing, flag, noload):
        cluster.apply(body, namespace=ns)
    expected = {
        "missing": ("TargetNotFound", "spec.targetRef.name"),
        "flag": ("InvalidOverride", "spec.candidates[0].overrides.max-num-sequences"),
        "noload": ("NoWorkload", "spec.measure.workload"),
    }
    for name, (reason, field) in expected.items():

        def refused(n: str = name, r: str = reason) -> dict[str, Any] | None:
            found = condition(fetch(cluster, ns, "inferencetuning", n), "Ready")
            return found if found.get("reason") == r else None

        ready = wait_for(refused, f"{name}: {reason}", timeout=60)
        assert ready["status"] == "False" and field in ready["message"], ready
        assert tuning_children(cluster, ns, name) == [], name
    assert flag_value(service_args(cluster, ns, "svc"), "max-num-seqs") == "4"


def _in_place(name: str, *candidates: tuple[str, str]) -> dict[str, Any]:
    return tuning_manifest(
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
    service_ready(cluster, ns, "svc")

    # In place: the target's own pod takes the candidate; the operator is stopped while
    # the candidate is measured, and the restarted one carries the run to its end.
    cluster.apply(_in_place("once", ("fast", "16")), namespace=ns)
    wait_for(
        lambda: (t := measuring(cluster, ns, "once")) and t["name"] == "fast",
        "the candidate measured in place",
        timeout=240,
    )
    assert flag_value(service_args(cluster, ns, "svc"), "max-num-seqs") == "16"
    operator.stop()
    try:
        # The lock holds without the operator: the target cannot scale down mid-trial.
        assert _scale_refused(cluster, ns, "svc", 0)
    finally:
        operator.start()
    status = tuning_ended(cluster, ns, "once", timeout=300)
    print_trials(status)
    assert status["phase"] == "Succeeded", status
    assert [t["state"] for t in status["trials"]] == ["Succeeded", "Succeeded"], status
    assert not status.get("inPlace"), status
    # Not applied (no autoApply, no reference): the target is back on its own arguments.
    wait_for(
        lambda: flag_value(service_args(cluster, ns, "svc"), "max-num-seqs") == "4",
        "the target back on its own arguments",
        timeout=120,
    )

    # Deleted mid-trial with the operator down: nothing of it is left once it is back.
    cluster.apply(_in_place("gone", ("fast", "16")), namespace=ns)
    wait_for(lambda: measuring(cluster, ns, "gone"), "a trial measuring", timeout=240)
    operator.stop()
    try:
        cluster.kubectl("delete", "inferencetuning", "gone", "-n", ns, "--wait=false")
    finally:
        operator.start()
    wait_for(lambda: fetch(cluster, ns, "inferencetuning", "gone") is None, "the tuning gone")
    wait_for(
        lambda: flag_value(service_args(cluster, ns, "svc"), "max-num-seqs") == "4",
        "the target back on its own arguments",
        timeout=120,
    )
    wait_for(lambda: tuning_children(cluster, ns, "gone") == [], "no trial object left", timeout=90)
    service_ready(cluster, ns, "svc")
    # No lock left behind: the target scales down.
    assert not _scale_refused(cluster, ns, "svc", 0)
