"""ModelCache: a model's weights on a PersistentVolumeClaim, downloaded once for every
InferenceService in the namespace that names it (``spec.model.source.cache``).

The operator creates the claim and a download Job that fills it from the Hub (or adopts a
claim that already holds the weights), reports the download's progress and the resolved
commit in status, and defers the cache's deletion while services still use it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from vllm_operator.models.base import (
    CONDITIONS_LIST,
    ApiModel,
    Condition,
    SecretKeyReference,
    SizeOrAuto,
    cel_rules,
)
from vllm_operator.models.inference_service import (
    HubRepo,
    ModelArchitecture,
    ObjectMeta,
    PVCSource,
    _one_source_rule,
    _OneSource,
)

AccessMode = Literal["ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany", "ReadOnlyMany"]
CachePhase = Literal["Pending", "Downloading", "Ready", "Failed", "Deleting"]
# An http(s) URL without spaces: the Hub, or a mirror that speaks its API.
URL_PATTERN = r"^https?://[^\s]+$"


class CacheHuggingFaceSource(ApiModel):
    """A Hugging Face repository, downloaded into the cache's claim by a Job."""

    repo: HubRepo
    revision: str = Field(
        default="main",
        min_length=1,
        max_length=200,
        description="Branch, tag or commit; resolved to a commit once, when the download "
        "starts (status.commit).",
    )
    token_secret_ref: SecretKeyReference | None = Field(
        default=None,
        description="Secret key holding an access token for gated repositories; only the "
        "download Job reads it.",
    )
    endpoint: str | None = Field(
        default=None,
        max_length=512,
        pattern=URL_PATTERN,
        description="The Hub's address (HF_ENDPOINT) for a mirror or proxy that speaks its "
        "API; unset downloads from huggingface.co.",
    )


class CacheSource(_OneSource):
    """Where the cached weights come from: exactly one of huggingFace, pvc."""

    model_config = _one_source_rule("huggingFace", "pvc")

    hugging_face: CacheHuggingFaceSource | None = Field(
        default=None, description="Downloaded from a Hugging Face repository."
    )
    pvc: PVCSource | None = Field(
        default=None,
        description="Weights already on a claim of the namespace: adopted as they are (no "
        "download; the claim is never deleted by the operator).",
    )


class CacheStorage(ApiModel):
    """The claim the operator creates for a huggingFace source."""

    storage_class_name: str | None = Field(
        default=None,
        max_length=253,
        description="StorageClass of the claim; unset uses the cluster's default.",
    )
    size: SizeOrAuto = Field(
        default="auto",
        description="Size of the claim; auto is the weights estimate (from "
        "spec.architecture or the tuner's catalog) plus 10 % and 1 GiB for the repository's "
        "other files.",
    )
    access_modes: list[AccessMode] = Field(
        default_factory=lambda: list[AccessMode](["ReadWriteOnce"]),
        min_length=1,
        max_length=4,
        description="Access modes of the claim. ReadWriteOnce lets every pod on one node "
        "share it; services with pods on several nodes need ReadWriteMany (or ReadOnlyMany "
        "after the download) from a storage class that offers it.",
    )
    retain: bool = Field(
        default=False,
        description="Keep the claim (and the weights) when the ModelCache is deleted; by "
        "default the claim goes with it.",
    )


class ModelCacheSpec(ApiModel):
    """What to cache and where. The source and the claim are fixed once created: to cache
    another revision, create another ModelCache and point the services at it."""

    model_config = cel_rules(
        {
            "rule": "self.source == oldSelf.source",
            "message": "spec.source is immutable: create another ModelCache for another "
            "model or revision",
            "fieldPath": ".source",
        },
        {
            "rule": "has(self.storage.storageClassName) == has(oldSelf.storage.storageClassName)"
            " && (!has(self.storage.storageClassName) || "
            "self.storage.storageClassName == oldSelf.storage.storageClassName)"
            " && self.storage.size == oldSelf.storage.size"
            " && self.storage.accessModes == oldSelf.storage.accessModes",
            "message": "spec.storage is immutable but for retain: the claim exists already",
            "fieldPath": ".storage",
        },
    )

    source: CacheSource = Field(description="Where the weights come from (immutable).")
    storage: CacheStorage = Field(
        default_factory=CacheStorage,
        description="The claim the operator creates for a huggingFace source (immutable "
        "but for retain); unused for a pvc source.",
    )
    architecture: ModelArchitecture | None = Field(
        default=None,
        description="The model's architecture, for storage size auto when the tuner's "
        "catalog does not know the repository.",
    )


class ModelCacheStatus(ApiModel):
    """Where the download stands and who uses the cache."""

    observed_generation: int | None = Field(default=None, description="Generation observed.")
    phase: CachePhase | None = Field(
        default=None,
        description="Pending (claim or Job starting), Downloading, Ready, Failed (needs a "
        "change), Deleting (waiting for its services to go).",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Reconciling, Stalled.",
        json_schema_extra=CONDITIONS_LIST,
    )
    claim_name: str | None = Field(default=None, description="The claim holding the weights.")
    path: str | None = Field(
        default=None, description="Folder of the model inside the claim (from its root)."
    )
    size: str | None = Field(default=None, description="Size of the claim the operator made.")
    commit: str | None = Field(default=None, description="The commit the revision resolved to.")
    bytes_downloaded: int | None = Field(default=None, description="Bytes on the claim so far.")
    bytes_total: int | None = Field(default=None, description="Bytes of the repository's files.")
    files_total: int | None = Field(default=None, description="Files of the repository.")
    used_by: list[str] = Field(
        default_factory=list, description="InferenceServices of the namespace that name it."
    )
    completion_time: datetime | None = Field(
        default=None, description="When the download finished and was verified."
    )
    config_json: str | None = Field(
        default=None,
        max_length=16384,
        description="The model's config.json as downloaded (compact JSON): the services "
        "that use the cache are planned from it.",
    )


class ModelCache(ApiModel):
    """A model's weights on a volume, downloaded once for the namespace's services."""

    api_version: Literal["inference.vllm-operator.dev/v1alpha1"] = Field(
        default="inference.vllm-operator.dev/v1alpha1"
    )
    kind: Literal["ModelCache"] = Field(default="ModelCache")
    metadata: ObjectMeta
    spec: ModelCacheSpec
    status: ModelCacheStatus | None = None
