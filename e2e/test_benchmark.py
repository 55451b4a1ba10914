"""InferenceBenchmark on the real node, with the operator as the chart's pod: the load Job is
a pod of the operator image that reaches its target through the Service's DNS name, the
target's two replicas are containers of the fault-server image (``slow``: 0.4 s to each
first token, see e2e/test_warmup.py), and while the Job runs no path may lower the
replicas, not even with the operator down. The benchmark against a real CPU vLLM (a
dataset, every request in the results ConfigMap) is in e2e/test_real_node.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from devenv.cluster import node
from devenv.cluster.cluster import ClusterHandle
from devenv.cluster.images import Images
from e2e.framework import benchmark, condition, fault_isvc, fetch, wait_for
from e2e.real_node_fixtures import ChartOperator, PodOperator
from vllm_operator.bench.neighbour import cpu_list
from vllm_operator.constants import GROUP, LABEL_SERVICE


def _target(name: str, replicas: int, image: str) -> dict[str, Any]:
    return fault_isvc(name, "slow", image, replicas=replicas, warmup={"enabled": False})


@pytest.fixture
def target_ns(chart_operator: ChartOperator, real_namespace: Callable[..., str]) -> str:
    return real_namespace()  # restricted, as every pod the operator renders passes it


def _phase(cluster: ClusterHandle, ns: str, name: str) -> str | None:
    obj = fetch(cluster, ns, "inferencebenchmark", name) or {}
    phase: str | None = obj.get("status", {}).get("phase")
    return phase


def _replicas(cluster: ClusterHandle, ns: str, kind: str, name: str) -> int:
    return int((fetch(cluster, ns, kind, name) or {}).get("spec", {}).get("replicas", -1))


def _chaos(cluster: ClusterHandle, ns: str, name: str, timeout: float = 240) -> dict[str, Any]:
    """The one chaos entry of benchmark ``name``, once it has Succeeded."""
    wait_for(
        lambda: _phase(cluster, ns, name) in ("Succeeded", "Failed"),
        "the benchmark to end",
        timeout=timeout,
    )
    status = (fetch(cluster, ns, "inferencebenchmark", name) or {})["status"]
    assert status["phase"] == "Succeeded", status
    (chaos,) = status["chaos"]
    return dict(chaos)


def _print_chaos(chaos: dict[str, Any]) -> None:
    """What a chaos entry measured, for the test's output (-rP)."""
    print(chaos["perturbation"], "|", chaos["verdict"])
    for name in ("baseline", "perturbed"):
        run = chaos[name]
        ttft = run["fromSend"]["ttft"]
        print(f"  {name}: TTFT p50 {ttft['p50']:.1f} p99 {ttft['p99']:.1f} ms, "
              f"{run['requests']} requests, errors {run.get('errored', 0)}, schedule lag p99 "
              f"{run.get('scheduleLagP99Milliseconds')} ms")  # fmt: skip


def _neighbour_burning(cluster: ClusterHandle, ns: str, name: str) -> bool:
    """Benchmark ``name``'s neighbour says it burns (its state in the results ConfigMap)."""
    data = (fetch(cluster, ns, "configmap", f"{name}-results") or {}).get("data", {})
    return '"burning": true' in data.get("chaos-neighbour-state", "")


def _wait_ready(cluster: ClusterHandle, ns: str, replicas: int) -> None:
    """InferenceService svc Ready, with ``replicas`` ready replicas."""
    wait_for(
        lambda: (
            (i := fetch(cluster, ns, "vis", "svc"))
            and i.get("status", {}).get("readyReplicas") == replicas
            and condition(i, "Ready").get("status") == "True"
        ),
        f"{replicas} ready replicas",
        timeout=180,
    )


def _start_burning(
    cluster: ClusterHandle, real_images: Images, ns: str, name: str, seconds: int
) -> None:
    """A CPU-bound target, and benchmark ``name`` against it whose chaos phase burns half
    the node's CPUs beside it; returns once the neighbour burns (after the level's
    ``seconds`` and the plain run's), which it does for ``seconds`` more."""
    target = fault_isvc("svc", "cpu", real_images.fault_server, replicas=1,
                   warmup={"enabled": False})  # fmt: skip
    cluster.apply(target, namespace=ns)
    _wait_ready(cluster, ns, 1)
    bench = benchmark(name, "svc", seconds)
    bench["spec"]["chaos"] = {"ratePerSecond": 2, "noisyNeighbour": {"cpuShare": 0.5}}
    cluster.apply(bench, namespace=ns)
    wait_for(lambda: _neighbour_burning(cluster, ns, name), "the neighbour to burn", timeout=240)


def _refused(cluster: ClusterHandle, *args: str) -> str:
    proc = cluster.kubectl(*args, check=False)
    assert proc.returncode != 0, f"{' '.join(args)} was allowed"
    return proc.stderr


def test_a_benchmark_runs_and_no_path_can_scale_its_target_down(
    cluster: ClusterHandle, real_images: Images, target_ns: str
) -> None:
    ns = target_ns
    cluster.apply(_target("svc", 2, real_images.fault_server), namespace=ns)
    _wait_ready(cluster, ns, 2)
    cluster.apply(benchmark("load", "svc", 30), namespace=ns)
    wait_for(lambda: _phase(cluster, ns, "load") == "Running", "the benchmark to run", timeout=90)
    job = fetch(cluster, ns, "job", "load-load")
    assert job is not None
    [load] = fetch(cluster, ns, "pods", "-l", "job-name=load-load")["items"]  # type: ignore[index]
    assert load["spec"]["nodeName"] == node.NODE_NAME
    assert load["spec"]["containers"][0]["image"] == real_images.operator
    assert job["metadata"]["labels"][f"{GROUP}/scale-down-lock"] == "true"
    assert job["metadata"]["labels"][f"{GROUP}/lock-target"] == "svc"
    wait_for(
        lambda: (
            condition(fetch(cluster, ns, "vis", "svc"), "ScaleDownBlocked").get("status") == "True"
        ),
        "ScaleDownBlocked=True",
    )
    blocked = condition(fetch(cluster, ns, "vis", "svc"), "ScaleDownBlocked")
    assert "load" in blocked["message"]

    # Every way down is refused while it runs ...
    err = _refused(cluster, "scale", "vis", "svc", "-n", ns, "--replicas=1")
    assert "while InferenceBenchmark load runs" in err, err
    _refused(cluster, "scale", "deployment", "svc", "-n", ns, "--replicas=1")
    _refused(
        cluster,
        "patch",
        "deployment",
        "svc",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec": {"replicas": 1}}',
    )
    _refused(
        cluster, "patch", "vis", "svc", "-n", ns, "--type=merge", "-p", '{"spec": {"replicas": 1}}'
    )
    cluster.apply(
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "svc"},
            "spec": {
                "scaleTargetRef": {
                    "apiVersion": f"{GROUP}/v1alpha1",
                    "kind": "InferenceService",
                    "name": "svc",
                },
                "minReplicas": 1,
                "maxReplicas": 1,
                "metrics": [
                    {
                        "type": "Resource",
                        "resource": {
                            "name": "cpu",
                            "target": {"type": "Utilization", "averageUtilization": 80},
                        },
                    }
                ],
            },
        },
        namespace=ns,
    )
    wait_for(
        lambda: any(
            e.get("reason") == "FailedRescale"
            for e in (
                fetch(
                    cluster,
                    ns,
                    "events",
                    "--field-selector",
                    "involvedObject.kind=HorizontalPodAutoscaler",
                )
                or {}
            ).get("items", [])
        ),
        "the HPA's scale-down to be refused",
        timeout=60,
    )
    cluster.kubectl("delete", "hpa", "svc", "-n", ns)
    assert _replicas(cluster, ns, "vis", "svc") == 2
    assert _replicas(cluster, ns, "deployment", "svc") == 2
    # ... while up is allowed.
    cluster.kubectl("scale", "vis", "svc", "-n", ns, "--replicas=3")
    wait_for(lambda: _replicas(cluster, ns, "deployment", "svc") == 3, "the scale-up")

    bench = wait_for(
        lambda: (
            (b := fetch(cluster, ns, "inferencebenchmark", "load"))
            and b.get("status", {}).get("phase") in ("Succeeded", "Failed")
            and b
        ),
        "the benchmark to end",
        timeout=180,
    )
    status = bench["status"]
    assert status["phase"] == "Succeeded", status
    head = status["headline"]
    assert head["requests"] > 0 and head["succeeded"] > 0
    assert head["fromScheduled"]["ttft"]["p99"] >= 400, "the fake server waits 0.4 s"
    assert condition(bench, "Ready")["status"] == "True"
    # The lock is the load Job: a pass between the Job's end and the benchmark's Succeeded
    # can clear ScaleDownBlocked before the benchmark shows as the last one; the
    # benchmark's own status change then reconciles the target again.
    isvc = wait_for(
        lambda: (
            (i := fetch(cluster, ns, "vis", "svc"))
            and condition(i, "ScaleDownBlocked").get("status") == "False"
            and "lastBenchmark" in i["status"]
            and i
        ),
        "ScaleDownBlocked=False and the benchmark in status.lastBenchmark",
    )
    assert isvc["status"]["lastBenchmark"]["name"] == "load"
    assert isvc["status"]["lastBenchmark"]["phase"] == "Succeeded"
    # Afterwards, down works again.
    cluster.kubectl("scale", "vis", "svc", "-n", ns, "--replicas=1")
    wait_for(lambda: _replicas(cluster, ns, "deployment", "svc") == 1, "the scale-down")


def test_the_lock_clears_when_the_operator_is_down_as_the_benchmark_ends(
    cluster: ClusterHandle, real_images: Images, chart_operator: ChartOperator, target_ns: str
) -> None:
    ns = target_ns
    operator: PodOperator = chart_operator.process
    cluster.apply(_target("svc", 2, real_images.fault_server), namespace=ns)
    wait_for(
        lambda: (
            (i := fetch(cluster, ns, "vis", "svc"))
            and condition(i, "Ready").get("status") == "True"
        ),
        "Ready",
        timeout=120,
    )
    cluster.apply(benchmark("short", "svc", 10), namespace=ns)
    wait_for(lambda: _phase(cluster, ns, "short") == "Running", "the benchmark to run", timeout=90)
    operator.stop()  # the Deployment scaled to 0: no operator pod at all
    try:
        _refused(cluster, "scale", "vis", "svc", "-n", ns, "--replicas=1")
        # The load Job ends: the lock it is goes with it, no operator needed.
        wait_for(
            lambda: (
                condition(fetch(cluster, ns, "job", "short-load"), "Complete").get("status")
                == "True"
            ),
            "the load Job to finish without the operator",
            timeout=180,
        )
        cluster.kubectl("scale", "vis", "svc", "-n", ns, "--replicas=1")
        assert _replicas(cluster, ns, "vis", "svc") == 1
    finally:
        operator.start()
    wait_for(
        lambda: _phase(cluster, ns, "short") in ("Succeeded", "Failed"),
        "the benchmark to be closed by the restarted operator",
        timeout=60,
    )


def _server_pods(cluster: ClusterHandle, ns: str) -> dict[str, dict[str, Any]]:
    found = fetch(cluster, ns, "pods", "-l", f"{LABEL_SERVICE}=svc") or {}
    return {p["metadata"]["name"]: p for p in found.get("items", [])}


def test_a_chaos_restart_evicts_a_server_mid_run_and_loses_no_request(
    cluster: ClusterHandle, real_images: Images, target_ns: str
) -> None:
    """The load Job evicts one of the two servers through the Eviction API (its Role
    allows only that, by name), the Deployment replaces it, and the status compares the
    run with the plain one before it."""
    ns = target_ns
    # Warmup on, as a user runs it: the replacement takes traffic only once warmed, and
    # the evicted pod drains (preStop, then the server's --shutdown-timeout), so the
    # restart costs no request.
    target = fault_isvc("svc", "slow", real_images.fault_server, replicas=2)
    cluster.apply(target, namespace=ns)
    _wait_ready(cluster, ns, 2)
    before = set(_server_pods(cluster, ns))
    assert len(before) == 2
    bench = benchmark("restart", "svc", 12)
    bench["spec"]["chaos"] = {"ratePerSecond": 2, "restart": {"afterSeconds": 3}}
    cluster.apply(bench, namespace=ns)
    wait_for(lambda: _phase(cluster, ns, "restart") == "Running", "the benchmark", timeout=90)
    role = fetch(cluster, ns, "role", "restart-load") or {}
    assert role["rules"][1]["resources"] == ["pods/eviction"]
    assert sorted(role["rules"][1]["resourceNames"]) == sorted(before)
    # The Job's account may evict those pods and nothing else about pods.
    account = f"--as=system:serviceaccount:{ns}:restart-load"
    for verb, what in (("delete", "pods"), ("list", "pods"), ("create", "pods/eviction")):
        plural, _, sub = what.partition("/")
        extra = [f"--subresource={sub}"] if sub else []
        proc = cluster.kubectl("auth", "can-i", verb, plural, *extra, "-n", ns, account,
                               check=False)  # fmt: skip
        assert proc.stdout.strip() == "no", (verb, what, proc.stdout)
    name = sorted(before)[0]
    proc = cluster.kubectl("auth", "can-i", "create", f"pods/{name}", "--subresource=eviction",
                           "-n", ns, account, check=False)  # fmt: skip
    assert proc.stdout.strip() == "yes", proc.stdout
    chaos = _chaos(cluster, ns, "restart")
    print("chaos restart:", chaos["perturbation"], "|", chaos["verdict"])
    print("perturbed errors by kind:", chaos["perturbed"].get("errorsByKind"))
    for name in ("baseline", "perturbed"):
        run = chaos[name]
        print(f"{name}: schedule lag p99 {run.get('scheduleLagP99Milliseconds')} ms, "
              f"client saturated {run.get('clientSaturated')}")  # fmt: skip
    words = chaos["perturbation"].split()
    assert words[:2] == ["restart:", "pod"] and words[3] == "evicted", chaos["perturbation"]
    evicted = words[2]
    assert evicted in before
    # The evicted pod goes (gracefully: it drains first), and the Deployment replaces it.
    wait_for(
        lambda: (
            evicted not in _server_pods(cluster, ns)
            and fetch(cluster, ns, "vis", "svc").get("status", {}).get("readyReplicas") == 2
        ),  # type: ignore[union-attr]
        "the evicted pod replaced",
        timeout=120,
    )
    assert chaos["baseline"]["requests"] > 0 and chaos["perturbed"]["requests"] > 0
    # The drain and the warmup gate keep every request whole through the restart.
    assert chaos["baseline"].get("errored", 0) == 0, chaos["baseline"].get("errorsByKind")
    assert chaos["perturbed"].get("errored", 0) == 0, chaos["perturbed"].get("errorsByKind")
    assert "errors 0 -> 0" in chaos["verdict"], chaos["verdict"]


def test_a_noisy_neighbour_burns_beside_a_target_pod_only_through_its_run(
    cluster: ClusterHandle, real_images: Images, target_ns: str
) -> None:
    """The neighbour Job lands on the node of the target's pod, burns every CPU of it
    (with a small CPU request, so it competes as a tenant's pod would) only through the
    perturbed run, and leaves when the load Job dismisses it."""
    ns = target_ns
    target = fault_isvc("svc", "cpu", real_images.fault_server, replicas=1,
                   warmup={"enabled": False})  # fmt: skip
    cluster.apply(target, namespace=ns)
    _wait_ready(cluster, ns, 1)
    (server,) = _server_pods(cluster, ns).values()
    node_name = server["spec"]["nodeName"]
    node_cpus = int(cluster.kubectl_json("get", "node", node_name)["status"]["capacity"]["cpu"])
    bench = benchmark("noisy", "svc", 15)
    bench["spec"]["arrival"] = {"process": "Constant", "ratePerSecond": 4}
    bench["spec"]["chaos"] = {
        "ratePerSecond": 4,
        "noisyNeighbour": {"cpuShare": 1, "cpuRequest": "100m"},
    }
    cluster.apply(bench, namespace=ns)
    wait_for(lambda: _phase(cluster, ns, "noisy") == "Running", "the benchmark", timeout=90)
    pods = wait_for(
        lambda: (fetch(cluster, ns, "pods", "-l", "job-name=noisy-neighbour") or {}).get("items"),
        "the neighbour's pod",
        timeout=60,
    )
    assert pods[0]["spec"]["nodeName"] == node_name
    chaos = _chaos(cluster, ns, "noisy", timeout=300)
    _print_chaos(chaos)
    cpus = f"{node_cpus} CPU{'s' if node_cpus != 1 else ''}"
    # Beside the unpinned server, on every CPU of the node (the kubelet pins nothing here).
    assert chaos["perturbation"] == (
        f"noisy neighbour: {cpus} burnt on node {node_name} beside pod "
        f"{server['metadata']['name']} (Burstable QoS), on all CPUs "
        f"({cpu_list(range(node_cpus))})"
    )
    # Dismissed at the end of the run, the neighbour exits and its Job completes.
    wait_for(
        lambda: (
            condition(fetch(cluster, ns, "job", "noisy-neighbour"), "Complete").get("status")
            == "True"
        ),
        "the neighbour's Job to complete",
        timeout=60,
    )
    board = (fetch(cluster, ns, "configmap", "noisy-results") or {}).get("data", {})
    assert '"burning": false' in board["chaos-neighbour-state"], board
    assert '"done": true' in board["chaos-neighbour-order"], board


def test_deleting_a_benchmark_mid_burn_with_the_operator_down_takes_the_neighbour_away(
    cluster: ClusterHandle, real_images: Images, chart_operator: ChartOperator, target_ns: str
) -> None:
    """The neighbour is the benchmark's: garbage collection removes its Job and pod (and so
    the burn) with the benchmark, no operator needed."""
    ns = target_ns
    operator: PodOperator = chart_operator.process
    # 15 s of burn: the operator's stop (its pod's SIGTERM) takes a few seconds of it.
    _start_burning(cluster, real_images, ns, "gone", 15)
    operator.stop()
    try:
        # Mid-burn, or the test would only show a finished Job's garbage collection.
        assert _neighbour_burning(cluster, ns, "gone"), "the burn ended before the deletion"
        cluster.kubectl("delete", "inferencebenchmark", "gone", "-n", ns, "--wait=false")
        wait_for(
            lambda: (
                not (fetch(cluster, ns, "pods", "-l", "job-name=gone-neighbour") or {}).get("items")
            ),
            "the neighbour's pod to go with its benchmark",
            timeout=120,
        )
        assert fetch(cluster, ns, "job", "gone-neighbour") is None
        assert fetch(cluster, ns, "job", "gone-load") is None
    finally:
        operator.start()


def test_network_faults_move_the_measured_latency_by_what_was_injected(
    cluster: ClusterHandle, real_images: Images, target_ns: str
) -> None:
    """The load Job's relay delays each way by 100 ms with 20 ms of jitter and holds 10 %
    of the reads back one retransmission (200 ms): the median TTFT grows by the round trip,
    the tail by a retransmission on top, across the real pod network to the server."""
    ns = target_ns
    cluster.apply(_target("svc", 1, real_images.fault_server), namespace=ns)
    _wait_ready(cluster, ns, 1)
    bench = benchmark("net", "svc", 20)
    bench["spec"]["chaos"] = {
        "ratePerSecond": 2,
        "network": {
            "delayMilliseconds": 100,
            "jitterMilliseconds": 20,
            "loss": 0.1,
            "retransmitMilliseconds": 200,
        },
    }
    cluster.apply(bench, namespace=ns)
    chaos = _chaos(cluster, ns, "net", timeout=300)
    _print_chaos(chaos)
    base, hurt = chaos["baseline"], chaos["perturbed"]
    assert chaos["perturbation"].startswith("network delay 100 ms"), chaos["perturbation"]
    assert base["requests"] >= 20 and hurt["requests"] >= 20
    assert base.get("errored", 0) == hurt.get("errored", 0) == 0
    # The fault server answers in 400 ms: the plain median is that plus the pod network.
    plain_p50 = base["fromSend"]["ttft"]["p50"]
    assert 395 <= plain_p50 < 500, plain_p50
    # Two delays on the median request (its jitter is symmetric about zero) ...
    faulty_p50 = hurt["fromSend"]["ttft"]["p50"]
    assert 170 <= faulty_p50 - plain_p50 <= 260, (plain_p50, faulty_p50)
    # ... and a retransmission in the tail: about one request in five loses one of the
    # reads before its first token (none in 20 or more: under 1 in 10,000).
    faulty_p99 = hurt["fromSend"]["ttft"]["p99"]
    assert faulty_p99 - faulty_p50 >= 150, (faulty_p50, faulty_p99)


def test_a_load_job_that_fails_mid_burn_takes_its_neighbour_with_it(
    cluster: ClusterHandle, real_images: Images, target_ns: str
) -> None:
    """The load Job's pod is killed while the neighbour burns: the Job fails (a benchmark is
    never retried), the benchmark says so, and the operator deletes the neighbour's Job."""
    ns = target_ns
    _start_burning(cluster, real_images, ns, "dies", 10)
    cluster.kubectl("delete", "pods", "-n", ns, "-l", "job-name=dies-load", "--grace-period=0",
                    "--force")  # fmt: skip
    wait_for(lambda: _phase(cluster, ns, "dies") == "Failed", "the benchmark to fail", timeout=120)
    wait_for(
        lambda: (
            fetch(cluster, ns, "job", "dies-neighbour") is None
            and not (fetch(cluster, ns, "pods", "-l", "job-name=dies-neighbour") or {}).get("items")
        ),
        "the neighbour's Job and pod to go",
        timeout=120,
    )
