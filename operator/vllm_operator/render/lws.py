"""The LeaderWorkerSet that runs one vLLM instance over several nodes (a multi-node plan).

A multi-node plan (tuning/multinode.py) is one vLLM whose pipeline stages sit on
``--nnodes`` nodes. It runs as a LeaderWorkerSet (``leaderworkerset.x-k8s.io/v1``, LWS
v0.9.0 tested): a **group** is one instance, ``size`` pods (one per node: the leader and
``size - 1`` workers), and ``replicas`` counts groups, so the InferenceService's
``spec.replicas`` (and its scale subresource) means groups.

- **vLLM's own multi-node launch** (0.12 and newer; no Ray): every pod runs ``vllm serve``
  with the plan's arguments plus ``--node-rank``, ``--master-addr`` and
  ``--master-port``. The leader is rank 0 and serves the API; workers add
  ``--headless`` (engine processes only, no API server). LWS injects
  ``LWS_LEADER_ADDRESS`` (the leader's stable DNS name) and ``LWS_WORKER_INDEX`` (0 for
  the leader) into each container; Kubernetes expands ``$(VAR)`` in ``args`` from them.
- **One failure is the group's failure**: a vLLM instance cannot lose a stage, so
  ``restartPolicy: RecreateGroupOnPodRestart`` recreates every pod of a group when any
  of its pods or containers restarts, and the group starts again together.
- **Readiness of a group**: only the leader serves HTTP, carries the ``/health`` probes
  and the warmup readiness gate, and carries the service's selector label; the Service,
  the PodDisruptionBudget and the warmup see leaders only. LWS counts a group ready when
  all its pods are (``status.readyReplicas``), and workers are ready once running
  (headless: no endpoint to probe).
- **Placement**: every pod asks for one node's GPUs (``--tensor-parallel-size`` of them),
  with the Deployment's placement rules (product, interconnect, overlay); where the nodes
  carry a rack or zone label, ``leaderworkerset.sigs.k8s.io/exclusive-topology`` keeps a
  group inside one such domain (and one group per domain), so its stages talk over the
  rack's switch, not across the spine.
- Workers carry the plan's NCCL settings and /dev/shm like the leader; the rest of each pod
  (volumes, resources, overlay) is the Deployment's pod, rendered by
  :func:`~vllm_operator.render.deployment.build_deployment` for one node's GPUs.
"""

from __future__ import annotations

import copy
from typing import Final

from vllm_operator.constants import LABEL_COMPONENT
from vllm_operator.models import InferenceService
from vllm_operator.models.base import Manifest
from vllm_operator.models.inference_service import EffectiveTuning
from vllm_operator.render.deployment import build_deployment, gpus_per_replica
from vllm_operator.render.meta import child_metadata, deployment_name, selector_labels

__all__ = [
    "API_VERSION",
    "EXCLUSIVE_TOPOLOGY",
    "KIND",
    "MASTER_PORT",
    "build_leaderworkerset",
    "group_size",
]

GROUP: Final = "leaderworkerset.x-k8s.io"
API_VERSION: Final = f"{GROUP}/v1"
KIND: Final = "LeaderWorkerSet"
PLURAL: Final = "leaderworkersets"
EXCLUSIVE_TOPOLOGY: Final = "leaderworkerset.sigs.k8s.io/exclusive-topology"
# torch.distributed's rendezvous on the leader (vLLM's --master-port default).
MASTER_PORT: Final = 29501
MASTER_PORT_NAME: Final = "dist"


def group_size(tuning: EffectiveTuning) -> int:
    """Pods (nodes) of one group: the plan's ``--nnodes``; 1 for a single-node plan."""
    for a in tuning.arguments:
        if a.name == "nnodes" and a.value.isdigit():
            return max(1, int(a.value))
    return 1


def _member(template: Manifest, *, role: str, rank: str, selector: Manifest) -> Manifest:
    """One pod template of the group from the Deployment's, with its rank flags; workers
    headless, without probes, warmup gate or the service's selector labels."""
    t = copy.deepcopy(template)
    container = t["spec"]["containers"][0]
    container["args"] = [
        *container["args"],
        "--node-rank",
        rank,
        "--master-addr",
        "$(LWS_LEADER_ADDRESS)",
        "--master-port",
        str(MASTER_PORT),
    ]
    labels = t["metadata"]["labels"]
    if role == "leader":
        container["ports"] = [
            *container["ports"],
            {"name": MASTER_PORT_NAME, "containerPort": MASTER_PORT, "protocol": "TCP"},
        ]
        return t
    labels[LABEL_COMPONENT] = "worker"
    container["args"].append("--headless")
    # Headless: no HTTP server to probe, gate on warmup or send traffic to.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        container.pop(probe, None)
    container["ports"] = []
    t["spec"].pop("readinessGates", None)
    for key in selector:
        labels.pop(key, None)
    return t


def build_leaderworkerset(
    isvc: InferenceService,
    tuning: EffectiveTuning,
    *,
    image: str,
    groups: int,
    topology_key: str | None = None,
) -> Manifest:
    """The LeaderWorkerSet for ``isvc`` under the multi-node plan ``tuning``.

    ``groups``: vLLM instances (the reconcile's replicas, held up while a benchmark runs);
    ``topology_key``: the node label a group stays within (rack or zone), None for none.
    """
    size = group_size(tuning)
    per_pod = max(1, gpus_per_replica(tuning) // size)
    pod_tuning = tuning.model_copy(update={"gpus_per_replica": per_pod})
    deployment = build_deployment(isvc, pod_tuning, image=image, replicas=groups)
    template = deployment["spec"]["template"]
    selector = selector_labels(isvc)
    metadata = child_metadata(isvc, deployment_name(isvc), "server")
    if topology_key is not None:
        metadata["annotations"] = {
            **metadata.get("annotations", {}),
            EXCLUSIVE_TOPOLOGY: topology_key,
        }
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "replicas": groups,
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                # Keep serving capacity during rollouts: one extra group at a time.
                "rollingUpdateConfiguration": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "leaderWorkerTemplate": {
                "size": size,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": _member(template, role="leader", rank="0", selector=selector),
                "workerTemplate": _member(
                    template, role="worker", rank="$(LWS_WORKER_INDEX)", selector=selector
                ),
            },
        },
    }
