"""The one reconcile of a ModelCache (what an InferenceService that names one makes of it
is reconcile/cache_use.py).

A huggingFace source: the claim (``render/model_cache.py``), then the download Job into
it; while the Job runs, its progress (read from the Job's pod) goes into status; when it
succeeds, the commit and the sizes it reports (its termination message). A pvc source is
adopted: Ready once the claim is Bound. Phases: Pending → Downloading → Ready, or Failed
(a permanent failure: the Job's reason is the Stalled reason; deleting the Job after
fixing the cause starts another). A cache is never downloaded twice: once Ready it stays
Ready while its claim exists.

Deletion is deferred, not refused: the operator puts a finalizer on every cache and
removes it only once no InferenceService of the namespace names the cache; meanwhile the
phase is Deleting and Ready says which services hold it. This is what Kubernetes does for
a claim in use (its pvc-protection finalizer), and it needs no admission webhook: a
``kubectl delete`` or an Argo CD prune returns at once and completes on its own once the
services move off. The claim goes with the cache by garbage collection, unless
spec.storage.retain.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

import httpx
from pydantic import ValidationError

from vllm_operator.constants import (
    API_VERSION,
    DOWNLOAD_PERMANENT_EXIT_CODES,
    FINALIZER_MODEL_CACHE,
    KIND_INFERENCE_SERVICE,
    KIND_MODEL_CACHE,
)
from vllm_operator.k8s.api import ClusterAPI
from vllm_operator.models import ModelCache, ModelCacheStatus
from vllm_operator.models.base import Condition, Manifest
from vllm_operator.models.conditions import find, manifest_condition
from vllm_operator.reconcile.cache_use import progress_text, size_text
from vllm_operator.reconcile.jobs import job_report, job_state
from vllm_operator.reconcile.phases import phase_conditions, phase_event, write_phase_status
from vllm_operator.render.model_cache import (
    PROGRESS_PORT,
    build_claim,
    build_download_job,
    claim_name,
    download_job_name,
    model_path,
)
from vllm_operator.servers.download import download_progress
from vllm_operator.settings import OperatorSettings
from vllm_operator.tuning.cache import SizeUnknown, claim_size

log = logging.getLogger(__name__)

# A download in progress is looked at again this soon (its progress into status).
DOWNLOAD_POLL_SECONDS: Final = 5.0
# A cache waiting for its claim, Secret or Job pod.
PENDING_POLL_SECONDS: Final = 10.0
# --- the cache's own reconcile -----------------------------------------------------------


def _conditions(
    phase: str, reason: str, message: str, *, gen: int | None, now: datetime, old: list[Condition]
) -> list[Condition]:
    return phase_conditions(
        reason, message, ready=phase == "Ready", reconciling=phase in ("Pending", "Downloading"),
        stalled=phase == "Failed", now=now, generation=gen, previous=old,
    )  # fmt: skip


async def _users(api: ClusterAPI, cache: ModelCache) -> list[str]:
    """The namespace's InferenceServices that name the cache in spec.model.source.cache."""
    items = await api.list(API_VERSION, KIND_INFERENCE_SERVICE, cache.metadata.namespace)
    names = []
    for item in items:
        source = ((item.get("spec") or {}).get("model") or {}).get("source") or {}
        if (source.get("cache") or {}).get("name") == cache.metadata.name:
            names.append(str(item["metadata"]["name"]))
    return sorted(names)


async def _set_finalizer(api: ClusterAPI, body: Manifest, present: bool) -> None:
    """Our finalizer on the cache, or not: a merge patch of the whole list as read, with
    its resourceVersion, so a finalizer someone added meanwhile makes it a conflict (409,
    retried) rather than lost."""
    meta = body["metadata"]
    others = [f for f in meta.get("finalizers") or [] if f != FINALIZER_MODEL_CACHE]
    await api.patch(
        API_VERSION,
        KIND_MODEL_CACHE,
        meta["name"],
        meta.get("namespace"),
        {
            "metadata": {
                "finalizers": [*others, FINALIZER_MODEL_CACHE] if present else others,
                "resourceVersion": meta.get("resourceVersion"),
            }
        },
    )


async def _write(
    api: ClusterAPI, body: Manifest, old: ModelCacheStatus | None, status: ModelCacheStatus
) -> None:
    event = phase_event(old, status)
    await write_phase_status(api, body, old, status, (event,) if event else ())
    if event is not None:
        ready = find(status.conditions, "Ready")
        log.info(
            "ModelCache %s/%s: %s (%s).",
            body["metadata"].get("namespace"), body["metadata"]["name"], status.phase,
            ready.reason if ready else None,
        )  # fmt: skip


def _stored(body: Manifest) -> ModelCacheStatus | None:
    try:
        return (
            ModelCacheStatus.model_validate(body.get("status") or {})
            if body.get("status")
            else None
        )
    except ValidationError:
        return None


async def reconcile_model_cache(
    api: ClusterAPI,
    body: Manifest,
    *,
    settings: OperatorSettings,
    http: httpx.AsyncClient | None = None,
    now: datetime | None = None,
) -> float | None:
    """Advance one ModelCache; returns when to look again (None: at the next event)."""
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    meta = body["metadata"]
    gen = meta.get("generation")
    old = _stored(body)
    deleting = bool(meta.get("deletionTimestamp"))
    try:
        cache = ModelCache.model_validate(body)
    except ValidationError as err:
        if deleting:
            await _release(api, body)
            return None
        fields = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()[:5]
        )
        invalid = ModelCacheStatus(
            observed_generation=gen,
            phase="Failed",
            conditions=_conditions(
                "Failed", "InvalidSpec", f"The spec is invalid: {fields}",
                gen=gen, now=now, old=old.conditions if old else [],
            ),
        )  # fmt: skip
        await _write(api, body, old, invalid)
        return None
    users = await _users(api, cache)
    base = old or ModelCacheStatus()

    def status(phase: str, reason: str, message: str, **fields: Any) -> ModelCacheStatus:
        kept = base.model_dump(exclude={"conditions", "phase", "observed_generation", "used_by"})
        kept.update(fields)
        return ModelCacheStatus(
            observed_generation=gen,
            phase=phase,
            conditions=_conditions(phase, reason, message, gen=gen, now=now, old=base.conditions),
            used_by=users,
            **kept,
        )

    if deleting:
        if users:
            await _write(
                api,
                body,
                old,
                status(
                    "Deleting",
                    "InUse",
                    f"Deletion waits until no InferenceService names this cache; now "
                    f"{', '.join(users)} (spec.model.source.cache). Point them at another "
                    "source or delete them, and the cache goes.",
                ),
            )
            return None
        if cache.spec.source.hugging_face is not None and cache.spec.storage.retain:
            # Kept: the claim loses its owner reference before the cache goes.
            claim = await api.get(
                "v1", "PersistentVolumeClaim", claim_name(cache), cache.metadata.namespace
            )
            if claim is not None:
                size = (
                    (claim.get("spec") or {})
                    .get("resources", {})
                    .get("requests", {})
                    .get("storage")
                )
                await api.apply(build_claim(cache, str(size or base.size), owned=False))
        await _release(api, body)
        return None
    if FINALIZER_MODEL_CACHE not in (meta.get("finalizers") or []):
        await _set_finalizer(api, body, True)
    if cache.spec.source.pvc is not None:
        new, again = await _adopt(api, cache, status)
    else:
        new, again = await _download(
            api, cache, status, base, settings=settings, http=http, now=now
        )
    await _write(api, body, old, new)
    return again


async def _release(api: ClusterAPI, body: Manifest) -> None:
    if FINALIZER_MODEL_CACHE in (body["metadata"].get("finalizers") or []):
        await _set_finalizer(api, body, False)


# The ``status`` builder of reconcile_model_cache: (phase, reason, message, **fields).
Status = Callable[..., ModelCacheStatus]


async def _adopt(
    api: ClusterAPI, cache: ModelCache, status: Status
) -> tuple[ModelCacheStatus, float | None]:
    """A pvc source: Ready once the claim exists and is Bound."""
    ns = cache.metadata.namespace
    name = claim_name(cache)
    where = {"claim_name": name, "path": model_path(cache)}
    claim = await api.get("v1", "PersistentVolumeClaim", name, ns)
    if claim is None:
        return status(
            "Pending",
            "ClaimNotFound",
            f"PersistentVolumeClaim {name} named in spec.source.pvc does not exist in "
            f"namespace {ns}.",
            **where,
        ), PENDING_POLL_SECONDS
    phase = (claim.get("status") or {}).get("phase")
    if phase != "Bound":
        return status(
            "Pending",
            "ClaimPending",
            f"PersistentVolumeClaim {name} is {phase or 'Pending'}, not Bound yet.",
            **where,
        ), PENDING_POLL_SECONDS
    return status(
        "Ready", "Adopted", f"Serving the weights on PersistentVolumeClaim {name} as they are.",
        **where,
    ), None  # fmt: skip


async def _download(
    api: ClusterAPI,
    cache: ModelCache,
    status: Status,
    base: ModelCacheStatus,
    *,
    settings: OperatorSettings,
    http: httpx.AsyncClient | None,
    now: datetime,
) -> tuple[ModelCacheStatus, float | None]:
    ns = cache.metadata.namespace or ""
    hub = cache.spec.source.hugging_face
    assert hub is not None
    job_name = download_job_name(cache)
    where: dict[str, Any] = {"claim_name": claim_name(cache), "path": model_path(cache)}
    try:
        size, _why = claim_size(cache)
    except SizeUnknown as err:
        return status("Failed", "SizeUnknown", str(err)), None
    where["size"] = size
    claim = await api.get("v1", "PersistentVolumeClaim", claim_name(cache), ns)
    if claim is not None and base.phase == "Ready":
        # Downloaded: neither the token nor the Job matters any more.
        return status(
            "Ready", "Downloaded", _ready_message(hub.repo, base), **where
        ), None  # fmt: skip
    ref = hub.token_secret_ref
    if ref is not None:
        secret = await api.get("v1", "Secret", ref.name, ns)
        keys = (secret or {}).get("data") or {}
        if secret is None or ref.key not in keys:
            what = (
                f"Secret {ref.name} does not exist in namespace {ns}"
                if secret is None
                else f"Secret {ref.name} has no key {ref.key}"
            )
            return status(
                "Pending",
                "SecretNotFound",
                f"{what} (spec.source.huggingFace.tokenSecretRef); the download starts once "
                "it does.",
                **where,
            ), PENDING_POLL_SECONDS
    job = await api.get("batch/v1", "Job", job_name, ns)
    if claim is None:
        # New, or deleted by hand: the claim, then a download into it (the Job of a
        # download into a claim that is gone says nothing of the new one).
        await api.apply(build_claim(cache, size))
        if job is not None:
            await api.delete("batch/v1", "Job", job_name, ns)
            return status(
                "Pending", "ClaimCreated", f"PersistentVolumeClaim {claim_name(cache)} was "
                "created again; the download starts over.", **where,
            ), PENDING_POLL_SECONDS  # fmt: skip
    if job is None:
        job = await api.apply(
            build_download_job(
                cache, image=settings.warmup_image, resources=settings.download_resources.to_wire()
            )
        )
    state = job_state(job)
    if state == "Running":
        return await _running(api, cache, status, where, job_name, http)
    report = await job_report(api, ns, job_name)
    if state == "Succeeded" and not report.get("commit"):
        # Its pod, and the result in it, is gone (deleted by hand, or by the pod garbage
        # collector): the folder is complete, so another run only checks it and reports.
        await api.delete("batch/v1", "Job", job_name, ns)
        return status(
            "Pending", "Rechecking", f"Job {job_name} finished, but its pod and the result "
            "in it are gone; a new Job checks the claim's files and reports them (nothing "
            "already there is downloaded again).", **where,
        ), PENDING_POLL_SECONDS  # fmt: skip
    if state == "Succeeded":
        done = {
            "commit": report.get("commit"),
            "bytes_downloaded": report.get("bytesDownloaded"),
            "bytes_total": report.get("bytesTotal"),
            "files_total": report.get("filesTotal"),
            "config_json": _config_text(report.get("config")),
            "completion_time": now,
        }
        merged = base.model_copy(update={k: v for k, v in done.items() if v is not None})
        return status(
            "Ready", "Downloaded", _ready_message(hub.repo, merged), **where,
            **{k: v for k, v in done.items() if v is not None},
        ), None  # fmt: skip
    reason = str(report.get("reason") or "")
    message = str(report.get("message") or "the download Job failed")
    if reason not in DOWNLOAD_PERMANENT_EXIT_CODES:
        reason = "DownloadFailed"
        message = f"{message} (the Job's retries are spent)"
    return status(
        "Failed",
        reason,
        f"Job {job_name}: {message}. Fix the cause, then delete Job {job_name} to try again.",
        **where,
    ), None


def _ready_message(repo: str, st: ModelCacheStatus) -> str:
    commit = f" at commit {st.commit}" if st.commit else ""
    size = f", {size_text(st.bytes_total)} in {st.files_total} files" if st.bytes_total else ""
    return f"{repo}{commit} is on PersistentVolumeClaim {st.claim_name or ''}{size}, verified."


def _config_text(config: Any) -> str | None:
    return (
        json.dumps(config, sort_keys=True, separators=(",", ":"))
        if isinstance(config, dict)
        else None
    )


async def _running(
    api: ClusterAPI,
    cache: ModelCache,
    status: Status,
    where: dict[str, Any],
    job_name: str,
    http: httpx.AsyncClient | None,
) -> tuple[ModelCacheStatus, float | None]:
    """The Job runs: its pod's progress, or why its pod does not run."""
    ns = cache.metadata.namespace or ""
    pods = await api.list(
        "v1", "Pod", ns, label_selector=f"batch.kubernetes.io/job-name={job_name}"
    )
    pods = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    pods.sort(key=lambda p: p["metadata"].get("creationTimestamp", ""))
    pod = pods[-1] if pods else None
    pod_status = (pod or {}).get("status") or {}
    if pod is None or pod_status.get("phase") != "Running" or not pod_status.get("podIP"):
        why = _pod_waiting(pod)
        return status(
            "Pending", "DownloadStarting", f"Job {job_name} is starting{why}.", **where
        ), PENDING_POLL_SECONDS  # fmt: skip
    progress = await download_progress(http, pod_status["podIP"], PROGRESS_PORT) or {}
    counts = {
        key: progress.get(wire)
        for key, wire in (
            ("commit", "commit"),
            ("bytes_downloaded", "bytesDownloaded"),
            ("bytes_total", "bytesTotal"),
            ("files_total", "filesTotal"),
        )
        if isinstance(progress.get(wire), int | str) and progress.get(wire) not in ("", None)
    }
    shown = ModelCacheStatus(**{**where, **counts})
    step = str(progress.get("phase") or "Downloading").lower()
    return status(
        "Downloading",
        "Downloading",
        f"Job {job_name} is {step}{progress_text(shown)}.",
        **where,
        **counts,
    ), DOWNLOAD_POLL_SECONDS


def _pod_waiting(pod: Manifest | None) -> str:
    """ ": <why its pod waits>" (unschedulable, an unbound claim, a container waiting)."""
    if pod is None:
        return ""
    st = pod.get("status") or {}
    scheduled = manifest_condition(pod, "PodScheduled") or {}
    if scheduled.get("status") == "False":
        return f": its pod is not scheduled ({scheduled.get('message') or scheduled.get('reason')})"
    for cs in st.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") not in (None, "ContainerCreating"):
            return f": its container waits ({waiting.get('reason')}: {waiting.get('message', '')})"
    return ""
