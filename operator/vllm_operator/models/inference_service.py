"""InferenceService: what a user wants served, and under what load.

The spec holds only what the operator cannot work out itself (the model, its source, the
traffic, the objectives, explicit overrides); everything it can work out (tensor
parallelism, context length, batch sizes, shared memory) is planned by the tuner and shown
in status with a reason for each value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Annotated, Any, Literal, Protocol, Self

from pydantic import ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from vllm_operator.constants import OWN_MOUNTS, OWN_RESOURCES, OWN_VOLUMES
from vllm_operator.models.base import (
    ADAPTER_NAME_PATTERN,
    CONDITIONS_LIST,
    DNS_LABEL_PATTERN,
    ApiModel,
    Condition,
    ConfigMapKeyReference,
    LocalObjectReference,
    ObjectName,
    Quantity,
    ResourceQuantity,
    SecretKeyReference,
    SizeOrAuto,
    cel_rules,
    map_list,
    to_camel,
)
from vllm_operator.models.workload import SLO, Workload

# --- model --------------------------------------------------------------------------------


# A Hugging Face repository id, organisation/name (the model's and the adapters').
HubRepo = Annotated[
    str,
    Field(
        min_length=3,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Repository id, as organisation/name.",
    ),
]


class HuggingFaceSource(ApiModel):
    """Weights downloaded from a Hugging Face repository when the pod starts."""

    repo: HubRepo
    revision: str = Field(
        default="main",
        min_length=1,
        max_length=200,
        description="Branch, tag or commit. Pin a commit for reproducible rollouts.",
    )
    token_secret_ref: SecretKeyReference | None = Field(
        default=None, description="Secret key holding an access token for gated repositories."
    )


class PVCSource(ApiModel):
    """Weights already on a PersistentVolumeClaim in the same namespace."""

    claim_name: ObjectName = Field(description="Name of the PersistentVolumeClaim.")
    path: str = Field(
        default="/",
        pattern=r"^/",
        max_length=1024,
        description="Folder of the model inside the volume (absolute, within the volume).",
    )


class ImageSource(ApiModel):
    """Weights baked into the serving image."""

    path: str = Field(
        pattern=r"^/", max_length=1024, description="Absolute folder of the model in the image."
    )


def _one_of(*names: str) -> str:
    return f"exactly one of {', '.join(names[:-1])} or {names[-1]} must be set"


def _one_source_rule(*names: str) -> ConfigDict:
    """The CEL rule of a source with these (camelCase) fields: exactly one is set."""
    present = ", ".join(f"has(self.{name})" for name in names)
    return cel_rules({"rule": f"[{present}].filter(x, x).size() == 1", "message": _one_of(*names)})


class _OneSource(ApiModel):
    """Exactly one of the subclass's fields, each a source (the model's, an adapter's): the
    subclass's CEL rule (``_one_source_rule``) at admission and this twin in the model."""

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        fields = type(self).model_fields
        if sum(getattr(self, name) is not None for name in fields) != 1:
            raise ValueError(_one_of(*(f.alias or name for name, f in fields.items())))
        return self


class ModelSource(_OneSource):
    """Where the weights come from: exactly one of huggingFace, pvc, image, cache."""

    model_config = _one_source_rule("huggingFace", "pvc", "image", "cache")

    hugging_face: HuggingFaceSource | None = Field(default=None, description="Hugging Face.")
    pvc: PVCSource | None = Field(default=None, description="A PersistentVolumeClaim.")
    image: ImageSource | None = Field(default=None, description="A path in the image.")
    cache: LocalObjectReference | None = Field(
        default=None,
        description="A ModelCache in the same namespace: its volume, downloaded once for "
        "every service that names it, is mounted read-only and served from; the serving "
        "pods never reach the Hub.",
    )


QuantizationMethod = Literal[
    "None", "AWQ", "GPTQ", "FP8", "BitsAndBytes", "GGUF", "CompressedTensors", "MXFP4"
]


class Quantization(ApiModel):
    """How the weights are quantized, as published."""

    method: QuantizationMethod = Field(
        default="None",
        description="Quantization method (MXFP4: gpt-oss's 4-bit experts, rest in bf16).",
    )
    bits: int | None = Field(
        default=None, ge=2, le=16, description="Bits per weight (for AWQ, GPTQ, GGUF)."
    )
    group_size: int | None = Field(
        default=None, ge=-1, le=4096, description="Quantization group size (-1: per channel)."
    )

    model_config = cel_rules(
        {
            "rule": "!(self.method in ['AWQ', 'GPTQ']) || has(self.bits)",
            "message": "AWQ and GPTQ need bits",
            "fieldPath": ".bits",
            "reason": "FieldValueRequired",
        }
    )

    @model_validator(mode="after")
    def _bits(self) -> Self:
        if self.method in ("AWQ", "GPTQ") and self.bits is None:
            raise ValueError("AWQ and GPTQ need bits")
        return self


class ModelArchitecture(ApiModel):
    """The shape of the network, for when config.json cannot be read before scheduling."""

    num_layers: int = Field(ge=1, le=1024, description="Transformer layers.")
    hidden_size: int = Field(ge=1, le=1_000_000, description="Hidden size.")
    num_attention_heads: int = Field(ge=1, le=4096, description="Attention (query) heads.")
    num_key_value_heads: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="Key/value heads (grouped-query attention). Defaults to the attention heads.",
    )
    head_dim: int | None = Field(
        default=None, ge=1, le=4096, description="Head dimension. Defaults to hidden/heads."
    )
    intermediate_size: int | None = Field(
        default=None, ge=1, le=10_000_000, description="MLP intermediate size."
    )
    vocab_size: int = Field(ge=1, le=10_000_000, description="Vocabulary size.")
    max_position_embeddings: int = Field(
        ge=1, le=100_000_000, description="Longest context the model was trained for."
    )
    parameter_count: int | None = Field(
        default=None,
        ge=1,
        description="Total parameters. Estimated from the shape when left out.",
    )
    num_experts: int | None = Field(
        default=None, ge=1, le=4096, description="Experts per MoE layer (mixture of experts)."
    )
    num_experts_per_token: int | None = Field(
        default=None, ge=1, le=4096, description="Experts active per token (MoE)."
    )

    model_config = cel_rules(
        {
            "rule": "!has(self.numKeyValueHeads) || "
            "self.numAttentionHeads % self.numKeyValueHeads == 0",
            "message": "numAttentionHeads must be a multiple of numKeyValueHeads",
            "fieldPath": ".numKeyValueHeads",
        }
    )

    @model_validator(mode="after")
    def _gqa(self) -> Self:
        kv = self.num_key_value_heads
        if kv is not None and self.num_attention_heads % kv:
            raise ValueError("numAttentionHeads must be a multiple of numKeyValueHeads")
        return self


Dtype = Literal["auto", "bfloat16", "float16", "float32"]


class ModelSpec(ApiModel):
    """The model to serve."""

    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Name clients send in requests. Defaults to the InferenceService's name.",
    )
    source: ModelSource = Field(description="Where the weights come from.")
    dtype: Dtype = Field(
        default="auto",
        description="Weights and activations dtype; auto picks bfloat16 where the GPU has it.",
    )
    quantization: Quantization | None = Field(default=None, description="Quantization.")
    architecture: ModelArchitecture | None = Field(
        default=None,
        description="Explicit architecture; otherwise read from config.json or the catalog.",
    )


# --- LoRA adapters --------------------------------------------------------------------------


class AdapterHuggingFaceSource(ApiModel):
    """An adapter in a Hugging Face repository, downloaded by the vLLM server itself when
    it loads the adapter (vLLM's loader takes the repository's default branch: it has no
    revision to pin; pin one by copying the adapter to a volume)."""

    repo: HubRepo
    token_secret_ref: SecretKeyReference | None = Field(
        default=None,
        description="Secret key holding an access token, set as the server's HF_TOKEN: one "
        "token serves the model and every adapter, so all that name one must name the same.",
    )


class AdapterSource(_OneSource):
    """Where an adapter's files (adapter_config.json, adapter_model.safetensors) are:
    exactly one of huggingFace, pvc, image."""

    model_config = _one_source_rule("huggingFace", "pvc", "image")

    hugging_face: AdapterHuggingFaceSource | None = Field(default=None, description="Hugging Face.")
    pvc: PVCSource | None = Field(
        default=None,
        description="A folder on a PersistentVolumeClaim, mounted read-only at "
        "/adapters/<claimName> (an adapter on a claim the pods do not mount yet rolls them "
        "out once, to mount it).",
    )
    image: ImageSource | None = Field(default=None, description="A folder in the image.")


class Adapter(ApiModel):
    """A LoRA adapter served on the base model under its own name: a request whose model
    is this name is answered by the base model with the adapter applied."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=ADAPTER_NAME_PATTERN,
        description="The model name requests give for this adapter (lower case letters, "
        "digits, '-', '.', '_'); not the base model's served name.",
    )
    source: AdapterSource = Field(description="Where the adapter's files are.")
    rank: int | None = Field(
        default=None,
        ge=1,
        le=512,
        description="The adapter's LoRA rank (r in adapter_config.json), for the plan's "
        "max-lora-rank; an adapter above the rank in force is not loaded.",
    )


# --- GPUs, tuning, node, warmup, autoscaling -----------------------------------------------

# A label value, as nvidia.com/gpu.product carries it (no spaces: GFD writes dashes).
LABEL_VALUE = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"

GpuCount = Annotated[
    int | Literal["auto"],
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
        }
    ),
]


class GPUSpec(ApiModel):
    """Which GPUs a replica runs on."""

    count: GpuCount = Field(
        default="auto",
        description="GPUs per replica: auto (the tuner's choice) or a number from 1 to 16.",
    )
    products: list[Annotated[str, Field(min_length=1, max_length=63, pattern=LABEL_VALUE)]] = Field(
        default_factory=list,
        max_length=32,
        description="Allowed GPU products, as the node label nvidia.com/gpu.product spells "
        "them (NVIDIA-H100-80GB-HBM3); empty: any.",
    )

    model_config = cel_rules(
        {
            "rule": "type(self.count) == string ? self.count == 'auto' "
            ": (self.count >= 1 && self.count <= 16)",
            "message": "count must be auto or a number from 1 to 16",
            "fieldPath": ".count",
        }
    )

    @field_validator("count")
    @classmethod
    def _count(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 16:
            raise ValueError("count must be auto or a number from 1 to 16")
        return v


Profile = Literal["Balanced", "Latency", "Throughput", "FastStart"]
OVERRIDE_KEY_PATTERN = r"^[a-z][a-z0-9-]*$"


class TuningSpec(ApiModel):
    """How the tuner should lean, and what it must not decide."""

    profile: Profile = Field(
        default="Balanced",
        description="Balanced, Latency (small batches), Throughput (large batches) or "
        "FastStart (eager mode: faster start, 15-22% less throughput).",
    )
    overrides: dict[Annotated[str, Field(pattern=OVERRIDE_KEY_PATTERN)], str] = Field(
        default_factory=dict,
        max_length=64,
        description="vLLM arguments by name without dashes (max-model-len: '4096'). An "
        "override always wins and is reported as such. 'true' or 'false' toggle a flag. Each "
        "is checked against the arguments of the vLLM release deployed: one it does not take "
        "stalls the service (InvalidOverride) and reaches no pod.",
    )
    measured_ref: LocalObjectReference | None = Field(
        default=None,
        description="An InferenceTuning in this namespace whose measured winner to run: its "
        "winning flags are laid over spec.tuning.overrides (this spec is never changed; "
        "status.measuredFrom says what is applied, or why not). A winner that is stale or "
        "not distinguishable from the incumbent is not applied. Unset: the most recent "
        "finished tuning of this service with spec.autoApply true, if any. An in-place "
        "trial running on this service comes before either.",
    )

    model_config = cel_rules(
        {
            "rule": "self.overrides.all(k, k.matches('^[a-z][a-z0-9-]*$'))",
            "message": "override keys are vLLM argument names without dashes",
            "fieldPath": ".overrides",
        },
        {
            "rule": "!(['model', 'host', 'port', 'served-model-name'].exists(k, "
            "k in self.overrides))",
            "message": "model, host, port and served-model-name are set by the "
            "operator and cannot be overridden",
            "fieldPath": ".overrides",
        },
    )

    @model_validator(mode="after")
    def _reserved(self) -> Self:
        reserved = {"model", "host", "port", "served-model-name"} & set(self.overrides)
        if reserved:
            raise ValueError(
                "model, host, port and served-model-name are set by the operator "
                "and cannot be overridden"
            )
        return self


class NodeSpec(ApiModel):
    """Pod-level settings on the node: shared memory and CPUs."""

    shm_size: SizeOrAuto = Field(
        default="auto",
        description="Size of /dev/shm: auto (planned from tensor parallelism) or a quantity.",
    )
    cpu_pinning: bool = Field(
        default=False,
        description="Give the pod exclusive cores (Guaranteed QoS, integer CPUs) and match "
        "thread counts to them. Needs the kubelet's static CPU manager.",
    )
    cpus: int | None = Field(
        default=None, ge=1, le=512, description="CPU cores per replica. Planned when left out."
    )
    memory: Quantity | None = Field(
        default=None, description="Host memory per replica, /dev/shm excluded. Planned."
    )


class WarmupSpec(ApiModel):
    """Warmup of each pod before it takes traffic."""

    enabled: bool = Field(
        default=True,
        description="Gate readiness on warmup (readiness gate inference.vllm-operator.dev/"
        "warmed-up).",
    )
    timeout_seconds: int = Field(
        default=600, ge=10, le=7200, description="Budget for one warmup of one pod."
    )
    max_retries: int = Field(
        default=3, ge=0, le=20, description="Warmup attempts after the first that fail."
    )


RolloutStrategy = Literal["Auto", "Surge", "Replace"]
# What an Auto rollout resolves to (the Deployment's strategy).
ResolvedRollout = Literal["Surge", "Replace"]


AutoscalingMetric = Literal[
    "RequestsWaiting", "RequestsRunning", "KVCacheUsage", "TTFTP90", "TTFTP99"
]
AutoscalingMode = Literal["Operator", "HPA"]
PER_POD_METRICS: tuple[str, ...] = ("RequestsWaiting", "RequestsRunning", "KVCacheUsage")


class AutoscalingSpec(ApiModel):
    """Follow the load on vLLM's own signals."""

    enabled: bool = Field(default=False, description="Turn autoscaling on.")
    mode: AutoscalingMode = Field(
        default="Operator",
        description="Operator: the operator reads each Ready pod's /metrics every "
        "periodSeconds and sets spec.replicas through the scale subresource (no metrics "
        "adapter needed). HPA: the operator renders an autoscaling/v2 "
        "HorizontalPodAutoscaler on a Pods metric that your metrics adapter serves.",
    )
    min_replicas: int = Field(default=1, ge=0, le=1000, description="Fewest replicas.")
    max_replicas: int = Field(default=4, ge=1, le=1000, description="Most replicas.")
    metric: AutoscalingMetric = Field(
        default="RequestsWaiting",
        description="Signal, read from each pod's /metrics: requests waiting or running per "
        "pod (vllm:num_requests_waiting, vllm:num_requests_running), KV-cache usage per pod "
        "(vllm:kv_cache_usage_perc, 0-1), or the service's TTFT P90/P99 in seconds over "
        "the last period (vllm:time_to_first_token_seconds).",
    )
    target: str = Field(
        default="4",
        pattern=r"^[0-9]+(\.[0-9]+)?$",
        description="Target value of the signal (per pod for the per-pod signals), as a "
        "decimal string greater than zero.",
    )
    metric_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="HPA mode: the Pods metric's name as your adapter serves it. Defaults "
        "to vllm_num_requests_waiting, vllm_num_requests_running or vllm_kv_cache_usage_perc; "
        "a TTFT signal needs it set.",
    )
    period_seconds: int = Field(
        default=15,
        ge=1,
        le=600,
        description="How often the signal is read, and the period of the scale-up and "
        "scale-down rates.",
    )
    scale_up_window_seconds: int = Field(
        default=0,
        ge=0,
        le=3600,
        description="Stabilisation window before scaling up: the lowest recommendation of "
        "the window is used.",
    )
    scale_down_window_seconds: int = Field(
        default=300,
        ge=0,
        le=3600,
        description="Stabilisation window before scaling down: the highest recommendation of "
        "the window is used.",
    )
    scale_up_pods: int = Field(
        default=4, ge=1, le=1000, description="Most replicas added per periodSeconds."
    )
    scale_down_pods: int = Field(
        default=1, ge=1, le=1000, description="Most replicas removed per periodSeconds."
    )
    scale_to_zero: bool = Field(
        default=False,
        description="Allow minReplicas 0. A service at zero has no pod to read a signal "
        "from: it comes back by kubectl scale (there is no request-holding activator).",
    )

    model_config = cel_rules(
        {
            "rule": "self.minReplicas <= self.maxReplicas",
            "message": "minReplicas must not exceed maxReplicas",
            "fieldPath": ".minReplicas",
        },
        {
            "rule": "self.scaleToZero || self.minReplicas >= 1",
            "message": "minReplicas 0 needs scaleToZero",
            "fieldPath": ".minReplicas",
        },
        {
            "rule": "self.target.matches('[1-9]')",
            "message": "target must be greater than zero",
            "fieldPath": ".target",
        },
        {
            "rule": "self.metric != 'KVCacheUsage' || double(self.target) <= 1.0",
            "message": "a KVCacheUsage target is a fraction, at most 1",
            "fieldPath": ".target",
        },
        {
            "rule": "self.mode != 'HPA' || !self.metric.startsWith('TTFT') || has(self.metricName)",
            "message": "a TTFT signal in HPA mode needs metricName (the adapter's name for it)",
            "fieldPath": ".metricName",
        },
        {
            "rule": "self.mode != 'HPA' || self.minReplicas >= 1",
            "message": "HPA mode cannot scale to zero (the HPA needs minReplicas >= 1)",
            "fieldPath": ".minReplicas",
        },
    )

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.min_replicas > self.max_replicas:
            raise ValueError("minReplicas must not exceed maxReplicas")
        if self.min_replicas == 0 and not self.scale_to_zero:
            raise ValueError("minReplicas 0 needs scaleToZero")
        if float(self.target) <= 0:
            raise ValueError("target must be greater than zero")
        if self.metric == "KVCacheUsage" and float(self.target) > 1:
            raise ValueError("a KVCacheUsage target is a fraction, at most 1")
        if self.mode == "HPA" and self.metric.startswith("TTFT") and not self.metric_name:
            raise ValueError("a TTFT signal in HPA mode needs metricName")
        if self.mode == "HPA" and self.min_replicas < 1:
            raise ValueError("HPA mode cannot scale to zero (the HPA needs minReplicas >= 1)")
        return self


TolerationOperator = Literal["Exists", "Equal"]
TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class Toleration(ApiModel):
    """A pod toleration, as in core/v1."""

    key: str | None = Field(default=None, max_length=316, description="Taint key.")
    operator: TolerationOperator = Field(default="Equal", description="Exists or Equal.")
    value: str | None = Field(default=None, max_length=63, description="Taint value.")
    effect: TaintEffect | None = Field(default=None, description="Taint effect; empty: all.")
    toleration_seconds: int | None = Field(
        default=None, description="How long a NoExecute taint is tolerated."
    )


class EnvVarSource(ApiModel):
    """Where an environment variable's value comes from."""

    secret_key_ref: SecretKeyReference | None = Field(default=None, description="A Secret key.")
    config_map_key_ref: ConfigMapKeyReference | None = Field(
        default=None, description="A ConfigMap key."
    )


class EnvVar(ApiModel):
    """An environment variable for the vLLM container."""

    name: str = Field(
        min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", description="Name."
    )
    value: str | None = Field(default=None, description="Literal value.")
    value_from: EnvVarSource | None = Field(default=None, description="Value from a source.")


class Affinity(ApiModel):
    """Scheduling affinity, in the shape of the pod's own (the apiserver validates the
    inside when the Deployment is applied). The operator's node rules (GPU product,
    interconnect) are added to every required node term."""

    node_affinity: dict[str, Any] | None = Field(default=None, description="Node affinity.")
    pod_affinity: dict[str, Any] | None = Field(default=None, description="Pod affinity.")
    pod_anti_affinity: dict[str, Any] | None = Field(
        default=None, description="Pod anti-affinity (for example one replica per node)."
    )


class TopologySpreadConstraint(ApiModel):
    """How the replicas spread over a topology (zones, nodes)."""

    max_skew: int = Field(ge=1, description="Largest difference in replicas between domains.")
    topology_key: str = Field(
        min_length=1,
        max_length=316,
        description="Node label of the domains (topology.kubernetes.io/zone).",
    )
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = Field(
        default="DoNotSchedule", description="DoNotSchedule or ScheduleAnyway."
    )
    label_selector: dict[str, Any] | None = Field(
        default=None, description="Pods counted; default: this service's pods."
    )
    min_domains: int | None = Field(default=None, ge=1, description="Domains to count at least.")


class VolumeMount(ApiModel):
    """Where the vLLM container mounts one of spec.podTemplate.volumes."""

    name: str = Field(min_length=1, max_length=63, description="The volume's name.")
    mount_path: str = Field(min_length=1, max_length=4096, pattern=r"^/", description="Path.")
    read_only: bool = Field(default=False, description="Mount read-only.")
    sub_path: str | None = Field(default=None, max_length=4096, description="A path inside it.")


class ExtraResources(ApiModel):
    """Resources beyond the ones the operator plans (ephemeral-storage, an RDMA device)."""

    requests: dict[str, ResourceQuantity] = Field(
        default_factory=dict, max_length=16, description="Requests."
    )
    limits: dict[str, ResourceQuantity] = Field(
        default_factory=dict, max_length=16, description="Limits."
    )

    @model_validator(mode="after")
    def _not_the_planned_ones(self) -> Self:
        planned = sorted(set(OWN_RESOURCES) & (set(self.requests) | set(self.limits)))
        if planned:
            raise ValueError(
                f"{', '.join(planned)} come from spec.node.cpus, spec.node.memory and "
                "spec.gpu.count, not from spec.podTemplate.resources"
            )
        return self


class PodTemplateOverlay(ApiModel):
    """A small, typed overlay on the pods the operator renders."""

    annotations: dict[str, str] = Field(default_factory=dict, description="Pod annotations.")
    labels: dict[str, str] = Field(default_factory=dict, description="Extra pod labels.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node selector.")
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=64, description="Tolerations."
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=128,
        description="Extra environment variables, each name once.",
        # A list keyed by name: the apiserver refuses a name given twice at admission (the
        # Deployment's own validation would refuse it later, on every reconcile).
        json_schema_extra=map_list("name"),
    )
    priority_class_name: str | None = Field(
        default=None, max_length=253, description="PriorityClass of the pods."
    )
    service_account_name: str | None = Field(
        default=None, max_length=253, description="ServiceAccount the pods run as."
    )
    runtime_class_name: ObjectName | None = Field(
        default=None,
        description="RuntimeClass of the pods (nvidia where it is not the node's default).",
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, max_length=16, description="Secrets to pull the image with."
    )
    affinity: Affinity | None = Field(
        default=None,
        description="Affinity; the operator's GPU-product and interconnect rules are added to "
        "every required node term.",
    )
    topology_spread_constraints: list[TopologySpreadConstraint] = Field(
        default_factory=list, max_length=8, description="Spread of the replicas."
    )
    volumes: list[
        Annotated[
            dict[str, Any],
            WithJsonSchema(
                {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 63,
                            "description": "The volume's name, for volumeMounts.",
                        }
                    },
                    "x-kubernetes-preserve-unknown-fields": True,
                }
            ),
        ]
    ] = Field(
        default_factory=list,
        max_length=16,
        description="Extra pod volumes, as the pod takes them (the apiserver validates the "
        "source when the Deployment is applied); not named shm, cache, model or tmp.",
    )
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list,
        max_length=16,
        description="Mounts of those volumes in the vLLM container; not at /dev/shm, /cache, "
        "/models, /adapters or /tmp.",
    )
    container_security_context: dict[str, Any] | None = Field(
        default=None,
        description="Keys of the vLLM container's securityContext, as Kubernetes takes them, "
        "each replacing the operator's: by default the container passes restricted Pod "
        "Security (non-root uid 65532, no privilege escalation, no capabilities, "
        "RuntimeDefault seccomp, read-only root with /tmp and /cache writable).",
    )
    resources: ExtraResources = Field(
        default_factory=ExtraResources,
        description="Requests and limits added to the planned ones; cpu, memory and "
        "nvidia.com/gpu come from spec.node and spec.gpu.",
    )

    model_config = cel_rules(
        {
            "rule": "!has(self.volumes) || self.volumes.all(v, !(v.name in "
            + str(list(OWN_VOLUMES)).replace('"', "'")
            + ")) && self.volumes.all(v, self.volumes.exists_one(w, w.name == v.name))",
            "message": "volume names must be unique and not the operator's own "
            "(shm, cache, model, tmp)",
            "fieldPath": ".volumes",
        },
        {
            "rule": "!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) "
            "&& self.volumes.exists(v, v.name == m.name))",
            "message": "each of volumeMounts names one of spec.podTemplate.volumes",
            "fieldPath": ".volumeMounts",
        },
        {
            "rule": "!has(self.volumeMounts) || self.volumeMounts.all(m, "
            + " && ".join(
                f"m.mountPath != '{own}' && !m.mountPath.startsWith('{own}/')" for own in OWN_MOUNTS
            )
            + ")",
            "message": "volumeMounts may not be at or under /dev/shm, /cache, /models, "
            "/adapters or /tmp",
            "fieldPath": ".volumeMounts",
        },
        {
            "rule": "!has(self.resources) || ["
            + ", ".join(f"'{r}'" for r in OWN_RESOURCES)
            + "].all(r, !(has(self.resources.requests) && r in self.resources.requests) "
            "&& !(has(self.resources.limits) && r in self.resources.limits))",
            "message": "cpu, memory and nvidia.com/gpu come from spec.node and spec.gpu, not "
            "spec.podTemplate.resources",
            "fieldPath": ".resources",
        },
    )

    @field_validator("volumes")
    @classmethod
    def _volumes_named_and_not_ours(cls, volumes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        names = [v.get("name") for v in volumes]
        if not all(isinstance(n, str) and n for n in names):
            raise ValueError("every volume needs a name")
        taken = sorted({str(n) for n in names} & set(OWN_VOLUMES))
        if taken:
            raise ValueError(f"volume names {', '.join(taken)} are the operator's own")
        if len(set(names)) != len(names):
            raise ValueError("volume names must be unique")
        return volumes

    @model_validator(mode="after")
    def _mounts_of_given_volumes_not_on_ours(self) -> Self:
        names = {v.get("name") for v in self.volumes}
        for mount in self.volume_mounts:
            if mount.name not in names:
                raise ValueError(
                    f"volumeMounts: {mount.name} is not one of spec.podTemplate.volumes"
                )
            path = mount.mount_path.rstrip("/") or "/"
            if any(path == own or path.startswith(own + "/") for own in OWN_MOUNTS):
                raise ValueError(
                    f"volumeMounts: {mount.mount_path} is under the operator's own mounts "
                    f"({', '.join(OWN_MOUNTS)})"
                )
        return self

    @field_validator("env")
    @classmethod
    def _env_names_once(cls, env: list[EnvVar]) -> list[EnvVar]:
        names = [e.name for e in env]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"env names must be unique; given more than once: {', '.join(twice)}")
        return env


class InferenceServiceSpec(ApiModel):
    """Desired state of an InferenceService."""

    model: ModelSpec = Field(description="The model to serve.")
    replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Replicas (each with its own GPUs). Target of the scale subresource.",
    )
    gpu: GPUSpec = Field(default_factory=GPUSpec, description="GPUs per replica and products.")
    workload: Workload = Field(
        default_factory=Workload, description="The traffic the service will see."
    )
    slo: SLO = Field(
        default_factory=SLO,
        description=(
            "Latency objectives the tuner plans for: with a declared peak concurrency it "
            "predicts each P99 target at the peak and plans the cheapest tensor-parallel "
            "size and replica count that meet them all (a TTFT P99 also sets "
            "max-num-batched-tokens from the workload's p99 prompt). status.tuning.notes "
            "answers each target: met with the predicted figure and the replicas needed, "
            "or the best prediction and what would meet it (docs/tuning.md)."
        ),
    )
    tuning: TuningSpec = Field(default_factory=TuningSpec, description="Tuning profile.")
    warmup: WarmupSpec = Field(default_factory=WarmupSpec, description="Warmup before traffic.")
    autoscaling: AutoscalingSpec = Field(
        default_factory=AutoscalingSpec, description="Autoscaling on vLLM's signals."
    )
    node: NodeSpec = Field(default_factory=NodeSpec, description="Shared memory and CPUs.")
    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="vLLM serving image. Defaults to the operator's configured image.",
    )
    vllm_version: str | None = Field(
        default=None,
        pattern=r"^v?[0-9]+\.[0-9]+(\.[0-9]+)?$",
        max_length=32,
        description="The vLLM version the image runs (0.19.1), for an image whose tag does "
        "not say (latest, a digest, a private build). Decides which arguments are rendered "
        "and which overrides are accepted; default: the version in the image's tag, else the "
        "operator's default.",
    )
    pod_template: PodTemplateOverlay = Field(
        default_factory=PodTemplateOverlay, description="Overlay on the rendered pods."
    )
    rollout: RolloutStrategy = Field(
        default="Auto",
        description="How a change of the pods (an argument, the first adapter, an image) "
        "rolls out. Surge: one extra replica at a time, never fewer than spec.replicas "
        "serving (needs room for one more replica: GPUs, CPU, memory). Replace: one replica "
        "at a time is stopped first, then started anew (no spare room needed; one replica "
        "fewer while it restarts and warms up: none at all for a single replica). Auto: Surge "
        "when a node that fits the plan has room for one more replica, else Replace; "
        "status.rollout says which and why.",
    )
    adapters: list[Adapter] = Field(
        default_factory=list,
        max_length=64,
        description="LoRA adapters served on the model, each under its own name. The "
        "operator loads them into every running server through vLLM's adapter API: adding, "
        "changing or removing one restarts no pod (the first one, or removing the last, "
        "does once: vLLM turns LoRA on only at start).",
        json_schema_extra=map_list("name"),
    )

    model_config = cel_rules(
        {
            "rule": "!has(self.adapters) || !has(self.model.name) || "
            "self.adapters.all(a, a.name != self.model.name)",
            "message": "an adapter's name must differ from spec.model.name (the base model's "
            "served name)",
            "fieldPath": ".adapters",
        },
        {
            "rule": "!has(self.adapters) || size(self.adapters) == 0 || !has(self.tuning) || "
            "!has(self.tuning.overrides) || !('enable-lora' in self.tuning.overrides) || "
            "self.tuning.overrides['enable-lora'] != 'false'",
            "message": "spec.adapters needs LoRA: spec.tuning.overrides.enable-lora is 'false'",
            "fieldPath": ".adapters",
        },
    )

    @model_validator(mode="after")
    def _adapters(self) -> Self:
        names = [a.name for a in self.adapters]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"spec.adapters: names given more than once: {', '.join(twice)}")
        if self.model.name is not None and self.model.name in names:
            raise ValueError(
                f"spec.adapters: {self.model.name} is spec.model.name (the base model's "
                "served name); an adapter needs a name of its own"
            )
        if self.adapters and self.tuning.overrides.get("enable-lora") == "false":
            raise ValueError(
                "spec.adapters needs LoRA: spec.tuning.overrides.enable-lora is 'false'"
            )
        tokens = {
            (r.name, r.key)
            for r in [
                *(
                    [self.model.source.hugging_face.token_secret_ref]
                    if self.model.source.hugging_face is not None
                    else []
                ),
                *(
                    a.source.hugging_face.token_secret_ref
                    for a in self.adapters
                    if a.source.hugging_face is not None
                ),
            ]
            if r is not None
        }
        if len(tokens) > 1:
            raise ValueError(
                "spec.adapters: the model and its Hugging Face adapters must name one "
                "tokenSecretRef (the server has one HF_TOKEN)"
            )
        return self


# --- status ------------------------------------------------------------------------------

ArgumentSource = Literal["Tuner", "Override", "Measured", "Spec", "Default"]


class EffectiveArgument(ApiModel):
    """One vLLM argument (or environment variable) as it is passed, and why."""

    name: str = Field(description="Argument name without dashes, or the variable's name.")
    value: str = Field(description="Value passed ('true' for a bare flag).")
    source: ArgumentSource = Field(
        description="Who decided it: Tuner, Override (spec.tuning.overrides), Measured (an "
        "InferenceTuning's result, status.measuredFrom), Spec, Default."
    )
    reason: str = Field(description="Why this value.")


class NamedValue(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> str: ...


def command_flags(
    arguments: Iterable[NamedValue], negations: Mapping[str, str] | None = None
) -> list[str]:
    """vLLM's command-line flags for ``arguments``: ``true`` a bare ``--name``, ``false``
    the switch's negation in the release deployed (``negations``: ``--disable-NAME`` for
    some, ``--no-NAME`` by default), anything else ``--name value``. The one place flags are
    spelled: the tuner's ``vllm serve`` line and the rendered container's both come from
    here, through :func:`vllm_operator.releases.arguments.release_flags`."""
    flags: list[str] = []
    for arg in arguments:
        if arg.value == "true":
            flags.append(f"--{arg.name}")
        elif arg.value == "false":
            flags.append(f"--{(negations or {}).get(arg.name, 'no-' + arg.name)}")
        else:
            flags += [f"--{arg.name}", arg.value]
    return flags


class Predictions(ApiModel):
    """What the tuner predicts for one replica."""

    weights_bytes: int | None = Field(default=None, description="Weights memory per replica.")
    kv_cache_bytes: int | None = Field(default=None, description="KV-cache memory per replica.")
    kv_cache_tokens: int | None = Field(default=None, description="KV-cache capacity, tokens.")
    max_concurrent_sequences: int | None = Field(
        default=None, description="Sequences of the chosen context that fit at once."
    )
    context_length: int | None = Field(default=None, description="Chosen max model length.")
    decode_tokens_per_second: float | None = Field(
        default=None, description="Decode rate of one sequence (memory-bandwidth roofline)."
    )
    load_seconds: float | None = Field(default=None, description="Time to load the weights.")


class PlannedPod(ApiModel):
    """Pod settings the plan chose for each replica."""

    shm_size: str | None = Field(default=None, description="Size of /dev/shm (quantity).")
    cpus: int | None = Field(default=None, description="CPU cores per replica.")
    memory: str | None = Field(
        default=None, description="Host memory per replica, /dev/shm excluded (quantity)."
    )
    cpu_pinning: bool = Field(default=False, description="Exclusive cores (Guaranteed QoS).")
    startup_seconds: int | None = Field(
        default=None, description="Budget for the server to start (load weights, compile)."
    )
    interconnect: Literal["NVLink", "PCIe"] | None = Field(
        default=None, description="Interconnect class the replica's GPUs must share."
    )
    cache_size: str | None = Field(
        default=None,
        description="Size of the pod's cache volume (/cache) when the weights are downloaded "
        "into it from the Hub: the weights with headroom, the volume's sizeLimit and the "
        "container's ephemeral-storage request (quantity). None when nothing is downloaded.",
    )


class EffectiveTuning(ApiModel):
    """The plan in force."""

    planned_by: Literal["Tuner", "SpecOnly"] = Field(
        description="Tuner: planned from the model and GPUs; SpecOnly: only the spec applied."
    )
    vllm_version: str | None = Field(
        default=None,
        description="The vLLM version planned for (spec.vllmVersion, the image's tag, or the "
        "operator's default): its arguments are the ones rendered and checked.",
    )
    gpus_per_replica: int | None = Field(default=None, description="GPUs per replica.")
    tensor_parallel_size: int | None = Field(default=None, description="Tensor parallelism.")
    arguments: list[EffectiveArgument] = Field(
        default_factory=list, description="Every vLLM argument with its value and reason."
    )
    environment: list[EffectiveArgument] = Field(
        default_factory=list,
        max_length=64,
        description="Environment variables the plan sets on the vLLM container, with reasons "
        "(spec.podTemplate.env overrides them).",
    )
    pod: PlannedPod | None = Field(default=None, description="Pod settings per replica.")
    predictions: Predictions | None = Field(default=None, description="Predicted capacity.")
    notes: list[str] = Field(default_factory=list, description="Warnings and remarks.")


class WarmupStatus(ApiModel):
    """Warmup results of the service's pods."""

    last_cold_ttft_milliseconds: float | None = Field(
        default=None, description="TTFT of the first request of the last warmup."
    )
    last_warm_ttft_milliseconds: float | None = Field(
        default=None, description="Median TTFT at the end of the last warmup."
    )


class BenchmarkSummary(ApiModel):
    """Headline of the last benchmark that targeted this service."""

    name: str = Field(description="InferenceBenchmark name.")
    phase: str = Field(description="Its phase.")
    completion_time: datetime | None = Field(default=None, description="When it ended.")
    requests_per_second: float | None = Field(default=None, description="Achieved rate.")
    ttft_p99_milliseconds: float | None = Field(default=None, description="TTFT P99.")
    slo_attainment: float | None = Field(default=None, description="Share meeting the SLO.")


AutoscalingDecision = Literal["Steady", "ScaleUp", "ScaleDown", "ScaleDownHeld", "NoSignal"]


class AutoscalingStatus(ApiModel):
    """What the autoscaler saw and decided at its last reading (Operator mode), written by
    the autoscaler under its own field manager."""

    mode: AutoscalingMode = Field(description="Operator or HPA.")
    metric: AutoscalingMetric = Field(description="The signal.")
    target: str = Field(description="The target value of the signal.")
    current_value: str | None = Field(
        default=None,
        description="The signal at the last reading (per-pod average for per-pod signals).",
    )
    pods_read: int | None = Field(default=None, description="Pods whose /metrics were read.")
    current_replicas: int | None = Field(default=None, description="spec.replicas when read.")
    desired_replicas: int | None = Field(
        default=None, description="Replicas after stabilisation, bounds, rates and holds."
    )
    decision: AutoscalingDecision | None = Field(
        default=None, description="Steady, ScaleUp, ScaleDown, ScaleDownHeld or NoSignal."
    )
    message: str | None = Field(default=None, description="Why, in words.")
    last_scale_time: datetime | None = Field(
        default=None, description="When the autoscaler last changed spec.replicas."
    )
    horizontal_pod_autoscaler: str | None = Field(
        default=None, description="HPA mode: the HorizontalPodAutoscaler's name."
    )


class AdapterStatus(ApiModel):
    """One adapter of spec.adapters on the service's running servers."""

    name: str = Field(description="The adapter's name.")
    path: str = Field(description="What the servers load it from (lora_path).")
    loaded_replicas: int = Field(
        default=0, description="Running servers that have it loaded from that path."
    )
    message: str | None = Field(
        default=None, description="Why it is not loaded everywhere (the server's words)."
    )


class RolloutStatus(ApiModel):
    """The strategy the pods roll out with, and why (spec.rollout)."""

    strategy: ResolvedRollout = Field(description="Surge or Replace.")
    message: str = Field(max_length=1024, description="Why this strategy.")


MeasuredReason = Literal[
    "InPlaceTrial",
    "WinnerApplied",
    "TuningNotFound",
    "OtherTarget",
    "TuningNotFinished",
    "TuningFailed",
    "NoWinner",
    "Stale",
    "NotDistinguishable",
    "InvalidOverride",
]


class MeasuredFrom(ApiModel):
    """The measured result (an InferenceTuning) the arguments come from, or the one that
    was asked for and why it is not applied."""

    name: str = Field(description="The InferenceTuning.")
    trial: str | None = Field(
        default=None,
        description="Its trial whose flags are applied (the winner, or the "
        "in-place trial running now).",
    )
    applied: bool = Field(description="Whether its flags are in the rendered arguments.")
    reason: MeasuredReason = Field(
        description="InPlaceTrial or WinnerApplied when applied; else TuningNotFound, "
        "OtherTarget, TuningNotFinished, TuningFailed, NoWinner, Stale, NotDistinguishable "
        "or InvalidOverride."
    )
    message: str = Field(max_length=1024, description="The same, in words.")


class InferenceServiceStatus(ApiModel):
    """Observed state of an InferenceService, computed by the operator."""

    observed_generation: int | None = Field(
        default=None, description="The generation this status describes."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Reconciling, Stalled, WarmedUp, ScaleDownBlocked, AdaptersLoaded, "
        "Tuned.",
        json_schema_extra=CONDITIONS_LIST,
    )
    replicas: int | None = Field(default=None, description="Pods that exist (scale subresource).")
    desired_replicas: int | None = Field(default=None, description="Replicas asked for.")
    ready_replicas: int | None = Field(default=None, description="Pods Ready.")
    warmed_replicas: int | None = Field(default=None, description="Pods warmed up.")
    selector: str | None = Field(
        default=None, description="Label selector of the pods (scale subresource)."
    )
    endpoint: str | None = Field(default=None, description="In-cluster OpenAI-compatible URL.")
    served_model_name: str | None = Field(
        default=None,
        description="The model name requests give (spec.model.name, else the service's name).",
    )
    tuning: EffectiveTuning | None = Field(default=None, description="The effective tuning.")
    warmup: WarmupStatus | None = Field(default=None, description="Warmup results.")
    last_benchmark: BenchmarkSummary | None = Field(
        default=None, description="The last benchmark of this service."
    )
    autoscaling: AutoscalingStatus | None = Field(
        default=None, description="The autoscaler's last reading and decision."
    )
    rollout: RolloutStatus | None = Field(
        default=None, description="How the pods roll out (spec.rollout), and why."
    )
    adapters: list[AdapterStatus] | None = Field(
        default=None, description="The LoRA adapters of spec.adapters, and where they are loaded."
    )
    measured_from: MeasuredFrom | None = Field(
        default=None,
        description="The InferenceTuning whose measured flags the arguments carry, or why "
        "the one asked for is not applied; unset when none is asked for.",
    )


class ObjectMeta(ApiModel):
    """The parts of metadata the operator reads; everything else is kept as is."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    name: str = Field(pattern=DNS_LABEL_PATTERN, max_length=63)
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class InferenceService(ApiModel):
    """A model served by tuned, warmed-up vLLM replicas."""

    api_version: Literal["inference.vllm-operator.dev/v1alpha1"] = Field(
        default="inference.vllm-operator.dev/v1alpha1"
    )
    kind: Literal["InferenceService"] = Field(default="InferenceService")
    metadata: ObjectMeta
    spec: InferenceServiceSpec
    status: InferenceServiceStatus | None = None

    @model_validator(mode="after")
    def _adapter_names_not_the_model(self) -> Self:
        served = self.spec.model.name or self.metadata.name
        if any(a.name == served for a in self.spec.adapters):
            raise ValueError(
                f"spec.adapters: {served} is the base model's served name (spec.model.name, "
                "else the InferenceService's name); an adapter needs a name of its own"
            )
        return self
