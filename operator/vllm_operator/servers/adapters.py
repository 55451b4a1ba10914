"""vLLM's adapter API, spoken over HTTP: the one client the operator's pass and the
warmup Job both use.

``POST /v1/load_lora_adapter`` ``{lora_name, lora_path}`` loads an adapter
(``load_inplace`` replaces one of that name), ``POST /v1/unload_lora_adapter``
``{lora_name}`` drops one, ``GET /v1/models`` lists the base model and each adapter with
the path it came from (``root``) and its base model (``parent``). The server must run
with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; errors come back as
``{"error": {"message"}}`` (older releases: ``{"message"}``).
"""

from __future__ import annotations

import json
from typing import Final

import httpx

from vllm_operator.servers.errors import PodHTTPError

REQUEST_TIMEOUT_SECONDS: Final = 10.0
# Loading reads the adapter (and may download it from the Hub): longer.
LOAD_TIMEOUT_SECONDS: Final = 120.0


# A server without the adapter routes (vLLM started without LoRA, or without runtime
# updating): what its 404 means, in words.
NO_ADAPTER_API: Final = (
    "the server has no adapter API (HTTP 404): its vLLM was started without --enable-lora "
    "or without VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
)


class AdapterApiError(PodHTTPError):
    """The server answered, with an error (its own words), or did not answer."""


def _error_text(response: httpx.Response) -> str:
    """vLLM's error message: {"error": {"message"}} from 0.2x, {"message"} before."""
    try:
        body = response.json()
    except (json.JSONDecodeError, ValueError):
        return response.text.strip()[:500] or f"HTTP {response.status_code}"
    if isinstance(body, dict):
        inner = body.get("error")
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:500]
        if body.get("message"):
            return str(body["message"])[:500]
        if response.status_code == 404 and body.get("detail") == "Not Found":
            # FastAPI's answer for a route the server does not have.
            return NO_ADAPTER_API
        if isinstance(body.get("detail"), str):
            return str(body["detail"])[:500]
    return response.text.strip()[:500]


async def _post(http: httpx.AsyncClient, url: str, body: dict[str, object], limit_s: float) -> None:
    try:
        response = await http.post(url, json=body, timeout=limit_s)
    except (httpx.HTTPError, OSError) as err:
        raise AdapterApiError(f"{url}: {type(err).__name__}: {err}") from err
    if response.status_code >= 400:
        raise AdapterApiError(_error_text(response), response.status_code)


async def loaded_adapters(http: httpx.AsyncClient, endpoint: str) -> dict[str, str]:
    """The adapters a server has loaded: name → the path it loaded each from."""
    try:
        response = await http.get(f"{endpoint}/v1/models", timeout=REQUEST_TIMEOUT_SECONDS)
        response.raise_for_status()
        cards = response.json().get("data") or []
    except (httpx.HTTPError, OSError, ValueError, AttributeError) as err:
        raise AdapterApiError(f"{endpoint}/v1/models: {type(err).__name__}: {err}") from err
    return {
        str(card["id"]): str(card.get("root") or "")
        for card in cards
        if isinstance(card, dict) and card.get("parent") and card.get("id")
    }


async def load_adapter(
    http: httpx.AsyncClient, endpoint: str, name: str, path: str, *, replace: bool = False
) -> None:
    """Load ``name`` from ``path``; ``replace``: in place of the one of that name. An
    adapter already loaded under that name from that path counts as loaded."""
    url = f"{endpoint}/v1/load_lora_adapter"
    body: dict[str, object] = {"lora_name": name, "lora_path": path}
    if replace:
        body["load_inplace"] = True
    try:
        await _post(http, url, body, LOAD_TIMEOUT_SECONDS)
    except AdapterApiError as err:
        if err.status != 400 or "already been loaded" not in str(err):
            raise
        # Loaded by someone else since we looked (the warmup Job and a pass, or a release
        # without in-place loading): the path decides.
        current = (await loaded_adapters(http, endpoint)).get(name)
        if current == path:
            return
        await unload_adapter(http, endpoint, name)
        await _post(http, url, {"lora_name": name, "lora_path": path}, LOAD_TIMEOUT_SECONDS)


async def unload_adapter(http: httpx.AsyncClient, endpoint: str, name: str) -> None:
    """Unload ``name``; one that is not loaded counts as unloaded."""
    try:
        await _post(
            http, f"{endpoint}/v1/unload_lora_adapter", {"lora_name": name}, REQUEST_TIMEOUT_SECONDS
        )
    except AdapterApiError as err:
        if err.status != 404:
            raise
