"""Evict one of the target's pods mid-run: the chaos phase's ``restart`` perturbation.

The load Job's Role allows ``create`` of ``pods/eviction`` for the names of the target's
pods that were Ready when the benchmark started, and nothing else about pods: it cannot
list them. So the first of those names that the API evicts is the one; a name that is gone
(404: the pod was replaced since) passes to the next. An eviction and not a deletion,
because that is how a node drain or the cluster autoscaler takes a pod, and so the
target's PodDisruptionBudget has its say: a 429 is a finding ("the budget refused"), not
a fault of the run.

Credentials as for the results upload (bench/upload.py). kubernetes_asyncio is imported
only when an eviction is due.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from vllm_operator.bench.upload import api_client

log = logging.getLogger(__name__)
REQUEST_TIMEOUT_S: Final = 30


@dataclass(frozen=True)
class Eviction:
    """What an eviction did: the pod evicted (None: none was), when (seconds into the
    run), and in words."""

    pod: str | None
    at_s: float
    outcome: str


class PodEvictor:
    """Evicts through the API (an :data:`~vllm_operator.bench.run.Evictor`). Opened before
    the run: importing the client and setting up its credentials take a good part of a
    second, which on the sending loop would hold back the requests around the eviction."""

    def __init__(self) -> None:
        self._api: Any = None
        self._why: str | None = None

    async def __aenter__(self) -> PodEvictor:
        await asyncio.to_thread(importlib.import_module, "kubernetes_asyncio.client")
        from kubernetes_asyncio import config

        try:
            self._api = await api_client()
        except (config.ConfigException, OSError) as exc:
            self._why = f"no credentials for the Kubernetes API: {exc}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._api is not None:
            await self._api.close()

    async def __call__(self, pods: Sequence[str], namespace: str, at_s: float) -> Eviction:
        if self._api is None:
            return Eviction(None, at_s, f"no pod evicted: {self._why}")
        return await evict_one(self._api, pods, namespace, at_s=at_s)


async def evict_one(api: Any, pods: Sequence[str], namespace: str, *, at_s: float) -> Eviction:
    """Evict the first of ``pods`` that the API lets go; never raises."""
    import aiohttp
    from kubernetes_asyncio import client

    refused: list[str] = []
    core = client.CoreV1Api(api)
    for name in pods:
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
        started = time.monotonic()
        try:
            await core.create_namespaced_pod_eviction(
                name, namespace, body, _request_timeout=REQUEST_TIMEOUT_S
            )
        except client.ApiException as exc:
            if exc.status == 404:
                refused.append(f"{name} is gone")
                continue
            if exc.status == 429:
                return Eviction(
                    None,
                    at_s,
                    f"no pod evicted: the PodDisruptionBudget refused pod {name} (429)",
                )
            detail = str(exc.body or exc.reason or "")[:200]
            refused.append(f"{name}: {exc.status} {detail}")
            continue
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            refused.append(f"{name}: {exc or type(exc).__name__}")
            continue
        log.info(
            "Evicted pod %s/%s %.1f s into the run (%.2f s to answer)",
            namespace,
            name,
            at_s,
            time.monotonic() - started,
        )
        return Eviction(name, at_s, f"pod {name} evicted {at_s:.3g} s in")
    why = "; ".join(refused) if refused else "no pod was named"
    return Eviction(None, at_s, f"no pod evicted: {why}")
