"""The objects of a ModelCache: the claim the weights go on, and the Job that downloads
them from the Hub into it (``vllm-operator download``, in the operator's image).

The Job mounts the claim read-write at ``/cache`` and writes the model into
``/cache/model``; the services that use the cache mount the same claim read-only at the
model mount and serve from its ``model`` folder. The Job's container reports its progress
on an HTTP port (the operator reads ``/progress`` at the pod's IP) and its result as the
termination message; permanent failures (exit codes 10-14) fail the Job at once, other
failures and evicted or deleted pods are retried, and each retry resumes the files left
half-written.
"""

from __future__ import annotations

from typing import Final

from vllm_operator.constants import (
    DOWNLOAD_PERMANENT_EXIT_CODES,
    KIND_MODEL_CACHE,
    LABEL_MODEL_CACHE,
)
from vllm_operator.models.base import Manifest
from vllm_operator.models.model_cache import ModelCache
from vllm_operator.render.meta import (
    controller_reference,
    job_labels,
    restricted_security_context,
)

# Where the download Job mounts the claim, and the model's folder in it.
JOB_MOUNT: Final = "/cache"
MODEL_FOLDER: Final = "model"
PROGRESS_PORT: Final = 8090
# A failed download is retried this many times (each retry resumes); the permanent
# failures are not retried at all.
DOWNLOAD_RETRIES: Final = 6
DOWNLOAD_UID: Final = 65532


def claim_name(cache: ModelCache) -> str:
    """The claim holding the weights: the adopted one, or the one the operator creates."""
    pvc = cache.spec.source.pvc
    return pvc.claim_name if pvc is not None else f"{cache.metadata.name}-weights"


def model_path(cache: ModelCache) -> str:
    """The model's folder inside the claim, from its root ("/" for the root itself)."""
    pvc = cache.spec.source.pvc
    return pvc.path if pvc is not None else f"/{MODEL_FOLDER}"


def download_job_name(cache: ModelCache) -> str:
    return f"{cache.metadata.name}-download"


def cache_labels(cache: ModelCache, component: str) -> dict[str, str]:
    return job_labels("vllm-model-cache", LABEL_MODEL_CACHE, cache.metadata.name, component)


def _owned_by_cache(cache: ModelCache) -> list[Manifest]:
    meta = cache.metadata
    return [controller_reference(KIND_MODEL_CACHE, meta.name, meta.uid)]


def build_claim(cache: ModelCache, size: str, *, owned: bool = True) -> Manifest:
    """The claim for a huggingFace source, owned by the cache, so it goes with it. A cache
    with spec.storage.retain lets go of its claim as it is deleted (``owned=False``): the
    claim is created owned all the same, as the chart's admission policy wants of
    everything the operator creates."""
    storage = cache.spec.storage
    spec: Manifest = {
        "accessModes": list(storage.access_modes),
        "resources": {"requests": {"storage": size}},
        "volumeMode": "Filesystem",
    }
    if storage.storage_class_name is not None:
        spec["storageClassName"] = storage.storage_class_name
    metadata: Manifest = {
        "name": claim_name(cache),
        "namespace": cache.metadata.namespace,
        "labels": cache_labels(cache, "model-weights"),
    }
    if owned:
        metadata["ownerReferences"] = _owned_by_cache(cache)
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": spec}


def build_download_job(cache: ModelCache, *, image: str, resources: Manifest) -> Manifest:
    """The Job that fills the claim from the Hub (``resources``: the operator's setting for
    its Jobs)."""
    hub = cache.spec.source.hugging_face
    assert hub is not None  # only a huggingFace source is downloaded
    args = [
        "--repo",
        hub.repo,
        "--revision",
        hub.revision,
        "--dest",
        f"{JOB_MOUNT}/{MODEL_FOLDER}",
        "--progress-port",
        str(PROGRESS_PORT),
        "--termination-log",
        "/dev/termination-log",
    ]
    if hub.endpoint is not None:
        args += ["--endpoint", hub.endpoint]
    env: list[Manifest] = [{"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"}]
    mounts: list[Manifest] = [
        {"name": "weights", "mountPath": JOB_MOUNT},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes: list[Manifest] = [
        {"name": "weights", "persistentVolumeClaim": {"claimName": claim_name(cache)}},
        {"name": "tmp", "emptyDir": {}},
    ]
    if hub.token_secret_ref is not None:
        # A file, not a variable: nothing in the pod's spec or environment shows it.
        ref = hub.token_secret_ref
        volumes.append(
            {
                "name": "token",
                "secret": {
                    "secretName": ref.name,
                    "items": [{"key": ref.key, "path": "token"}],
                    "defaultMode": 0o440,
                },
            }
        )
        mounts.append({"name": "token", "mountPath": "/var/run/hub-token", "readOnly": True})
        args += ["--token-file", "/var/run/hub-token/token"]
    container: Manifest = {
        "name": "download",
        "image": image,
        "command": ["vllm-operator", "download"],
        "args": args,
        "env": env,
        "ports": [{"name": "progress", "containerPort": PROGRESS_PORT}],
        "volumeMounts": mounts,
        "resources": resources,
        "terminationMessagePolicy": "File",
        "securityContext": restricted_security_context(),
    }
    labels = cache_labels(cache, "model-download")
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": download_job_name(cache),
            "namespace": cache.metadata.namespace,
            "labels": labels,
            "ownerReferences": _owned_by_cache(cache),
        },
        "spec": {
            "backoffLimit": DOWNLOAD_RETRIES,
            "podFailurePolicy": {
                "rules": [
                    # A wrong repo, revision or token, a full volume, files that do not
                    # verify: another try would fail the same way.
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": "download",
                            "operator": "In",
                            "values": sorted(DOWNLOAD_PERMANENT_EXIT_CODES.values()),
                        },
                    },
                    # An evicted, preempted or deleted pod is not the download's fault.
                    {
                        "action": "Ignore",
                        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                    },
                ]
            },
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    # The claim's files belong to the Job's group, so it can write them.
                    "securityContext": {
                        "fsGroup": DOWNLOAD_UID,
                        "fsGroupChangePolicy": "OnRootMismatch",
                    },
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }
