"""``make dev``: the whole thing on this machine, in one command, in real containers.

Starts (or reuses) the local control plane with its real node (devenv/cluster/node.py),
builds (or reuses) the images, installs the operator **with its Helm chart, as a pod from
its own image**, applies the sample InferenceService and waits until it is Ready: its vLLM
runs in a container from the CPU serving image with exactly the arguments the operator
rendered, its warmup Job runs as a pod from the operator image and reaches vLLM through
the Service (CoreDNS, kube-proxy), and the readiness gate opens only after warmup.
Then it prints where each pod runs and one real chat completion sent to the Service's
ClusterIP. ``make cluster-down`` stops everything.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from devenv.cluster import node
from devenv.cluster.cluster import ClusterHandle, up
from devenv.cluster.processes import ClusterError
from devenv.cluster.settings import Settings
from vllm_operator.constants import LABEL_SERVICE as SERVICE_LABEL

REPO = Path(__file__).parents[1]
CHART = REPO / "charts" / "vllm-operator"
SAMPLE = REPO / "examples" / "dev-sample.yaml"
NAMESPACE = "dev"
OPERATOR_NAMESPACE = "vllm-operator-system"
RELEASE = "vllm-operator"


def _say(msg: str) -> None:
    print(f"[dev] {msg}", flush=True)


def install_operator(
    cluster: ClusterHandle,
    *,
    namespace: str = OPERATOR_NAMESPACE,
    release: str = RELEASE,
    extra_values: dict[str, Any] | None = None,
    timeout_s: int = 180,
) -> None:
    """The chart, installed as a user would, with the images built here: the operator runs
    as a pod on the real node (its namespace sends every pod there, under restricted Pod
    Security), and services that name no image get the CPU vLLM serving image."""
    if cluster.settings is None or not node.is_healthy(cluster.settings):
        raise ClusterError("the cluster runs no real node (VLLM_OP_REAL_NODE=0?)")
    # Images rebuilt since the node started (an edited operator, say) are imported first.
    built = node.ensure_images(cluster.settings)
    cluster.apply(node.real_node_namespace(namespace))
    repository, tag = built.operator.rsplit(":", 1)
    values: dict[str, Any] = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        # The CRDs are applied from crds/ (the cluster tests share them); the chart's own
        # copy is the same generated file.
        "crds": {"install": False},
        "operator": {"defaultImage": built.vllm, "resyncSeconds": 30},
    }
    for key, value in (extra_values or {}).items():
        values[key] = values.get(key, {}) | value if isinstance(value, dict) else value
    assert cluster.helm_path is not None
    values_file = (
        cluster.settings.state_dir if cluster.settings else REPO
    ) / f"{release}-values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    argv = [
        str(cluster.helm_path), "upgrade", "--install", release, str(CHART),
        "--namespace", namespace, "--values", str(values_file),
        "--wait", f"--timeout={timeout_s}s", f"--kubeconfig={cluster.kubeconfig}",
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=cluster.env())
    if proc.returncode != 0:
        raise ClusterError(f"helm install failed: {proc.stderr.strip()}")


def apply_crds(cluster: ClusterHandle) -> None:
    crds = str(REPO / "crds")
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", crds)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", crds)


def dev_up(timeout: int) -> int:
    settings = Settings.from_env()
    if not settings.real_node:
        print("[dev] make dev needs the real node (VLLM_OP_REAL_NODE is 0)", file=sys.stderr)
        return 2
    started = time.monotonic()
    cluster = up(settings)
    _say(
        f"cluster ready after {time.monotonic() - started:.1f} s; "
        f"export KUBECONFIG={cluster.kubeconfig}"
    )
    apply_crds(cluster)
    # The node has 2 cores and the sample requests one: a benchmark's load Job gets half of
    # the other (the chart's default, a whole CPU, would leave it Pending beside the sample).
    load = {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}
    install_operator(cluster, extra_values={"operator": {"loadResources": load}})
    _say(f"operator installed with the chart after {time.monotonic() - started:.1f} s")
    # The sample's namespace enforces restricted Pod Security: every pod the operator
    # renders (the vLLM server, its warmup Job, a benchmark's Jobs) passes it.
    cluster.apply(node.real_node_namespace(NAMESPACE))
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", str(SAMPLE))
    _say(f"applied {SAMPLE.relative_to(REPO)}; waiting for Ready")
    proc = cluster.kubectl(
        "wait", "--for=condition=Ready", "vis/tiny-chat", "-n", NAMESPACE,
        f"--timeout={timeout}s", timeout=timeout + 10, check=False,
    )  # fmt: skip
    for ns in (OPERATOR_NAMESPACE, NAMESPACE):
        print(cluster.kubectl("get", "pods", "-n", ns, "-o", "wide").stdout)
    if proc.returncode != 0:
        print(cluster.kubectl("describe", "vis", "tiny-chat", "-n", NAMESPACE).stdout)
        print(cluster.kubectl("get", "events", "-n", NAMESPACE).stdout)
        print("[dev] the sample did not become Ready", file=sys.stderr)
        return 1
    status = cluster.kubectl_json("get", "vis", "tiny-chat", "-n", NAMESPACE)["status"]
    _say("effective vLLM arguments:")
    for arg in status["tuning"]["arguments"]:
        print(f"  --{arg['name']}={arg['value']}  ({arg['source']}: {arg['reason']})")
    _say(
        f"tiny-chat is Ready after {time.monotonic() - started:.1f} s; "
        f"endpoint {status['endpoint']}"
    )
    warm = status.get("warmup") or {}
    _say(
        f"warmup: cold TTFT {warm.get('lastColdTtftMilliseconds')} ms, warm TTFT "
        f"{warm.get('lastWarmTtftMilliseconds')} ms"
    )
    show_placement(cluster)
    return chat(cluster)


def show_placement(cluster: ClusterHandle) -> None:
    """Where each pod runs, from which image, as which user."""
    for ns in (OPERATOR_NAMESPACE, NAMESPACE):
        for pod in cluster.kubectl_json("get", "pods", "-n", ns)["items"]:
            spec, st = pod["spec"], pod.get("status", {})
            for c, cs in zip(spec["containers"], st.get("containerStatuses", []), strict=False):
                _say(
                    f"{ns}/{pod['metadata']['name']}: node {spec.get('nodeName')}, phase "
                    f"{st.get('phase')}, image {c['image']}, "
                    f"container {cs.get('containerID', '')[:25]}"
                )


def service_url(cluster: ClusterHandle, namespace: str, name: str) -> str:
    """The ClusterIP URL of an InferenceService's Service (kube-proxy routes it)."""
    services = cluster.kubectl_json(
        "get", "services", "-n", namespace, "-l", f"{SERVICE_LABEL}={name}"
    )
    svc = services["items"][0]
    port = svc["spec"]["ports"][0]["port"]
    return f"http://{svc['spec']['clusterIP']}:{port}"


def answers(url: str) -> bool:
    """Whether ``url`` answers 200 now. A Service's ClusterIP refuses connections until the
    EndpointSlice controller has listed a Ready pod and kube-proxy has written its rules,
    which can lag the pod's (and so the InferenceService's) Ready condition by seconds on
    a loaded node: poll this before the first request through a new Service."""
    import httpx

    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def ttft_ms(url: str, prompt: str) -> float:
    """Milliseconds to the first streamed token of one chat completion at ``url``."""
    import httpx

    body = {
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 8,
        "stream": True,
    }
    start = time.perf_counter()
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                return (time.perf_counter() - start) * 1000
    raise RuntimeError(f"{url} streamed no token")


def chat(cluster: ClusterHandle) -> int:
    """The first requests after Ready, timed, then one real chat completion, through the
    sample's Service ClusterIP."""
    import httpx

    url = service_url(cluster, NAMESPACE, "tiny-chat") + "/v1/chat/completions"
    # A prompt of its own each, so no prefix-cache hit flatters the figures.
    first = ttft_ms(url, "The first question after Ready: how are you?")
    after = sorted(ttft_ms(url, f"Question {i} after Ready: how are you?") for i in range(5))
    _say(
        f"first request after Ready: TTFT {first:.0f} ms; the next 5: median "
        f"{after[2]:.0f} ms (range {after[0]:.0f}-{after[-1]:.0f} ms)"
    )
    body = {
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": "Say hello to the operator."}],
        "max_tokens": 24,
    }
    response = httpx.post(url, json=body, timeout=60)
    response.raise_for_status()
    answer: dict[str, Any] = response.json()
    _say(f"POST {url} (the Service's ClusterIP, through kube-proxy)")
    _say(
        f"answer ({answer['usage']['completion_tokens']} tokens; the weights are "
        f"random): {answer['choices'][0]['message']['content']!r}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devenv.dev", description=__doc__)
    parser.add_argument("action", choices=["up", "down"], nargs="?", default="up")
    parser.add_argument("--timeout", type=int, default=420, help="seconds to wait for Ready")
    args = parser.parse_args(argv)
    if args.action == "down":
        return 0  # the operator is a pod: `python -m devenv.cluster down` ends it with the rest
    return dev_up(args.timeout)


if __name__ == "__main__":
    sys.exit(main())
