"""``ClusterAPI`` over kubernetes_asyncio, the async Kubernetes client.

kubernetes_asyncio rather than the synchronous ``kubernetes`` package: Kopf runs handlers
on an asyncio loop, and a synchronous client would block that loop (or need a thread pool)
on every request. Only its configuration loading and HTTP plumbing are used; requests go
to paths from a static table, with server-side apply for every write.

Every request has a timeout (connecting included): kubernetes_asyncio passes an empty
``aiohttp.ClientTimeout()`` unless told otherwise, which waits for ever, and one silent
connection (a stalled load balancer, a half-open TCP connection) held a reconcile, and
its worker, for good (issue 15, item 2).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from datetime import UTC, datetime
from typing import Any, Final

import aiohttp
import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from vllm_operator.constants import FIELD_MANAGER
from vllm_operator.k8s.api import ApiError
from vllm_operator.k8s.resources import resource_for
from vllm_operator.metrics import API_REQUESTS
from vllm_operator.models.base import Manifest

log = logging.getLogger(__name__)
_OBJECT: Final = {200: "object", 201: "object"}
# A TCP and TLS handshake with the apiserver takes milliseconds; one that has not finished
# in this time will not, and the request should fail (and be retried) without waiting for
# the whole request timeout.
CONNECT_TIMEOUT_SECONDS: Final = 5.0
DEFAULT_TIMEOUT_SECONDS: Final = 30.0
# The pauses between the tries of an event's POST that failed transiently.
EVENT_RETRY_DELAYS_S: Final = (0.5, 2.0)


def request_timeout(seconds: float) -> aiohttp.ClientTimeout:
    """The whole request at most ``seconds``, connecting at most 5 s of them."""
    return aiohttp.ClientTimeout(total=seconds, sock_connect=min(CONNECT_TIMEOUT_SECONDS, seconds))


def _resource_of(path: str) -> str:
    """The plural (and subresource) a request path names, for the request metric."""
    parts = path.strip("/").split("/")
    if "namespaces" in parts and parts.index("namespaces") + 2 < len(parts):
        parts = parts[parts.index("namespaces") + 2 :]
    else:
        parts = parts[2:] if parts[0] == "api" else parts[3:]
    return "/".join(p for i, p in enumerate(parts) if i != 1)


def _error(exc: ApiException) -> ApiError:
    status = int(exc.status or 0)
    reason, message = str(exc.reason or ""), str(exc.body or "")
    causes: tuple[str, ...] = ()
    try:
        body = json.loads(message)
        reason = body.get("reason", reason)
        message = body.get("message", message)
        details = body.get("details") or {}
        causes = tuple(str(c.get("reason")) for c in details.get("causes") or () if c.get("reason"))
    except (ValueError, AttributeError):
        pass
    return ApiError(status, reason, message, causes)


async def load_config(kubeconfig: str | None = None) -> client.ApiClient:
    """An API client from a kubeconfig file, else the in-cluster service account."""
    configuration = client.Configuration()
    if kubeconfig:
        # kubernetes_asyncio reads a missing file as an empty one ("Invalid kube-config
        # file. Expected key current-context"): say what is wrong instead.
        try:
            os.stat(kubeconfig)
        except OSError as exc:
            raise config.ConfigException(f"kubeconfig {kubeconfig}: {exc.strerror or exc}") from exc
    try:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    except config.ConfigException:
        if kubeconfig:
            raise
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return client.ApiClient(configuration=configuration)


def credentials_problem(kubeconfig: str | None) -> str | None:
    """Why the operator could not talk to a cluster with these credentials (read as it
    reads them: the file given, else KUBECONFIG or ~/.kube/config, else the pod's service
    account), or None. `vllm-operator run` checks them before Kopf starts, which otherwise
    stops on them with its own tracebacks and warnings around the one line that matters."""

    async def load() -> None:
        api = await load_config(kubeconfig)
        await api.close()

    where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    # The loader warns "Config not found" before falling back to the service account: the
    # line below says it, once.
    quiet = logging.getLogger("kubernetes_asyncio.config.kube_config")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        asyncio.run(load())
    except yaml.YAMLError as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        return f"kubeconfig {where} is not YAML: {first} ({_mark(err)})"
    except (config.ConfigException, OSError, ValueError, TypeError, KeyError) as err:
        if kubeconfig:
            why = str(err).removeprefix(f"kubeconfig {kubeconfig}: ")
            return f"cannot use kubeconfig {kubeconfig}: {why}"
        return (
            f"no credentials: {where} does not give a usable context and this is not a pod "
            f"with a service account ({err}); give --kubeconfig or set KUBECONFIG"
        )
    finally:
        quiet.setLevel(level)
    return None


def _mark(err: Exception) -> str:
    """Where in the file a YAML error is, as its line and column."""
    mark = getattr(err, "problem_mark", None)
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "?"


def _path(
    api_version: str, kind: str, namespace: str | None, name: str, subresource: str | None
) -> str:
    """The URL path of one object, or of its subresource (status, scale)."""
    path = resource_for(api_version, kind).path(namespace, name)
    return f"{path}/{subresource}" if subresource else path


class KubeClient:
    """The real ``ClusterAPI``."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        field_manager: str = FIELD_MANAGER,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
    ):
        self._api = api_client
        self._field_manager = field_manager
        self._timeout = request_timeout(timeout)
        self.requests = 0

    async def close(self) -> None:
        await self._api.close()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str | None = None,
        verb: str | None = None,
    ) -> Any:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        self.requests += 1
        # The metric's verb: the HTTP method, or the apiserver's own name where one method
        # means two things (a LIST is a GET of a collection).
        API_REQUESTS.labels(verb or method, _resource_of(path)).inc()
        try:
            return await self._api.call_api(
                path,
                method,
                query_params=query or [],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                response_types_map=_OBJECT,
                _return_http_data_only=True,
                _request_timeout=self._timeout,
            )
        except ApiException as exc:
            raise _error(exc) from exc
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            # The apiserver is unreachable or slow: transient by definition (status 0).
            raise ApiError(0, "ConnectionFailed", str(exc) or type(exc).__name__) from exc

    async def served(self, api_version: str) -> set[str]:
        """The resources (plurals) the apiserver serves in a group version; none when it
        does not serve the group version at all (its CRDs are not installed)."""
        path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        try:
            listing = await self._call("GET", path)
        except ApiError as err:
            if err.not_found:
                return set()
            raise
        return {str(r.get("name")) for r in listing.get("resources") or []}

    async def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> Manifest | None:
        path = resource_for(api_version, kind).path(namespace, name)
        try:
            obj: Manifest = await self._call("GET", path)
        except ApiError as err:
            if err.not_found:
                return None
            raise
        return obj

    async def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
    ) -> list[Manifest]:
        query = [("labelSelector", label_selector)] if label_selector else []
        result = await self._call(
            "GET", resource_for(api_version, kind).path(namespace), query=query, verb="LIST"
        )
        items: list[Manifest] = result.get("items", [])
        return items

    async def apply(
        self,
        manifest: Manifest,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> Manifest:
        meta = manifest["metadata"]
        api_version, kind = manifest["apiVersion"], manifest["kind"]
        path = _path(api_version, kind, meta.get("namespace"), meta["name"], subresource)
        query = [("fieldManager", field_manager or self._field_manager), ("force", "true")]
        obj: Manifest = await self._call(
            "PATCH", path, query=query, body=manifest, content_type="application/apply-patch+yaml"
        )
        return obj

    async def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None,
        patch: Manifest,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> Manifest:
        path = _path(api_version, kind, namespace, name, subresource)
        query = [("fieldManager", field_manager or self._field_manager)]
        obj: Manifest = await self._call(
            "PATCH", path, query=query, body=patch, content_type="application/merge-patch+json"
        )
        return obj

    async def delete(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> None:
        path = resource_for(api_version, kind).path(namespace, name)
        try:
            await self._call("DELETE", path, body={"propagationPolicy": "Background"})
        except ApiError as err:
            if not err.not_found:
                raise

    async def event(
        self, involved: Manifest, *, reason: str, message: str, warning: bool = False
    ) -> None:
        meta = involved["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        namespace = meta.get("namespace") or "default"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": involved["apiVersion"],
                "kind": involved["kind"],
                "name": meta["name"],
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message,
            "type": "Warning" if warning else "Normal",
            "source": {"component": self._field_manager},
            "reportingComponent": self._field_manager,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        path = resource_for("v1", "Event").path(namespace)
        # A busy apiserver's 429, 5xx or timeout loses no event a user reads a decision by
        # (ScaledUp): a few quick tries, without holding the reconcile up for long.
        for delay in (*EVENT_RETRY_DELAYS_S, None):
            try:
                await self._call("POST", path, body=body)
                return
            except ApiError as err:
                if err.transient and delay is not None:
                    await asyncio.sleep(delay)
                    continue
                # An event is a courtesy; failing to record one must not fail the
                # reconcile. In a namespace being deleted, nothing can be recorded and
                # nothing needs to be.
                (log.debug if err.namespace_terminating else log.warning)(
                    "Recording event %s on %s/%s failed: %s.", reason, namespace, meta["name"],
                    err, extra={"reason": reason, "error": str(err)},
                )  # fmt: skip
                return
