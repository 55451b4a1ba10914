"""Write a run's full results into a ConfigMap (``vllm-operator bench --results-config-map``).

As the InferenceBenchmark's load Job, the load generator runs under a ServiceAccount of
its own whose Role allows exactly ``get``, ``update`` and ``patch`` of the one results
ConfigMap the operator created for it; it patches ``data`` and ``binaryData`` in (a strategic
merge patch, as ``kubectl patch`` sends: on a ConfigMap the same as a merge patch; see
:mod:`vllm_operator.bench.archive` for what they hold), keeping the operator's labels and
owner reference.

Credentials: the pod's ServiceAccount (in-cluster configuration) when there is one, else
a kubeconfig (``KUBECONFIG``, or ``~/.kube/config``), which is how a standalone run
outside the cluster supplies them.

kubernetes_asyncio is imported only here, and only when an upload is asked for: the load
generator itself needs no Kubernetes client and runs without any cluster.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Final

from vllm_operator.bench.archive import Packed, pack

log = logging.getLogger(__name__)
ATTEMPTS: Final = 3
REQUEST_TIMEOUT_S: Final = 30


class UploadError(Exception):
    """The results could not be written to the ConfigMap."""


async def api_client() -> Any:
    """A Kubernetes API client: in-cluster credentials, else the kubeconfig."""
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        # Read KUBECONFIG now: kubernetes_asyncio's default is fixed when it is imported.
        await config.load_kube_config(
            config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration
        )
    return client.ApiClient(configuration=configuration)


async def upload(results: dict[str, Any], *, name: str, namespace: str) -> Packed:
    """Write ``results`` (``report.result_json``) into ConfigMap ``namespace/name``; what
    was written. Transient failures (connection, 429, 5xx) are retried twice."""
    import aiohttp
    from kubernetes_asyncio import client, config

    try:
        packed = pack(results)
    except ValueError as exc:
        raise UploadError(str(exc)) from exc
    try:
        api = await api_client()
    except (config.ConfigException, OSError) as exc:
        raise UploadError(f"no credentials for the Kubernetes API: {exc}") from exc
    async with api:
        core = client.CoreV1Api(api)
        for attempt in range(1, ATTEMPTS + 1):
            try:
                await core.patch_namespaced_config_map(
                    name,
                    namespace,
                    packed.patch(),
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
                return packed
            except client.ApiException as exc:
                transient = exc.status == 429 or (exc.status or 0) >= 500
                why = f"{exc.status} {exc.reason}: {str(exc.body or '')[:300]}"
                if not transient or attempt == ATTEMPTS:
                    raise UploadError(f"ConfigMap {namespace}/{name}: {why}") from exc
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                why = str(exc) or type(exc).__name__
                if attempt == ATTEMPTS:
                    raise UploadError(f"ConfigMap {namespace}/{name}: {why}") from exc
            log.warning("Writing ConfigMap %s/%s failed (%s); retrying.", namespace, name, why)
            await asyncio.sleep(attempt)
    raise AssertionError("unreachable")
