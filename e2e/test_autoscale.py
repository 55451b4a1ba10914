"""Autoscaling on the real node, with the operator as the chart's pod reading the real
vLLM containers' ``/metrics``.

Load from the load generator raises vLLM's own signal and the replicas go up to the
limit, the new pod taking traffic only once warmed up; a benchmark (its load Job a pod on
the node) holds the scale-down that the signal asks for; once the benchmark is deleted,
the replicas come down, the least loaded pod first (the older one here, which the
ReplicaSet would otherwise keep), and the load generator counts no failed request. The
test prints the timeline of replicas and signal. The two replicas take the node's 2 cores,
one each; the operator and the load Job ask for none (``chart_operator``). HPA mode is in
e2e/test_operator.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from devenv.cluster import node
from devenv.cluster.cluster import ClusterHandle
from devenv.cluster.images import Images
from e2e.framework import benchmark, condition, fetch, wait_for
from e2e.real_node_fixtures import ChartOperator
from vllm_operator.constants import LABEL_SERVICE, LABEL_WARMUP_FOR
from vllm_operator.reconcile.jobs import job_state

SAMPLE = Path(__file__).parents[1] / "examples" / "dev-sample.yaml"


def _isvc(name: str, **spec: Any) -> dict[str, Any]:
    """The dev sample (tiny-llama on the real node's CPU vLLM), renamed, with ``spec``."""
    body: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    body["metadata"] = {"name": name}
    body["spec"].update(spec)
    return body


def _pods(cluster: ClusterHandle, ns: str, name: str) -> list[dict[str, Any]]:
    found = fetch(cluster, ns, "pods", "-l", f"{LABEL_SERVICE}={name}")
    return [
        p
        for p in (found or {}).get("items", [])
        if not p["metadata"].get("deletionTimestamp")
        and LABEL_WARMUP_FOR not in p["metadata"]["labels"]
    ]


class Load:
    """``vllm-operator bench`` against one pod, closed loop, as a child process."""

    def __init__(
        self, url: str, out: Path, *, concurrency: int, seconds: int, tokens: int, stream: bool
    ):
        self.out = out
        self._output: str | None = None
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "vllm_operator.cli", "bench",
                "--endpoint", url, "--api", "completions",
                "--arrival", "closed", "--concurrency", str(concurrency),
                "--duration", str(seconds),
                "--prompt-tokens", "32", "--output-tokens", str(tokens),
                "--request-timeout", "120",
                "--output-dir", str(out), "--no-html", "--no-progress", "--seed", "7",
                *([] if stream else ["--no-stream"]),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip

    def check_running(self) -> bool:
        """True while the load runs; a load that ended early fails the test with its output
        (a wait for what the load causes would otherwise time out without saying why)."""
        if self.proc.poll() is None:
            return True
        raise AssertionError(f"the load ended before its time: {self.state()}")

    def state(self) -> str:
        """The load's exit status and the end of its output, or that it still runs."""
        if self.proc.poll() is None:
            return "the load still runs"
        if self._output is None:  # the pipe can be read once
            self._output, _ = self.proc.communicate()
        return f"the load exited {self.proc.returncode}: {self._output[-2000:]}"

    def result(self, timeout: float) -> dict[str, Any]:
        """Requests sent and failed (errors by kind) once the run is over."""
        output, _ = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, output[-3000:]
        status = json.loads((self.out / "status.json").read_text())
        level = status["levels"][0]
        return {
            "requests": level["requests"],
            "failed": level.get("failed", 0),
            "errors": level.get("errorsByKind", {}),
        }


class Timeline:
    """Replicas and signal every second, from the InferenceService's status."""

    def __init__(self, cluster: ClusterHandle, ns: str, name: str) -> None:
        self.rows: list[tuple[float, int, int, str, str]] = []
        self._stop = threading.Event()
        self._start = time.monotonic()
        self._args = (cluster, ns, name)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        cluster, ns, name = self._args
        while not self._stop.is_set():
            obj = fetch(cluster, ns, "vis", name) or {}
            auto = obj.get("status", {}).get("autoscaling") or {}
            self.rows.append(
                (
                    time.monotonic() - self._start,
                    int(obj.get("spec", {}).get("replicas", -1)),
                    int(obj.get("status", {}).get("readyReplicas") or 0),
                    str(auto.get("currentValue")),
                    str(auto.get("decision")),
                )
            )
            self._stop.wait(1.0)

    def mark(self, what: str) -> None:
        self.rows.append((time.monotonic() - self._start, -1, -1, "", f"-- {what}"))

    def stop(self) -> str:
        self._stop.set()
        self._thread.join(timeout=10)
        lines = ["  t(s)  replicas  ready  running/pod  decision"]
        last = None
        for t, replicas, ready, value, decision in self.rows:
            if replicas < 0:
                lines.append(f"{t:6.1f}  {decision}")
                continue
            if (replicas, ready, value, decision) == last:
                continue
            last = (replicas, ready, value, decision)
            lines.append(f"{t:6.1f}  {replicas:8d}  {ready:5d}  {value:>11}  {decision}")
        return "\n".join(lines)


class Repeated:
    """``Load`` runs of ``seconds`` each, one after the other, until ``stop``: a load with no
    end fixed in advance (the test ends it once it has seen what it waits for)."""

    def __init__(self, url: str, out: Path, *, seconds: int, **load: Any) -> None:
        self.results: list[dict[str, Any]] = []
        self.current: Load | None = None
        self._stop = threading.Event()
        self._args = (url, out, seconds, load)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        url, out, seconds, load = self._args
        run = 0
        while not self._stop.is_set():
            run += 1
            self.current = Load(url, out / str(run), seconds=seconds, **load)
            self.results.append(self.current.result(timeout=seconds + 200))

    def stop(self, timeout: float) -> list[dict[str, Any]]:
        """Ends the load after its current run; the results of every run."""
        self._stop.set()
        self._thread.join(timeout=timeout)
        assert not self._thread.is_alive(), "the load's last run did not end"
        return self.results

    def kill(self) -> None:
        self._stop.set()
        if self.current is not None and self.current.proc.poll() is None:
            self.current.proc.kill()


def _url(pod: dict[str, Any]) -> str:
    return f"http://{pod['status']['podIP']}:8000"


def _replicas(cluster: ClusterHandle, ns: str, name: str) -> Any:
    return (fetch(cluster, ns, "vis", name) or {}).get("spec", {}).get("replicas")


def _operator_lines(cluster: ClusterHandle, operator: ChartOperator, words: tuple[str, ...]) -> str:
    """The operator pod's last 20 log lines that hold any of ``words`` (lower case, matched
    against the line in lower case)."""
    log = cluster.kubectl(
        "logs", "-n", operator.namespace, operator.pod["metadata"]["name"], check=False
    ).stdout
    lines = [line for line in log.splitlines() if any(w in line.lower() for w in words)]
    return " | ".join(lines[-20:])


def _events_and_log(cluster: ClusterHandle, ns: str, operator: ChartOperator) -> str:
    """What a missing event is judged by: the namespace's events and the operator's lines
    on scaling and on events."""
    events = fetch(cluster, ns, "events") or {"items": []}
    listed = "; ".join(f"{e.get('reason')}: {e.get('message')}" for e in events["items"])
    lines = _operator_lines(cluster, operator, ("utoscal", "event"))
    return f"events: {listed or 'none'}; operator: {lines}"


def _operator_state(cluster: ClusterHandle, operator: ChartOperator) -> str:
    """The operator pod's restarts and its last autoscaler and warning lines (when it
    read, what it read): a scale-up that does not come is judged by them."""
    pods = fetch(cluster, operator.namespace, "pods", "-l", "app.kubernetes.io/component=operator")
    restarts = [
        (
            p["metadata"]["name"],
            [c.get("restartCount") for c in p["status"].get("containerStatuses") or []],
        )
        for p in (pods or {}).get("items", [])
    ]
    lines = _operator_lines(cluster, operator, ("utoscal", '"severity": "warn'))
    return f"operator pods (restarts): {restarts}; its last lines: {lines}"


def _server_load(pod: dict[str, Any]) -> str:
    """What the pod's vLLM itself says it runs and queues now, read by the test, beside
    what the operator read (the timeline)."""
    try:
        text = httpx.get(f"{_url(pod)}/metrics", timeout=10).text
    except httpx.HTTPError as err:
        return f"the pod's /metrics did not answer ({err!r})"
    wanted = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    lines = [line for line in text.splitlines() if line.startswith(wanted)]
    return "the pod's /metrics now: " + ("; ".join(lines) or "no request gauges")


def test_vllm_load_scales_up_a_benchmark_holds_and_the_least_loaded_pod_goes(
    cluster: ClusterHandle,
    chart_operator: ChartOperator,
    real_images: Images,
    real_namespace: Callable[..., str],
    tmp_path: Path,
) -> None:
    ns = real_namespace()  # restricted, as every pod the operator renders passes it
    # Longer than a second CPU vLLM takes to start and warm up on two cores, so the pod the
    # load asked for is not removed before it serves: 86 s measured alone on the real node,
    # over 110 s in a full CI run (startup probe period and warmup Job included). Once the
    # benchmark that holds the scale-down runs, the test shortens it to ``short`` (as a user
    # may: the operator reads the window at each reading), so that the hold shows without
    # waiting out the long one (~90 s of each CI run).
    window = 180
    short = 30
    cluster.apply(
        _isvc(
            "auto",
            replicas=1,
            autoscaling={
                "enabled": True,
                "metric": "RequestsRunning",
                "target": "3",
                "minReplicas": 1,
                "maxReplicas": 2,
                "periodSeconds": 2,
                "scaleUpWindowSeconds": 0,
                "scaleDownWindowSeconds": window,
            },
        ),
        namespace=ns,
    )
    wait_for(
        lambda: (
            (i := fetch(cluster, ns, "vis", "auto"))
            and i.get("status", {}).get("readyReplicas") == 1
        ),
        "the first replica to be warmed up and Ready",
        timeout=300,
    )
    (first,) = _pods(cluster, ns, "auto")
    assert first["spec"]["nodeName"] == node.NODE_NAME
    assert first["spec"]["containers"][0]["image"] == real_images.vllm
    timeline = Timeline(cluster, ns, "auto")
    loads: list[Load] = []
    repeated: list[Repeated] = []
    try:
        # Heavy load on the only pod until the autoscaler asks for more. Not streamed: it is
        # the server's load that counts, and the client shares two cores with everything.
        # Target 3 sits between the two loads with a margin of one request or more each
        # way: 8 clients of long requests keep the server's 6 sequences (the sample's
        # max-num-seqs) running, the light load below 1-2 for two pods.
        # Few, long requests rather than many short ones: the load client's CPU goes with
        # its request rate, and on the two cores it starves the operator (a pod that asks
        # for no CPU here, so its share is the smallest on the node). A CI run (2026-12-07)
        # with 32 clients of 200 tokens read "RequestsRunning 1" for 140 s while its
        # client ran 10 req/s; 8 clients of 400 tokens (prompt 32 + 400 within the
        # sample's max-model-len of 512) ask half that rate of the client.
        timeline.mark("heavy load on the first pod (8 long requests in flight at the client)")
        # The load outlasts the wait by 10 s; the wait allows 140 s, and the load is killed
        # once the scale-up shows (the bench CLI has no graceful early end; its part, the
        # scale-up, is done), so a quick scale-up costs nothing more.
        heavy = Load(
            _url(first), tmp_path / "heavy", concurrency=8, seconds=150, tokens=400, stream=False
        )
        loads.append(heavy)
        try:
            wait_for(
                lambda: heavy.check_running() and _replicas(cluster, ns, "auto") == 2,
                "the scale-up",
                timeout=140,
            )
        except AssertionError as err:
            auto = (fetch(cluster, ns, "vis", "auto") or {}).get("status", {}).get("autoscaling")
            raise AssertionError(
                f"{err}; status.autoscaling: {auto}; {_server_load(first)}; {heavy.state()}; "
                f"{_operator_state(cluster, chart_operator)}"
            ) from None
        timeline.mark("scaled up; the heavy load is stopped")
        heavy.proc.kill()
        heavy.proc.wait(timeout=30)
        # The new pod takes traffic only once warmed up; the replicas stay meanwhile (the
        # scale-down window has not passed).
        isvc = wait_for(
            lambda: (
                (i := fetch(cluster, ns, "vis", "auto"))
                and i.get("status", {}).get("readyReplicas") == 2
                and i
            ),
            "the second pod to be warmed up and Ready",
            timeout=window - 10,
        )
        timeline.mark("the second pod is warmed up and Ready")
        assert isvc["spec"]["replicas"] == 2  # the limit
        auto = isvc["status"]["autoscaling"]
        assert auto["mode"] == "Operator" and auto["metric"] == "RequestsRunning"
        # A read of the events can fail on the loaded machine: read again before judging.
        try:
            wait_for(
                lambda: (fetch(cluster, ns, "events", "--field-selector", "reason=ScaledUp")
                         or {}).get("items"),
                "a ScaledUp event",
                timeout=30,
            )  # fmt: skip
        except AssertionError as err:
            raise AssertionError(f"{err}; {_events_and_log(cluster, ns, chart_operator)}") from None
        second = next(p for p in _pods(cluster, ns, "auto") if p["metadata"]["name"] !=
                      first["metadata"]["name"])  # fmt: skip

        # A benchmark starts; light load goes to the newer pod only.
        # The benchmark outlasts what the test waits for; the test deletes it once the held
        # scale-down has shown (the remedy docs/troubleshooting.md names). The hold shows a
        # scale-down window (``short`` from the moment the benchmark runs) after the last
        # reading that asked for two replicas: the heavy load's end at the latest (the signal
        # being a 15 s average), unless the benchmark itself reads high (a 50 s stall of a CPU
        # vLLM on the loaded CI machine kept two of its requests in the server, 2026-12-01;
        # two stalls in one run piled up 2.4 and 3.0 requests per pod at 0.1/s, 2026-12-02),
        # which restarts the window: the wait allows two such stalls. Its requests are few
        # (0.03/s, 4 tokens each), so that a stall piles up one or two of them, not five: an
        # idle pod's gauge reads 1 when a scrape catches one.
        bench = benchmark("hold", "auto", 900)
        bench["spec"]["arrival"]["ratePerSecond"] = 0.03
        cluster.apply(bench, namespace=ns)
        wait_for(
            lambda: (
                (b := fetch(cluster, ns, "inferencebenchmark", "hold"))
                and b.get("status", {}).get("phase") == "Running"
            ),
            "the benchmark to run",
            timeout=120,
        )
        cluster.kubectl(
            "patch", "vis", "auto", "-n", ns, "--type=merge",
            "-p", json.dumps({"spec": {"autoscaling": {"scaleDownWindowSeconds": short}}}),
        )  # fmt: skip
        timeline.mark(
            f"benchmark 'hold' runs; scale-down window now {short} s; light load (1 in flight)"
            " on the second pod"
        )
        # Short requests: the 15 s average counts a request whole when it ends, so it can read
        # up to (15 s + one request's time) / 15 s per request kept going (1.45 measured
        # with 256-token requests of ~7 s on the loaded machine).
        light = Repeated(
            _url(second), tmp_path / "light", seconds=45, concurrency=1, tokens=64, stream=True
        )
        repeated.append(light)

        # The signal asks for one replica; the benchmark holds it.
        held = wait_for(
            lambda: (
                (i := fetch(cluster, ns, "vis", "auto"))
                and (i["status"].get("autoscaling") or {}).get("decision") == "ScaleDownHeld"
                and i
            ),
            "the scale-down to be held",
            timeout=2 * (50 + 15 + short) + 60,
        )
        timeline.mark("scale-down held")
        assert "InferenceBenchmark hold" in held["status"]["autoscaling"]["message"]
        blocked = condition(held, "ScaleDownBlocked")
        assert blocked.get("status") == "True" and "hold" in blocked.get("message", "")
        # Held for several periods while the load Job runs.
        hold_until = time.monotonic() + 20
        while time.monotonic() < hold_until:
            replicas = (fetch(cluster, ns, "vis", "auto") or {}).get("spec", {}).get("replicas")
            assert replicas == 2, "scaled down while the benchmark's load ran"
            time.sleep(1)
        assert job_state(fetch(cluster, ns, "job", "hold-load") or {}) == "Running"
        cluster.kubectl("delete", "inferencebenchmark", "hold", "-n", ns, "--wait=false")
        timeline.mark("benchmark 'hold' deleted")

        # Now it scales down at once (the window had passed: that is what the hold said),
        # and the pod that goes is the idle, older one.
        try:
            wait_for(
                lambda: (i := fetch(cluster, ns, "vis", "auto")) and i["spec"]["replicas"] == 1,
                "the scale-down after the benchmark",
                timeout=60,
            )
        except AssertionError as err:
            last = fetch(cluster, ns, "vis", "auto") or {}
            auto = last.get("status", {}).get("autoscaling")
            raise AssertionError(f"{err}; status.autoscaling: {auto}") from None
        wait_for(lambda: len(_pods(cluster, ns, "auto")) == 1, "one pod left", timeout=60)
        timeline.mark("scaled down to one pod")
        (left,) = _pods(cluster, ns, "auto")
        assert left["metadata"]["name"] == second["metadata"]["name"], (
            "the busy pod was removed instead of the idle one"
        )
        results = [r for each in repeated for r in each.stop(timeout=300)]
    finally:
        for load in loads:
            if load.proc.poll() is None:
                load.proc.kill()
        for each in repeated:
            each.kill()
        print("\nAutoscaling timeline (this run):\n" + timeline.stop())
    for r in results:
        assert r["requests"] > 0
        assert r["failed"] == 0 and not r["errors"], results
    counts = [(r["requests"], r["failed"]) for r in results]
    print("load generator runs (requests, failed):", counts)
