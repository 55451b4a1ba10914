"""What an InferenceService that names a ModelCache (spec.model.source.cache) makes of it:
the cache's claim and folder as its model source once the cache is usable, or why it
waits (the download runs: progress, not a problem) or stalls (the cache is missing or
failed). The service reconcile and ``vllm-operator render`` read it here; the cache's own
reconcile (reconcile/model_cache.py), which the service reconcile does not import
(pyproject's independence contract), shares the progress text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from vllm_operator.constants import API_VERSION, KIND_MODEL_CACHE
from vllm_operator.k8s.api import ClusterAPI
from vllm_operator.models import InferenceService, ModelCache, ModelCacheStatus
from vllm_operator.models.base import Manifest
from vllm_operator.models.conditions import find
from vllm_operator.models.inference_service import ModelSource, PVCSource
from vllm_operator.reconcile.status import Problem

# The phases in which a cache's claim serves: Deleting waits for its users to move off.
USABLE: Final = ("Ready", "Deleting")


@dataclass(frozen=True)
class CacheUse:
    """What an InferenceService naming a cache serves from, or why it cannot yet."""

    # The service with spec.model.source the cache's claim and folder (a pvc source):
    # what is planned and rendered; the service itself when the cache is not usable.
    service: InferenceService
    # The model's repository (the tuner's catalog lookup), and its config.json as the
    # download read it (the tuner's architecture), when known.
    model_name: str | None = None
    config: dict[str, Any] | None = None
    # Why nothing can be rolled out yet: waiting is progress (WaitingForModel), stalled
    # needs a change (the cache missing or failed).
    waiting: Problem | None = None
    stalled: Problem | None = None


def cache_name_of(isvc: InferenceService) -> str | None:
    ref = isvc.spec.model.source.cache
    return ref.name if ref is not None else None


async def read_cache(api: ClusterAPI, isvc: InferenceService) -> Manifest | None:
    name = cache_name_of(isvc)
    if name is None:
        return None
    return await api.get(API_VERSION, KIND_MODEL_CACHE, name, isvc.metadata.namespace)


def use_cache(isvc: InferenceService, body: Manifest | None) -> CacheUse:
    """What ``isvc`` serves from, given the ModelCache it names as read (``body``)."""
    name = cache_name_of(isvc)
    if name is None:
        return CacheUse(isvc)
    ns = isvc.metadata.namespace
    if body is None:
        return CacheUse(
            isvc,
            stalled=Problem(
                "ModelCacheNotFound",
                f"ModelCache {name} named in spec.model.source.cache does not exist in "
                f"namespace {ns}.",
            ),
        )
    try:
        cache = ModelCache.model_validate(body)
    except ValidationError:
        return CacheUse(
            isvc,
            stalled=Problem(
                "ModelCacheInvalid", f"ModelCache {name} is invalid: its own status says why."
            ),
        )
    status = cache.status or ModelCacheStatus()
    hub = cache.spec.source.hugging_face
    repo = hub.repo if hub is not None else None
    if status.phase in USABLE and status.claim_name and status.path:
        spec = isvc.spec.model_copy(
            update={
                "model": isvc.spec.model.model_copy(
                    update={
                        "source": ModelSource(
                            pvc=PVCSource(claim_name=status.claim_name, path=status.path)
                        )
                    }
                )
            }
        )
        return CacheUse(
            isvc.model_copy(update={"spec": spec}),
            model_name=repo,
            config=_config(status),
        )
    ready = find(status.conditions, "Ready")
    why = f": {ready.message}" if ready is not None and ready.message else ""
    if status.phase == "Failed":
        return CacheUse(
            isvc,
            model_name=repo,
            stalled=Problem(
                "ModelCacheFailed",
                f"ModelCache {name} failed ({ready.reason if ready else 'Failed'}){why}",
            ),
        )
    return CacheUse(
        isvc,
        model_name=repo,
        waiting=Problem(
            "WaitingForModel", f"Waiting for ModelCache {name}{progress_text(status)}{why}"
        ),
    )


def _config(status: ModelCacheStatus) -> dict[str, Any] | None:
    if not status.config_json:
        return None
    try:
        config = json.loads(status.config_json)
    except ValueError:
        return None
    return config if isinstance(config, dict) else None


def progress_text(status: ModelCacheStatus) -> str:
    """ " (1.2 of 2.9 GiB, 41 %)" while the size is known, else ""."""
    done, total = status.bytes_downloaded, status.bytes_total
    if done is None or not total:
        return ""
    return f" ({size_text(done)} of {size_text(total)}, {100 * done // total} %)"


def size_text(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
