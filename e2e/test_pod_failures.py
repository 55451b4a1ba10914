"""Pod failures reach the InferenceService's status, each produced for real on the real
node by the operator's own pods (the chart's operator, the real CPU vLLM image).

- an argument the image's vLLM refuses (the spec says 0.10.0, the image runs 0.32.0, and
  an override only 0.10 takes): a crash loop, ``InvalidArgument``, ``Stalled=True``, with
  vLLM's own "unrecognized arguments" line in the message;
- a model path the image lacks (offline, as every pod here is): ``ModelNotFound``;
- a memory limit below what vLLM needs in host memory: ``OOMKilled``;
- an image that cannot be pulled (a registry on loopback that does not answer):
  ``ImagePullFailed``, stalled once the kubelet backs off;
- a memory request no node has: ``Unschedulable``, not stalled (nodes may be added), with
  the scheduler's words.

The GPU out-of-memory, gated-model and progress-deadline cases need a GPU, a model hub or
a 10-minute wait; tests/reconcile/test_pods.py has them from recorded messages.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from devenv.cluster.cluster import ClusterHandle
from devenv.cluster.images import Images
from e2e.framework import condition, fetch, wait_for
from e2e.real_node_fixtures import ChartOperator

SAMPLE = yaml.safe_load((Path(__file__).parents[1] / "examples" / "dev-sample.yaml").read_text())


def _service(name: str, **spec: Any) -> dict[str, Any]:
    body = copy.deepcopy(SAMPLE)
    body["metadata"] = {"name": name}
    # Warmup would only add a Job that fails the same way.
    body["spec"]["warmup"] = {"enabled": False}
    for key, value in spec.items():
        body["spec"][key] = {**body["spec"].get(key, {}), **value} if isinstance(value, dict) \
            else value  # fmt: skip
    return body


def _ready_says(cluster: ClusterHandle, ns: str, name: str, reason: str) -> dict[str, Any] | None:
    obj = fetch(cluster, ns, "vis", name)
    if obj and condition(obj, "Ready").get("reason") == reason:
        return obj
    return None


def _warned(cluster: ClusterHandle, ns: str, name: str, reason: str) -> bool:
    events = fetch(cluster, ns, "events", "--field-selector",
                  f"involvedObject.name={name},reason={reason},type=Warning")  # fmt: skip
    return bool((events or {}).get("items"))


def test_crash_loops_from_vllms_own_errors_stall_with_the_log_line(
    cluster: ClusterHandle,
    chart_operator: ChartOperator,
    real_images: Images,
    real_namespace: Callable[..., str],
) -> None:
    ns = real_namespace()
    # Two CPU vLLM pods at a time: the node's two cores.
    cluster.apply(
        [
            _service("badflag", vllmVersion="0.10.0", tuning={"overrides": {"swap-space": "4"}}),
            _service(
                "nomodel",
                model={"source": {"image": {"path": "/models/no-such-model"}}},
                podTemplate={"env": [{"name": "HF_HUB_OFFLINE", "value": "1"}]},
            ),
        ],
        namespace=ns,
    )
    for name, reason, line in (
        ("badflag", "InvalidArgument", "unrecognized arguments: --swap-space"),
        ("nomodel", "ModelNotFound", "Repo id must be in the form"),
    ):
        obj = wait_for(
            lambda n=name, r=reason: (
                (o := _ready_says(cluster, ns, n, r))
                and condition(o, "Stalled").get("status") == "True"
                and o
            ),
            f"{name}: Ready={reason} and Stalled=True",
            timeout=240,
        )
        conds = obj["status"]["conditions"]
        assert condition(obj, "Stalled")["reason"] == reason, conds
        assert condition(obj, "Reconciling")["status"] == "False", conds
        message = condition(obj, "Ready").get("message", "")
        assert "container vllm exited" in message and "CrashLoopBackOff" in message, message
        assert line in message, message
        assert _warned(cluster, ns, name, reason)
        print(f"\n{name}: {message}")
    cluster.kubectl("delete", "vis", "badflag", "nomodel", "-n", ns, "--wait=true")


def test_oom_image_pull_and_unschedulable_are_named(
    cluster: ClusterHandle,
    chart_operator: ChartOperator,
    real_images: Images,
    real_namespace: Callable[..., str],
) -> None:
    ns = real_namespace()
    missing = real_images.vllm.rsplit(":", 1)[0] + ":v0.32.0-never-built"
    cluster.apply(
        [
            _service("oom", node={"memory": "400Mi"}),
            _service("nopull", image=missing),
            _service("nowhere", node={"memory": "200Gi"}),
        ],
        namespace=ns,
    )
    nowhere = wait_for(
        lambda: _ready_says(cluster, ns, "nowhere", "Unschedulable"),
        "nowhere: Ready=Unschedulable",
        timeout=120,
    )
    conds = nowhere["status"]["conditions"]
    reconciling = condition(nowhere, "Reconciling")
    assert condition(nowhere, "Stalled")["status"] == "False", conds
    assert (reconciling["status"], reconciling["reason"]) == ("True", "Unschedulable"), conds
    assert "Insufficient memory" in condition(nowhere, "Ready").get("message", ""), conds
    nopull = wait_for(
        lambda: (
            (o := _ready_says(cluster, ns, "nopull", "ImagePullFailed"))
            and condition(o, "Stalled").get("status") == "True"
            and o
        ),
        "nopull: Ready=ImagePullFailed and Stalled=True",
        timeout=180,
    )
    assert missing in condition(nopull, "Ready").get("message", "")
    oom = wait_for(
        lambda: _ready_says(cluster, ns, "oom", "OOMKilled"),
        "oom: Ready=OOMKilled",
        timeout=240,
    )
    assert "memory limit of" in condition(oom, "Ready").get("message", "")
    for obj in (nowhere, nopull, oom):
        print(f"\n{obj['metadata']['name']}: {condition(obj, 'Ready').get('message', '')}")
