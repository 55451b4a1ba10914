"""LoRA adapters on a running service, through the real kubelet and a real CPU vLLM.

The operator runs as the chart's pod; the server is a container of the CPU vLLM image,
whose tiny LoRA adapters of the tiny model are baked in under /opt/adapters
(scripts/make_tiny_adapter.py). The service starts with one adapter, which its warmup Job
loads; then adapters are added, one removed, and bad ones declared, each reaching the
running server through vLLM's adapter API: the pod's uid and restart count and the
Deployment's generation stay the same throughout.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from devenv.cluster import node
from devenv.cluster.cluster import ClusterHandle
from devenv.cluster.processes import wait_until
from devenv.dev import answers, service_url
from e2e.real_node_fixtures import ChartOperator
from e2e.test_real_node import SAMPLE, server_pod
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
        cluster.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s",
                        check=False, timeout=130)  # fmt: skip


def _service(cluster: ClusterHandle, ns: str) -> dict[str, Any]:
    got: dict[str, Any] = cluster.kubectl_json("get", "vis", NAME, "-n", ns)
    return got


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in obj.get("status", {}).get("conditions", []):
        if c["type"] == kind:
            found: dict[str, Any] = c
            return found
    return {}


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


def _adapters_status(cluster: ClusterHandle, ns: str) -> dict[str, dict[str, Any]]:
    return {a["name"]: a for a in _service(cluster, ns).get("status", {}).get("adapters") or []}


def _patch_adapters(cluster: ClusterHandle, ns: str, adapters: list[dict[str, Any]]) -> None:
    patch = yaml.safe_dump({"spec": {"adapters": adapters}})
    cluster.kubectl("patch", "vis", NAME, "-n", ns, "--type=merge", "-p", patch)


def test_adapters_are_added_and_removed_on_a_running_server_without_a_restart(
    cluster: ClusterHandle, lora_ns: str
) -> None:
    ns = lora_ns
    doc: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    doc["metadata"]["name"] = NAME
    # The rank limit pinned, so that declaring a larger one is refused, not re-planned.
    doc["spec"]["tuning"] = {"overrides": {"max-lora-rank": "16"}}
    doc["spec"]["adapters"] = [_adapter("sql", "tiny-lora-a")]
    cluster.apply(doc, namespace=ns)
    cluster.kubectl("wait", "--for=condition=Ready", f"vis/{NAME}", "-n", ns,
                    "--timeout=480s", timeout=500)  # fmt: skip
    wait_until(
        "AdaptersLoaded=True",
        lambda: _condition(_service(cluster, ns), "AdaptersLoaded").get("status") == "True",
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

    url = service_url(cluster, ns, NAME)
    wait_until(f"{NAME}'s Service answering", lambda: answers(f"{url}/health"), 60)
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
    assert _condition(_service(cluster, ns), "AdaptersLoaded")["status"] == "True"

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
    loaded = _condition(service, "AdaptersLoaded")
    assert loaded["status"] == "False" and loaded["reason"] == "AdapterRankTooLarge", loaded
    assert _condition(service, "Ready")["status"] == "True", "the base model still serves"
    assert _completion(url, "tone") == tone
    after = _identity(cluster, ns)
    print(f"after: server pod uid {after[0]}, restarts {after[1]}, generation {after[2]}")
    assert after == before
