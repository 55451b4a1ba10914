"""The Deployment that runs vLLM's OpenAI-compatible server for an InferenceService.

The pod carries everything a tuned vLLM pod needs: the planned arguments, /dev/shm as a
memory-backed volume counted in the memory limit, GPUs and placement by product and
interconnect, optional exclusive cores, a startup budget derived from the model, the
warmup readiness gate, and a drain on termination so rollouts and scale-down don't cut
streaming responses.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from typing import Final

from vllm_operator.constants import (
    ADAPTER_MOUNT,
    ANNOTATION_TEMPLATE_HASH,
    CACHE_MOUNT,
    GPU_RESOURCE,
    HOME_DIR,
    MODEL_MOUNT,
    NODE_LABEL_GPU_INTERCONNECT,
    NODE_LABEL_GPU_PRODUCT,
    SHM_MOUNT,
    TMP_MOUNT,
    WARMED_UP_CONDITION,
)
from vllm_operator.models import InferenceService
from vllm_operator.models.base import Manifest, SecretKeyReference
from vllm_operator.models.inference_service import EffectiveTuning, PlannedPod, ResolvedRollout
from vllm_operator.models.quantity import format_mebibytes, to_bytes
from vllm_operator.releases.arguments import arguments_for, release_flags
from vllm_operator.releases.version import TESTED_VERSION, Version
from vllm_operator.render.adapters import adapter_claims
from vllm_operator.render.meta import (
    SERVER_PORT,
    SERVER_PORT_NAME,
    child_metadata,
    common_labels,
    deployment_name,
    restricted_security_context,
    selector_labels,
)

CONTAINER: Final = "vllm"
DEFAULT_SHM: Final = "2Gi"
DEFAULT_CPUS: Final = 4
DEFAULT_MEMORY: Final = "16Gi"
DEFAULT_STARTUP_SECONDS: Final = 900
STARTUP_PERIOD_SECONDS: Final = 10
# Endpoints controllers and proxies need a moment to stop sending to a terminating pod.
PRESTOP_DELAY_SECONDS: Final = 5
# vLLM's --shutdown-timeout: how long in-flight requests may finish after SIGTERM.
DRAIN_SECONDS: Final = 60
# The Deployment's rolling update of each strategy (spec.rollout; Auto resolves to one).
ROLLING_UPDATES: Final[dict[ResolvedRollout, dict[str, int]]] = {
    # One extra replica at a time: never fewer than the desired count serving.
    "Surge": {"maxSurge": 1, "maxUnavailable": 0},
    # One replica stopped first: no spare room needed.
    "Replace": {"maxSurge": 0, "maxUnavailable": 1},
}


def template_hash(template: Manifest) -> str:
    """A digest of a rendered pod template (ANNOTATION_TEMPLATE_HASH)."""
    text = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def rollout_strategy(deployment: Manifest | None) -> ResolvedRollout | None:
    """The strategy a Deployment (rendered or live) rolls out with, None when neither."""
    update = ((deployment or {}).get("spec") or {}).get("strategy", {}).get("rollingUpdate")
    for name, wanted in ROLLING_UPDATES.items():
        if update is not None and all(str(update.get(k)) == str(v) for k, v in wanted.items()):
            return name
    return None


def with_strategy(deployment: Manifest, strategy: ResolvedRollout) -> Manifest:
    """``deployment`` (rendered) rolling out with ``strategy``."""
    changed = copy.deepcopy(deployment)
    changed["spec"]["strategy"] = {
        "type": "RollingUpdate",
        "rollingUpdate": dict(ROLLING_UPDATES[strategy]),
    }
    return changed


def served_model_name(isvc: InferenceService) -> str:
    return isvc.spec.model.name or isvc.metadata.name


def model_reference(isvc: InferenceService) -> str:
    """What vLLM loads: a repo id or a local folder."""
    source = isvc.spec.model.source
    if source.hugging_face is not None:
        return source.hugging_face.repo
    if source.pvc is not None:
        return (
            MODEL_MOUNT + "/" + source.pvc.path.strip("/")
            if source.pvc.path != "/"
            else MODEL_MOUNT
        )
    assert source.image is not None  # the model validator guarantees exactly one
    return source.image.path


def gpus_per_replica(tuning: EffectiveTuning) -> int:
    """GPUs of each replica: the plan's (the planner fills it in, Tuner and SpecOnly
    alike; the 1 is for a hand-built EffectiveTuning without it)."""
    return tuning.gpus_per_replica if tuning.gpus_per_replica is not None else 1


def vllm_args(isvc: InferenceService, tuning: EffectiveTuning) -> list[str]:
    """The server's command-line arguments: what the operator owns, then the plan."""
    args = [
        model_reference(isvc),
        "--host",
        "0.0.0.0",
        "--port",
        str(SERVER_PORT),
        "--served-model-name",
        served_model_name(isvc),
    ]
    hf = isvc.spec.model.source.hugging_face
    if hf is not None:
        args += ["--revision", hf.revision]
    return args + release_flags(tuning.arguments, tuning.vllm_version)


def _drain_flags(tuning: EffectiveTuning) -> list[str]:
    """``--shutdown-timeout`` for the releases that have it (0.18 and newer): in-flight
    requests finish after SIGTERM. Older releases reject the flag; they get none."""
    version = Version.parse(tuning.vllm_version or "") or TESTED_VERSION
    arguments = arguments_for(version).arguments
    if arguments is None or arguments.get("shutdown-timeout") is None:
        return []
    return ["--shutdown-timeout", str(DRAIN_SECONDS)]


def _env(
    isvc: InferenceService, tuning: EffectiveTuning, pod: PlannedPod, cpus: int
) -> list[Manifest]:
    """The operator's variables, then the plan's (NCCL_P2P_DISABLE where peer-to-peer
    hangs, ...), then the user's spec.podTemplate.env, each later one winning a name."""
    env: list[Manifest] = [
        # The root filesystem is read-only: vLLM's and its libraries' dot-folders (usage
        # stats, Triton's cache) go under the cache volume.
        {"name": "HOME", "value": HOME_DIR},
        {"name": "VLLM_CACHE_ROOT", "value": f"{CACHE_MOUNT}/vllm"},
        {"name": "HF_HOME", "value": f"{CACHE_MOUNT}/huggingface"},
    ]
    token = hf_token_ref(isvc)
    if token is not None:
        env.append(
            {
                "name": "HF_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": token.name, "key": token.key}},
            }
        )
    if pod.cpu_pinning:
        # Thread pools sized to the exclusive cores; more threads than cores only contend.
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_RS_NUM_CPUS"):
            env.append({"name": name, "value": str(cpus)})
        env.append({"name": "TOKENIZERS_PARALLELISM", "value": "true"})
    planned = [{"name": e.name, "value": e.value} for e in tuning.environment]
    user = [e.to_wire() for e in isvc.spec.pod_template.env]
    later = {e["name"] for e in planned} | {e["name"] for e in user}
    user_names = {e["name"] for e in user}
    return (
        [e for e in env if e["name"] not in later]
        + [e for e in planned if e["name"] not in user_names]
        + user
    )


def hf_token_ref(isvc: InferenceService) -> SecretKeyReference | None:
    """The one Hub token of the server: the model's, else its Hub adapters' (the models
    refuse two different ones)."""
    hf = isvc.spec.model.source.hugging_face
    if hf is not None and hf.token_secret_ref is not None:
        return hf.token_secret_ref
    for adapter in isvc.spec.adapters:
        source = adapter.source.hugging_face
        if source is not None and source.token_secret_ref is not None:
            return source.token_secret_ref
    return None


def _with_extra_resources(resources: Manifest, isvc: InferenceService) -> Manifest:
    """The planned requests and limits, with spec.podTemplate.resources' others added (the
    models refuse cpu, memory and GPUs there: those come from spec.node and spec.gpu)."""
    extra = isvc.spec.pod_template.resources
    for part in ("requests", "limits"):
        given = getattr(extra, part)
        if given:
            resources[part] = {**resources.get(part, {}), **given}
    return resources


def _resources(pod: PlannedPod, gpus: int, cpus: int) -> Manifest:
    memory = to_bytes(pod.memory or DEFAULT_MEMORY)
    shm = to_bytes(pod.shm_size or DEFAULT_SHM)
    # A memory-backed emptyDir is charged to the pod's memory cgroup: the limit must hold
    # the process's memory and /dev/shm together, or NCCL's buffers get the pod OOM-killed.
    limit = format_mebibytes(memory + shm)
    requests: Manifest = {"cpu": str(cpus), "memory": format_mebibytes(memory)}
    if pod.cache_size:
        # The node disk the downloaded weights fill (the cache volume is an emptyDir).
        requests["ephemeral-storage"] = pod.cache_size
    limits: Manifest = {"memory": limit}
    if pod.cpu_pinning:
        # Guaranteed QoS with integer CPUs: the kubelet's static CPU manager then gives
        # the container exclusive cores.
        requests["memory"] = limit
        limits["cpu"] = str(cpus)
    if gpus:
        requests[GPU_RESOURCE] = str(gpus)
        limits[GPU_RESOURCE] = str(gpus)
    return {"requests": requests, "limits": limits}


def _affinity(isvc: InferenceService, pod: PlannedPod) -> Manifest | None:
    expressions: list[Manifest] = []
    if isvc.spec.gpu.products:
        expressions.append(
            {"key": NODE_LABEL_GPU_PRODUCT, "operator": "In", "values": isvc.spec.gpu.products}
        )
    if pod.interconnect is not None:
        expressions.append(
            {
                "key": NODE_LABEL_GPU_INTERCONNECT,
                "operator": "In",
                "values": [pod.interconnect.lower()],
            }
        )
    given = isvc.spec.pod_template.affinity
    affinity: Manifest = copy.deepcopy(given.to_wire()) if given is not None else {}
    if expressions:
        # Node terms are ORed: the operator's rules go into each of the user's terms, so
        # every way of scheduling the pod still lands on a matching GPU node.
        node = affinity.setdefault("nodeAffinity", {})
        required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
        terms = required.get("nodeSelectorTerms") or [{}]
        required["nodeSelectorTerms"] = [
            {
                **term,
                "matchExpressions": [
                    *(term.get("matchExpressions") or []),
                    *copy.deepcopy(expressions),
                ],
            }
            for term in terms
        ]
    return affinity or None


def _spread(isvc: InferenceService) -> list[Manifest]:
    """The topology spread constraints; one that names no pods counts this service's."""
    spread = []
    for constraint in isvc.spec.pod_template.topology_spread_constraints:
        wire = constraint.to_wire()
        wire.setdefault("labelSelector", {"matchLabels": selector_labels(isvc)})
        spread.append(wire)
    return spread


def _probe(path: str, *, period: int, timeout: int, failures: int) -> Manifest:
    return {
        "httpGet": {"path": path, "port": SERVER_PORT_NAME},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _volumes(isvc: InferenceService, pod: PlannedPod) -> tuple[list[Manifest], list[Manifest]]:
    volumes: list[Manifest] = [
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": pod.shm_size or DEFAULT_SHM}},
        # Survives container restarts, so a crashed server reuses its compile cache (and
        # the downloaded weights); sized by the plan when the weights are downloaded.
        {"name": "cache", "emptyDir": {"sizeLimit": pod.cache_size} if pod.cache_size else {}},
        # The root filesystem is read-only: ZMQ's sockets and compile caches go here.
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts: list[Manifest] = [
        {"name": "shm", "mountPath": SHM_MOUNT},
        {"name": "cache", "mountPath": CACHE_MOUNT},
        {"name": "tmp", "mountPath": TMP_MOUNT},
    ]
    pvc = isvc.spec.model.source.pvc
    if pvc is not None:
        volumes.append(
            {
                "name": "model",
                "persistentVolumeClaim": {"claimName": pvc.claim_name, "readOnly": True},
            }
        )
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
    for index, claim in enumerate(adapter_claims(isvc)):
        volumes.append(
            {
                "name": f"adapters-{index}",
                "persistentVolumeClaim": {"claimName": claim, "readOnly": True},
            }
        )
        mounts.append(
            {"name": f"adapters-{index}", "mountPath": f"{ADAPTER_MOUNT}/{claim}", "readOnly": True}
        )
    overlay = isvc.spec.pod_template
    volumes += [dict(v) for v in overlay.volumes]
    mounts += [m.to_wire() for m in overlay.volume_mounts]
    return volumes, mounts


def build_deployment(
    isvc: InferenceService,
    tuning: EffectiveTuning,
    *,
    image: str,
    replicas: int,
    strategy: ResolvedRollout = "Surge",
) -> Manifest:
    """The vLLM Deployment for ``isvc`` under the plan ``tuning``.

    ``image`` is the spec's image or the operator's default; ``replicas`` is what the
    reconcile decided (the spec's, held up while a benchmark runs); ``strategy``: how a
    change of the template rolls out (spec.rollout, Auto resolved by the reconcile).
    """
    pod = tuning.pod or PlannedPod()
    gpus = gpus_per_replica(tuning)
    cpus = pod.cpus or isvc.spec.node.cpus or DEFAULT_CPUS
    startup = pod.startup_seconds or DEFAULT_STARTUP_SECONDS
    overlay = isvc.spec.pod_template
    volumes, mounts = _volumes(isvc, pod)

    container: Manifest = {
        "name": CONTAINER,
        "image": image,
        "command": ["vllm", "serve"],
        "args": [*vllm_args(isvc, tuning), *_drain_flags(tuning)],
        "ports": [{"name": SERVER_PORT_NAME, "containerPort": SERVER_PORT, "protocol": "TCP"}],
        "env": _env(isvc, tuning, pod, cpus),
        "resources": _with_extra_resources(_resources(pod, gpus, cpus), isvc),
        "volumeMounts": mounts,
        "startupProbe": _probe(
            "/health",
            period=STARTUP_PERIOD_SECONDS,
            timeout=5,
            failures=max(3, math.ceil(startup / STARTUP_PERIOD_SECONDS)),
        ),
        "readinessProbe": _probe("/health", period=5, timeout=5, failures=3),
        "livenessProbe": _probe("/health", period=15, timeout=10, failures=4),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_DELAY_SECONDS)]}}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # Restricted Pod Security; a key of spec.podTemplate.containerSecurityContext
        # replaces the operator's.
        "securityContext": {
            **restricted_security_context(),
            **(overlay.container_security_context or {}),
        },
    }

    tolerations = [t.to_wire() for t in overlay.tolerations]
    if gpus and not any(t.get("key") == GPU_RESOURCE for t in tolerations):
        # GPU nodes are commonly tainted nvidia.com/gpu:NoSchedule to keep others off.
        tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})

    pod_spec: Manifest = {
        "containers": [container],
        "volumes": volumes,
        "tolerations": tolerations,
        "terminationGracePeriodSeconds": PRESTOP_DELAY_SECONDS + DRAIN_SECONDS + 15,
        "enableServiceLinks": False,
    }
    if overlay.node_selector:
        pod_spec["nodeSelector"] = dict(overlay.node_selector)
    affinity = _affinity(isvc, pod)
    if affinity is not None:
        pod_spec["affinity"] = affinity
    if overlay.priority_class_name:
        pod_spec["priorityClassName"] = overlay.priority_class_name
    if overlay.service_account_name:
        pod_spec["serviceAccountName"] = overlay.service_account_name
    else:
        # vLLM never calls the API: no token, unless the user names an account (whose own
        # automountServiceAccountToken then decides).
        pod_spec["automountServiceAccountToken"] = False
    if overlay.runtime_class_name:
        pod_spec["runtimeClassName"] = overlay.runtime_class_name
    if overlay.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s.name} for s in overlay.image_pull_secrets]
    spread = _spread(isvc)
    if spread:
        pod_spec["topologySpreadConstraints"] = spread
    if isvc.spec.warmup.enabled:
        pod_spec["readinessGates"] = [{"conditionType": WARMED_UP_CONDITION}]

    pod_labels = {**overlay.labels, **common_labels(isvc, "server")}
    pod_annotations = {
        **overlay.annotations,
        "kubectl.kubernetes.io/default-container": CONTAINER,
    }
    template = {
        "metadata": {"labels": pod_labels, "annotations": pod_annotations},
        "spec": pod_spec,
    }
    metadata = child_metadata(isvc, deployment_name(isvc), "server")
    metadata["annotations"] = {ANNOTATION_TEMPLATE_HASH: template_hash(template)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector_labels(isvc)},
            "revisionHistoryLimit": 3,
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": dict(ROLLING_UPDATES[strategy]),
            },
            "progressDeadlineSeconds": startup + 300,
            "template": template,
        },
    }
