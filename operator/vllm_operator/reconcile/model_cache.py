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

One pass is :func:`observe` (every read, the running download's progress among them) →
the pure :func:`next_step` (the status, the claim and Job to apply or delete, our
finalizer, when to look again) → :func:`apply_step`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final

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
from vllm_operator.models.base import Condition, Manifest, field_errors
from vllm_operator.models.conditions import find, manifest_condition
from vllm_operator.reconcile.cache_use import progress_text, size_text
from vllm_operator.reconcile.jobs import job_pods_selector, job_state, report_of
from vllm_operator.reconcile.phases import phase_conditions, phase_event, write_phase_status
from vllm_operator.reconcile.steps import Event, Ref, apply_all, delete_all
from vllm_operator.render.model_cache import (
    PROGRESS_PORT,
    build_claim,
    build_download_job,
    claim_name,
    download_job_name,
    model_path,
)
from vllm_operator.servers.pods import PodClient
from vllm_operator.settings import OperatorSettings
from vllm_operator.tuning.cache import SizeUnknown, claim_size

log = logging.getLogger(__name__)

# A download in progress is looked at again this soon (its progress into status).
DOWNLOAD_POLL_SECONDS: Final = 5.0
# A cache waiting for its claim, Secret or Job pod.
PENDING_POLL_SECONDS: Final = 10.0
# --- observe ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    """Everything one pass reads for a cache, read before anything is decided. What a pass
    does not need is not read, and left empty: the claim of a cache in use that is being
    deleted; the Secret and the Job of a cache that is Ready; the Job's pods of a claim
    made again (the Job goes); the progress of a Job whose pod does not run."""

    # The status as stored (None: none, or written by an older version).
    stored: ModelCacheStatus | None = None
    # The cache is being deleted; our finalizer is on it.
    deleting: bool = False
    finalized: bool = False
    # The namespace's InferenceServices that name the cache (spec.model.source.cache).
    users: list[str] = field(default_factory=list)
    # The claim: ours for a huggingFace source, the named one for a pvc source.
    claim: Manifest | None = None
    # The Secret spec.source.huggingFace.tokenSecretRef names.
    secret: Manifest | None = None
    # The download Job and its pods, and what its running pod says of its progress.
    job: Manifest | None = None
    job_pods: list[Manifest] = field(default_factory=list)
    progress: Mapping[str, Any] | None = None


async def _users(api: ClusterAPI, cache: ModelCache) -> list[str]:
    """The namespace's InferenceServices that name the cache in spec.model.source.cache."""
    items = await api.list(API_VERSION, KIND_INFERENCE_SERVICE, cache.metadata.namespace)
    names = []
    for item in items:
        source = ((item.get("spec") or {}).get("model") or {}).get("source") or {}
        if (source.get("cache") or {}).get("name") == cache.metadata.name:
            names.append(str(item["metadata"]["name"]))
    return sorted(names)


async def observe(
    api: ClusterAPI, body: Manifest, cache: ModelCache, *, http: PodClient | None
) -> Observed:
    """Every read of a pass, in the order the decision needs them (a later read only when
    an earlier one says the decision will use it)."""
    meta = body["metadata"]
    ns = cache.metadata.namespace or ""
    seen = Observed(
        stored=_stored(body),
        deleting=bool(meta.get("deletionTimestamp")),
        finalized=FINALIZER_MODEL_CACHE in (meta.get("finalizers") or []),
        users=await _users(api, cache),
    )
    hub = cache.spec.source.hugging_face
    if seen.deleting and (seen.users or hub is None or not cache.spec.storage.retain):
        return seen
    if hub is not None and not seen.deleting and _size(cache) is None:
        return seen  # Failed whatever the cluster holds
    claim = await api.get("v1", "PersistentVolumeClaim", claim_name(cache), ns)
    seen = replace(seen, claim=claim)
    base = seen.stored or ModelCacheStatus()
    if hub is None or seen.deleting or (claim is not None and base.phase == "Ready"):
        return seen
    ref = hub.token_secret_ref
    if ref is not None:
        secret = await api.get("v1", "Secret", ref.name, ns)
        seen = replace(seen, secret=secret)
        if _secret_missing(secret, ref.key):
            return seen
    job = await api.get("batch/v1", "Job", download_job_name(cache), ns)
    seen = replace(seen, job=job)
    if claim is None and job is not None:
        return seen  # the Job goes with the claim that is gone
    pods = await api.list(
        "v1", "Pod", ns, label_selector=job_pods_selector(download_job_name(cache))
    )
    seen = replace(seen, job_pods=pods)
    pod_status = (_latest_pod(pods) or {}).get("status") or {}
    # A Job made this pass runs; its pod is read for progress once it runs.
    if http is not None and (job is None or job_state(job) == "Running") and _serving(pod_status):
        progress = await http.download_progress(pod_status["podIP"], PROGRESS_PORT)
        seen = replace(seen, progress=progress)
    return seen


# --- decide -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """What one pass does, and when to look again (``requeue``; None: at the next event)."""

    # The whole status to write (written only when it differs); None: none, the cache goes.
    status: ModelCacheStatus | None = None
    # Applied in this order (the claim before the Job that downloads into it).
    apply: tuple[Manifest, ...] = ()
    delete: tuple[Ref, ...] = ()
    events: tuple[Event, ...] = ()
    requeue: float | None = None
    # Our finalizer: True to add it (first), False to remove it (last), None as it is.
    finalizer: bool | None = None


def _conditions(
    phase: str, reason: str, message: str, *, gen: int | None, now: datetime, old: list[Condition]
) -> list[Condition]:
    return phase_conditions(
        reason, message, ready=phase == "Ready", reconciling=phase in ("Pending", "Downloading"),
        stalled=phase == "Failed", now=now, generation=gen, previous=old,
    )  # fmt: skip


def _status(
    cache: ModelCache,
    observed: Observed,
    now: datetime,
    phase: str,
    reason: str,
    message: str,
    **fields: Any,
) -> ModelCacheStatus:
    """The whole status in ``phase``: what the last one recorded, with ``fields`` over it."""
    gen = cache.metadata.generation
    base = observed.stored or ModelCacheStatus()
    kept = base.model_dump(exclude={"conditions", "phase", "observed_generation", "used_by"})
    kept.update(fields)
    return ModelCacheStatus(
        observed_generation=gen,
        phase=phase,
        conditions=_conditions(phase, reason, message, gen=gen, now=now, old=base.conditions),
        used_by=observed.users,
        **kept,
    )


def _step(observed: Observed, status: ModelCacheStatus, **parts: Any) -> Step:
    """The step that writes ``status``, with the event of a new phase."""
    event = phase_event(observed.stored, status)
    return Step(status, events=(event,) if event else (), **parts)


def invalid_step(body: Manifest, err: ValidationError, now: datetime) -> Step:
    """A stored cache the models reject: Failed with what is invalid (a cache being
    deleted just goes)."""
    meta = body["metadata"]
    if meta.get("deletionTimestamp"):
        return Step(finalizer=False) if _finalized(body) else Step()
    old = _stored(body)
    gen = meta.get("generation")
    fields = field_errors(err, limit=5)
    invalid = ModelCacheStatus(
        observed_generation=gen,
        phase="Failed",
        conditions=_conditions(
            "Failed", "InvalidSpec", f"The spec is invalid: {fields}",
            gen=gen, now=now, old=old.conditions if old else [],
        ),
    )  # fmt: skip
    return _step(Observed(stored=old), invalid)


def next_step(
    cache: ModelCache, observed: Observed, now: datetime, *, settings: OperatorSettings
) -> Step:
    """The pass's step, pure: a cache being deleted waits for its users, then goes; a pvc
    source is adopted; a huggingFace source is downloaded once."""
    if observed.deleting:
        return _deleting(cache, observed, now)
    add = None if observed.finalized else True
    if cache.spec.source.pvc is not None:
        return replace(_adopt(cache, observed, now), finalizer=add)
    return replace(_download(cache, observed, now, settings=settings), finalizer=add)


def _deleting(cache: ModelCache, observed: Observed, now: datetime) -> Step:
    users = observed.users
    if users:
        return _step(observed, _status(
            cache, observed, now, "Deleting", "InUse",
            f"Deletion waits until no InferenceService names this cache; now "
            f"{', '.join(users)} (spec.model.source.cache). Point them at another "
            "source or delete them, and the cache goes.",
        ))  # fmt: skip
    keep: tuple[Manifest, ...] = ()
    claim = observed.claim
    if cache.spec.source.hugging_face is not None and cache.spec.storage.retain and claim:
        # Kept: the claim loses its owner reference before the cache goes.
        size = (claim.get("spec") or {}).get("resources", {}).get("requests", {}).get("storage")
        base = observed.stored or ModelCacheStatus()
        keep = (build_claim(cache, str(size or base.size), owned=False),)
    return Step(apply=keep, finalizer=False if observed.finalized else None)


def _adopt(cache: ModelCache, observed: Observed, now: datetime) -> Step:
    """A pvc source: Ready once the claim exists and is Bound."""
    ns = cache.metadata.namespace
    name = claim_name(cache)
    where = {"claim_name": name, "path": model_path(cache)}
    claim = observed.claim
    if claim is None:
        return _step(observed, _status(
            cache, observed, now, "Pending", "ClaimNotFound",
            f"PersistentVolumeClaim {name} named in spec.source.pvc does not exist in "
            f"namespace {ns}.",
            **where,
        ), requeue=PENDING_POLL_SECONDS)  # fmt: skip
    phase = (claim.get("status") or {}).get("phase")
    if phase != "Bound":
        return _step(observed, _status(
            cache, observed, now, "Pending", "ClaimPending",
            f"PersistentVolumeClaim {name} is {phase or 'Pending'}, not Bound yet.",
            **where,
        ), requeue=PENDING_POLL_SECONDS)  # fmt: skip
    return _step(observed, _status(
        cache, observed, now, "Ready", "Adopted",
        f"Serving the weights on PersistentVolumeClaim {name} as they are.",
        **where,
    ))  # fmt: skip


def _size(cache: ModelCache) -> str | None:
    try:
        size, _why = claim_size(cache)
    except SizeUnknown:
        return None
    return size


def _secret_missing(secret: Manifest | None, key: str) -> bool:
    return secret is None or key not in (secret.get("data") or {})


def _download(
    cache: ModelCache, observed: Observed, now: datetime, *, settings: OperatorSettings
) -> Step:
    ns = cache.metadata.namespace or ""
    hub = cache.spec.source.hugging_face
    assert hub is not None
    job_name = download_job_name(cache)
    base = observed.stored or ModelCacheStatus()
    where: dict[str, Any] = {"claim_name": claim_name(cache), "path": model_path(cache)}
    try:
        size, _why = claim_size(cache)
    except SizeUnknown as err:
        return _step(observed, _status(cache, observed, now, "Failed", "SizeUnknown", str(err)))
    where["size"] = size

    def status(phase: str, reason: str, message: str, **fields: Any) -> ModelCacheStatus:
        return _status(cache, observed, now, phase, reason, message, **where, **fields)

    claim = observed.claim
    if claim is not None and base.phase == "Ready":
        # Downloaded: neither the token nor the Job matters any more.
        return _step(observed, status("Ready", "Downloaded", _ready_message(hub.repo, base)))
    ref = hub.token_secret_ref
    if ref is not None and _secret_missing(observed.secret, ref.key):
        what = (
            f"Secret {ref.name} does not exist in namespace {ns}"
            if observed.secret is None
            else f"Secret {ref.name} has no key {ref.key}"
        )
        return _step(observed, status(
            "Pending", "SecretNotFound",
            f"{what} (spec.source.huggingFace.tokenSecretRef); the download starts once it does.",
        ), requeue=PENDING_POLL_SECONDS)  # fmt: skip
    job = observed.job
    made: list[Manifest] = []
    if claim is None:
        # New, or deleted by hand: the claim, then a download into it (the Job of a
        # download into a claim that is gone says nothing of the new one).
        made.append(build_claim(cache, size))
        if job is not None:
            return _step(observed, status(
                "Pending", "ClaimCreated", f"PersistentVolumeClaim {claim_name(cache)} was "
                "created again; the download starts over.",
            ), apply=tuple(made), delete=(Ref("batch/v1", "Job", job_name, ns),),
               requeue=PENDING_POLL_SECONDS)  # fmt: skip
    if job is None:
        resources = settings.download_resources.to_wire()
        made.append(build_download_job(cache, image=settings.warmup_image, resources=resources))
    state = "Running" if job is None else job_state(job)  # a Job made now runs
    if state == "Running":
        running, counts, again = _running(observed, job_name)
        return _step(observed, status(*running, **counts), apply=tuple(made), requeue=again)
    report = report_of(observed.job_pods)
    if state == "Succeeded" and not report.get("commit"):
        # Its pod, and the result in it, is gone (deleted by hand, or by the pod garbage
        # collector): the folder is complete, so another run only checks it and reports.
        return _step(observed, status(
            "Pending", "Rechecking", f"Job {job_name} finished, but its pod and the result "
            "in it are gone; a new Job checks the claim's files and reports them (nothing "
            "already there is downloaded again).",
        ), apply=tuple(made), delete=(Ref("batch/v1", "Job", job_name, ns),),
           requeue=PENDING_POLL_SECONDS)  # fmt: skip
    if state == "Succeeded":
        done = {
            "commit": report.get("commit"),
            "bytes_downloaded": report.get("bytesDownloaded"),
            "bytes_total": report.get("bytesTotal"),
            "files_total": report.get("filesTotal"),
            "config_json": _config_text(report.get("config")),
            "completion_time": now,
        }
        found = {k: v for k, v in done.items() if v is not None}
        merged = base.model_copy(update=found)
        ready = status("Ready", "Downloaded", _ready_message(hub.repo, merged), **found)
        return _step(observed, ready, apply=tuple(made))
    reason = str(report.get("reason") or "")
    message = str(report.get("message") or "the download Job failed")
    if reason not in DOWNLOAD_PERMANENT_EXIT_CODES:
        reason = "DownloadFailed"
        message = f"{message} (the Job's retries are spent)"
    return _step(observed, status(
        "Failed", reason,
        f"Job {job_name}: {message}. Fix the cause, then delete Job {job_name} to try again.",
    ), apply=tuple(made))  # fmt: skip


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


def _latest_pod(pods: list[Manifest]) -> Manifest | None:
    """The Job's newest pod that is not going."""
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    live.sort(key=lambda p: p["metadata"].get("creationTimestamp", ""))
    return live[-1] if live else None


def _serving(pod_status: Manifest) -> bool:
    """Whether the pod runs and has an address to ask for its progress."""
    return pod_status.get("phase") == "Running" and bool(pod_status.get("podIP"))


def _running(
    observed: Observed, job_name: str
) -> tuple[tuple[str, str, str], dict[str, Any], float]:
    """The Job runs: (phase, reason, message) of its pod's progress, or of why its pod
    does not run; the counts it reported; and when to look again."""
    pod = _latest_pod(observed.job_pods)
    pod_status = (pod or {}).get("status") or {}
    if pod is None or not _serving(pod_status):
        why = _pod_waiting(pod)
        starting = ("Pending", "DownloadStarting", f"Job {job_name} is starting{why}.")
        return starting, {}, PENDING_POLL_SECONDS
    progress = observed.progress or {}
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
    shown = ModelCacheStatus(**counts)
    step = str(progress.get("phase") or "Downloading").lower()
    message = f"Job {job_name} is {step}{progress_text(shown)}."
    return ("Downloading", "Downloading", message), counts, DOWNLOAD_POLL_SECONDS


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


# --- apply --------------------------------------------------------------------------------


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


async def apply_step(api: ClusterAPI, body: Manifest, step: Step) -> None:
    """Our finalizer first (when added), the step's objects in order, its deletions, our
    finalizer last (when removed), then its status (only when it changed) with its events."""
    if step.finalizer is True:
        await _set_finalizer(api, body, True)
    await apply_all(api, step.apply)
    await delete_all(api, step.delete)
    if step.finalizer is False:
        await _set_finalizer(api, body, False)
    if step.status is None:
        return
    await write_phase_status(api, body, _stored(body), step.status, step.events)
    if step.events:
        ready = find(step.status.conditions, "Ready")
        log.info(
            "ModelCache %s/%s: %s (%s).",
            body["metadata"].get("namespace"), body["metadata"]["name"], step.status.phase,
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


def _finalized(body: Manifest) -> bool:
    return FINALIZER_MODEL_CACHE in (body["metadata"].get("finalizers") or [])


async def reconcile_model_cache(
    api: ClusterAPI,
    body: Manifest,
    *,
    settings: OperatorSettings,
    http: PodClient | None = None,
    now: datetime | None = None,
) -> float | None:
    """Advance one ModelCache; returns when to look again (None: at the next event)."""
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    try:
        cache = ModelCache.model_validate(body)
    except ValidationError as err:
        step = invalid_step(body, err, now)
    else:
        step = next_step(cache, await observe(api, body, cache, http=http), now, settings=settings)
    await apply_step(api, body, step)
    return step.requeue
