"""The rendered children of representative InferenceServices, pinned as golden YAML.

Set UPDATE_GOLDEN=1 to rewrite the files after an intended change, then review the diff.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

from tests.determinism import same_across_processes
from tests.specs import GOLDEN_CASES, NODES, isvc, plan_for
from vllm_operator.constants import ANNOTATION_TEMPLATE_HASH, DEFAULT_SERVING_IMAGE, GPU_RESOURCE
from vllm_operator.models import InferenceService
from vllm_operator.models.inference_service import EffectiveTuning, ResolvedRollout
from vllm_operator.reconcile.rollout import choose
from vllm_operator.render.deployment import build_deployment
from vllm_operator.render.pdb import build_pdb
from vllm_operator.render.service import build_service

GOLDEN = Path(__file__).parents[1] / "golden"


def _full_pool_strategy(svc: InferenceService, plan: EffectiveTuning) -> ResolvedRollout:
    """What Auto resolves to when a change rolls out on NODES with every GPU taken."""
    rendered = build_deployment(svc, plan, image=DEFAULT_SERVING_IMAGE, replicas=1)
    live = copy.deepcopy(rendered)
    live["metadata"]["annotations"] = {ANNOTATION_TEMPLATE_HASH: "older"}  # a rollout starts
    taken = [
        {"metadata": {"name": f"other-{n['metadata']['name']}"},
         "spec": {"nodeName": n["metadata"]["name"], "containers": [{"resources": {
             "requests": {GPU_RESOURCE: n["status"]["allocatable"][GPU_RESOURCE]}}}]},
         "status": {"phase": "Running"}}
        for n in NODES
    ]  # fmt: skip
    choice = choose(svc, plan, rendered, live, nodes=NODES, cluster_pods=taken,
                    service_pods=[], stored=None)  # fmt: skip
    return choice.strategy


def _render(case: str) -> str:
    svc = isvc(**GOLDEN_CASES[case])
    plan = plan_for(svc)
    strategy: ResolvedRollout = "Surge"
    if svc.spec.rollout == "Auto" and case.startswith("rollout-auto-full"):
        strategy = _full_pool_strategy(svc, plan)
    elif svc.spec.rollout != "Auto":
        strategy = svc.spec.rollout
    docs = [
        build_deployment(
            svc, plan, image=DEFAULT_SERVING_IMAGE, replicas=svc.spec.replicas, strategy=strategy
        ),
        build_service(svc),
        build_pdb(svc),
    ]
    return yaml.safe_dump_all(docs, sort_keys=True)


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_rendered_children_match_the_golden_file(case: str) -> None:
    path = GOLDEN / f"{case}.yaml"
    text = _render(case)
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path.name}; run with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{case} renders differently from {path.name}"


def rendered_golden_cases() -> list[str]:
    return [_render(case) for case in GOLDEN_CASES]


def test_rendering_is_deterministic() -> None:
    same_across_processes("tests.render.test_golden:rendered_golden_cases")
