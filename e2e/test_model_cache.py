"""ModelCache on the real node: a download Job fills a local PersistentVolume from a local
stand-in for the Hub, and services start from it without reaching the Hub.

The stand-in (devenv/hub_standin.py) runs as a pod of the CPU vLLM image, serving the tiny
model baked in at /models/tiny-llama as tiny/llama, and a gated copy that needs a token;
it counts every request and byte it serves. The volumes are local PersistentVolumes on the
real node (host folders; a 1 MiB tmpfs for the full volume), of storage classes without a
provisioner, bound when the download Job's pod is scheduled. The operator runs as the
chart's pod; the download Job runs `vllm-operator download` from the operator's image.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
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
from e2e.framework import condition, delete_namespace
from e2e.real_node_fixtures import ChartOperator
from e2e.test_real_node import SAMPLE

REPO = Path(__file__).resolve().parents[1]
HUB_SCRIPT = REPO / "devenv" / "hub_standin.py"
TOKEN = "e2e-hub-token"
CLASS = "e2e-model-cache"
TINY_CLASS = "e2e-model-cache-tiny"
HOST_ROOT = Path("/var/lib/vllm-operator-e2e/model-cache")
MODEL_FILE = "model.safetensors"


@pytest.fixture(scope="module")
def cache_ns(
    cluster: ClusterHandle, chart_operator: ChartOperator, real_images: Images
) -> Iterator[str]:
    ns = f"e2e-cache-{secrets.token_hex(3)}"
    # Restricted: the vLLM pods and the download Job's pod pass it.
    cluster.apply(node.real_node_namespace(ns))
    cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", ns, "--timeout=60s")
    _start_hub(cluster, ns, real_images.vllm)
    volumes = _volumes(cluster, ns)
    try:
        yield ns
    finally:
        delete_namespace(cluster, ns, wait_gone=True, timeout=180)
        for pv in volumes:
            cluster.kubectl("delete", "pv", pv, "--wait=false", check=False)
        cluster.kubectl("delete", "storageclass", CLASS, TINY_CLASS, check=False)
        tiny = HOST_ROOT / ns / "tiny"
        subprocess.run(["umount", str(tiny)], check=False)
        shutil.rmtree(HOST_ROOT / ns, ignore_errors=True)


def _start_hub(cluster: ClusterHandle, ns: str, image: str) -> None:
    labels = {"app": "hub"}
    restricted = {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "hub"},
                "data": {"hub_standin.py": HUB_SCRIPT.read_text()},
            },
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "hub", "labels": labels},
                "spec": {
                    # python3 as PID 1 ignores SIGTERM: without this the namespace's deletion
                    # waits out the default 30 s grace period.
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "hub",
                            "image": image,
                            "command": ["/usr/bin/python3", "/hub/hub_standin.py"],
                            "args": [
                                "--host",
                                "0.0.0.0",
                                "--port",
                                "8080",
                                "--repo",
                                "tiny/llama=/models/tiny-llama",
                                "--gated",
                                "tiny/llama-gated=/models/tiny-llama",
                                "--token",
                                TOKEN,
                            ],
                            "ports": [{"containerPort": 8080}],
                            "readinessProbe": {"httpGet": {"path": "/_stats", "port": 8080}},
                            "resources": {"requests": {"cpu": "0", "memory": "64Mi"}},
                            "volumeMounts": [{"name": "script", "mountPath": "/hub"}],
                            "securityContext": restricted,
                        }
                    ],
                    "volumes": [{"name": "script", "configMap": {"name": "hub"}}],
                },
            },
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "hub"},
                "spec": {"selector": labels, "ports": [{"port": 8080, "targetPort": 8080}]},
            },
        ],
        namespace=ns,
    )
    cluster.kubectl("wait", "--for=condition=Ready", "pod/hub", "-n", ns, "--timeout=180s",
                    timeout=190)  # fmt: skip
    # Ready is the kubelet's view; the host reaches the pod through the Service's address
    # once kube-proxy has programmed it (after an apiserver restart, its watches catch up
    # late). Wait for that, so that a test's first call does not meet a refused connection.
    wait_until("the hub to answer at its Service's address", lambda: _answers(cluster, ns), 90)


def _answers(cluster: ClusterHandle, ns: str) -> bool:
    return answers(f"{_hub(cluster, ns)}/_stats")


def _volumes(cluster: ClusterHandle, ns: str) -> list[str]:
    """Four 1 GiB local volumes and one of 1 MiB (a tmpfs: writes past it fail)."""
    classes = [
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": name},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer",
        }
        for name in (CLASS, TINY_CLASS)
    ]
    cluster.apply(classes)
    names = []
    for index in range(5):
        tiny = index == 4
        folder = HOST_ROOT / ns / ("tiny" if tiny else f"pv-{index}")
        folder.mkdir(parents=True, exist_ok=True)
        if tiny:
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0777", "tmpfs", str(folder)],
                check=True,
            )
        folder.chmod(0o777)
        name = f"{ns}-{'tiny' if tiny else index}"
        names.append(name)
        cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": name},
                "spec": {
                    "capacity": {"storage": "1Mi" if tiny else "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": TINY_CLASS if tiny else CLASS,
                    "local": {"path": str(folder)},
                    "nodeAffinity": {
                        "required": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": "kubernetes.io/hostname",
                                            "operator": "In",
                                            "values": [node.NODE_NAME],
                                        }
                                    ]
                                }
                            ]
                        }
                    },
                },
            }
        )
    return names


def _hub(cluster: ClusterHandle, ns: str) -> str:
    svc = cluster.kubectl_json("get", "service", "hub", "-n", ns)
    return f"http://{svc['spec']['clusterIP']}:8080"


def _stats(cluster: ClusterHandle, ns: str) -> dict[str, Any]:
    got: dict[str, Any] = httpx.get(f"{_hub(cluster, ns)}/_stats", timeout=10).json()
    return got


def _weights_served(stats: dict[str, Any]) -> int:
    served: int = stats["bytesServed"].get("tiny/llama", {}).get(MODEL_FILE, 0)
    return served


def _weight_gets(stats: dict[str, Any]) -> int:
    return sum(
        r["count"] for r in stats["requests"]
        if r["method"] == "GET" and r["repo"] == "tiny/llama" and r["file"] == MODEL_FILE
    )  # fmt: skip


def _print_other_pods(cluster: ClusterHandle, ns: str, pods: list[dict[str, Any]]) -> None:
    """How each pod that no longer runs ended, and the end of its log."""
    for pod in pods:
        name = pod["metadata"]["name"]
        states = [c.get("state") for c in pod["status"].get("containerStatuses") or []]
        log = cluster.kubectl("logs", name, "-n", ns, "--tail=20", check=False).stdout
        deleting = bool(pod["metadata"].get("deletionTimestamp"))
        phase = pod["status"].get("phase")
        print(f"earlier download pod {name}: phase {phase}, deleting {deleting}, {states}\n{log}")


def _control(cluster: ClusterHandle, ns: str, what: str) -> None:
    httpx.post(f"{_hub(cluster, ns)}/{what}", timeout=10).raise_for_status()


def _cache(
    name: str, repo: str = "tiny/llama", *, revision: str = "main", tiny: bool = False, **hub: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "inference.vllm-operator.dev/v1alpha1",
        "kind": "ModelCache",
        "metadata": {"name": name},
        "spec": {
            "source": {
                "huggingFace": {
                    "repo": repo,
                    "revision": revision,
                    "endpoint": "http://hub:8080",
                    **hub,
                }
            },
            "storage": {
                "storageClassName": TINY_CLASS if tiny else CLASS,
                "size": "1Mi" if tiny else "64Mi",
            },
        },
    }


def _get(cluster: ClusterHandle, ns: str, kind: str, name: str) -> dict[str, Any]:
    got: dict[str, Any] = cluster.kubectl_json("get", kind, name, "-n", ns)
    return got


def _wait_reason(
    cluster: ClusterHandle, ns: str, kind: str, name: str, reason: str
) -> dict[str, Any]:
    wait_until(
        f"{kind} {name} reason {reason}",
        lambda: condition(_get(cluster, ns, kind, name), "Ready").get("reason") == reason,
        240,
    )
    return _get(cluster, ns, kind, name)


def _service(name: str, source: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["model"]["source"] = source
    # Any Hub request the server makes goes to the stand-in, where it is counted.
    doc["spec"]["podTemplate"] = {"env": [{"name": "HF_ENDPOINT", "value": "http://hub:8080"}]}
    doc["spec"]["warmup"]["enabled"] = False
    return doc


def _hub_requests(cluster: ClusterHandle, ns: str) -> int:
    return int(_stats(cluster, ns)["totalRequests"])


def _roll(cluster: ClusterHandle, ns: str, name: str, value: str) -> None:
    """A rollout: a pod template change (an annotation) that replaces the pod."""
    patch = {"spec": {"podTemplate": {"annotations": {"e2e/rollout": value}}}}
    cluster.kubectl("patch", "vis", name, "-n", ns, "--type=merge", "-p", yaml.safe_dump(patch))
    wait_until(
        f"{name} rolled out ({value})",
        lambda: (
            _get(cluster, ns, "deployment", name)["spec"]["template"]["metadata"]
            .get("annotations", {})
            .get("e2e/rollout")
            == value
        ),
        60,
    )
    cluster.kubectl("rollout", "status", f"deployment/{name}", "-n", ns, "--timeout=420s",
                    timeout=430)  # fmt: skip
    cluster.kubectl("wait", "--for=condition=Ready", f"vis/{name}", "-n", ns, "--timeout=300s",
                    timeout=310)  # fmt: skip


def test_a_cache_downloads_and_resumes_after_its_pod_is_killed(
    cluster: ClusterHandle, cache_ns: str
) -> None:
    ns = cache_ns
    # Slow enough to catch the Job mid-file: 2.9 MB at 200 kB/s is ~15 s.
    _control(cluster, ns, "_throttle?bytesPerSecond=200000")
    _control(cluster, ns, "_reset")
    cluster.apply(_cache("tiny"), namespace=ns)

    # Progress in status, then the Job's pod killed mid-file.
    def mid_file() -> bool:
        st = _get(cluster, ns, "modelcache", "tiny").get("status", {})
        done, total = st.get("bytesDownloaded") or 0, st.get("bytesTotal") or 0
        return st.get("phase") == "Downloading" and total > 0 and total * 0.1 < done < total * 0.7

    deadline = time.monotonic() + 240
    while not mid_file():
        assert time.monotonic() < deadline, "the download was never seen mid-file"
        time.sleep(0.5)
    during = _get(cluster, ns, "modelcache", "tiny")["status"]
    print(f"mid-download status: {during['bytesDownloaded']} of {during['bytesTotal']} bytes")
    assert "%" in condition(_get(cluster, ns, "modelcache", "tiny"), "Ready")["message"]
    pods = cluster.kubectl_json(
        "get", "pods", "-n", ns, "-l", "batch.kubernetes.io/job-name=tiny-download"
    )["items"]
    running = [p for p in pods if p["status"].get("phase") == "Running"
               and not p["metadata"].get("deletionTimestamp")]  # fmt: skip
    # One pod, unless an earlier one failed and the Job replaced it (a transient failure the
    # Job's retries are for): what it said is printed, and the counts below start here.
    _print_other_pods(cluster, ns, [p for p in pods if p not in running])
    [pod] = running
    failed_before = _get(cluster, ns, "job", "tiny-download")["status"].get("failed") or 0
    at_kill = _stats(cluster, ns)
    killed = time.monotonic()
    cluster.kubectl("delete", "pod", pod["metadata"]["name"], "-n", ns, "--wait=false")
    # SIGTERM stops the download (it is PID 1, where an unhandled SIGTERM is dropped and
    # the pod would download on through its 30 s grace period); the pod object goes once
    # it has stopped.
    name = pod["metadata"]["name"]
    wait_until(
        "the killed pod stopped",
        lambda: cluster.kubectl("get", "pod", name, "-n", ns, check=False).returncode != 0,
        60,
    )
    print(f"the killed pod was gone {time.monotonic() - killed:.1f} s after its deletion")
    cache = _wait_reason(cluster, ns, "modelcache", "tiny", "Downloaded")
    st = cache["status"]
    stats = _stats(cluster, ns)
    served = _weights_served(stats) - _weights_served(at_kill)
    gets = _weight_gets(stats) - _weight_gets(at_kill)
    size = next(
        f["size"] for f in httpx.get(
            f"{_hub(cluster, ns)}/api/models/tiny/llama?blobs=true", timeout=10
        ).json()["siblings"] if f["rfilename"] == MODEL_FILE
    )  # fmt: skip
    print(
        f"resumed download: {served} bytes of {MODEL_FILE} served after the kill for a "
        f"{size}-byte file ({_weights_served(stats)} in all); commit {st['commit']}, "
        f"{st['bytesTotal']} bytes in {st['filesTotal']} files"
    )
    # One fetch of the weights after the kill, of less than the file: the replacement
    # resumed (none would mean the killed pod finished the file in its grace period).
    assert gets == 1, stats["requests"]
    assert served < size, "the replacement pod started the file over"
    assert st["bytesDownloaded"] == st["bytesTotal"]
    assert st["claimName"] == "tiny-weights"
    assert cache["metadata"]["finalizers"] == ["inference.vllm-operator.dev/model-cache-in-use"]
    job = _get(cluster, ns, "job", "tiny-download")["status"]
    assert (job.get("failed"), job.get("succeeded")) == (failed_before + 1, 1), job
    _control(cluster, ns, "_throttle?bytesPerSecond=0")


def test_two_services_share_the_cache_without_asking_the_hub(
    cluster: ClusterHandle, cache_ns: str
) -> None:
    """Runs after the test above, on the cache it filled."""
    ns = cache_ns
    size = next(
        f["size"] for f in httpx.get(
            f"{_hub(cluster, ns)}/api/models/tiny/llama?blobs=true", timeout=10
        ).json()["siblings"] if f["rfilename"] == MODEL_FILE
    )  # fmt: skip
    _wait_reason(cluster, ns, "modelcache", "tiny", "Downloaded")
    # Two services share it; neither, nor a rollout of one, asks the Hub for anything.
    _control(cluster, ns, "_reset")
    for name in ("cached-a", "cached-b"):
        cluster.apply(_service(name, {"cache": {"name": "tiny"}}), namespace=ns)
    for name in ("cached-a", "cached-b"):
        cluster.kubectl("wait", "--for=condition=Ready", f"vis/{name}", "-n", ns,
                        "--timeout=480s", timeout=490)  # fmt: skip
    url = service_url(cluster, ns, "cached-a")
    # Ready is the pods'; the Service routes to them once its endpoints and kube-proxy's
    # rules catch up (CI met a refused connection right after Ready).
    wait_until("cached-a's Service answering", lambda: answers(f"{url}/health"), 60)
    answer = httpx.post(
        f"{url}/v1/completions",
        json={"model": "tiny-llama", "prompt": "The cache", "max_tokens": 4},
        timeout=60,
    )
    if answer.status_code != 200:  # the server's own account of it
        log = cluster.kubectl("logs", "deployment/cached-a", "-n", ns, "--tail=80", check=False)
        raise AssertionError(f"{answer.text}\n{log.stdout}{log.stderr}")
    deployment = _get(cluster, ns, "deployment", "cached-a")
    pod_spec = deployment["spec"]["template"]["spec"]
    assert pod_spec["containers"][0]["args"][0] == "/models/model"
    assert {
        "name": "model",
        "persistentVolumeClaim": {"claimName": "tiny-weights", "readOnly": True},
    } in pod_spec["volumes"]
    assert sorted(_get(cluster, ns, "modelcache", "tiny")["status"]["usedBy"]) == [
        "cached-a",
        "cached-b",
    ]
    # The node has two cores: one server goes before the other rolls out (a surge pod).
    cluster.kubectl("delete", "vis", "cached-b", "-n", ns, "--wait=true", "--timeout=120s")
    _roll(cluster, ns, "cached-a", "1")
    with_cache = _hub_requests(cluster, ns)
    print(f"Hub requests for two services and a rollout, served from the cache: {with_cache}")
    assert with_cache == 0

    # Deleting the cache waits for its last service, then takes the claim with it.
    cluster.kubectl("delete", "modelcache", "tiny", "-n", ns, "--wait=false")
    cache = _wait_reason(cluster, ns, "modelcache", "tiny", "InUse")
    assert cache["status"]["phase"] == "Deleting"
    assert "cached-a" in condition(cache, "Ready")["message"]
    assert (
        condition(_get(cluster, ns, "vis", "cached-a"), "Ready")["status"] == "True"
    )  # still serving
    cluster.kubectl("delete", "vis", "cached-a", "-n", ns, "--wait=true", "--timeout=120s")
    wait_until(
        "the cache and its claim gone",
        lambda: (
            cluster.kubectl("get", "modelcache", "tiny", "-n", ns, check=False).returncode != 0
            and cluster.kubectl("get", "pvc", "tiny-weights", "-n", ns, check=False).returncode != 0
        ),
        120,
    )

    # Without a cache: every pod start downloads, a rollout included.
    _control(cluster, ns, "_reset")
    cluster.apply(_service("direct", {"huggingFace": {"repo": "tiny/llama"}}), namespace=ns)
    cluster.kubectl("wait", "--for=condition=Ready", "vis/direct", "-n", ns,
                    "--timeout=480s", timeout=490)  # fmt: skip
    first = _stats(cluster, ns)
    _roll(cluster, ns, "direct", "1")
    second = _stats(cluster, ns)
    weights_first = first["bytesServed"].get("tiny/llama", {}).get(MODEL_FILE, 0)
    weights_both = second["bytesServed"].get("tiny/llama", {}).get(MODEL_FILE, 0)
    print(
        f"Hub requests without the cache: {first['totalRequests']} for the first pod, "
        f"{second['totalRequests']} after one rollout; weights served {weights_first} then "
        f"{weights_both} bytes"
    )
    print("requests after the rollout:", yaml.safe_dump(second["requests"]))
    assert first["totalRequests"] > 0 and weights_first >= size
    assert second["totalRequests"] > first["totalRequests"] and weights_both >= 2 * size
    cluster.kubectl("delete", "vis", "direct", "-n", ns, "--wait=true", "--timeout=120s")


def test_download_failures_stall_with_their_reason(cluster: ClusterHandle, cache_ns: str) -> None:
    ns = cache_ns
    _control(cluster, ns, "_throttle?bytesPerSecond=0")
    cluster.apply(
        [
            _cache("wrong-revision", revision="v9"),
            _cache("gated-no-token", "tiny/llama-gated"),
            _cache("full-volume", tiny=True),
        ],
        namespace=ns,
    )
    for name, reason in (
        ("wrong-revision", "RevisionNotFound"),
        ("gated-no-token", "Unauthorized"),
        ("full-volume", "OutOfSpace"),
    ):
        cache = _wait_reason(cluster, ns, "modelcache", name, reason)
        print(f"{name}: {reason}: {condition(cache, 'Ready')['message']}")
        assert cache["status"]["phase"] == "Failed"
        assert condition(cache, "Stalled")["status"] == "True"
        job = _get(cluster, ns, "job", f"{name}-download")
        # Failed at once: a permanent failure is not retried.
        assert job["status"].get("failed", 0) == 1, job["status"]
    # A service naming a failed cache stalls, and never rolls out.
    cluster.apply(_service("on-failed", {"cache": {"name": "gated-no-token"}}), namespace=ns)
    svc = _wait_reason(cluster, ns, "vis", "on-failed", "ModelCacheFailed")
    assert "Unauthorized" in condition(svc, "Ready")["message"]
    assert cluster.kubectl("get", "deployment", "on-failed", "-n", ns, check=False).returncode != 0
    cluster.kubectl("delete", "vis", "on-failed", "-n", ns, "--wait=true", "--timeout=60s")

    # The gated copy with the token: downloaded.
    cluster.kubectl("create", "secret", "generic", "hub-token", "-n", ns,
                    f"--from-literal=token={TOKEN}")  # fmt: skip
    cluster.apply(
        _cache("gated", "tiny/llama-gated", tokenSecretRef={"name": "hub-token"}), namespace=ns
    )
    cache = _wait_reason(cluster, ns, "modelcache", "gated", "Downloaded")
    job = _get(cluster, ns, "job", "gated-download")
    env = job["spec"]["template"]["spec"]["containers"][0].get("env", [])
    assert all(e["name"] != "HF_TOKEN" for e in env), "the token is a file, not a variable"
    for name in ("wrong-revision", "gated-no-token", "full-volume", "gated"):
        cluster.kubectl("delete", "modelcache", name, "-n", ns, "--wait=true", "--timeout=60s")
