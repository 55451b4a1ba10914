"""The LeaderWorkerSet of a multi-node plan (render/lws.py), pinned as golden YAML, and the
properties a group must have whatever the plan.

Set UPDATE_GOLDEN=1 to rewrite the golden files after an intended change, then review.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.determinism import same_across_processes
from tests.specs import isvc, node
from vllm_operator.constants import (
    DEFAULT_SERVING_IMAGE,
    NODE_LABEL_GPUDIRECT_RDMA,
    NODE_LABEL_NETWORK,
    NODE_LABEL_NETWORK_GBPS,
    NODE_LABEL_RACK,
    WARMED_UP_CONDITION,
)
from vllm_operator.models import InferenceService
from vllm_operator.models.inference_service import EffectiveTuning
from vllm_operator.reconcile.placement import plan_inference_service
from vllm_operator.render.lws import EXCLUSIVE_TOPOLOGY, build_leaderworkerset, group_size
from vllm_operator.render.meta import selector_labels
from vllm_operator.tuning.multinode import placement_topology_key

GOLDEN = Path(__file__).parents[1] / "golden"
LLAMA_405B = {"huggingFace": {"repo": "meta-llama/Llama-3.1-405B-Instruct"}}
INFINIBAND = {
    NODE_LABEL_NETWORK: "infiniband",
    NODE_LABEL_NETWORK_GBPS: "3200",
    NODE_LABEL_GPUDIRECT_RDMA: "true",
}


def h100(name: str, **labels: str) -> dict[str, Any]:
    n = node(name, "NVIDIA-H100-80GB-HBM3", 8, 81559, "nvlink")
    n["metadata"]["labels"].update(labels)
    return n


CASES: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {
    # 405B in bf16 over InfiniBand with GPUDirect, two racks: a group per rack.
    "lws-405b-infiniband-rack": (
        {"model": {"source": LLAMA_405B}, "replicas": 2,
         "workload": {"promptTokens": {"type": "Uniform", "min": 100, "max": 2000},
                      "outputTokens": {"type": "Uniform", "min": 50, "max": 1000},
                      "peakConcurrency": 32}},
        [h100(f"h100-{r}{i}", **INFINIBAND, **{NODE_LABEL_RACK: r}) for r in "ab" for i in "12"],
    ),
    # The same over unlabelled nodes: Ethernet assumed, no topology to keep a group in.
    "lws-405b-ethernet": (
        {"model": {"source": LLAMA_405B}, "warmup": {"enabled": False}},
        [h100("h100-1"), h100("h100-2")],
    ),
}  # fmt: skip


def _plan(case: str) -> tuple[InferenceService, EffectiveTuning, str | None]:
    spec, nodes = CASES[case]
    svc = isvc(**spec)
    outcome = plan_inference_service(svc, nodes, [])
    assert outcome.does_not_fit is None, outcome.does_not_fit
    key = placement_topology_key([n["metadata"]["labels"] for n in nodes])
    return svc, outcome.tuning, key


def _render(case: str) -> dict[str, Any]:
    svc, tuning, key = _plan(case)
    return build_leaderworkerset(
        svc, tuning, image=DEFAULT_SERVING_IMAGE, groups=svc.spec.replicas, topology_key=key
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_leaderworkerset_matches_the_golden_file(case: str) -> None:
    path = GOLDEN / f"{case}.yaml"
    text = yaml.safe_dump(_render(case), sort_keys=True)
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path.name}; run with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{case} renders differently from {path.name}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_group_is_one_vllm_over_its_nodes(case: str) -> None:
    lws = _render(case)
    svc, tuning, key = _plan(case)
    spec = lws["spec"]
    lwt = spec["leaderWorkerTemplate"]
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert spec["replicas"] == svc.spec.replicas  # groups
    assert lwt["size"] == group_size(tuning) == 2
    assert lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader = lwt["leaderTemplate"]["spec"]["containers"][0]
    worker = lwt["workerTemplate"]["spec"]["containers"][0]
    for c in (leader, worker):
        args = c["args"]
        assert args[args.index("--nnodes") + 1] == "2"
        assert args[args.index("--tensor-parallel-size") + 1] == "8"
        assert args[args.index("--pipeline-parallel-size") + 1] == "2"
        assert args[args.index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"  # one node's GPUs
        assert any(m["mountPath"] == "/dev/shm" for m in c["volumeMounts"])
        assert any(e["name"] == "NCCL_IB_DISABLE" for e in c["env"])
    assert leader["args"][leader["args"].index("--node-rank") + 1] == "0"
    assert "--headless" not in leader["args"] and "readinessProbe" in leader
    assert worker["args"][worker["args"].index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
    assert "--headless" in worker["args"] and "readinessProbe" not in worker
    # Only leaders are selected by the Service and PDB, and only they wait for warmup.
    selector = selector_labels(svc)
    leader_labels = lwt["leaderTemplate"]["metadata"]["labels"]
    worker_labels = lwt["workerTemplate"]["metadata"]["labels"]
    assert selector.items() <= leader_labels.items()
    assert not set(selector) & set(worker_labels)
    assert "readinessGates" not in lwt["workerTemplate"]["spec"]
    gates = lwt["leaderTemplate"]["spec"].get("readinessGates", [])
    assert (gates == [{"conditionType": WARMED_UP_CONDITION}]) == svc.spec.warmup.enabled
    assert lws["metadata"].get("annotations", {}).get(EXCLUSIVE_TOPOLOGY) == key


def rendered_cases() -> list[dict[str, Any]]:
    return [_render(case) for case in CASES]


def test_rendering_is_deterministic() -> None:
    same_across_processes("tests.render.test_lws:rendered_cases")
