"""The agent's Kubernetes I/O: its own GPUNode and its own Node, nothing else.

Writes use server-side apply under the field manager ``vllm-operator-agent`` with force,
and carry only the fields the agent owns: on the GPUNode its labels and the owner
reference to the Node (so the GPUNode is garbage-collected with the Node), and on the
status subresource the status. The spec is never sent, so it stays the user's.

``KubeStore`` implements ``agent.store.GPUNodeStore`` with kubernetes_asyncio; unit tests
drive the loop through a recording implementation of that protocol instead.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from vllm_operator.agent.logs import kv
from vllm_operator.agent.store import StoreError
from vllm_operator.constants import GROUP, KIND_GPU_NODE, PLURAL_GPU_NODE, VERSION
from vllm_operator.models.base import Manifest

log = logging.getLogger(__name__)

FIELD_MANAGER_AGENT: Final = "vllm-operator-agent"
APPLY: Final = "application/apply-patch+yaml"
MERGE: Final = "application/merge-patch+json"

# The client picks the patch content type from the body unless told; the generated stubs
# do not list _content_type although the client accepts it, hence these untyped mappings.
_APPLY_OPTIONS: Final[dict[str, Any]] = {
    "field_manager": FIELD_MANAGER_AGENT,
    "force": True,
    "_content_type": APPLY,
}
_MERGE_OPTIONS: Final[dict[str, Any]] = {"_content_type": MERGE}


def gpunode_metadata(name: str, *, node_uid: str, labels: dict[str, str]) -> Manifest:
    """The apply body for the GPUNode's metadata: labels and the owner reference."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND_GPU_NODE,
        "metadata": {
            "name": name,
            "labels": dict(labels),
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": name,
                    "uid": node_uid,
                    # Not a controller reference: the Node does not manage the GPUNode; the
                    # reference is there for garbage collection only.
                }
            ],
        },
    }


def gpunode_status(name: str, status: Manifest) -> Manifest:
    """The apply body for the status subresource."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND_GPU_NODE,
        "metadata": {"name": name},
        "status": status,
    }


def _error(error: ApiException) -> StoreError:
    return StoreError(int(error.status or 0), str(error.reason or error.body or error))


class KubeStore:
    """``GPUNodeStore`` on kubernetes_asyncio."""

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)

    @classmethod
    async def connect(cls, kubeconfig: str | None) -> KubeStore:
        """From a kubeconfig file, or from the pod's service account."""
        if kubeconfig:
            api_config = client.Configuration()
            await config.load_kube_config(config_file=kubeconfig, client_configuration=api_config)
        else:
            api_config = client.Configuration()
            config.load_incluster_config(client_configuration=api_config)  # type: ignore[no-untyped-call]
        return cls(client.ApiClient(api_config))

    async def node_uid(self, name: str) -> str | None:
        try:
            node = await self._core.read_node(name)
        except ApiException as error:
            if error.status == 404:
                return None
            raise _error(error) from error
        return str(node.metadata.uid)

    async def get(self, name: str) -> Manifest | None:
        try:
            obj: Manifest = await self._custom.get_cluster_custom_object(
                GROUP, VERSION, PLURAL_GPU_NODE, name
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise _error(error) from error
        return obj

    async def apply_metadata(self, name: str, *, node_uid: str, labels: dict[str, str]) -> Manifest:
        try:
            obj: Manifest = await self._custom.patch_cluster_custom_object(
                GROUP,
                VERSION,
                PLURAL_GPU_NODE,
                name,
                gpunode_metadata(name, node_uid=node_uid, labels=labels),
                **_APPLY_OPTIONS,
            )
        except ApiException as error:
            raise _error(error) from error
        return obj

    async def apply_status(self, name: str, status: Manifest) -> Manifest:
        try:
            obj: Manifest = await self._custom.patch_cluster_custom_object_status(
                GROUP,
                VERSION,
                PLURAL_GPU_NODE,
                name,
                gpunode_status(name, status),
                **_APPLY_OPTIONS,
            )
        except ApiException as error:
            raise _error(error) from error
        return obj

    async def label_node(self, name: str, labels: dict[str, str]) -> None:
        # A merge patch, not an apply: an apply would create a Node that does not exist.
        try:
            await self._core.patch_node(
                name,
                {"metadata": {"labels": labels}},
                field_manager=FIELD_MANAGER_AGENT,
                **_MERGE_OPTIONS,
            )
        except ApiException as error:
            raise _error(error) from error

    async def wait_for_change(self, name: str, *, generation: int | None, timeout: float) -> None:  # noqa: ASYNC109
        # Watch keeps an ApiClient of its own (to decode events); the context closes it.
        async with watch.Watch() as w:
            try:
                async with asyncio.timeout(timeout):
                    async for event in w.stream(
                        self._custom.list_cluster_custom_object,
                        GROUP,
                        VERSION,
                        PLURAL_GPU_NODE,
                        field_selector=f"metadata.name={name}",
                        timeout_seconds=max(1, int(timeout)),
                    ):
                        obj = event.get("object") or {}
                        if event.get("type") == "DELETED":
                            return
                        if (obj.get("metadata") or {}).get("generation") != generation:
                            return
            except TimeoutError:
                return
            except ApiException as error:
                # A failed watch only costs the prompt reaction; the loop still runs on time.
                log.debug("Failed to watch GPUNode", extra=kv(gpuNode=name, err=str(error)))

    async def close(self) -> None:
        await self._api.close()
