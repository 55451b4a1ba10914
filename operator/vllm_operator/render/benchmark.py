"""The children of an InferenceBenchmark: its spec as a file, the load Job, and where the
Job leaves its full results.

The load Job runs ``vllm-operator bench`` against the target's Service, and it is also
the scale-down lock: its labels name the target, and the lock holds while the Job has not
finished (the chart's admission policy and the operator both read it so). The lock thus
goes away by itself the moment the load stops, even while the operator is down; deleting
the benchmark deletes the Job, and the lock with it.

The spec's dataset and trace (ConfigMap keys the user provides) are mounted into the Job
as files. Every request's data goes into the results ConfigMap, which the Job writes at
the end under a ServiceAccount of its own: its Role allows ``get``, ``update`` and
``patch`` of that one ConfigMap and nothing else. All of these are owned by the benchmark
and named after it, so they go with it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Final

from vllm_operator.constants import (
    KIND_INFERENCE_BENCHMARK,
    LABEL_BENCHMARK,
    LABEL_LOCK_TARGET,
    LABEL_SCALE_DOWN_LOCK,
    LABEL_SERVICE,
)
from vllm_operator.models import InferenceBenchmark
from vllm_operator.models.base import Manifest
from vllm_operator.render.meta import (
    controller_reference,
    job_labels,
    restricted_security_context,
)

SPEC_MOUNT: Final = "/etc/vllm-operator/benchmark"
# Not below SPEC_MOUNT: each input is a volume of its own.
DATASET_MOUNT: Final = "/etc/vllm-operator/dataset"
TRACE_MOUNT: Final = "/etc/vllm-operator/trace"
DATASET_FILE: Final = "dataset.jsonl"
TRACE_FILE: Final = "trace.jsonl"
# How long a finished load Job stays for the operator to collect its results; after that
# the TTL controller deletes it.
JOB_TTL_SECONDS: Final = 60


def spec_config_map_name(bench: InferenceBenchmark) -> str:
    return f"{bench.metadata.name[:50]}-spec"


def load_job_name(bench: InferenceBenchmark) -> str:
    return f"{bench.metadata.name[:50]}-load"


def results_config_map_name(bench: InferenceBenchmark) -> str:
    return f"{bench.metadata.name[:50]}-results"


def neighbour_job_name(bench: InferenceBenchmark) -> str:
    return f"{bench.metadata.name[:50]}-neighbour"


def load_identity_name(bench: InferenceBenchmark) -> str:
    """The load Job's ServiceAccount, and its Role and RoleBinding."""
    return f"{bench.metadata.name[:50]}-load"


def _labels(bench: InferenceBenchmark, component: str) -> dict[str, str]:
    return job_labels("vllm-benchmark", LABEL_BENCHMARK, bench.metadata.name, component)


def _owned_by_benchmark(bench: InferenceBenchmark) -> list[Manifest]:
    meta = bench.metadata
    return [controller_reference(KIND_INFERENCE_BENCHMARK, meta.name, meta.uid)]


def build_spec_config_map(bench: InferenceBenchmark) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": spec_config_map_name(bench),
            "namespace": bench.metadata.namespace,
            "labels": _labels(bench, "benchmark-spec"),
            "ownerReferences": _owned_by_benchmark(bench),
        },
        "data": {"spec.json": json.dumps(bench.spec.to_wire(), sort_keys=True)},
    }


def _meta(bench: InferenceBenchmark, name: str, component: str) -> Manifest:
    return {
        "name": name,
        "namespace": bench.metadata.namespace,
        "labels": _labels(bench, component),
        "ownerReferences": _owned_by_benchmark(bench),
    }


def build_results_config_map(bench: InferenceBenchmark) -> Manifest:
    """Empty: the load Job writes the data. The operator applies only metadata, so
    applying it again never takes the Job's data away."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(bench, results_config_map_name(bench), "benchmark-results"),
    }


def build_load_service_account(bench: InferenceBenchmark) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(bench, load_identity_name(bench), "benchmark-load"),
    }


def build_load_role(bench: InferenceBenchmark, restart_pods: Sequence[str] = ()) -> Manifest:
    """The load Job may read and write its results ConfigMap; for a chaos restart, evict
    the ``restart_pods`` (by name: it cannot list, read or delete pods); nothing else."""
    rules: list[Manifest] = [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [results_config_map_name(bench)],
            "verbs": ["get", "update", "patch"],
        }
    ]
    if restart_pods:
        rules.append(
            {
                "apiGroups": [""],
                "resources": ["pods/eviction"],
                "resourceNames": sorted(restart_pods),
                "verbs": ["create"],
            }
        )
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(bench, load_identity_name(bench), "benchmark-load"),
        "rules": rules,
    }


def build_load_role_binding(bench: InferenceBenchmark) -> Manifest:
    name = load_identity_name(bench)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(bench, name, "benchmark-load"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [
            {"kind": "ServiceAccount", "name": name, "namespace": bench.metadata.namespace}
        ],
    }


def _inputs(bench: InferenceBenchmark) -> tuple[list[str], list[Manifest], list[Manifest]]:
    """Arguments, mounts and volumes for the dataset and the trace the spec names: each
    ConfigMap key becomes one read-only file."""
    args: list[str] = []
    mounts: list[Manifest] = []
    volumes: list[Manifest] = []
    for volume, ref, mount, file, flag in (
        ("dataset", bench.spec.workload.dataset, DATASET_MOUNT, DATASET_FILE, "--dataset-file"),
        ("trace", bench.spec.arrival.trace, TRACE_MOUNT, TRACE_FILE, "--trace-file"),
    ):
        if ref is None:
            continue
        args += [flag, f"{mount}/{file}"]
        mounts.append({"name": volume, "mountPath": mount, "readOnly": True})
        volumes.append(
            {
                "name": volume,
                "configMap": {"name": ref.name, "items": [{"key": ref.key, "path": file}]},
            }
        )
    return args, mounts, volumes


def load_deadline_seconds(bench: InferenceBenchmark) -> int:
    """The load Job's ``activeDeadlineSeconds``: twice the levels' and the chaos runs'
    expected time, and ten minutes."""
    spec = bench.spec
    levels = (
        max(len(spec.sweep.rates_per_second), len(spec.sweep.concurrencies), 1)
        if spec.sweep
        else (spec.search.max_probes if spec.search else 1)
    )
    if spec.chaos is not None:
        # A plain run and a perturbed one per perturbation.
        chaos = spec.chaos
        levels += 2 * sum(
            p is not None for p in (chaos.network, chaos.noisy_neighbour, chaos.restart)
        )
    return int((spec.duration_seconds or 600) * levels * 2 + 600)


def build_neighbour_job(
    bench: InferenceBenchmark, *, image: str, node: Manifest, beside: Manifest
) -> Manifest:
    """The chaos phase's noisy neighbour (vllm_operator/bench/neighbour.py): a pod on the
    node ``node`` names (``{"name": ..., "tolerations": [...]}``), beside the target pod
    ``beside`` names (``{"name": ..., "qosClass": ...}``, which its report names), under the
    load Job's account, BestEffort unless the spec gives a CPU request, burning CPUs only
    while the load Job orders it to."""
    chaos = bench.spec.chaos
    assert chaos is not None and chaos.noisy_neighbour is not None
    deadline = load_deadline_seconds(bench)
    labels = _labels(bench, "benchmark-neighbour")
    container = {
        "name": "neighbour",
        "image": image,
        "command": ["vllm-operator", "noisy-neighbour"],
        "args": [
            "--config-map",
            results_config_map_name(bench),
            "--namespace",
            str(bench.metadata.namespace),
            "--cpu-share",
            f"{chaos.noisy_neighbour.cpu_share:g}",
            "--deadline-seconds",
            str(deadline),
            "--beside",
            str(beside["name"]),
            "--beside-qos",
            str(beside.get("qosClass") or ""),
        ],
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "securityContext": restricted_security_context(),
    }
    if chaos.noisy_neighbour.cpu_request is not None:
        container["resources"] = {"requests": {"cpu": chaos.noisy_neighbour.cpu_request}}
    return _job(
        bench,
        neighbour_job_name(bench),
        labels,
        labels,
        {
            # Beside the target pod: on its node, past the taints it tolerates.
            "nodeName": node["name"],
            "tolerations": node.get("tolerations") or [],
            "containers": [container],
        },
    )


def _job(
    bench: InferenceBenchmark,
    name: str,
    labels: dict[str, str],
    pod_labels: dict[str, str],
    pod: Manifest,
) -> Manifest:
    """A Job of the benchmark: run once, under the load Job's account (which may write
    the results ConfigMap and nothing else), within the load Job's deadline."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": bench.metadata.namespace,
            "labels": labels,
            "ownerReferences": _owned_by_benchmark(bench),
        },
        "spec": {
            # A benchmark is not retried: a second run would measure something else.
            "backoffLimit": 0,
            "activeDeadlineSeconds": load_deadline_seconds(bench),
            "ttlSecondsAfterFinished": JOB_TTL_SECONDS,
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": load_identity_name(bench),
                    "automountServiceAccountToken": True,
                    "enableServiceLinks": False,
                    **pod,
                },
            },
        },
    }


def build_load_job(
    bench: InferenceBenchmark,
    *,
    image: str,
    resources: Manifest,
    endpoint: str,
    model: str,
    metrics_urls: Sequence[str] = (),
    restart_pods: Sequence[str] = (),
) -> Manifest:
    """The Job that sends the load; it reports the headline results as its termination
    message and writes every request into the results ConfigMap. ``resources`` are its
    container's (the operator's setting); ``metrics_urls`` the target pods' /metrics it
    reads through every level; ``restart_pods`` the pods a chaos restart may evict."""
    spec = bench.spec
    extra: list[str] = []
    for url in metrics_urls:
        extra += ["--metrics-url", url]
    if restart_pods:
        for pod in restart_pods:
            extra += ["--restart-pod", pod]
        extra += ["--restart-namespace", str(bench.metadata.namespace)]
    if spec.chaos is not None and spec.chaos.noisy_neighbour is not None:
        extra += ["--neighbour-config-map", results_config_map_name(bench)]
        extra += ["--neighbour-namespace", str(bench.metadata.namespace)]
    input_args, input_mounts, input_volumes = _inputs(bench)
    container = {
        "name": "load",
        "image": image,
        "command": ["vllm-operator", "bench"],
        "args": [
            "--spec-file",
            f"{SPEC_MOUNT}/spec.json",
            "--endpoint",
            endpoint,
            "--model",
            model,
            "--output-dir",
            "/tmp/results",
            "--no-progress",
            "--termination-log",
            "/dev/termination-log",
            "--results-config-map",
            results_config_map_name(bench),
            "--results-namespace",
            str(bench.metadata.namespace),
            *input_args,
            *extra,
        ],
        "volumeMounts": [
            {"name": "spec", "mountPath": SPEC_MOUNT, "readOnly": True},
            *input_mounts,
            {"name": "results", "mountPath": "/tmp"},
        ],
        "resources": resources,
        "terminationMessagePolicy": "File",
        "securityContext": restricted_security_context(),
    }
    labels = _labels(bench, "benchmark-load")
    lock = {LABEL_SCALE_DOWN_LOCK: "true", LABEL_LOCK_TARGET: bench.spec.target_ref.name}
    return _job(
        bench,
        load_job_name(bench),
        {**labels, **lock},
        labels,
        {
            # Its own CPU where the cluster has one: a load client on the target's node
            # shares its cores, and lags its schedule with the server's load.
            "affinity": {
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 100,
                            "podAffinityTerm": {
                                "labelSelector": {
                                    "matchLabels": {LABEL_SERVICE: bench.spec.target_ref.name}
                                },
                                "topologyKey": "kubernetes.io/hostname",
                            },
                        }
                    ]
                }
            },
            "containers": [container],
            "volumes": [
                {"name": "spec", "configMap": {"name": spec_config_map_name(bench)}},
                *input_volumes,
                {"name": "results", "emptyDir": {}},
            ],
        },
    )
