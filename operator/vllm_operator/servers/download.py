"""The progress endpoint of a ModelCache's download Job (``vllm-operator download
--progress-port``), read by the operator at the Job's pod IP: ``GET /progress`` answers
JSON with ``phase``, ``bytesDownloaded``, ``bytesTotal``, ``filesDone``, ``filesTotal``,
``commit``. Nothing of the weights passes through here."""

from __future__ import annotations

from typing import Any, Final

import httpx

PROGRESS_TIMEOUT_SECONDS: Final = 3.0


async def download_progress(
    http: httpx.AsyncClient | None, pod_ip: str, port: int
) -> dict[str, Any] | None:
    """The Job's progress, or None when it does not answer (starting, or gone)."""
    if http is None:
        return None
    try:
        response = await http.get(
            f"http://{pod_ip}:{port}/progress", timeout=PROGRESS_TIMEOUT_SECONDS
        )
        response.raise_for_status()
        body = response.json()
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) else None
