"""The watch store and the cached API the service reconciles read through."""

from __future__ import annotations

import asyncio

from tests.fakes import RecordingCluster
from vllm_operator.constants import (
    API_VERSION,
    KIND_INFERENCE_BENCHMARK,
    LABEL_LOCK_TARGET,
    LABEL_SERVICE,
)
from vllm_operator.k8s.api import ApiError
from vllm_operator.models.base import Manifest
from vllm_operator.runtime.cache import WATCHED, CachedAPI, WatchStore, equality_selector
from vllm_operator.runtime.dispatch import Runtime
from vllm_operator.servers.pods import PodClient
from vllm_operator.settings import OperatorSettings


def _pod(name: str, service: str = "chat", ns: str = "team", rv: str = "1") -> Manifest:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "resourceVersion": rv,
                     "labels": {LABEL_SERVICE: service}},
    }  # fmt: skip


def test_events_during_a_relist_win_over_its_answer() -> None:
    """The LIST's answer is of some moment of its span; an event that arrived meanwhile
    is at least as new, a deletion included."""
    store = WatchStore()
    store.begin_listing("Pod")
    store.on_event("Pod", "MODIFIED", _pod("a", rv="5"))
    store.on_event("Pod", "ADDED", _pod("gone"))
    store.on_event("Pod", "DELETED", _pod("gone"))
    store.finish_listing("Pod", [_pod("a", rv="4"), _pod("gone", rv="4"), _pod("b", rv="4")])
    assert store.get("Pod", "team", "a")["metadata"]["resourceVersion"] == "5"  # type: ignore[index]
    assert store.get("Pod", "team", "gone") is None
    assert store.get("Pod", "team", "b") is not None
    # The next relist replaces what no event touched, and drops what it no longer lists
    # (a deletion a watch reconnect missed).
    store.begin_listing("Pod")
    store.finish_listing("Pod", [_pod("a", rv="6")])
    assert [p["metadata"]["name"] for p in store.select("Pod", "team", {})] == ["a"]


def test_select_matches_namespace_and_every_label() -> None:
    store = WatchStore()
    store.begin_listing("Pod")
    store.finish_listing("Pod", [_pod("a"), _pod("b", service="other"), _pod("c", ns="else")])
    names = [p["metadata"]["name"] for p in store.select("Pod", "team", {LABEL_SERVICE: "chat"})]
    assert names == ["a"]


def test_equality_selectors_only() -> None:
    assert equality_selector(None) == {}
    assert equality_selector("a=b,c=d") == {"a": "b", "c": "d"}
    assert equality_selector("a==b") is None
    assert equality_selector("a!=b") is None
    assert equality_selector("a") is None
    assert equality_selector("a in (b)") is None


async def test_the_cached_api_answers_from_the_store_only_what_the_watches_show() -> None:
    api = RecordingCluster()
    store = WatchStore()
    cached = CachedAPI(api, store)
    # Not listed yet: every read goes out.
    await cached.list("v1", "Pod", "team", label_selector=f"{LABEL_SERVICE}=chat")
    assert api.calls == [("list", "Pod", "team")]
    for kind in ("Pod", "Job", KIND_INFERENCE_BENCHMARK, "Service"):
        store.begin_listing(kind)
        store.finish_listing(kind, [_pod("a")] if kind == "Pod" else [])
    api.calls.clear()
    pods = await cached.list("v1", "Pod", "team", label_selector=f"{LABEL_SERVICE}=chat")
    locks = await cached.list(
        "batch/v1", "Job", "team", label_selector=f"x/scale-down-lock=true,{LABEL_LOCK_TARGET}=c"
    )
    await cached.list(API_VERSION, KIND_INFERENCE_BENCHMARK, "team")
    assert api.calls == [] and [p["metadata"]["name"] for p in pods] == ["a"] and locks == []
    # A selector no watch covers, another form of selector, a cluster-wide list, another
    # apiVersion: the apiserver.
    await cached.list("batch/v1", "Job", "team", label_selector="app=x")
    await cached.list("v1", "Pod", "team", label_selector=f"{LABEL_SERVICE}!=chat")
    await cached.list("v1", "Pod", None, label_selector=f"{LABEL_SERVICE}=chat")
    assert len(api.calls) == 3
    # A GET the store answers is a copy; one it lacks goes out (the object may exist
    # outside the watches).
    pod = await cached.get("v1", "Pod", "a", "team")
    assert pod is not None
    pod["metadata"]["name"] = "changed"
    assert store.get("Pod", "team", "a")["metadata"]["name"] == "a"  # type: ignore[index]
    api.calls.clear()
    await cached.get("v1", "Service", "chat", "team")
    assert api.calls == [("get", "Service", "chat")]


async def test_a_failed_relist_keeps_what_the_kind_had() -> None:
    api = RecordingCluster()
    api.put(_pod("a"))
    runtime = Runtime(settings=OperatorSettings(), api=api, http=PodClient())
    await runtime.refresh_store()
    assert runtime.store.get("Pod", "team", "a") is not None and "Pod" in runtime.store.ready
    api.fail[("list", "Pod")] = ApiError(503, "ServiceUnavailable", "away")
    del api.objects[("v1", "Pod", "team", "a")]
    await runtime.refresh_store()
    assert runtime.store.get("Pod", "team", "a") is not None, "kept until a LIST answers"
    api.fail.clear()
    await runtime.refresh_store()
    assert runtime.store.get("Pod", "team", "a") is None
    await runtime.http.aclose()


async def test_the_relist_takes_every_label_that_puts_a_job_in_a_watch() -> None:
    """Warmup, load and lock Jobs; an unlabelled Job is in no watch and not listed."""
    api = RecordingCluster()
    for name, label in (("w", "warmup-for"), ("l", "inference-benchmark"), ("k", "lock-target")):
        api.put({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "team",
                         "labels": {f"inference.vllm-operator.dev/{label}": "chat"}},
        })  # fmt: skip
    api.put(
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x", "namespace": "team"}}
    )
    runtime = Runtime(settings=OperatorSettings(), api=api, http=PodClient())
    await runtime.refresh_store()
    assert sorted(j["metadata"]["name"] for j in runtime.store.select("Job", "team", {})) == [
        "k", "l", "w",
    ]  # fmt: skip
    await runtime.http.aclose()


async def test_the_first_fill_retries_what_was_refused_until_every_cache_is_filled() -> None:
    """A LIST refused at start (the apiserver's 429 while its storage initializes) is
    retried within a second, not left to the next resync."""
    api = RecordingCluster()
    api.put(_pod("a"))
    api.fail[("list", "GPUNode")] = ApiError(429, "TooManyRequests", "storage initializing")
    api.fail[("list", "Pod")] = ApiError(429, "TooManyRequests", "storage initializing")
    runtime = Runtime(settings=OperatorSettings(), api=api, http=PodClient())

    async def clear_soon() -> None:
        await asyncio.sleep(0.1)
        api.fail.clear()

    clearing = asyncio.create_task(clear_soon())
    await asyncio.wait_for(runtime.fill_caches(), timeout=5)
    await clearing
    assert runtime.node_view() is not None
    assert runtime.store.get("Pod", "team", "a") is not None
    listed = [kind for verb, kind, _ in api.calls if verb == "list"]
    assert listed.count("Pod") == 2 and listed.count("Deployment") == 1, listed
    await runtime.http.aclose()


def test_every_watched_kind_has_an_api_path() -> None:
    """The runtime lists every watched kind through the k8s layer (and the reconcile
    reads them there before the first relist): each needs its path."""
    from vllm_operator.k8s.resources import resource_for

    for kind, (api_version, _) in WATCHED.items():
        assert resource_for(api_version, kind).namespaced, kind
