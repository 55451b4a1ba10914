"""The operator's one client of its own pods: every HTTP request the operator process
makes to a pod it runs goes through :class:`PodClient`.

The reconciles ask three things of the pods: a vLLM server's /metrics (the autoscaler's
reading), its adapters (listed, loaded, unloaded: servers/adapters.py) and a download
Job's progress (servers/download.py). They receive a ``PodClient`` and catch
:class:`PodHTTPError`, so no module above servers/ imports the HTTP client, which an
import-linter contract keeps (pyproject.toml). The requests, their timeouts and the words
of their errors are the ones the reconciles made themselves before.

The Jobs (warmup, bench, download) are programs of their own with their own data-plane
clients; they do not use this one.
"""

from __future__ import annotations

from typing import Any, Final

import httpx

from vllm_operator.servers import adapters
from vllm_operator.servers.download import download_progress
from vllm_operator.servers.errors import PodHTTPError

__all__ = ["METRICS_TIMEOUT_SECONDS", "PodClient", "PodHTTPError"]

# A pod that takes longer for /metrics is left out of the autoscaler's reading.
METRICS_TIMEOUT_SECONDS: Final = 3.0


class PodClient:
    """One connection pool to the operator's pods, opened at start-up and closed at
    cleanup by the runtime. ``http``: the client to wrap (the tests give one with a mock
    transport); a default one when not given."""

    def __init__(self, http: httpx.AsyncClient | None = None) -> None:
        self._http = http if http is not None else httpx.AsyncClient()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def metrics(self, url: str) -> str:
        """The text of a server's /metrics at ``url``."""
        try:
            response = await self._http.get(url, timeout=METRICS_TIMEOUT_SECONDS)
            response.raise_for_status()
        except httpx.HTTPStatusError as err:
            raise PodHTTPError(str(err), err.response.status_code) from err
        except (httpx.HTTPError, OSError) as err:
            raise PodHTTPError(str(err)) from err
        return response.text

    async def loaded_adapters(self, endpoint: str) -> dict[str, str]:
        """The adapters the server at ``endpoint`` has loaded: name → the path of each."""
        return await adapters.loaded_adapters(self._http, endpoint)

    async def load_adapter(
        self, endpoint: str, name: str, path: str, *, replace: bool = False
    ) -> None:
        """Load ``name`` from ``path`` (``replace``: in place of the one of that name)."""
        await adapters.load_adapter(self._http, endpoint, name, path, replace=replace)

    async def unload_adapter(self, endpoint: str, name: str) -> None:
        """Unload ``name``; one that is not loaded counts as unloaded."""
        await adapters.unload_adapter(self._http, endpoint, name)

    async def download_progress(self, pod_ip: str, port: int) -> dict[str, Any] | None:
        """A download Job's progress, or None when it does not answer."""
        return await download_progress(self._http, pod_ip, port)
