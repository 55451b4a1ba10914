"""LoRA adapters on a running service, through the real kubelet and a real CPU vLLM.

The operator runs as the chart's pod; the server is a container of the CPU vLLM image,
whose tiny LoRA adapters of the tiny model are baked in under /opt/adapters
(scripts/make_tiny_adapter.py). The service starts as make dev's sample, without LoRA, on
the two-core node that has no room for a second server; the first adapter turns LoRA on,
which only a new pod can have: the default rollout (Auto) replaces the pod, announced
first, and no adapter call goes to the old server. Then adapters are added, one removed,
and bad ones declared, each reaching the running server through vLLM's adapter API: the
pod's uid and restart count and the Deployment's generation stay the same throughout.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from devenv.cluster import node
from devenv.cluster.cluster import ClusterHandle
from devenv.cluster.images import Images
from devenv.cluster.processes import wait_until
from devenv.dev import answers, service_url
from e2e.framework import condition, delete_namespace
from e2e.real_node_fixtures import ChartOperator
from e2e.test_real_node import SAMPLE, _restricted_pod, server_pod
from vllm_operator.constants import LABEL_SERVICE, LABEL_WARMUP_FOR

NAME = "tiny-lora"


def _adapter(name: str, folder: str, rank: int | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"name": name, "source": {"image": {"path": f"/opt/adapters/{folder}"}}}
    if rank is not None:
        found["rank"] = rank
    return found


@pytest.fixture
def lora_ns(cluster: ClusterHandle, chart_operator: ChartOperator) -> Iterator[str]:
    ns = f"e2e-lora-{secrets.token_hex(3)}"
    cluster.apply(node.real_node_namespace(ns))
    cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", ns, "--timeout=60s")
    try:
        yield ns
    finally:
        delete_namespace(cluster, ns, wait_gone=True, timeout=120)


def _service(cluster: ClusterHandle, ns: str) -> dict[str, Any]:
    got: dict[str, Any] = cluster.kubectl_json("get", "vis", NAME, "-n", ns)
    return got


def _identity(cluster: ClusterHandle, ns: str) -> tuple[str, int, int]:
    """(the server pod's uid, its container restarts, the Deployment's generation)."""
    pod = server_pod(cluster, ns, NAME)
    [deployment] = cluster.kubectl_json(
        "get", "deployments", "-n", ns, "-l", f"{LABEL_SERVICE}={NAME}"
    )["items"]
    restarts = pod["status"]["containerStatuses"][0]["restartCount"]
    return pod["metadata"]["uid"], restarts, deployment["metadata"]["generation"]


def _completion(url: str, model: str) -> tuple[int, str]:
    body = {"model": model, "prompt": "The operator tunes", "max_tokens": 8, "temperature": 0}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    if answer.status_code != 200:
        return answer.status_code, answer.text
    return 200, str(answer.json()["choices"][0]["text"])


def _serves(url: str, model: str) -> bool:
    """``model`` answers a completion through ``url`` now (a refused connection: no)."""
    try:
        return _completion(url, model)[0] == 200
    except httpx.HTTPError:
        return False


class _Watch:
    """While a rollout runs: the AdaptersLoaded reasons the service shows, and how long the
    Service answers no /health (every half second)."""

    def __init__(self, cluster: ClusterHandle, ns: str, url: str) -> None:
        self.reasons: list[str] = []
        self.outage_s = 0.0
        self._stop = threading.Event()
        self._args = (cluster, ns, url)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        cluster, ns, url = self._args
        first_down: float | None = None
        last_down: float | None = None
        while not self._stop.is_set():
            now = time.monotonic()
            if not answers(f"{url}/health"):
                first_down = now if first_down is None else first_down
                last_down = now
            got = cluster.kubectl("get", "vis", NAME, "-n", ns, "-o", "json", check=False)
            if got.returncode == 0:
                reason = condition(json.loads(got.stdout), "AdaptersLoaded").get("reason")
                if reason and (not self.reasons or self.reasons[-1] != reason):
                    self.reasons.append(reason)
            if first_down is not None and last_down is not None:
                self.outage_s = last_down - first_down
            self._stop.wait(0.5)

    def stop(self) -> _Watch:
        self._stop.set()
        self._thread.join(timeout=30)
        return self


def _adapters_status(cluster: ClusterHandle, ns: str) -> dict[str, dict[str, Any]]:
    return {a["name"]: a for a in _service(cluster, ns).get("status", {}).get("adapters") or []}


def _patch_adapters(cluster: ClusterHandle, ns: str, adapters: list[dict[str, Any]]) -> None:
    patch = yaml.safe_dump({"spec": {"adapters": adapters}})
    cluster.kubectl("patch", "vis", NAME, "-n", ns, "--type=merge", "-p", patch)


def test_adapters_are_added_and_removed_on_a_running_server_without_a_restart(
    cluster: ClusterHandle, lora_ns: str, real_images: Images
) -> None:
    ns = lora_ns
    # The node as make dev has it: the chart's operator pod asks 50m of the two cores there
    # (here, for the tiers sharing the node, it asks none), so a second server of one core
    # does not fit beside the first.
    share = _restricted_pod("operator-share", real_images.operator, [],
                            requests={"cpu": "50m"}, limits={"memory": "64Mi"})  # fmt: skip
    share["spec"]["containers"][0]["command"] = ["python", "-c", "import time; time.sleep(86400)"]
    share["spec"]["terminationGracePeriodSeconds"] = 1  # PID 1 python ignores SIGTERM
    cluster.apply(share, namespace=ns)
    doc: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    doc["metadata"]["name"] = NAME
    assert "rollout" not in doc["spec"] and "adapters" not in doc["spec"]  # make dev's sample
    cluster.apply(doc, namespace=ns)
    cluster.kubectl("wait", "--for=condition=Ready", f"vis/{NAME}", "-n", ns,
                    "--timeout=480s", timeout=500)  # fmt: skip
    url = service_url(cluster, ns, NAME)
    wait_until(f"{NAME}'s Service answering", lambda: answers(f"{url}/health"), 60)
    first_pod = server_pod(cluster, ns, NAME)["metadata"]["name"]

    # The first adapter: LoRA on, so a new pod. The node has no room for a second server
    # (one core each, two cores): Auto replaces the pod, and says so before it does.
    watch = _Watch(cluster, ns, url)
    started = time.monotonic()
    # The rank limit pinned, so that declaring a larger one below is refused, not re-planned.
    patch = {"spec": {"tuning": {"overrides": {"max-lora-rank": "16"}},
                      "adapters": [_adapter("sql", "tiny-lora-a")]}}  # fmt: skip
    cluster.kubectl("patch", "vis", NAME, "-n", ns, "--type=merge", "-p", yaml.safe_dump(patch))
    try:
        wait_until("the sql adapter served by name", lambda: _serves(url, "sql"), 480)
    finally:
        seen = watch.stop()
    served_after = time.monotonic() - started
    rollout = _service(cluster, ns)["status"]["rollout"]
    print(f"status.rollout: {rollout}")
    print(f"first adapter: served by name {served_after:.1f} s after the patch; the Service "
          f"answered no /health for {seen.outage_s:.1f} s; AdaptersLoaded reasons seen: "
          f"{seen.reasons}")  # fmt: skip
    assert rollout["strategy"] == "Replace", rollout
    assert f"{node.NODE_NAME}: cpu 1 wanted" in rollout["message"], rollout
    events = cluster.kubectl_json("get", "events", "-n", ns, "--field-selector",
                                  "reason=RolloutWithOutage")["items"]  # fmt: skip
    assert events and "unavailable while the new pod starts" in events[0]["message"], events
    assert "AdapterLoadFailed" not in seen.reasons, seen.reasons  # no call to the old server
    assert server_pod(cluster, ns, NAME)["metadata"]["name"] != first_pod
    wait_until(
        "AdaptersLoaded=True",
        lambda: condition(_service(cluster, ns), "AdaptersLoaded").get("status") == "True",
        120,
    )
    before = _identity(cluster, ns)
    print(f"server pod uid {before[0]}, restarts {before[1]}, Deployment generation {before[2]}")

    # The warmup Job loaded it before the gate opened, and sent a request through it.
    [job] = cluster.kubectl_json("get", "jobs", "-n", ns, "-l", f"{LABEL_WARMUP_FOR}={NAME}")[
        "items"
    ]
    assert (
        "--adapter=sql=/opt/adapters/tiny-lora-a"
        in job["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    deployment = cluster.kubectl_json("get", "deployment", NAME, "-n", ns)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--enable-lora" in container["args"]
    assert {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"} in container["env"]

    base = _completion(url, "tiny-llama")
    sql = _completion(url, "sql")
    assert base[0] == 200 and sql[0] == 200, (base, sql)
    assert sql != base, "the adapter's answer is the base model's"
    assert _adapters_status(cluster, ns)["sql"]["loadedReplicas"] == 1

    # Added at run time: loaded into the running server; no pod restarted, no rollout.
    _patch_adapters(cluster, ns, [_adapter("sql", "tiny-lora-a"), _adapter("tone", "tiny-lora-b")])
    wait_until(
        "tone loaded",
        lambda: _adapters_status(cluster, ns).get("tone", {}).get("loadedReplicas") == 1,
        120,
    )
    tone = _completion(url, "tone")
    assert tone[0] == 200 and tone not in (base, sql), tone
    assert _identity(cluster, ns) == before
    assert condition(_service(cluster, ns), "AdaptersLoaded")["status"] == "True"

    # Removed: unloaded from the server, which then refuses the name.
    _patch_adapters(cluster, ns, [_adapter("tone", "tiny-lora-b")])
    wait_until("sql unloaded", lambda: _completion(url, "sql")[0] == 404, 120)
    # The status follows the unload at the end of the same pass (CI, 2026-12-03, read it
    # between the two).
    wait_until("sql gone from status", lambda: set(_adapters_status(cluster, ns)) == {"tone"}, 30)
    assert _completion(url, "tone") == tone
    assert _identity(cluster, ns) == before

    # Bad ones: a declared rank above the pinned limit (refused, never sent), an undeclared
    # one (vLLM's own refusal), a folder with no adapter. The good one keeps serving.
    _patch_adapters(
        cluster,
        ns,
        [
            _adapter("tone", "tiny-lora-b"),
            _adapter("big", "tiny-lora-r32", rank=32),
            _adapter("big-undeclared", "tiny-lora-r32"),
            _adapter("missing", "none"),
        ],
    )

    def failed() -> bool:
        status = _adapters_status(cluster, ns)
        return all(status.get(n, {}).get("message") for n in ("big", "big-undeclared", "missing"))

    wait_until("the three bad adapters reported", failed, 120)
    service = _service(cluster, ns)
    status = _adapters_status(cluster, ns)
    print({n: (a["loadedReplicas"], a.get("message")) for n, a in status.items()})
    assert "rank 32 exceeds the servers' max-lora-rank 16" in status["big"]["message"]
    assert "LoRA rank 32 is greater than max_lora_rank 16" in status["big-undeclared"]["message"]
    # vLLM 0.32 hides paths under /opt, /home, /usr, ... in its errors ("<path>"): the
    # status names the path itself.
    assert "No adapter found for" in status["missing"]["message"]
    assert status["missing"]["path"] == "/opt/adapters/none"
    assert status["tone"]["loadedReplicas"] == 1 and status["tone"].get("message") is None
    loaded = condition(service, "AdaptersLoaded")
    assert loaded["status"] == "False" and loaded["reason"] == "AdapterRankTooLarge", loaded
    assert condition(service, "Ready")["status"] == "True", "the base model still serves"
    assert _completion(url, "tone") == tone
    after = _identity(cluster, ns)
    print(f"after: server pod uid {after[0]}, restarts {after[1]}, generation {after[2]}")
    assert after == before
