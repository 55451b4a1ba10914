"""The product in real containers under a real kubelet (devenv/cluster/node.py).

What a simulated kubelet cannot show is shown here: the operator's image running as its
own uid with a read-only root, installed by its chart and holding only the chart's
ServiceAccount token; an InferenceService served by a container of the CPU vLLM image
with exactly the arguments the operator rendered (so a flag that vLLM version lacks would
fail the pod), warmed up by a Job pod of the operator's image that reaches vLLM through
the Service (CoreDNS and kube-proxy), behind the readiness gate; /dev/shm as the planned
memory-backed volume; Pod Security enforced; and the faults a user meets (an image that
does not exist, a container that exits, one killed for memory, a pod that fits nowhere),
each produced for real.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from devenv.cluster import node
from devenv.cluster.cluster import ClusterHandle
from devenv.cluster.images import Images
from devenv.cluster.processes import wait_until
from devenv.dev import answers, service_url
from devenv.vllm_server import Streams
from e2e.framework import condition, delete_namespace
from e2e.real_node_fixtures import ChartOperator, operator_pod
from vllm_operator.bench.archive import unpack
from vllm_operator.constants import LABEL_SERVICE as SERVICE_LABEL
from vllm_operator.constants import LABEL_WARMUP_FOR as WARMUP_LABEL
from vllm_operator.constants import WARMED_UP_CONDITION as GATE
from vllm_operator.render.deployment import DRAIN_SECONDS

REPO = Path(__file__).parents[1]
SAMPLE = REPO / "examples" / "dev-sample.yaml"
MiB = 1024 * 1024
TOKENS = 400


def _exec(cluster: ClusterHandle, ns: str, pod: str, *argv: str) -> Any:
    return cluster.kubectl("exec", "-n", ns, pod, "--", *argv, check=False, timeout=60)


# --------------------------------------------------------------------------- the operator


def test_the_chart_runs_the_operator_image_as_65532_with_a_read_only_root(
    cluster: ClusterHandle, chart_operator: ChartOperator, real_images: Images
) -> None:
    pod = operator_pod(cluster, chart_operator.namespace)
    name = pod["metadata"]["name"]
    assert pod["spec"]["nodeName"] == node.NODE_NAME
    status = pod["status"]["containerStatuses"][0]
    assert pod["spec"]["containers"][0]["image"] == real_images.operator
    assert status["ready"] is True and status["restartCount"] == 0, status
    probe = _exec(
        cluster, chart_operator.namespace, name, "python", "-c",
        "import os; print(os.getuid(), os.getgid()); open('/probe', 'w')",
    )  # fmt: skip
    assert probe.stdout.split() == ["65532", "65532"], probe.stdout + probe.stderr
    assert probe.returncode != 0 and "Read-only file system" in probe.stderr, probe.stderr
    # Its only credentials are the chart's ServiceAccount token, mounted by the kubelet.
    who = _exec(
        cluster, chart_operator.namespace, name, "python", "-c",
        "import base64, json; t = open('/var/run/secrets/kubernetes.io/serviceaccount/token')"
        ".read().split('.')[1]; print(json.loads(base64.urlsafe_b64decode(t + '=='))['sub'])",
    )  # fmt: skip
    assert who.stdout.strip() == (
        f"system:serviceaccount:{chart_operator.namespace}:{pod['spec']['serviceAccountName']}"
    ), who.stderr

    def logs() -> str:
        return cluster.kubectl("logs", "-n", chart_operator.namespace, name).stdout

    wait_until("the operator's start in its log", lambda: "Started the vllm-operator" in logs(), 60)
    assert "Traceback" not in logs(), logs()[-3000:]


# --------------------------------------------------------------------------- serving


def _sample(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    doc["metadata"]["name"] = name
    return doc


@pytest.fixture(scope="module")
def served(cluster: ClusterHandle, chart_operator: ChartOperator) -> Iterator[str]:
    """The sample, applied in a real-node namespace and Ready; yields the namespace.

    Its namespace enforces restricted Pod Security: admission and the kubelet judge the
    vLLM pod the operator renders (uid 65532, read-only root) and the warmup Job's."""
    ns = f"e2e-rn-served-{secrets.token_hex(3)}"
    cluster.apply(node.real_node_namespace(ns))
    cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", ns, "--timeout=60s")
    try:
        cluster.apply(_sample("tiny-chat"), namespace=ns)
        cluster.kubectl(
            "wait", "--for=condition=Ready", "vis/tiny-chat", "-n", ns, "--timeout=480s",
            timeout=500,
        )  # fmt: skip
        yield ns
    finally:
        delete_namespace(cluster, ns, wait_gone=True, timeout=120)


def server_pod(cluster: ClusterHandle, ns: str, service: str = "tiny-chat") -> dict[str, Any]:
    """The one live server pod of an InferenceService (its warmup Jobs' pods left out)."""
    pods = cluster.kubectl_json("get", "pods", "-n", ns, "-l", f"{SERVICE_LABEL}={service}")
    servers = [
        p
        for p in pods["items"]
        if WARMUP_LABEL not in p["metadata"]["labels"]
        and not p["metadata"].get("deletionTimestamp")
    ]
    assert len(servers) == 1, [p["metadata"]["name"] for p in servers]
    return servers[0]


def test_a_service_is_served_by_a_real_vllm_container_after_a_real_warmup(
    cluster: ClusterHandle, served: str, real_images: Images
) -> None:
    ns = served
    deployment = cluster.kubectl_json(
        "get", "deployments", "-n", ns, "-l", f"{SERVICE_LABEL}=tiny-chat"
    )["items"][0]
    rendered = deployment["spec"]["template"]["spec"]["containers"][0]
    server = server_pod(cluster, ns)
    pod_name = server["metadata"]["name"]

    # The serving image ran, on the real node, with the operator's arguments untouched.
    assert server["spec"]["nodeName"] == node.NODE_NAME
    container = server["spec"]["containers"][0]
    assert container["image"] == real_images.vllm
    assert container["command"] == ["vllm", "serve"]
    assert container["args"] == rendered["args"]
    assert "--shutdown-timeout" in container["args"]
    # The argument list was accepted: a rejected flag exits 2 at every start. (One restart
    # during startup was seen once on the loaded 2-core machine, cause not recorded: the
    # termination is printed so the next one says why.)
    status = server["status"]["containerStatuses"][0]
    last = (status.get("lastState") or {}).get("terminated")
    if status["restartCount"]:
        print(f"the vLLM container restarted {status['restartCount']}x; last: {last}")
        assert last is not None and last.get("exitCode") != 2, last
    # The readiness gate is what made it Ready, and the operator set it after warmup.
    assert server["spec"]["readinessGates"] == [{"conditionType": GATE}]
    assert condition(server, GATE).get("status") == "True"
    assert condition(server, "Ready").get("status") == "True"
    # In that order: the kubelet's probe, then the gate the operator set, then Ready.
    times = {c["type"]: c["lastTransitionTime"] for c in server["status"]["conditions"]}
    assert times["ContainersReady"] <= times[GATE] <= times["Ready"], times
    # The entry point checked the whole list with this vLLM's own parser, then adapted.
    logs = cluster.kubectl("logs", "-n", ns, pod_name).stdout
    assert "vllm-cpu-serve" in logs, logs[-3000:]

    # /dev/shm is the planned memory-backed volume, of the planned size.
    shm = _exec(
        cluster, ns, pod_name, "python3", "-c",
        "import os; s = os.statvfs('/dev/shm'); print(s.f_blocks * s.f_frsize)",
    )  # fmt: skip
    assert int(shm.stdout) == 256 * MiB, shm.stdout + shm.stderr

    # The warmup Job ran as a pod of the operator's image on the real node, and reached
    # the server at its pod address across the node's pod network.
    jobs = cluster.kubectl_json("get", "pods", "-n", ns, "-l", f"{WARMUP_LABEL}")["items"]
    assert jobs, "no warmup pod"
    warm = jobs[0]
    assert warm["spec"]["nodeName"] == node.NODE_NAME
    assert warm["spec"]["containers"][0]["image"] == real_images.operator
    assert warm["status"]["phase"] == "Succeeded"
    endpoint = f"http://{server['status']['podIP']}:8000"
    assert endpoint in warm["spec"]["containers"][0]["args"]
    assert server["status"]["podIP"].startswith("198.18.1.")
    isvc = cluster.kubectl_json("get", "vis", "tiny-chat", "-n", ns)
    warmup = isvc["status"]["warmup"]
    assert warmup["lastColdTtftMilliseconds"] > 0 and warmup["lastWarmTtftMilliseconds"] > 0

    # A chat completion through the Service's ClusterIP (kube-proxy's rules).
    url = service_url(cluster, ns, "tiny-chat")
    wait_until("tiny-chat's Service answering", lambda: answers(f"{url}/health"), 60)
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] > 0


def test_a_benchmark_runs_as_a_real_load_job_under_the_scale_down_lock(
    cluster: ClusterHandle, served: str, real_images: Images
) -> None:
    """The load Job is a pod of the operator image on the real node: it reaches the target
    through the Service's DNS name, writes its results ConfigMap with the ServiceAccount
    token the kubelet mounts, and holds the chart's scale-down lock while it runs."""
    ns = served
    bench = {
        "apiVersion": "inference.vllm-operator.dev/v1alpha1",
        "kind": "InferenceBenchmark",
        "metadata": {"name": "real-load"},
        "spec": {
            "targetRef": {"name": "tiny-chat"},
            "workload": {
                "promptTokens": {"type": "Fixed", "value": 16},
                "outputTokens": {"type": "Fixed", "value": 8},
            },
            "arrival": {"process": "Poisson", "ratePerSecond": 2},
            "durationSeconds": 30,
            "endpoint": {"api": "Completions", "stream": True},
            "seed": 1,
        },
    }
    cluster.apply(bench, namespace=ns)

    def phase() -> str | None:
        got = cluster.kubectl_json("get", "inferencebenchmark", "real-load", "-n", ns)
        return got.get("status", {}).get("phase")

    wait_until("the benchmark Running", lambda: phase() == "Running", 180)
    refused = cluster.kubectl("scale", "vis/tiny-chat", "-n", ns, "--replicas=0", check=False)
    assert refused.returncode != 0, "scale-down allowed during the benchmark"
    assert "holds the scale-down lock" in refused.stderr, refused.stderr
    wait_until("the benchmark ended", lambda: phase() in ("Succeeded", "Failed"), 240)
    status = cluster.kubectl_json("get", "inferencebenchmark", "real-load", "-n", ns)["status"]
    assert status["phase"] == "Succeeded", status
    headline = status["headline"]
    assert headline["requests"] > 0 and headline["succeeded"] == headline["requests"], headline

    pods = cluster.kubectl_json(
        "get", "pods", "-n", ns, "-l", "job-name=real-load-load"
    )["items"]  # fmt: skip
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    load = pods[0]
    assert load["spec"]["nodeName"] == node.NODE_NAME
    assert load["spec"]["containers"][0]["image"] == real_images.operator
    assert load["status"]["phase"] == "Succeeded"
    args = load["spec"]["containers"][0]["args"]
    assert args[args.index("--endpoint") + 1] == f"http://tiny-chat.{ns}.svc:8000"
    results = cluster.kubectl_json("get", "configmap", "real-load-results", "-n", ns)
    assert results["data"]["requests"] == str(headline["requests"])


def _bench_status(cluster: ClusterHandle, ns: str, name: str) -> dict[str, Any]:
    got: dict[str, Any] = cluster.kubectl_json("get", "inferencebenchmark", name, "-n", ns)
    return got.get("status", {})


def _ready_reason(status: dict[str, Any]) -> str | None:
    reason: str | None = condition({"status": status}, "Ready").get("reason")
    return reason


def test_a_benchmark_reads_its_dataset_and_leaves_every_request_in_its_results_config_map(
    cluster: ClusterHandle, served: str, tmp_path: Path
) -> None:
    """Against the real vLLM: a benchmark waits for its dataset ConfigMap, reads its prompts
    from it, and its load Job writes every request into the results ConfigMap under its
    own ServiceAccount; the documented recipe turns that back into a report."""
    ns = served
    requests = 12
    bench = {
        "apiVersion": "inference.vllm-operator.dev/v1alpha1",
        "kind": "InferenceBenchmark",
        "metadata": {"name": "replay"},
        "spec": {
            "targetRef": {"name": "tiny-chat"},
            "workload": {"dataset": {"name": "prompts", "key": "chat.jsonl"}},
            "arrival": {"process": "ClosedLoop", "concurrency": 2},
            "requests": requests,
            "endpoint": {"api": "ChatCompletions", "stream": True},
            "seed": 1,
        },
    }
    # Applied before its dataset exists: it waits, saying for what.
    cluster.apply(bench, namespace=ns)
    wait_until(
        "DatasetNotFound",
        lambda: _ready_reason(_bench_status(cluster, ns, "replay")) == "DatasetNotFound",
        120,
    )
    waiting = _bench_status(cluster, ns, "replay")
    assert waiting["phase"] == "Pending"
    [ready] = [c for c in waiting["conditions"] if c["type"] == "Ready"]
    assert "spec.workload.dataset" in ready["message"]
    assert cluster.kubectl("get", "job", "replay-load", "-n", ns, check=False).returncode != 0
    lines = [
        {"messages": [{"role": "user", "content": f"Question {i}: what is {i} plus {i}?"}],
         "output_tokens": 4 + i % 3}
        for i in range(5)
    ]  # fmt: skip
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "prompts"},
            "data": {"chat.jsonl": "\n".join(json.dumps(line) for line in lines) + "\n"},
        },
        namespace=ns,
    )
    wait_until(
        "the benchmark to end",
        lambda: _bench_status(cluster, ns, "replay").get("phase") in ("Succeeded", "Failed"),
        300,
    )
    status = _bench_status(cluster, ns, "replay")
    assert status["phase"] == "Succeeded", status
    assert status["headline"]["requests"] == requests
    assert status["headline"]["succeeded"] == requests, status["headline"]
    assert status["resultsConfigMap"] == "replay-results"

    config_map = cluster.kubectl_json("get", "configmap", "replay-results", "-n", ns)
    assert config_map["metadata"]["ownerReferences"][0]["name"] == "replay"
    assert config_map["data"]["requests"] == str(requests)
    assert config_map["data"]["requestsDropped"] == "0"
    results = unpack(config_map)
    (level,) = results["levels"]
    assert len(level["requests"]) == requests == level["stats"]["requests"]
    assert all(r["error"] is None for r in level["requests"]), level["requests"]
    # The prompts came from the dataset: its output lengths, and no other.
    assert {r["output_tokens_planned"] for r in level["requests"]} <= {4, 5, 6}
    assert all(r["completion_tokens"] == r["output_tokens_planned"] for r in level["requests"])
    # The Job's identity may write its results and nothing else.
    as_job = f"--as=system:serviceaccount:{ns}:replay-load"
    can = cluster.kubectl(
        "auth", "can-i", "patch", "configmap/replay-results", "-n", ns, as_job, check=False
    )
    assert can.stdout.strip() == "yes"
    cannot = cluster.kubectl(
        "auth", "can-i", "patch", "configmap/prompts", "-n", ns, as_job, check=False
    )
    assert cannot.stdout.strip() == "no"

    # The documented recipe: the ConfigMap back into results.json and the HTML report.
    cm_json = cluster.kubectl("get", "configmap", "replay-results", "-n", ns, "-o", "json").stdout
    report = tmp_path / "report"
    subprocess.run(
        [sys.executable, "-m", "vllm_operator.cli", "bench", "--from-results", "-",
         "--output-dir", str(report)],
        input=cm_json, text=True, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    assert json.loads((report / "results.json").read_text())["levels"][0]["requests"]
    page = (report / "report.html").read_text()
    assert "<svg" in page
    # The operator pointed the load Job at the vLLM pod's own /metrics, read through the
    # level (bench/resources.py): the requests in the server and the KV cache.
    resources = level["resources"]
    print("resources read from the real vLLM pod:", resources)
    assert resources is not None and resources["urls"] == 1, resources
    assert resources["samples"] >= 2 and resources["scrape_errors"] == 0, resources
    assert resources["running_mean"] is not None and resources["running_mean"] > 0, resources
    assert resources["kv_cache_usage_max"] is not None, resources
    assert "Latency against resources" in page


DEV_EXAMPLES = REPO / "examples" / "dev"


def _run_dev_example(cluster: ClusterHandle, ns: str, file: str) -> dict[str, Any]:
    """Apply an example of examples/dev/ beside the sample; the benchmark's status once it
    has ended."""
    path = DEV_EXAMPLES / file
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    (name,) = [d["metadata"]["name"] for d in docs if d["kind"] == "InferenceBenchmark"]
    cluster.kubectl("apply", "-n", ns, "-f", str(path))
    wait_until(
        f"benchmark {name} to end",
        lambda: _bench_status(cluster, ns, name).get("phase") in ("Succeeded", "Failed"),
        400,
    )
    status = _bench_status(cluster, ns, name)
    levels = status.get("levels") or []
    top = (status.get("headline") or {}).get("ratePerSecond")
    print(
        f"{file}: {status.get('phase')}, reason {_ready_reason(status)}, knee "
        f"{status.get('kneeRatePerSecond')}, headline at {top}"
    )
    for lv in levels:
        print(
            f"  {lv.get('ratePerSecond') or lv.get('concurrency')}: {lv.get('sloVerdict')}, "
            f"attainment {lv.get('sloAttainment')}, TTFT P99 "
            f"{(lv.get('fromScheduled') or {}).get('ttft', {}).get('p99')} ms, lag P99 "
            f"{lv.get('scheduleLagP99Milliseconds')} ms, errors {lv.get('errored', 0)}"
        )
    for entry in status.get("chaos") or []:
        print(f"  {entry['perturbation']} | {entry['verdict']}")
    assert status["phase"] == "Succeeded", status
    return status


@pytest.mark.parametrize(
    "file",
    ["inferencebenchmark.yaml", "inferencebenchmark-dataset.yaml",
     "inferencebenchmark-search.yaml"],
)  # fmt: skip
def test_the_dev_examples_run_to_succeeded_against_the_sample(
    cluster: ClusterHandle, served: str, file: str
) -> None:
    """Issue 44: each example benchmark, in the variant examples/dev/ holds for `make dev`'s
    cluster, ends Succeeded against the sample, its requests answered."""
    status = _run_dev_example(cluster, served, file)
    headline = status.get("headline") or {}
    assert headline.get("requests", 0) > 0, status
    assert headline.get("errored", 0) == 0, headline
    if file.endswith("-search.yaml"):
        # Every probe counts: on this node the client lags its schedule, and a lag that
        # could not flip a probe's verdict no longer disqualifies it (the issue's search
        # walked down to 2.1 req/s below levels that met the objective).
        # The headline is the highest probe that met the objective.
        levels = status["levels"]
        assert len(levels) >= 2, levels
        met = [lv["ratePerSecond"] for lv in levels if lv.get("sloVerdict") == "Met"]
        assert met and headline["ratePerSecond"] == max(met), (met, status)


def test_a_chaos_sweep_against_the_real_vllm_ends_with_its_levels_and_comparisons(
    cluster: ClusterHandle, served: str
) -> None:
    """Issue 44: the chaos example's shape, scaled to the tiny model (examples/dev/), against
    the CPU vLLM sample on the two-core node, where the load Job shares the node with the
    server. It ends Succeeded with every level (each with the verdict the Job judged it by)
    and a plain-against-perturbed comparison for the network and the neighbour."""
    status = _run_dev_example(cluster, served, "inferencebenchmark-chaos.yaml")
    levels, chaos = status.get("levels") or [], status.get("chaos") or []
    assert [lv["ratePerSecond"] for lv in levels] == [2, 4, 8], levels
    for level in levels:
        # The server answered every request sent. A load Job starved beside the server on
        # two cores may leave a few unsent (CI, 2026-12-07: 2 of 101): the level says so,
        # as a client-limited one, and they are its only errors.
        unsent = level.get("unsent") or 0
        assert level["requests"] > 0 and level.get("errored", 0) == unsent, level
        assert not level.get("errorsByKind"), level
        if unsent:
            assert level["clientSaturated"] and level["sloVerdict"] == "ClientLimited", level
        assert level["sloVerdict"] in ("Met", "Missed", "ClientLimited"), level
    assert [c["perturbation"].split(" ")[0] for c in chaos] == ["network", "noisy"], chaos
    for entry in chaos:
        assert entry["ratePerSecond"] == 3
        assert entry["baseline"]["requests"] > 0 and entry["perturbed"]["requests"] > 0, entry
        assert entry["verdict"], entry
    # The network's delay is on every request's path: its median TTFT grows by about two
    # one-way delays (the request and its first token), less what the jitter takes.
    network = chaos[0]
    grew = (network["perturbed"]["fromSend"]["ttft"]["p50"]
            - network["baseline"]["fromSend"]["ttft"]["p50"])  # fmt: skip
    assert grew >= 20, network


def test_deleting_the_pod_lets_the_streams_in_flight_finish(
    cluster: ClusterHandle, served: str
) -> None:
    """The drain as the real kubelet runs it: the preStop delay while the Service stops
    routing to the pod, then SIGTERM, then vLLM's --shutdown-timeout for what it holds."""
    ns = served
    server = server_pod(cluster, ns)
    name = server["metadata"]["name"]
    url = service_url(cluster, ns, "tiny-chat")
    streams = Streams(url, "tiny-llama", count=4, tokens=TOKENS)
    streams.start()
    deleted = time.monotonic()
    cluster.kubectl("delete", "pod", name, "-n", ns, "--wait=false")
    streams.finish(DRAIN_SECONDS + 60)
    finished = time.monotonic() - deleted
    # The container ended by itself (exit 0), within the pod's grace period.
    wait_until(
        f"pod {name} gone",
        lambda: cluster.kubectl("get", "pod", name, "-n", ns, check=False).returncode != 0,
        DRAIN_SECONDS + 60,
    )
    events = cluster.kubectl(
        "get", "events", "-n", ns, f"--field-selector=involvedObject.name={name}", "-o", "json"
    ).stdout
    assert "FailedPreStopHook" not in events and "FailedKillPod" not in events, events
    print(f"4 streams of {TOKENS} tokens finished {finished:.1f} s after the pod's deletion")


# --------------------------------------------------------------------------- pod security


def _restricted_pod(name: str, image: str, args: list[str], **resources: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Always",
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "args": args,
                    "resources": resources or {"limits": {"memory": "128Mi"}},
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def test_restricted_pod_security_is_enforced_on_the_real_nodes_namespaces(
    cluster: ClusterHandle, real_images: Images, real_namespace: Callable[..., str]
) -> None:
    ns = real_namespace()
    privileged = _restricted_pod("privileged", real_images.operator, ["--version"])
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    refused = cluster.kubectl(
        "apply", "-n", ns, "-f", "-", input=json.dumps(privileged), check=False
    )
    assert refused.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in refused.stderr, refused.stderr
    # The same image under the restricted profile runs to completion on the real node.
    ok = _restricted_pod("restricted", real_images.operator, ["--version"])
    ok["spec"]["restartPolicy"] = "Never"
    cluster.apply(ok, namespace=ns)
    wait_until(
        "the restricted pod Succeeded",
        lambda: (
            cluster.kubectl_json("get", "pod", "restricted", "-n", ns)["status"].get("phase")
            == "Succeeded"
        ),
        120,
    )
    got = cluster.kubectl_json("get", "pod", "restricted", "-n", ns)
    assert got["spec"]["nodeName"] == node.NODE_NAME
    assert "vllm-operator" in cluster.kubectl("logs", "-n", ns, "restricted").stdout


# --------------------------------------------------------------------------- faults


def _waiting_reason(cluster: ClusterHandle, ns: str, name: str) -> str | None:
    statuses = cluster.kubectl_json("get", "pod", name, "-n", ns)["status"].get(
        "containerStatuses", []
    )
    waiting = statuses[0].get("state", {}).get("waiting", {}) if statuses else {}
    reason = waiting.get("reason")
    return str(reason) if reason else None


def _last_terminated(cluster: ClusterHandle, ns: str, name: str) -> dict[str, Any]:
    statuses = cluster.kubectl_json("get", "pod", name, "-n", ns)["status"].get(
        "containerStatuses", []
    )
    if not statuses:
        return {}
    st = statuses[0]
    term = st.get("lastState", {}).get("terminated") or st.get("state", {}).get("terminated")
    return dict(term or {})


def test_the_real_node_produces_image_pull_crash_loop_oom_and_unschedulable_pods(
    cluster: ClusterHandle, real_images: Images, real_namespace: Callable[..., str]
) -> None:
    ns = real_namespace()
    image = real_images.operator
    pods = [
        _restricted_pod("no-image", "localhost/vllm-operator:does-not-exist", ["--version"]),
        _restricted_pod("exits", image, ["no-such-command"]),
        _restricted_pod(
            "oom",
            image,
            [],
            limits={"memory": "48Mi"},
            requests={"memory": "48Mi"},
        ),
        _restricted_pod(
            "fits-nowhere",
            image,
            ["--version"],
            limits={"nvidia.com/gpu": "64"},
            requests={"nvidia.com/gpu": "64"},
        ),
    ]
    # The operator image's entry point is vllm-operator; this one allocates past its limit.
    pods[2]["spec"]["containers"][0]["command"] = [
        "python", "-c", "b = bytearray(256 * 1024 * 1024); print(len(b))",
    ]  # fmt: skip
    cluster.apply(pods, namespace=ns)

    wait_until(
        "ErrImagePull/ImagePullBackOff",
        lambda: _waiting_reason(cluster, ns, "no-image") in ("ErrImagePull", "ImagePullBackOff"),
        120,
    )
    wait_until(
        "CrashLoopBackOff",
        lambda: _waiting_reason(cluster, ns, "exits") == "CrashLoopBackOff",
        120,
    )
    exited = _last_terminated(cluster, ns, "exits")
    assert exited.get("exitCode") == 2, exited  # argparse's "invalid choice"
    wait_until(
        "OOMKilled",
        lambda: _last_terminated(cluster, ns, "oom").get("reason") == "OOMKilled",
        120,
    )
    assert _last_terminated(cluster, ns, "oom")["exitCode"] == 137
    wait_until(
        "PodScheduled=False, Unschedulable",
        lambda: (
            condition(
                cluster.kubectl_json("get", "pod", "fits-nowhere", "-n", ns), "PodScheduled"
            ).get("reason")
            == "Unschedulable"
        ),
        60,
    )
    for name in ("no-image", "exits", "oom"):
        assert (
            cluster.kubectl_json("get", "pod", name, "-n", ns)["spec"]["nodeName"] == node.NODE_NAME
        )
