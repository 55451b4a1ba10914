"""The cluster tier's framework: what its test modules share, in one place.

- waits and reads: a poll with a deadline (``wait_for``), the one status-condition lookup
  (``condition``), an object or list as JSON or None (``fetch``), a Service's ready
  addresses;
- namespaces: created with their ``default`` ServiceAccount (``create_namespace``) and
  quickly torn down (``delete_namespace``);
- object builders used by more than one module: the benchmark lock a test holds by hand
  (``lock_job``), the InferenceServices on kwok's fake GPUs (``gpu_isvc``) and on the
  real node's fault server (``fault_isvc``), a benchmark (``benchmark``);
- ``dump_diagnostics``: what a failed test leaves behind (conftest.py calls it).

What more than one test module builds or looks up belongs here, not in a test module that
the others import; conftest.py holds the fixtures.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from devenv.cluster.cluster import ClusterHandle
from devenv.cluster.components import COMPONENTS
from vllm_operator.models.conditions import manifest_condition

# Spelled out, not imported from the operator: a renamed label must fail the tests.
GROUP = "inference.vllm-operator.dev"


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    """Poll until ``predicate`` returns something truthy, and return it (the waits are on
    state, with a deadline; the pause between polls only spares the CPU)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def create_namespace(cluster: ClusterHandle, name: str, *, labels: dict[str, str]) -> None:
    """Create namespace ``name`` and wait for its ``default`` ServiceAccount: the
    ServiceAccount admission plugin refuses pods until it exists, which the
    controller-manager creates a moment after the namespace."""
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": labels},
        }
    )
    cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", name, "--timeout=60s")


def delete_namespace(
    cluster: ClusterHandle, name: str, *, wait_gone: bool = False, timeout: int = 120
) -> None:
    """Delete a test's namespace, its pods ended after a 1 s grace period.

    The namespace goes first: a terminating namespace admits no new pod, so no controller
    replaces the ones deleted next. They are deleted at once, not by the namespace
    controller (which starts 5 s after the deletion, a fixed delay upstream), so that they
    stop holding the CPU and GPUs the next test asks for; and with a 1 s grace period,
    since a teardown tests nothing: a vLLM pod's preStop sleep and drain, and python as
    PID 1 (which ignores SIGTERM), held each teardown for their whole grace period (up to
    58 s a test on the real node). ``wait_gone`` also waits for the namespace itself, for
    the fixtures that clean up beside it (volumes, mounts) once it is gone."""
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
    cluster.kubectl(
        "delete", "pods", "--all", "-n", name, "--grace-period=1", "--wait=true",
        f"--timeout={timeout}s", check=False, timeout=timeout + 10,
    )  # fmt: skip
    if wait_gone:
        cluster.kubectl(
            "wait", "--for=delete", f"namespace/{name}", f"--timeout={timeout}s",
            check=False, timeout=timeout + 10,
        )  # fmt: skip


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    """The condition of that type in ``obj``'s status, or {}."""
    return manifest_condition(obj or {}, type_) or {}


def lock_job(target: str) -> dict[str, Any]:
    """A benchmark's scale-down lock on service ``target``, as its load Job carries it.
    Suspended: no pod runs (kwok would complete it at once), and it never finishes, so the
    lock holds until the Job is deleted."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "lock",
            "labels": {
                f"{GROUP}/scale-down-lock": "true",
                f"{GROUP}/lock-target": target,
                f"{GROUP}/inference-benchmark": "lock",
            },
        },
        "spec": {
            "suspend": True,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "none"}],
                }
            },
        },
    }


def ready_addresses(slices: list[dict[str, Any]], service: str) -> list[str]:
    """The addresses the EndpointSlices of Service ``service`` list as ready (an unset
    ``ready`` reads as ready, as the API says)."""
    return [
        address
        for s in slices
        if s["metadata"]["labels"].get("kubernetes.io/service-name") == service
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready") is not False
        for address in e["addresses"]
    ]


# --------------------------------------------------------------------------- reads


def fetch(cluster: ClusterHandle, ns: str, *what: str) -> dict[str, Any] | None:
    """``kubectl get WHAT -n NS -o json``, parsed; None when kubectl fails (not found)."""
    proc = cluster.kubectl("get", *what, "-n", ns, "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    obj: dict[str, Any] = json.loads(proc.stdout)
    return obj


# --------------------------------------------------------------------------- builders

# The shape of the tiny Llama at /models/tiny-llama, given to the tuner in the spec.
TINY_ARCH = {
    "numLayers": 2,
    "hiddenSize": 256,
    "numAttentionHeads": 4,
    "numKeyValueHeads": 2,
    "headDim": 64,
    "intermediateSize": 512,
    "vocabSize": 512,
    "maxPositionEmbeddings": 2048,
}


def gpu_isvc(name: str, **spec: Any) -> dict[str, Any]:
    """An InferenceService of a small model on kwok's fake RTX 4090 nodes (no pod of it
    runs), warmup off, with ``spec`` merged in: the operator's scenarios."""
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {"source": {"huggingFace": {"repo": "Qwen/Qwen2.5-0.5B-Instruct"}}},
            "gpu": {"count": 1, "products": ["NVIDIA-GeForce-RTX-4090"]},
            "warmup": {"enabled": False},
        },
    }
    body["spec"].update(spec)
    return body


def fault_isvc(name: str, mode: str, image: str, **spec: Any) -> dict[str, Any]:
    """An InferenceService served on the real node by the fault-server ``image`` in
    ``mode`` (devenv/cluster/fault_server.py: ok, slow, fail, cpu), warmup on, with
    ``spec`` merged in."""
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {
                "name": "tiny-llama",
                "source": {"image": {"path": "/models/tiny-llama"}},
                "architecture": TINY_ARCH,
            },
            "image": image,
            # The real node's GPUs (its CPUs stand in), so the pods land there.
            "gpu": {"count": 1, "products": ["NVIDIA-L4"]},
            "node": {"cpus": 1, "memory": "256Mi", "shmSize": "64Mi"},
            "workload": {
                "promptTokens": {"type": "Uniform", "min": 16, "max": 128},
                "outputTokens": {"type": "Fixed", "value": 16},
                "peakConcurrency": 4,
            },
            "warmup": {"enabled": True, "timeoutSeconds": 120, "maxRetries": 0},
            "podTemplate": {"env": [{"name": "VLLM_FAULT_MODE", "value": mode}]},
        },
    }
    body["spec"].update(spec)
    return body


def benchmark(name: str, target: str, seconds: int) -> dict[str, Any]:
    """An InferenceBenchmark of ``target``: Poisson arrivals at 2/s for ``seconds``, 16
    prompt and 4 output tokens, streamed completions."""
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "InferenceBenchmark",
        "metadata": {"name": name},
        "spec": {
            "targetRef": {"name": target},
            "workload": {
                "promptTokens": {"type": "Fixed", "value": 16},
                "outputTokens": {"type": "Fixed", "value": 4},
            },
            "arrival": {"process": "Poisson", "ratePerSecond": 2},
            "durationSeconds": seconds,
            "endpoint": {"api": "Completions", "stream": True},
            "seed": 1,
        },
    }


# --------------------------------------------------------------------------- tuning

# The label on what an InferenceTuning creates (spelled out, as GROUP is).
TUNING_LABEL = f"{GROUP}/tuning"


def tuning_manifest(name: str, target: str, **spec: Any) -> dict[str, Any]:
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


def service_ready(cluster: ClusterHandle, ns: str, name: str, timeout: float = 180) -> None:
    wait_for(
        lambda: condition(fetch(cluster, ns, "vis", name), "Ready").get("status") == "True",
        f"{name} Ready",
        timeout=timeout,
    )


def tuning_status(cluster: ClusterHandle, ns: str, name: str) -> dict[str, Any]:
    return dict((fetch(cluster, ns, "inferencetuning", name) or {}).get("status") or {})


def tuning_ended(cluster: ClusterHandle, ns: str, name: str, timeout: float) -> dict[str, Any]:
    wait_for(
        lambda: tuning_status(cluster, ns, name).get("phase") in ("Succeeded", "Failed"),
        f"tuning {name} to end",
        timeout=timeout,
    )
    return tuning_status(cluster, ns, name)


def trial_of(status: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [t for t in status.get("trials", []) if t["name"] == name]
    return dict(found)


def measuring(cluster: ClusterHandle, ns: str, name: str) -> dict[str, Any] | None:
    for t in tuning_status(cluster, ns, name).get("trials", []):
        if t.get("state") == "Measuring":
            return dict(t)
    return None


def service_args(cluster: ClusterHandle, ns: str, service: str) -> list[str]:
    found = fetch(cluster, ns, "deployments", "-l", f"{GROUP}/inference-service={service}") or {}
    items = found.get("items", [])
    assert len(items) == 1, [d["metadata"]["name"] for d in items]
    return list(items[0]["spec"]["template"]["spec"]["containers"][0]["args"])


def flag_value(args: list[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == f"--{flag}" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(f"--{flag}="):
            return a.split("=", 1)[1]
    return None


def tuning_children(cluster: ClusterHandle, ns: str, tuning: str) -> list[str]:
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


def live_children(cluster: ClusterHandle, ns: str, tuning: str) -> list[str]:
    """What of a tuning's still runs or holds something: its trial services, their
    Deployments, and Jobs that have not finished (a load Job, an in-place lock). A run
    that ended keeps its benchmarks (and their finished Jobs) as its record, until the
    tuning is deleted."""
    left = [
        item
        for item in tuning_children(cluster, ns, tuning)
        if not item.startswith(("inferencebenchmarks/", "jobs/"))
    ]
    found = fetch(cluster, ns, "jobs") or {}
    for job in found.get("items", []):
        name = job["metadata"]["name"]
        labels = job["metadata"].get("labels") or {}
        mine = labels.get(TUNING_LABEL) == tuning or name.startswith(f"{tuning}-")
        done = any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
            for c in (job.get("status") or {}).get("conditions") or []
        )
        if mine and not done:
            left.append(f"jobs/{name}")
    return sorted(set(left))


def print_trials(status: dict[str, Any]) -> None:
    for t in status.get("trials", []):
        print(
            f"  {t['name']:16} {t.get('state', ''):12} predicted "
            f"{t.get('predictedGoodputPerSecond')} measured {t.get('measuredGoodputPerSecond')} "
            f"req/s; TTFT p99 {(t.get('ttft') or {}).get('p99')} ms; {t.get('reason', '')}"
        )
    print("  winner:", status.get("winner"), "spread:", status.get("spread"))


# --------------------------------------------------------------------------- diagnostics


def dump_diagnostics(
    cluster: ClusterHandle, request: pytest.FixtureRequest, *, namespace: str | None
) -> None:
    """Prints what a failed test leaves behind and writes it to a file as well."""
    sections: list[tuple[str, str]] = []

    def run(title: str, *args: str) -> None:
        proc = cluster.kubectl(*args, check=False, timeout=60)
        sections.append((title, (proc.stdout + proc.stderr).strip()))

    run("nodes", "get", "nodes", "-o", "wide", "--show-labels")
    if namespace:
        run(
            f"events in {namespace}",
            "get",
            "events",
            "-n",
            namespace,
            "--sort-by=.lastTimestamp",
            "-o",
            "wide",
        )
        kinds = cluster.kubectl(
            "api-resources", "--namespaced", "--verbs=list", "-o", "name", check=False
        ).stdout.split()
        kinds = [k for k in kinds if k not in ("events", "events.events.k8s.io")]
        if kinds:
            run(
                f"objects in {namespace}",
                "get",
                ",".join(kinds),
                "-n",
                namespace,
                "-o",
                "yaml",
                "--ignore-not-found",
            )
    if "chart_operator" in request.fixturenames:
        # The operator as the chart's pod: its own log (the namespace above is the test's).
        # Its level is debug: the lines that name the test's namespace, the last 150.
        operator = request.getfixturevalue("chart_operator")
        proc = cluster.kubectl(
            "logs", f"deployment/{operator.process.deployment}", "-n", operator.namespace,
            "--tail=5000", check=False, timeout=60,
        )  # fmt: skip
        lines = (proc.stdout + proc.stderr).splitlines()
        if namespace:
            lines = [line for line in lines if namespace in line]
        sections.append(("the operator pod's log", "\n".join(lines[-150:])))
        # A restart in the test (liveness, OOM) shows in its pods' states, its namespace's
        # events, and the log of the container before.
        for title, args in (
            ("the operator's pods", ("get", "pods", "-o", "wide")),
            ("events in the operator's namespace", ("get", "events", "--sort-by=.lastTimestamp")),
            ("the operator pod's previous log",
             ("logs", f"deployment/{operator.process.deployment}", "--previous", "--tail=80")),
        ):  # fmt: skip
            proc = cluster.kubectl(*args, "-n", operator.namespace, check=False, timeout=60)
            sections.append((title, (proc.stdout + proc.stderr)[-8000:]))
    if cluster.local and cluster.settings is not None:
        logs = cluster.settings.logs_dir
        for name in COMPONENTS:
            try:
                tail = (logs / f"{name}.log").read_text(errors="replace").splitlines()[-40:]
            except OSError:
                tail = ["(no log)"]
            sections.append((f"last lines of {name}.log", "\n".join(tail)))
    text = "\n".join(f"===== {title}\n{body}\n" for title, body in sections)
    print(f"\n##### diagnostics for {request.node.nodeid}\n{text}")
    if cluster.local and cluster.settings is not None:
        out = cluster.settings.logs_dir / "diagnostics"
        out.mkdir(parents=True, exist_ok=True)
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid)[-150:]
        (out / f"{stem}.txt").write_text(text)
