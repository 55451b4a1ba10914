"""What runs on the work queue, and what puts keys on it.

A key is ``(controller, namespace, name)``, one controller of the table in
k8s/controllers.py: ``isvc`` reconciles an InferenceService, ``bench`` an
InferenceBenchmark, ``cache`` a ModelCache, ``tune`` an InferenceTuning, ``scale`` takes
one autoscaler reading of an InferenceService. The watch events (through
vllm_operator.handlers) and the periodic resync only add keys; ``Runtime.work``, the one
turn for every controller, reads the key's object, runs its controller's reconcile
(runtime/controllers.py binds each row to it) and says when to come back.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Final

from vllm_operator.autoscale.decide import ScalerState
from vllm_operator.constants import API_VERSION, KIND_INFERENCE_BENCHMARK, KIND_INFERENCE_SERVICE
from vllm_operator.k8s.api import ApiError, ClusterAPI
from vllm_operator.k8s.controllers import (
    AUTOSCALER_CONTROLLER,
    INFERENCE_BENCHMARK_CONTROLLER,
    INFERENCE_SERVICE_CONTROLLER,
    INFERENCE_TUNING_CONTROLLER,
    MODEL_CACHE_CONTROLLER,
    REPEATS_UNTIL_STALLED,
    field_keys,
    owner_keys,
    watches,
)
from vllm_operator.metrics import RECONCILE_SECONDS, RECONCILES
from vllm_operator.models.base import Manifest
from vllm_operator.reconcile.autoscale import autoscale_inference_service
from vllm_operator.reconcile.benchmark import reconcile_inference_benchmark
from vllm_operator.reconcile.inference_service import (
    AppliedMemo,
    NodeView,
    Outcome,
    list_nodes,
    reconcile_inference_service,
)
from vllm_operator.reconcile.model_cache import reconcile_model_cache
from vllm_operator.reconcile.tuning import Step as TuningStep
from vllm_operator.reconcile.tuning import reconcile_inference_tuning
from vllm_operator.runtime.cache import WATCHED, ObjectCache, WatchStore
from vllm_operator.runtime.controllers import BINDINGS, PENDING_BENCHMARK_SECONDS, Binding, Key
from vllm_operator.runtime.health import stuck
from vllm_operator.runtime.measurements import MeasurementsCache
from vllm_operator.runtime.queue import WorkQueue
from vllm_operator.servers.pods import PodClient
from vllm_operator.settings import OperatorSettings

__all__ = [
    "BENCH",
    "CACHE",
    "ISVC",
    "PENDING_BENCHMARK_SECONDS",
    "REPEATS_UNTIL_STALLED",
    "SCALE",
    "TUNE",
    "Key",
    "Runtime",
]

log = logging.getLogger("vllm_operator")

ISVC: Final = INFERENCE_SERVICE_CONTROLLER.name
BENCH: Final = INFERENCE_BENCHMARK_CONTROLLER.name
SCALE: Final = AUTOSCALER_CONTROLLER.name
CACHE: Final = MODEL_CACHE_CONTROLLER.name
TUNE: Final = INFERENCE_TUNING_CONTROLLER.name
# The kinds a watch maps to their controller's object by a field (Watch.names_by).
FIELD_WATCHED: Final = frozenset(w.resource.kind for _, w in watches() if w.names_by is not None)

ServiceReconcile = Callable[..., Awaitable[Outcome]]
BenchmarkReconcile = Callable[..., Awaitable[str]]
CacheReconcile = Callable[..., Awaitable[float | None]]
Autoscale = Callable[..., Awaitable[float | None]]
TuningReconcile = Callable[..., Awaitable[TuningStep]]


def reconcile_relevant(body: Manifest) -> str:
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


@dataclass
class Runtime:
    """Everything the operator holds while it runs (Kopf's memo carries only this)."""

    settings: OperatorSettings
    api: ClusterAPI
    # The one client of our own pods (their /metrics, adapters, a download's progress),
    # opened with the runtime and closed by close(); the tests give one on a mock transport.
    http: PodClient = field(default_factory=PodClient)
    queue: WorkQueue[Key] = field(init=False)
    # The reconciles a key's turn runs (the tests give their own).
    reconcile_service: ServiceReconcile = reconcile_inference_service
    reconcile_benchmark: BenchmarkReconcile = reconcile_inference_benchmark
    reconcile_cache: CacheReconcile = reconcile_model_cache
    reconcile_tuning: TuningReconcile = reconcile_inference_tuning
    # (namespace, InferenceService name) → the InferenceTunings targeting it, as their
    # events showed them: a change of the service (its image, model, GPUs) reaches them
    # at once (their Stale condition).
    tuning_targets: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    # (namespace, ModelCache name) → the InferenceServices naming it, as their events
    # showed them: a cache's change (its download done) reaches them at once.
    cache_users: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    autoscale: Autoscale = autoscale_inference_service
    # The autoscaler's memory of each service between readings.
    scaler_states: dict[str, ScalerState] = field(default_factory=dict)
    # Keys whose autoscaler readings are scheduled (each reading schedules the next).
    scaling: set[Key] = field(default_factory=set)
    # (namespace, name) → the digest of the service as its last event showed it.
    seen: dict[tuple[str, str], str] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # Nodes and GPUNodes, fed by watch events and relisted every resync (runtime/cache.py).
    nodes: ObjectCache = field(default_factory=ObjectCache)
    gpu_nodes: ObjectCache = field(default_factory=ObjectCache)
    # The namespaced objects the labelled watches show (runtime/cache.py), relisted
    # every resync; the service reconciles read through it.
    store: WatchStore = field(default_factory=WatchStore)
    # (namespace, name) of a service → what its passes last applied of its children.
    applied: dict[tuple[str, str], AppliedMemo] = field(default_factory=dict)
    # The measurements store's records, read once a minute at most for every service's
    # plan (runtime/measurements.py).
    measurements: MeasurementsCache = field(init=False)
    # Monotonic times for liveness: the last read of a key's object or LIST that
    # succeeded, and the last resync that listed every watched namespace (both start as
    # the runtime's creation).
    progressed: float = field(default_factory=time.monotonic)
    resynced: float = field(default_factory=time.monotonic)
    # Keys whose last turn failed to reach the apiserver at all: retried as soon as any
    # request gets an answer again, not after their back-off (which an outage of a
    # minute grows to 32 s and more), so a change pending across an apiserver restart
    # catches up within seconds.
    unreachable: set[Key] = field(default_factory=set)
    # The last internal error (500) of each service key, and how many passes in a row
    # gave that same error.
    repeated: dict[Key, tuple[str, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.queue = WorkQueue[Key](max_delay=self.settings.max_retry_seconds)
        self.measurements = MeasurementsCache(self.settings.own_namespace)

    # ------------------------------------------------------------------ lifecycle

    async def refresh_nodes(self) -> None:
        """One LIST of Nodes and of GPUNodes (the reconcile's own ``list_nodes``) into the
        caches; a failed one keeps both as they were (their watch events keep coming)."""
        try:
            view = await list_nodes(self.api)
        except ApiError as err:
            log.warning("Listing Nodes and GPUNodes failed: %s.", err, extra={"error": str(err)})
            return
        self._progressed()
        self.nodes.replace_all(view.nodes)
        self.gpu_nodes.replace_all(view.gpu_nodes)

    async def refresh_store(self, kinds: Collection[str] | None = None) -> None:
        """One LIST of each watched kind (or of ``kinds``), per watched namespace (per
        label that puts an object in a watch), into the store; a kind whose LIST failed
        keeps what it had."""
        spaces: list[str | None] = list(self.settings.namespaces) or [None]
        for kind, (api_version, labels) in WATCHED.items():
            if kinds is not None and kind not in kinds:
                continue
            self.store.begin_listing(kind)
            try:
                items: list[Manifest] = []
                for ns in spaces:
                    for label in labels or (None,):
                        items += await self.api.list(api_version, kind, ns, label_selector=label)
            except ApiError as err:
                self.store.abort_listing(kind)
                log.warning(
                    "Listing %ss for the cache failed: %s.", kind, err,
                    extra={"error": str(err)},
                )  # fmt: skip
                continue
            self._progressed()
            self.store.finish_listing(kind, items)

    def node_view(self) -> NodeView | None:
        """The caches as a reconcile reads them; None until both were listed once (the
        reconcile then lists them itself rather than plan on an empty cluster)."""
        if not (self.nodes.ready and self.gpu_nodes.ready):
            return None
        return NodeView(self.nodes.items(), self.gpu_nodes.items())

    def _progressed(self) -> None:
        self.progressed = time.monotonic()
        if self.unreachable:
            for key in self.unreachable:
                self.queue.add(key)
            self.unreachable.clear()

    def _failed(self, key: Key, err: ApiError) -> float:
        """The back-off after a failed turn (an unanswered one is also remembered)."""
        if err.status == 0:
            self.unreachable.add(key)
        return self.queue.backoff(key)

    def readiness(self) -> str | None:
        """Why the operator is not ready yet (the first LISTs of its caches not all
        answered), or None."""
        missing = [kind for kind in WATCHED if kind not in self.store.ready]
        if not (self.nodes.ready and self.gpu_nodes.ready):
            missing = ["Node", "GPUNode", *missing]
        if missing:
            return f"the first LISTs of {', '.join(missing)} have not all been answered yet"
        return None

    def health(self, now: float | None = None) -> str | None:
        """Why the work loop is stuck (runtime/health.py says what that means), or None."""
        now = time.monotonic() if now is None else now
        waiting = self.queue.waiting_since(now)
        resync_due = self.resynced + self.settings.resync_seconds
        if now > resync_due:
            waiting = resync_due if waiting is None else min(waiting, resync_due)
        return stuck(
            now,
            waiting_since=waiting,
            last_progress=self.progressed,
            bound=self.settings.liveness_seconds,
        )

    def start(self) -> None:
        """The queue's workers and the resync loop, as tasks of the running loop."""
        self.tasks = [
            asyncio.create_task(self.queue.run(self.work, self.settings.workers)),
            asyncio.create_task(self.resync_forever()),
        ]

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.tasks = []
        await self.http.aclose()

    # ------------------------------------------------------------------ a key's turn

    async def work(self, key: Key) -> float | None:
        """One turn of ``key``'s controller; the delay after which to run it again, or None.

        The key's object is read first: one gone, or going (unless the controller
        reconciles objects being deleted: a ModelCache's finalizer is ours to remove),
        ends the key. A failed API request (the apiserver away, a timeout, a 5xx) is one
        log line with the object and the error, then a retry with back-off; a traceback
        is for an exception nobody expected (the queue logs those)."""
        binding = BINDINGS[key[0]]
        kind = binding.controller.reconciles.kind
        _, namespace, name = key
        try:
            body = await self._current(kind, key, deleting=binding.controller.deleting)
            if body is None:
                if binding.gone is not None:
                    binding.gone(self, key)
                return None
            return await self._turn(binding, key, body)
        except ApiError as err:
            delay = self._failed(key, err)
            log.warning(
                "Reading %s %s/%s failed: %s; retrying in %.0f s.",
                kind, namespace, name, err, delay,
                extra={"object": f"{namespace}/{name}", "error": str(err), "delay": delay},
            )  # fmt: skip
            return delay

    async def _current(self, kind: str, key: Key, *, deleting: bool = False) -> Manifest | None:
        """The object of ``key``, or None (and its back-off forgotten) once it is gone or
        going: its children go with it through garbage collection. ``deleting``: an object
        being deleted is returned too."""
        _, namespace, name = key
        body = await self.api.get(API_VERSION, kind, name, namespace)
        self.unreachable.discard(key)  # this turn is its retry
        self._progressed()  # the apiserver answered: this turn is not stuck on it
        if body is None or (not deleting and body["metadata"].get("deletionTimestamp")):
            self.queue.forget(key)
            return None
        return body

    async def _turn(self, binding: Binding, key: Key, body: Manifest) -> float | None:
        """The reconcile of a present object, and what its failure or success makes of
        the key, as the controller's row says."""
        controller = binding.controller
        kind, metric = controller.reconciles.kind, controller.metric
        _, namespace, name = key
        timed = RECONCILE_SECONDS.labels(metric).time() if metric else contextlib.nullcontext()
        with timed:
            try:
                again, result = await binding.run(self, key, body)
            except ApiError as err:
                if controller.gone_namespace and err.namespace_terminating:
                    # Its namespace is being deleted: the object goes too, and its
                    # DELETED event ends the key; nothing to retry or report.
                    log.debug("%s %s/%s: its namespace is going.", kind, namespace, name)
                    self.queue.forget(key)
                    return None
                if await self._repeated_internal_error(binding, key, body, err):
                    return None
                result = "retry" if err.transient or not controller.classify else "error"
                if metric:
                    RECONCILES.labels(metric, result).inc()
                delay = self._failed(key, err)
                # The object and the error in the message itself: the plain log format
                # prints no extras.
                log.warning(
                    "%s of %s %s/%s failed: %s; retrying in %.0f s.",
                    controller.words, kind, namespace, name, err, delay,
                    extra={"object": f"{namespace}/{name}", "error": str(err), "delay": delay},
                )  # fmt: skip
                return delay
        self.repeated.pop(key, None)
        if metric:
            RECONCILES.labels(metric, result).inc()
        self.queue.forget(key)
        return again

    async def _repeated_internal_error(
        self, binding: Binding, key: Key, body: Manifest, err: ApiError
    ) -> bool:
        """Whether ``err`` is the same internal error (500) as the key's last
        ``stall_after_repeats - 1`` passes: then it is reported in the status as
        permanent, and the key waits for a change or the resync instead of retrying."""
        controller = binding.controller
        if not controller.stall_after_repeats or binding.report_repeated is None:
            return False
        if err.status != 500:
            self.repeated.pop(key, None)
            return False
        last, times = self.repeated.get(key, ("", 0))
        times = times + 1 if last == str(err) else 1
        self.repeated[key] = (str(err), times)
        if times < controller.stall_after_repeats:
            return False
        await binding.report_repeated(self.api, body, err, times)
        if controller.metric:
            RECONCILES.labels(controller.metric, "stalled").inc()
        del self.repeated[key]
        self.queue.forget(key)
        _, namespace, name = key
        log.warning(
            "%s of %s %s/%s failed %d times in a row with %s; "
            "stalled until it changes or the next resync.",
            controller.words, controller.reconciles.kind, namespace, name, times, err,
            extra={"object": f"{namespace}/{name}", "error": str(err)},
        )  # fmt: skip
        return True

    # ------------------------------------------------------------------ what adds keys

    def schedule_autoscaler(self, namespace: str, name: str) -> None:
        """The first autoscaler reading, now, unless readings are scheduled already: each
        one schedules the next, so events (the autoscaler's own status writes among them)
        and resyncs add nothing more."""
        scale = (SCALE, namespace, name)
        if scale not in self.scaling:
            self.scaling.add(scale)
            self.queue.add(scale)

    async def resync_once(self) -> None:
        """Every InferenceService gets a reconcile, spread over half the resync period (a
        thousand objects do not arrive at once); those autoscaling get their readings."""
        spread = self.settings.resync_seconds / 2
        spaces: list[str | None] = list(self.settings.namespaces) or [None]
        listed = 0
        for ns in spaces:
            try:
                items = await self.api.list(API_VERSION, KIND_INFERENCE_SERVICE, ns)
            except ApiError as err:
                where = f"namespace {ns}" if ns else "all namespaces"
                log.warning(
                    "Listing InferenceServices in %s for resync failed: %s.", where, err,
                    extra={"namespace": ns, "error": str(err)},
                )  # fmt: skip
                continue
            listed += 1
            self._progressed()
            for item in items:
                meta = item["metadata"]
                self.queue.add((ISVC, meta["namespace"], meta["name"]), random.uniform(0, spread))
                if item.get("spec", {}).get("autoscaling", {}).get("enabled"):
                    self.schedule_autoscaler(meta["namespace"], meta["name"])
        if listed == len(spaces):
            self.resynced = time.monotonic()

    async def fill_caches(self) -> None:
        """The first LISTs of every cache, each one that failed retried after 0.5 s, then
        twice as long each time up to 8 s, until all are filled. Until then the
        reconciles read for themselves; one refused LIST at start (a 429 while the
        apiserver's storage initializes) left them doing so until the next resync."""
        delay = 0.5
        while True:
            if not (self.nodes.ready and self.gpu_nodes.ready):
                await self.refresh_nodes()
            missing = [kind for kind in WATCHED if kind not in self.store.ready]
            if missing:
                await self.refresh_store(missing)
            if self.node_view() is not None and set(WATCHED) <= self.store.ready:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 8.0)

    async def resync_forever(self) -> None:
        await self.fill_caches()
        while True:
            await asyncio.sleep(self.settings.resync_seconds)
            await self.refresh_nodes()
            await self.refresh_store()
            await self.resync_once()

    def on_own_event(self, controller: str, event: str | None, body: Manifest) -> None:
        """A watch event of the kind ``controller`` reconciles (its binding says what it
        adds: runtime/controllers.py)."""
        on_event = BINDINGS[controller].on_event
        if on_event is not None:
            on_event(self, event, body)
        kind = str(body.get("kind"))
        if kind in FIELD_WATCHED:
            # Another controller maps this kind by a field (an InferenceTuning names its
            # target): the one handler of the kind serves that watch too.
            self.on_labelled(body, event, kind)

    def on_inference_service(self, event: str | None, body: Manifest) -> None:
        meta = body.get("metadata") or {}
        namespace, name = meta.get("namespace"), meta.get("name")
        if not namespace or not name:
            return
        self._track_cache_use(namespace, name, body, gone=event == "DELETED")
        for tuning in self.tuning_targets.get((namespace, name), ()):
            self.queue.add((TUNE, namespace, tuning))
        if event == "DELETED":
            self.seen.pop((namespace, name), None)
            self.queue.add((ISVC, namespace, name))
            return
        digest = reconcile_relevant(body)
        if self.seen.get((namespace, name)) != digest:
            self.seen[(namespace, name)] = digest
            self.queue.add((ISVC, namespace, name))
        # Autoscaling on, or its status to clear.
        spec, status = body.get("spec") or {}, body.get("status") or {}
        if (spec.get("autoscaling") or {}).get("enabled") or status.get("autoscaling"):
            self.schedule_autoscaler(namespace, name)

    def _track_cache_use(self, namespace: str, name: str, body: Manifest, *, gone: bool) -> None:
        """Keep ``cache_users`` current; the ModelCache a service names (or named) is
        reconciled, since its status lists its users and its deletion waits for them."""
        source = ((body.get("spec") or {}).get("model") or {}).get("source") or {}
        now = None if gone else (source.get("cache") or {}).get("name")
        for (ns, cache), users in list(self.cache_users.items()):
            if ns == namespace and name in users and cache != now:
                users.discard(name)
                self.queue.add((CACHE, ns, cache))
        if now:
            users = self.cache_users.setdefault((namespace, now), set())
            if name not in users:
                users.add(name)
                self.queue.add((CACHE, namespace, now))

    def on_model_cache(self, event: str | None, body: Manifest) -> None:
        """A ModelCache changed: it is reconciled, and so are the services that name it
        (its download finished, or it failed)."""
        meta = body.get("metadata") or {}
        namespace, name = meta.get("namespace"), meta.get("name")
        if not namespace or not name:
            return
        self.queue.add((CACHE, namespace, name))
        for user in self.cache_users.get((namespace, name), ()):
            self.queue.add((ISVC, namespace, user))

    def on_labelled(
        self, body: Manifest, event: str | None = None, kind: str | None = None
    ) -> None:
        """An event of an object that names its InferenceService by label (the children,
        their pods, warmup Jobs, lock Jobs) or its InferenceBenchmark (load Jobs: the
        lock they are changes what their target may do, so the target is reconciled
        too), or that names its InferenceService in a field (an InferenceTuning's
        spec.targetRef.name: its in-place trial, winner or deletion changes the
        service's arguments)."""
        kind = kind or str(body.get("kind"))
        self.store.on_event(kind, event, body)
        meta = body.get("metadata") or {}
        namespace, labels = meta.get("namespace"), meta.get("labels") or {}
        if not namespace:
            return
        for key in [*owner_keys(labels, namespace), *field_keys(kind, body)]:
            self.queue.add(key)

    def on_inference_benchmark(
        self,
        namespace: str | None,
        name: str,
        target: str | None = None,
        *,
        event: str | None = None,
        body: Manifest | None = None,
    ) -> None:
        """A benchmark changed: it is reconciled, and so is its target, whose status
        shows the last finished benchmark (a benchmark's end is a status change of the
        benchmark alone: without this the target showed it only at the next resync)."""
        if body is not None:
            self.store.on_event(KIND_INFERENCE_BENCHMARK, event, body)
        if namespace:
            self.queue.add((BENCH, namespace, name))
            if target:
                self.queue.add((ISVC, namespace, target))

    def on_inference_tuning(
        self, namespace: str | None, name: str, target: str | None, *, gone: bool = False
    ) -> None:
        """A tuning changed: it is reconciled, and so is its target, whose pods take an
        InPlace trial from the tuning's status (and go back when it ends or is deleted)."""
        if not namespace:
            return
        for (ns, service), tunings in list(self.tuning_targets.items()):
            if ns == namespace and service != target:
                tunings.discard(name)
        if target:
            tunings = self.tuning_targets.setdefault((namespace, target), set())
            if gone:
                tunings.discard(name)
            else:
                tunings.add(name)
            self.queue.add((ISVC, namespace, target))
        if not gone:
            self.queue.add((TUNE, namespace, name))
