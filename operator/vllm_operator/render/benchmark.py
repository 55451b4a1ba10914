"""The children of an InferenceBenchmark: its spec as a file, and the load Job.

The load Job runs ``vllm-operator bench`` against the target's Service, and it is also
the scale-down lock: its labels name the target, and the lock holds while the Job has not
finished (the chart's admission policy and the operator both read it so). The lock thus
goes away by itself the moment the load stops, even while the operator is down; deleting
the benchmark deletes the Job, and the lock with it.
"""

from __future__ import annotations

import json
from typing import Final

from vllm_operator.constants import (
    API_VERSION,
    KIND_INFERENCE_BENCHMARK,
    LABEL_BENCHMARK,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_LOCK_TARGET,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_SCALE_DOWN_LOCK,
)
from vllm_operator.models import InferenceBenchmark
from vllm_operator.render.meta import Manifest, restricted_security_context

SPEC_MOUNT: Final = "/etc/vllm-operator/benchmark"
# How long a finished load Job stays for the operator to collect its results; after that
# the TTL controller deletes it.
JOB_TTL_SECONDS: Final = 60


def spec_config_map_name(bench: InferenceBenchmark) -> str:
    return f"{bench.metadata.name[:50]}-spec"


def load_job_name(bench: InferenceBenchmark) -> str:
    return f"{bench.metadata.name[:50]}-load"


def _labels(bench: InferenceBenchmark, component: str) -> dict[str, str]:
    return {
        LABEL_NAME: "vllm-benchmark",
        LABEL_INSTANCE: bench.metadata.name,
        LABEL_COMPONENT: component,
        LABEL_MANAGED_BY: "vllm-operator",
        LABEL_BENCHMARK: bench.metadata.name,
    }


def _owned_by_benchmark(bench: InferenceBenchmark) -> list[Manifest]:
    if not bench.metadata.uid:
        raise ValueError(f"InferenceBenchmark {bench.metadata.name} has no uid yet")
    return [
        {
            "apiVersion": API_VERSION,
            "kind": KIND_INFERENCE_BENCHMARK,
            "name": bench.metadata.name,
            "uid": bench.metadata.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


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


def build_load_job(bench: InferenceBenchmark, *, image: str, endpoint: str, model: str) -> Manifest:
    """The Job that sends the load; it reports the results as its termination message."""
    seconds = (bench.spec.duration_seconds or 600) * (
        max(len(bench.spec.sweep.rates_per_second), len(bench.spec.sweep.concurrencies), 1)
        if bench.spec.sweep
        else (bench.spec.search.max_probes if bench.spec.search else 1)
    )
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
        ],
        "volumeMounts": [
            {"name": "spec", "mountPath": SPEC_MOUNT, "readOnly": True},
            {"name": "results", "mountPath": "/tmp"},
        ],
        "resources": {"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        "terminationMessagePolicy": "File",
        "securityContext": restricted_security_context(),
    }
    labels = _labels(bench, "benchmark-load")
    lock = {LABEL_SCALE_DOWN_LOCK: "true", LABEL_LOCK_TARGET: bench.spec.target_ref.name}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": load_job_name(bench),
            "namespace": bench.metadata.namespace,
            "labels": {**labels, **lock},
            "ownerReferences": _owned_by_benchmark(bench),
        },
        "spec": {
            # A benchmark is not retried: a second run would measure something else.
            "backoffLimit": 0,
            "activeDeadlineSeconds": int(seconds * 2 + 600),
            "ttlSecondsAfterFinished": JOB_TTL_SECONDS,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "containers": [container],
                    "volumes": [
                        {"name": "spec", "configMap": {"name": spec_config_map_name(bench)}},
                        {"name": "results", "emptyDir": {}},
                    ],
                },
            },
        },
    }
