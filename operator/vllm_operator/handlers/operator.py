"""Kopf registration: watch events become keys on the work queue; nothing else happens here.

Every InferenceService event that changes more than the autoscaler's own status, every
event of an object carrying the inference-service label (Deployment, Service,
PodDisruptionBudget, Pod), and a periodic resync add the owning InferenceService's key;
the queue runs the one reconcile for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import random
import socket
from typing import TYPE_CHECKING, Any, cast

import httpx
import kopf
from prometheus_client import start_http_server

from vllm_operator.constants import (
    API_VERSION,
    GROUP,
    KIND_INFERENCE_BENCHMARK,
    KIND_INFERENCE_SERVICE,
    LABEL_BENCHMARK,
    LABEL_LOCK_TARGET,
    LABEL_SERVICE,
    LABEL_WARMUP_FOR,
    PLURAL_INFERENCE_BENCHMARK,
    PLURAL_INFERENCE_SERVICE,
    VERSION,
)
from vllm_operator.k8s.api import ApiError
from vllm_operator.k8s.client import KubeClient, load_config
from vllm_operator.metrics import CONDITIONS, RECONCILE_SECONDS, RECONCILES
from vllm_operator.reconcile.autoscale import autoscale_inference_service, http_scraper
from vllm_operator.reconcile.benchmark import reconcile_inference_benchmark
from vllm_operator.reconcile.inference_service import reconcile_inference_service
from vllm_operator.reconcile.queue import WorkQueue
from vllm_operator.settings import OperatorSettings

if TYPE_CHECKING:
    # Kopf types the identity as a NewType of str that it does not export.
    from kopf._core.engines.peering import Identity

log = logging.getLogger("vllm_operator")
# (kind, namespace, name) of the object to reconcile.
Key = tuple[str, str, str]
ISVC, BENCH, SCALE = "isvc", "bench", "scale"


def _settings(memo: Any) -> OperatorSettings:
    settings: OperatorSettings = memo.settings
    return settings


@kopf.on.login()
async def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """Kopf's credentials from the same kubeconfig (or service account) as our client."""
    api = await load_config(_settings(memo).kubeconfig)
    cfg = api.configuration
    await api.close()
    token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    if token and token.lower().startswith("bearer "):
        token = token[7:]
    return kopf.ConnectionInfo(
        server=str(cfg.host),
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        token=token,
        default_namespace="default",
    )


async def _work(memo: Any, key: Key) -> float | None:
    kind, namespace, name = key
    if kind == BENCH:
        return await _work_benchmark(memo, key)
    if kind == SCALE:
        return await _work_autoscale(memo, key)
    api: KubeClient = memo.api
    queue: WorkQueue[Key] = memo.queue
    body = await api.get(API_VERSION, KIND_INFERENCE_SERVICE, name, namespace)
    if body is None or body["metadata"].get("deletionTimestamp"):
        queue.forget(key)  # children go with it through garbage collection
        return None
    with RECONCILE_SECONDS.labels(KIND_INFERENCE_SERVICE).time():
        try:
            outcome = await reconcile_inference_service(api, body, settings=_settings(memo))
        except ApiError as err:
            RECONCILES.labels(KIND_INFERENCE_SERVICE, "retry" if err.transient else "error").inc()
            delay = queue.backoff(key)
            log.warning(
                "Reconcile of InferenceService failed; retrying.",
                extra={"object": f"{namespace}/{name}", "error": str(err), "delay": delay},
            )
            return delay
    RECONCILES.labels(KIND_INFERENCE_SERVICE, "stalled" if outcome.stalled else "ok").inc()
    CONDITIONS.labels(KIND_INFERENCE_SERVICE, namespace, name, "Ready", "True").set(
        1 if outcome.ready else 0
    )
    queue.forget(key)
    return None


async def _work_benchmark(memo: Any, key: Key) -> float | None:
    _, namespace, name = key
    api: KubeClient = memo.api
    queue: WorkQueue[Key] = memo.queue
    body = await api.get(API_VERSION, KIND_INFERENCE_BENCHMARK, name, namespace)
    if body is None or body["metadata"].get("deletionTimestamp"):
        queue.forget(key)
        return None
    with RECONCILE_SECONDS.labels(KIND_INFERENCE_BENCHMARK).time():
        try:
            phase = await reconcile_inference_benchmark(api, body, settings=_settings(memo))
        except ApiError as err:
            RECONCILES.labels(KIND_INFERENCE_BENCHMARK, "retry").inc()
            log.warning(
                "Reconcile of InferenceBenchmark failed; retrying.",
                extra={"object": f"{namespace}/{name}", "error": str(err)},
            )
            return queue.backoff(key)
    RECONCILES.labels(KIND_INFERENCE_BENCHMARK, "ok").inc()
    queue.forget(key)
    # A pending benchmark waits for its target to become Ready: look again soon.
    return 5.0 if phase == "Pending" else None


async def _work_autoscale(memo: Any, key: Key) -> float | None:
    """One autoscaler reading; it schedules the next one itself while autoscaling is on."""
    _, namespace, name = key
    api: KubeClient = memo.api
    queue: WorkQueue[Key] = memo.queue
    body = await api.get(API_VERSION, KIND_INFERENCE_SERVICE, name, namespace)
    if body is None or body["metadata"].get("deletionTimestamp"):
        queue.forget(key)
        memo.scaling.discard(key)
        return None
    try:
        again = await autoscale_inference_service(
            api, body, states=memo.scaler_states, scrape=http_scraper(memo.http)
        )
    except ApiError as err:
        log.warning(
            "Autoscaler reading failed; retrying.",
            extra={"object": f"{namespace}/{name}", "error": str(err)},
        )
        return queue.backoff(key)
    queue.forget(key)
    if again is None:
        memo.scaling.discard(key)
    return again


def _schedule_autoscaler(memo: Any, namespace: str, name: str) -> None:
    """The first autoscaler reading, now, unless readings are scheduled already: each one
    schedules the next, so events (the autoscaler's own status writes among them) and
    resyncs add nothing more."""
    scale = (SCALE, namespace, name)
    if scale not in memo.scaling:
        memo.scaling.add(scale)
        memo.queue.add(scale)


async def _resync(memo: Any) -> None:
    """Every resync period, every InferenceService gets a reconcile (spread over the
    period, so a thousand objects do not arrive at once)."""
    settings = _settings(memo)
    api: KubeClient = memo.api
    while True:
        await asyncio.sleep(settings.resync_seconds)
        spaces: list[str | None] = list(settings.namespaces) or [None]
        for ns in spaces:
            try:
                items = await api.list(API_VERSION, KIND_INFERENCE_SERVICE, ns)
            except ApiError as err:
                log.warning(
                    "Listing InferenceServices for resync failed.", extra={"error": str(err)}
                )
                continue
            for item in items:
                meta = item["metadata"]
                memo.queue.add(
                    (ISVC, meta["namespace"], meta["name"]),
                    random.uniform(0, settings.resync_seconds / 2),
                )
                if item.get("spec", {}).get("autoscaling", {}).get("enabled"):
                    _schedule_autoscaler(memo, meta["namespace"], meta["name"])


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    ours = _settings(memo)
    # Kopf's own bookkeeping, should it ever need any, under our prefix; handler logs are
    # not posted as Events (we record our own, on transitions only).
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.enabled = False
    # Reconnect watches regularly; a silently dead stream is then bounded in time.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    if ours.metrics_port:
        start_http_server(ours.metrics_port)
    memo.api = KubeClient(await load_config(ours.kubeconfig))
    memo.queue = WorkQueue[Key](max_delay=ours.max_retry_seconds)
    memo.http = httpx.AsyncClient()
    memo.scaler_states = {}
    memo.scaling = set()  # keys whose autoscaler readings are scheduled
    memo.seen = {}  # (namespace, name) → the service as its last event showed it
    memo.tasks = [
        asyncio.create_task(memo.queue.run(lambda k: _work(memo, k), ours.workers)),
        asyncio.create_task(_resync(memo)),
    ]
    log.info("Started the vllm-operator.", extra={"namespaces": ours.namespaces or "all"})


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    for task in getattr(memo, "tasks", []):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    if hasattr(memo, "api"):
        await memo.api.close()
    if hasattr(memo, "http"):
        await memo.http.aclose()


def reconcile_relevant(body: Any) -> str:
    """A digest of the service as the reconcile sees it: everything but the fields that
    change with every write (resourceVersion, managedFields) and the autoscaler's own
    ``status.autoscaling``, which changes every period under load and which the reconcile
    neither reads nor writes. Events that leave it unchanged need no reconcile."""
    metadata = {
        k: v for k, v in (body.get("metadata") or {}).items()
        if k not in ("resourceVersion", "managedFields")
    }  # fmt: skip
    status = {k: v for k, v in (body.get("status") or {}).items() if k != "autoscaling"}
    relevant = {**dict(body), "metadata": metadata, "status": status}
    text = json.dumps(relevant, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@kopf.on.event(GROUP, VERSION, PLURAL_INFERENCE_SERVICE)
async def inference_service_event(
    type: str | None,
    body: kopf.Body,
    name: str,
    namespace: str | None,
    spec: kopf.Spec,
    status: kopf.Status,
    memo: Any,
    **_: Any,
) -> None:
    if not namespace:
        return
    seen: dict[tuple[str, str], str] = memo.seen
    if type == "DELETED":
        seen.pop((namespace, name), None)
        memo.queue.add((ISVC, namespace, name))
        return
    digest = reconcile_relevant(body)
    if seen.get((namespace, name)) != digest:
        seen[(namespace, name)] = digest
        memo.queue.add((ISVC, namespace, name))
    # Autoscaling on, or its status to clear.
    if (spec.get("autoscaling") or {}).get("enabled") or status.get("autoscaling"):
        _schedule_autoscaler(memo, namespace, name)


def _owner_event(body: kopf.Body, namespace: str | None, memo: Any) -> None:
    owner = body.get("metadata", {}).get("labels", {}).get(LABEL_SERVICE)
    if owner and namespace:
        memo.queue.add((ISVC, namespace, owner))


@kopf.on.event("apps", "v1", "deployments", labels={LABEL_SERVICE: kopf.PRESENT})
async def deployment_event(body: kopf.Body, namespace: str | None, memo: Any, **_: Any) -> None:
    _owner_event(body, namespace, memo)


@kopf.on.event("", "v1", "services", labels={LABEL_SERVICE: kopf.PRESENT})
async def service_event(body: kopf.Body, namespace: str | None, memo: Any, **_: Any) -> None:
    _owner_event(body, namespace, memo)


@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels={LABEL_SERVICE: kopf.PRESENT})
async def pdb_event(body: kopf.Body, namespace: str | None, memo: Any, **_: Any) -> None:
    _owner_event(body, namespace, memo)


@kopf.on.event("batch", "v1", "jobs", labels={LABEL_WARMUP_FOR: kopf.PRESENT})
async def warmup_job_event(body: kopf.Body, namespace: str | None, memo: Any, **_: Any) -> None:
    owner = body.get("metadata", {}).get("labels", {}).get(LABEL_WARMUP_FOR)
    if owner and namespace:
        memo.queue.add((ISVC, namespace, owner))


@kopf.on.event(GROUP, VERSION, PLURAL_INFERENCE_BENCHMARK)
async def inference_benchmark_event(name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    if namespace:
        memo.queue.add((BENCH, namespace, name))


@kopf.on.event("batch", "v1", "jobs", labels={LABEL_BENCHMARK: kopf.PRESENT})
async def benchmark_job_event(body: kopf.Body, namespace: str | None, memo: Any, **_: Any) -> None:
    labels = body.get("metadata", {}).get("labels", {})
    owner, target = labels.get(LABEL_BENCHMARK), labels.get(LABEL_LOCK_TARGET)
    if owner and namespace:
        memo.queue.add((BENCH, namespace, owner))
    if target and namespace:
        # The lock coming or going changes what its InferenceService may do.
        memo.queue.add((ISVC, namespace, target))


@kopf.on.event("", "v1", "pods", labels={LABEL_SERVICE: kopf.PRESENT})
async def pod_event(body: kopf.Body, namespace: str | None, memo: Any, **_: Any) -> None:
    _owner_event(body, namespace, memo)


def operator_identity() -> Identity:
    """Who this operator is, to Kopf: ``vllm-operator@<host>/<pid>``.

    Kopf computes its default from ``getpass.getuser()``, even in standalone mode, and that
    raises ``KeyError`` for a uid with no passwd entry and no ``USER``/``LOGNAME``: the
    image's own 65532, or OpenShift's random uids. The host is the pod's name in a cluster.
    Kopf uses the identity only to sign this operator into peering objects, and standalone
    it writes none.
    """
    return cast("Identity", f"vllm-operator@{socket.gethostname()}/{os.getpid()}")


def run(settings: OperatorSettings) -> None:
    """Run the operator until it is stopped (SIGINT/SIGTERM)."""
    kopf.configure(
        verbose=False,
        log_format=kopf.LogFormat.JSON if settings.log_format == "json" else kopf.LogFormat.PLAIN,
    )
    # Kopf announces every handled watch event at INFO; ours are on transitions only.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    # httpx logs every request at INFO: the autoscaler's /metrics readings would flood.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    liveness = f"http://0.0.0.0:{settings.health_port}/healthz" if settings.health_port else None
    kopf.run(
        standalone=True,
        identity=operator_identity(),
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        liveness_endpoint=liveness,
        memo=kopf.Memo(settings=settings),
    )
