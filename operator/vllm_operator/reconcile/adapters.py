"""LoRA adapters on the running servers: loaded, replaced and unloaded with no restart.

vLLM serves adapters it was told of at run time (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``):
``POST /v1/load_lora_adapter`` ``{lora_name, lora_path}`` loads one (``load_inplace``
replaces one already loaded under that name), ``POST /v1/unload_lora_adapter``
``{lora_name}`` drops one, and ``GET /v1/models`` lists the base model and each adapter
loaded, with the path it came from (``root``) and the base model as its ``parent``.

Each pass brings every server whose vLLM answers (ContainersReady) to spec.adapters:
:func:`plan_sync` is pure (what to load, replace, unload, and what to refuse);
servers/adapters.py speaks vLLM's HTTP API. A pod that starts gets the set from its warmup
Job before it counts as warmed up (warmup/run.py loads them the same way); an
adapter added later reaches it through the next pass. The status counts, per adapter, the
servers that have it from the right path.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Final, Literal

from vllm_operator.models import InferenceService
from vllm_operator.models.base import Manifest
from vllm_operator.models.conditions import pod_condition
from vllm_operator.models.inference_service import Adapter, AdapterStatus, EffectiveTuning
from vllm_operator.render.adapters import adapter_path, max_rank_in_force, rank_refusal
from vllm_operator.render.deployment import CONTAINER
from vllm_operator.render.meta import SERVER_PORT
from vllm_operator.servers.pods import PodClient, PodHTTPError

log = logging.getLogger(__name__)

# The reasons of the AdaptersLoaded condition (docs/troubleshooting.md).
REASON_LOADED: Final = "AdaptersLoaded"
REASON_LOADING: Final = "Loading"
REASON_LOAD_FAILED: Final = "AdapterLoadFailed"
REASON_RANK: Final = "AdapterRankTooLarge"
REASON_UNREACHABLE: Final = "ServerUnreachable"
REASON_AWAITING_ROLLOUT: Final = "AwaitingLoRARollout"
# The argument that turns LoRA on in vLLM: a server started without it has no adapter API.
LORA_FLAG: Final = "--enable-lora"


@dataclasses.dataclass(frozen=True)
class Action:
    kind: Literal["load", "replace", "unload"]
    name: str
    path: str = ""


def plan_sync(
    adapters: Sequence[Adapter], loaded: Mapping[str, str], *, max_rank: int | None
) -> tuple[list[Action], dict[str, str]]:
    """(the actions that bring one server from ``loaded`` (name → path) to ``adapters``,
    the adapters refused with why). An adapter whose declared rank exceeds the server's
    --max-lora-rank is refused rather than sent to fail."""
    refused: dict[str, str] = {}
    wanted: dict[str, str] = {}
    for adapter in adapters:
        why = rank_refusal(adapter, max_rank)
        if why is not None:
            refused[adapter.name] = why
            continue
        wanted[adapter.name] = adapter_path(adapter)
    actions = [
        Action("load" if name not in loaded else "replace", name, path)
        for name, path in wanted.items()
        if loaded.get(name) != path
    ]
    actions += [Action("unload", name) for name in sorted(loaded) if name not in wanted]
    return actions, refused


# --- one pass over the servers ------------------------------------------------------------


@dataclasses.dataclass
class ServerResult:
    """One server after its sync: what it has loaded, and the errors by adapter."""

    pod: str
    loaded: dict[str, str] = dataclasses.field(default_factory=dict)
    errors: dict[str, str] = dataclasses.field(default_factory=dict)
    unreachable: str | None = None


def lora_on(pod: Manifest) -> bool:
    """The pod's vLLM was started with LoRA on (its container's arguments say so)."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == CONTAINER:
            args = [str(a) for a in container.get("args") or []]
            return LORA_FLAG in args or f"{LORA_FLAG}=true" in args or (f"{LORA_FLAG}=True" in args)
    return False


def serving_pods(pods: Sequence[Manifest]) -> list[Manifest]:
    """The pods whose vLLM answers /health: the ones an adapter can be loaded into."""
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and p.get("status", {}).get("podIP")
        and pod_condition(p, "ContainersReady")
    ]


async def sync_server(
    http: PodClient,
    pod: Manifest,
    adapters: Sequence[Adapter],
    max_rank: int | None,
    *,
    port: int = SERVER_PORT,
) -> ServerResult:
    """Bring the server of ``pod`` to ``adapters``; what it then has, and what failed."""
    name = pod["metadata"]["name"]
    endpoint = f"http://{pod['status']['podIP']}:{port}"
    result = ServerResult(pod=name)
    try:
        loaded = await http.loaded_adapters(endpoint)
    except PodHTTPError as err:
        result.unreachable = str(err)
        return result
    actions, _ = plan_sync(adapters, loaded, max_rank=max_rank)
    for action in actions:
        try:
            if action.kind == "unload":
                await http.unload_adapter(endpoint, action.name)
                loaded.pop(action.name, None)
            else:
                await http.load_adapter(
                    endpoint, action.name, action.path, replace=action.kind == "replace"
                )
                loaded[action.name] = action.path
                log.info(
                    "Loaded adapter %s into pod %s.",
                    action.name,
                    name,
                    extra={"pod": name, "adapter": action.name, "path": action.path},
                )
        except PodHTTPError as err:
            result.errors[action.name] = str(err)
            if action.kind == "replace":
                loaded.pop(action.name, None)  # what is loaded is not what is wanted
    result.loaded = loaded
    return result


@dataclasses.dataclass(frozen=True)
class AdaptersObserved:
    """What the status says of the adapters after a pass."""

    statuses: list[AdapterStatus]
    servers: int
    # (reason, message) of the AdaptersLoaded condition.
    reason: str
    message: str
    ok: bool


async def sync_adapters(
    http: PodClient | None,
    isvc: InferenceService,
    tuning: EffectiveTuning,
    pods: Sequence[Manifest],
) -> AdaptersObserved | None:
    """Bring every serving pod to spec.adapters; None when the plan in force has LoRA off
    (no adapters, or no Deployment planned: nothing to load into)."""
    adapters = isvc.spec.adapters
    if not any(a.name == "enable-lora" and a.value == "true" for a in tuning.arguments):
        return None
    running = serving_pods(pods)
    # No adapter call goes to a server started without LoRA: it has no adapter API until
    # the rollout that turns LoRA on replaces it.
    servers = [p for p in running if lora_on(p)]
    max_rank = max_rank_in_force(tuning)
    results: list[ServerResult] = []
    if http is not None:
        results = list(
            await asyncio.gather(*(sync_server(http, p, adapters, max_rank) for p in servers))
        )
    found = summarize(adapters, results, servers=len(servers), max_rank=max_rank)
    without = len(running) - len(servers)
    if without and found.reason in (REASON_LOADED, REASON_LOADING):
        return dataclasses.replace(
            found,
            reason=REASON_AWAITING_ROLLOUT,
            message=f"{without} running server(s) started without LoRA; the adapters load "
            "into each server the rollout that turns LoRA on starts"
            + (f" ({found.message})" if servers else ""),
            ok=False,
        )
    return found


def summarize(
    adapters: Sequence[Adapter],
    results: Sequence[ServerResult],
    *,
    servers: int,
    max_rank: int | None,
) -> AdaptersObserved:
    """The status of each adapter and the AdaptersLoaded condition: pure."""
    _, refused = plan_sync(adapters, {}, max_rank=max_rank)
    statuses: list[AdapterStatus] = []
    failures: list[str] = []
    for adapter in adapters:
        path = adapter_path(adapter)
        count = sum(1 for r in results if r.loaded.get(adapter.name) == path)
        errors = [
            f"pod {r.pod}: {r.errors[adapter.name]}" for r in results if adapter.name in r.errors
        ]
        message = refused.get(adapter.name) or ("; ".join(errors[:3]) if errors else None)
        statuses.append(
            AdapterStatus(name=adapter.name, path=path, loaded_replicas=count, message=message)
        )
        if message is not None:
            failures.append(f"{adapter.name}: {message}")
    unreachable = [f"pod {r.pod}: {r.unreachable}" for r in results if r.unreachable]
    if failures:
        first = next(s for s in statuses if s.message is not None)
        reason = REASON_RANK if first.name in refused else REASON_LOAD_FAILED
        return AdaptersObserved(statuses, servers, reason, "; ".join(failures)[:1000], ok=False)
    if unreachable:
        return AdaptersObserved(
            statuses, servers, REASON_UNREACHABLE, "; ".join(unreachable)[:1000], ok=False
        )
    if statuses and servers == 0:
        return AdaptersObserved(
            statuses, servers, REASON_LOADING, "no server answers yet to load them into", ok=False
        )
    missing = [s.name for s in statuses if s.loaded_replicas < servers]
    if missing:
        return AdaptersObserved(
            statuses,
            servers,
            REASON_LOADING,
            f"not yet on every running server: {', '.join(missing)}",
            ok=False,
        )
    what = f"{len(statuses)} adapter(s)" if statuses else "no adapters"
    return AdaptersObserved(
        statuses, servers, REASON_LOADED, f"{what} on {servers} running server(s)", ok=True
    )
