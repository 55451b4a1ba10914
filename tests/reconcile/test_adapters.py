"""LoRA adapters on the running servers: what a pass loads, replaces, unloads and reports.

The decisions are pure (plan_sync, summarize); sync_server is run against an httpx mock
that answers as vLLM 0.32 answered on this machine (tests/vllm/test_adapters.py runs the
same calls against the real server).
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import httpx

from tests.fakes import RecordingCluster
from tests.specs import BASE, isvc, plan_for
from vllm_operator.models.inference_service import Adapter
from vllm_operator.reconcile.adapters import (
    REASON_AWAITING_ROLLOUT,
    REASON_LOAD_FAILED,
    REASON_LOADED,
    REASON_LOADING,
    REASON_RANK,
    Action,
    ServerResult,
    plan_sync,
    summarize,
    sync_adapters,
    sync_server,
)
from vllm_operator.reconcile.inference_service import reconcile_inference_service
from vllm_operator.render.adapters import adapter_path
from vllm_operator.servers.adapters import NO_ADAPTER_API
from vllm_operator.servers.pods import PodClient
from vllm_operator.settings import OperatorSettings


def _adapter(name: str, path: str | None = None, rank: int | None = None) -> Adapter:
    body: dict[str, Any] = {"name": name, "source": {"image": {"path": path or f"/a/{name}"}}}
    if rank is not None:
        body["rank"] = rank
    return Adapter.model_validate(body)


def test_paths_for_each_source() -> None:
    svc = isvc(
        adapters=[
            {"name": "hub", "source": {"huggingFace": {"repo": "team/lora"}}},
            {"name": "claim", "source": {"pvc": {"claimName": "loras", "path": "/v2/"}}},
            {"name": "root", "source": {"pvc": {"claimName": "loras"}}},
            {"name": "baked", "source": {"image": {"path": "/opt/a/"}}},
        ]
    )
    assert [adapter_path(a) for a in svc.spec.adapters] == [
        "team/lora",
        "/adapters/loras/v2",
        "/adapters/loras",
        "/opt/a",
    ]


def test_plan_sync_loads_the_missing_replaces_the_moved_and_unloads_the_removed() -> None:
    actions, refused = plan_sync(
        [_adapter("a"), _adapter("b", "/new/b"), _adapter("c")],
        {"a": "/a/a", "b": "/old/b", "gone": "/a/gone"},
        max_rank=16,
    )
    assert refused == {}
    assert actions == [
        Action("replace", "b", "/new/b"),
        Action("load", "c", "/a/c"),
        Action("unload", "gone"),
    ]
    assert plan_sync([_adapter("a")], {"a": "/a/a"}, max_rank=16) == ([], {})


def test_a_declared_rank_above_the_limit_is_refused_and_never_sent() -> None:
    actions, refused = plan_sync([_adapter("big", rank=32)], {}, max_rank=16)
    assert actions == []
    assert "rank 32 exceeds the servers' max-lora-rank 16" in refused["big"]
    # Loaded before the limit went down: it goes.
    actions, _ = plan_sync([_adapter("big", rank=32)], {"big": "/a/big"}, max_rank=16)
    assert actions == [Action("unload", "big")]


def test_summary_counts_servers_per_adapter_and_names_the_failure() -> None:
    adapters = [_adapter("a"), _adapter("b")]
    results = [
        ServerResult("p1", loaded={"a": "/a/a", "b": "/a/b"}),
        ServerResult("p2", loaded={"a": "/a/a"}, errors={"b": "No adapter found for /a/b"}),
    ]
    seen = summarize(adapters, results, servers=2, max_rank=16)
    assert [(s.name, s.loaded_replicas) for s in seen.statuses] == [("a", 2), ("b", 1)]
    assert (seen.ok, seen.reason) == (False, REASON_LOAD_FAILED)
    assert "b: pod p2: No adapter found for /a/b" in seen.message
    assert seen.statuses[1].message == "pod p2: No adapter found for /a/b"


def test_summary_of_a_rank_refusal_a_partial_load_and_success() -> None:
    refused = summarize([_adapter("big", rank=64)], [], servers=1, max_rank=16)
    assert (refused.ok, refused.reason) == (False, REASON_RANK)
    partial = summarize([_adapter("a")], [ServerResult("p1"), ServerResult("p2", {"a": "/a/a"})],
                        servers=2, max_rank=16)  # fmt: skip
    assert (partial.ok, partial.reason) == (False, REASON_LOADING)
    assert summarize([_adapter("a")], [], servers=0, max_rank=16).reason == REASON_LOADING
    done = summarize([_adapter("a")], [ServerResult("p1", {"a": "/a/a"})], servers=1, max_rank=16)
    assert (done.ok, done.reason, done.message) == (
        True,
        REASON_LOADED,
        "1 adapter(s) on 1 running server(s)",
    )


class _FakeVllm:
    """/v1/models and the two adapter endpoints, with vLLM 0.32's answers."""

    def __init__(self, loaded: dict[str, str], missing: set[str]) -> None:
        self.loaded = loaded
        self.missing = missing
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            cards = [{"id": "base", "root": "/models/x", "parent": None}]
            cards += [{"id": n, "root": p, "parent": "base"} for n, p in self.loaded.items()]
            return httpx.Response(200, json={"object": "list", "data": cards})
        body = json.loads(request.content)
        self.calls.append((path, body))
        name = body["lora_name"]
        if path == "/v1/load_lora_adapter":
            if body["lora_path"] in self.missing:
                message = f"Loading lora {name} failed: No adapter found for {body['lora_path']}"
                return httpx.Response(404, json={"error": {"message": message, "code": 404}})
            if name in self.loaded and not body.get("load_inplace"):
                message = f"The lora adapter '{name}' has already been loaded."
                return httpx.Response(400, json={"error": {"message": message, "code": 400}})
            self.loaded[name] = body["lora_path"]
            return httpx.Response(200, text=f"Success: LoRA adapter '{name}' added successfully.")
        if name not in self.loaded:
            return httpx.Response(404, json={"error": {"message": "cannot be found"}})
        del self.loaded[name]
        return httpx.Response(200, text="Success")


POD = {"metadata": {"name": "p1"}, "status": {"podIP": "10.0.0.7"}}


async def test_sync_server_loads_replaces_unloads_and_records_what_failed() -> None:
    fake = _FakeVllm({"old": "/a/old", "b": "/b-v1"}, missing={"/a/nope"})
    async with httpx.AsyncClient(transport=httpx.MockTransport(fake)) as http:
        result = await sync_server(
            PodClient(http), POD, [_adapter("a"), _adapter("b", "/b-v2"), _adapter("nope")], 16
        )
    assert result.loaded == {"a": "/a/a", "b": "/b-v2"}
    assert result.errors == {"nope": "Loading lora nope failed: No adapter found for /a/nope"}
    assert ("/v1/load_lora_adapter", {"lora_name": "b", "lora_path": "/b-v2",
                                      "load_inplace": True}) in fake.calls  # fmt: skip
    assert ("/v1/unload_lora_adapter", {"lora_name": "old"}) in fake.calls


async def test_an_unreachable_server_is_reported_not_raised() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as http:
        result = await sync_server(PodClient(http), POD, [_adapter("a")], 16)
    assert result.unreachable is not None and "ConnectError" in result.unreachable


async def test_a_pass_reports_each_adapter_and_renders_lora_without_a_server() -> None:
    api = RecordingCluster()
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "gpu-a", "labels": {"nvidia.com/gpu.product": "NVIDIA-L4"}},
            "status": {"allocatable": {"nvidia.com/gpu": "1"}},
        }
    )
    body = copy.deepcopy(BASE)
    body["spec"]["adapters"] = [{"name": "sql", "source": {"image": {"path": "/opt/a/sql"}}}]
    api.put(body)
    settings = OperatorSettings(default_image="registry.local/vllm:test")
    now = datetime(2026, 12, 2, tzinfo=UTC)
    await reconcile_inference_service(api, body, settings=settings, now=now)
    meta = body["metadata"]
    stored = api.objects[(body["apiVersion"], body["kind"], meta["namespace"], meta["name"])]
    status = stored["status"]
    assert status["adapters"] == [{"name": "sql", "path": "/opt/a/sql", "loadedReplicas": 0}]
    [loaded] = [c for c in status["conditions"] if c["type"] == "AdaptersLoaded"]
    assert (loaded["status"], loaded["reason"]) == ("False", "Loading")
    deployment = api.objects[("apps/v1", "Deployment", meta["namespace"], meta["name"])]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--enable-lora" in container["args"]
    assert {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"} in container["env"]


def _server(name: str, ip: str, *args: str) -> dict[str, Any]:
    """A pod whose vLLM answers, started with ``args``."""
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "vllm", "args": ["/models/model", *args]}]},
        "status": {"podIP": ip, "conditions": [{"type": "ContainersReady", "status": "True"}]},
    }


async def test_no_adapter_call_goes_to_a_server_started_without_lora() -> None:
    """The first adapter rolls the pods out (LoRA on only at start): until the new pod
    serves, the old one is left alone and the status says what it waits for."""
    svc = isvc(adapters=[{"name": "sql", "source": {"image": {"path": "/opt/a/sql"}}}])
    fake = _FakeVllm({}, missing=set())
    hosts: list[str] = []

    def serve(request: httpx.Request) -> httpx.Response:
        hosts.append(request.url.host)
        return fake(request)

    old, new = _server("old", "10.0.0.1"), _server("new", "10.0.0.2", "--enable-lora")
    async with httpx.AsyncClient(transport=httpx.MockTransport(serve)) as http:
        waiting = await sync_adapters(PodClient(http), svc, plan_for(svc), [old])
        assert hosts == []
        assert waiting is not None and not waiting.ok
        assert (waiting.reason, waiting.message) == (
            REASON_AWAITING_ROLLOUT,
            "1 running server(s) started without LoRA; the adapters load into each server "
            "the rollout that turns LoRA on starts",
        )
        both = await sync_adapters(PodClient(http), svc, plan_for(svc), [old, new])
    assert set(hosts) == {"10.0.0.2"}
    assert both is not None and both.reason == REASON_AWAITING_ROLLOUT
    assert both.statuses[0].loaded_replicas == 1
    assert "(1 adapter(s) on 1 running server(s))" in both.message


async def test_a_server_without_the_adapter_api_is_named_in_words() -> None:
    def no_route(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": []})
        return httpx.Response(404, json={"detail": "Not Found"})  # FastAPI: no such route

    async with httpx.AsyncClient(transport=httpx.MockTransport(no_route)) as http:
        result = await sync_server(PodClient(http), POD, [_adapter("sql")], 16)
    assert result.errors == {"sql": NO_ADAPTER_API}
    assert "started without --enable-lora" in NO_ADAPTER_API
