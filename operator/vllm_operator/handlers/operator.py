"""Kopf registration: watch events go to the runtime (vllm_operator.runtime), which turns
them into keys on its work queue; nothing else happens here.

What is watched comes from the controller table (k8s/controllers.py), registered by
:func:`register_watches` when this module is imported: each controller's own kind, each
labelled watch (an object naming its owner by label: the children, their pods and
EndpointSlices, warmup, benchmark, lock and download Jobs), and the node caches' kinds.
Every event of these, and a periodic resync, add the owning object's key; the queue runs
the one turn for it. The same events keep the runtime's caches current.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, cast

import kopf
from prometheus_client import start_http_server

from vllm_operator.constants import (
    API_VERSION,
    GROUP,
    LABEL_SERVICE,
    PLURAL_GPU_NODE,
    PLURAL_INFERENCE_BENCHMARK,
    PLURAL_INFERENCE_SERVICE,
    PLURAL_INFERENCE_TUNING,
    PLURAL_MODEL_CACHE,
)
from vllm_operator.k8s.api import ApiError
from vllm_operator.k8s.client import CONNECT_TIMEOUT_SECONDS, KubeClient, load_config
from vllm_operator.k8s.controllers import (
    CLUSTER_CACHES,
    CONTROLLERS,
    GPU_NODE,
    NODE,
    Resource,
    apiserver_selectors,
    watches,
)
from vllm_operator.runtime.dispatch import Runtime
from vllm_operator.runtime.health import HealthServer
from vllm_operator.settings import OperatorSettings

if TYPE_CHECKING:
    # Kopf types the identity as a NewType of str that it does not export.
    from kopf._core.engines.peering import Identity

log = logging.getLogger("vllm_operator")

# The resources our CRDs define: a start without them would watch nothing and live on.
OUR_RESOURCES = (
    PLURAL_INFERENCE_SERVICE,
    PLURAL_INFERENCE_BENCHMARK,
    PLURAL_GPU_NODE,
    PLURAL_MODEL_CACHE,
    PLURAL_INFERENCE_TUNING,
)
# Kopf retries a failed request (a watch's LIST among them) after these pauses, then the
# watch starts over. Kopf's default (1, 1, 2, 3, 5, 8, 13, 21) left a watch asleep up to
# 21 s after the apiserver was back: changes made meanwhile waited 29-71 s (issue 15,
# item 4). At most 2 s apart, over about as long in all (53.5 s against 54 s) before a
# 5xx that lasts is escalated.
ERROR_BACKOFFS = (0.5, 1.0) + (2.0,) * 26


class EventsOnlyDiffBase(kopf.AnnotationsDiffBaseStorage):
    """Kopf's diff base with no essence. Kopf builds an object's "essence", a deep copy of
    it without its status, on every watch event, for change-detecting handlers
    (on.create, on.update, on.delete) to diff against. This operator registers none: it
    handles raw events. The copies were about 14 % of the operator's event-loop time while
    500 services rolled in (py-spy, the scale benchmark), most of it for pods."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()


# The labelled watches the apiserver filters: resource -> the one label its objects carry
# (k8s/controllers.py derives them from the table).
_SELECTORS: Final = apiserver_selectors()


def _spelled(resource: Resource) -> tuple[str, str] | tuple[str, str, str]:
    """Kopf's spelling of a resource: (group, version, plural), or (version, plural) for
    the core group."""
    return (resource.version, resource.plural) if not resource.group else (
        resource.group, resource.version, resource.plural
    )  # fmt: skip


# The watched resources every object of which carries the inference-service label, in
# Kopf's spelling.
LABELLED_BY_SERVICE: Final = tuple(
    _spelled(r) for r, label in _SELECTORS.items() if label == LABEL_SERVICE
)


def _settings(memo: Any) -> OperatorSettings:
    settings: OperatorSettings = memo.settings
    return settings


def _runtime(memo: Any) -> Runtime:
    runtime: Runtime = memo.runtime
    return runtime


@kopf.on.login(errors=kopf.ErrorsMode.PERMANENT)
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


async def require_crds(kube: KubeClient) -> None:
    """Refuse to start (PermanentError) when the apiserver answers without our CRDs; an
    apiserver that does not answer yet is left to the watches and the resync."""
    try:
        served = await kube.served(API_VERSION)
    except ApiError as err:
        log.warning("Checking for the CRDs failed: %s; starting anyway.", err)
        return
    missing = [f"{plural}.{GROUP}" for plural in OUR_RESOURCES if plural not in served]
    if missing:
        raise kopf.PermanentError(
            f"the CRDs {', '.join(missing)} are not installed (API {API_VERSION}): "
            "apply crds/ or install the chart first"
        )


def configure_kopf(settings: kopf.OperatorSettings, *, request_timeout: float) -> None:
    """Kopf's settings as the operator runs it: persistence, timeouts and the watches'
    label selectors (``startup`` calls it; the tests hold it to the registered handlers)."""
    # Kopf's own bookkeeping, should it ever need any, under our prefix; handler logs are
    # not posted as Events (we record our own, on transitions only).
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = EventsOnlyDiffBase(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.enabled = False
    # Every request of Kopf's own has a timeout: its default of 300 s kept a watch's LIST
    # on a silent connection that long.
    settings.networking.request_timeout = request_timeout
    settings.networking.connect_timeout = CONNECT_TIMEOUT_SECONDS
    settings.networking.error_backoffs = ERROR_BACKOFFS
    # Watches: the apiserver ends each after 300 s, the client 30 s later if it does not; a
    # stream silent for Kopf's inactivity_timeout (70 s: the apiserver sends a bookmark
    # every minute) is dropped and reconnected.
    # The labelled watches filter on the apiserver, so the operator is not sent every pod
    # and Deployment of the cluster to drop them itself (Kopf's handler filters are
    # client-side). Jobs carry one of three labels, which one selector cannot OR: those
    # are filtered by the handlers.
    for resource, label in _SELECTORS.items():
        settings.watching.label_selectors[_spelled(resource)] = label
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = CONNECT_TIMEOUT_SECONDS


# Any exception fails the start for good, and the process exits non-zero (run() below):
# Kopf's default retried it every 60 s in a process that reconciled nothing meanwhile.
@kopf.on.startup(errors=kopf.ErrorsMode.PERMANENT)
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    ours = _settings(memo)
    configure_kopf(settings, request_timeout=ours.request_timeout_seconds)
    kube = KubeClient(await load_config(ours.kubeconfig), timeout=ours.request_timeout_seconds)
    try:
        await require_crds(kube)
    except BaseException:
        await kube.close()
        raise
    memo.kube = kube
    if ours.metrics_port:
        start_http_server(ours.metrics_port)
    memo.runtime = Runtime(settings=ours, api=kube)
    memo.runtime.start()
    if ours.health_port:
        memo.health = HealthServer(
            memo.runtime.health, ready=memo.runtime.readiness, port=ours.health_port
        )
        await memo.health.start()
    log.info("Started the vllm-operator.", extra={"namespaces": ours.namespaces or "all"})


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    if hasattr(memo, "health"):
        await memo.health.close()
    if hasattr(memo, "runtime"):
        await _runtime(memo).close()
    if hasattr(memo, "kube"):
        await memo.kube.close()


def _own_event(controller: str) -> Callable[..., Awaitable[None]]:
    async def own_event(type: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
        _runtime(memo).on_own_event(controller, type, dict(body))

    return own_event


async def labelled_event(
    type: str | None, body: kopf.Body, resource: kopf.Resource, memo: Any, **_: Any
) -> None:
    _runtime(memo).on_labelled(dict(body), type, resource.kind)


async def node_event(type: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    _runtime(memo).nodes.on_event(type, dict(body))


async def gpu_node_event(type: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    _runtime(memo).gpu_nodes.on_event(type, dict(body))


_CACHE_EVENTS: Final = {NODE: node_event, GPU_NODE: gpu_node_event}


def register_watches(registry: kopf.OperatorRegistry | None = None) -> None:
    """One Kopf event handler per watch the controller table declares (into Kopf's
    default registry unless ``registry``): each controller's own kind, each labelled
    watch (filtered again client-side by its label: the apiserver's selector is one
    label per resource, and Jobs carry one of several), each watch by a field of a kind
    no controller reconciles, and the node caches' kinds."""
    for controller in CONTROLLERS:
        if controller.own_events:
            kopf.on.event(
                *_spelled(controller.reconciles),
                id=f"{controller.name}-event",
                registry=registry,
            )(_own_event(controller.name))
    own = {c.reconciles for c in CONTROLLERS if c.own_events}
    for _, watch in watches():
        if watch.names_by is not None and watch.resource in own:
            # Mapped by a field, of a kind a controller reconciles: its own handler
            # passes every event on (Runtime.on_own_event); one handler per kind.
            continue
        labels = {watch.label: kopf.PRESENT} if watch.label else None
        kopf.on.event(*_spelled(watch.resource), labels=labels, id=watch.id, registry=registry)(
            labelled_event
        )
    for resource in CLUSTER_CACHES:
        kopf.on.event(*_spelled(resource), registry=registry)(_CACHE_EVENTS[resource])


register_watches()


def operator_identity() -> Identity:
    """Who this operator is, to Kopf: ``vllm-operator@<host>/<pid>``.

    Kopf computes its default from ``getpass.getuser()``, even in standalone mode, and that
    raises ``KeyError`` for a uid with no passwd entry and no ``USER``/``LOGNAME``: the
    image's own 65532, or OpenShift's random uids. The host is the pod's name in a cluster.
    Kopf uses the identity only to sign this operator into peering objects, and standalone
    it writes none.
    """
    return cast("Identity", f"vllm-operator@{socket.gethostname()}/{os.getpid()}")


def run(settings: OperatorSettings) -> int:
    """Run the operator until it is stopped (SIGINT/SIGTERM): 0. A start that failed, or
    Kopf stopping on an error of its own: 1, after one line that says why (Kopf logged
    the traceback of a handler's exception already)."""
    kopf.configure(
        verbose=False,
        log_format=kopf.LogFormat.JSON if settings.log_format == "json" else kopf.LogFormat.PLAIN,
    )
    log.setLevel(settings.log_level.upper())
    # Kopf announces every handled watch event at INFO; ours are on transitions only.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    # httpx logs every request at INFO: the autoscaler's /metrics readings would flood.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        kopf.run(
            standalone=True,
            identity=operator_identity(),
            clusterwide=not settings.namespaces,
            namespaces=settings.namespaces,
            memo=kopf.Memo(settings=settings),
        )
    except Exception as exc:
        cause = exc.__cause__ or exc  # Kopf's ActivityError wraps the handler's exception
        log.error("The operator stopped: %s", str(cause) or type(cause).__name__)
        return 1
    return 0
