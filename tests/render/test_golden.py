"""The rendered children of representative InferenceServices, pinned as golden YAML.

Set UPDATE_GOLDEN=1 to rewrite the files after an intended change, then review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests.determinism import same_across_processes
from tests.specs import GOLDEN_CASES, isvc, plan_for
from vllm_operator.constants import DEFAULT_SERVING_IMAGE
from vllm_operator.render.deployment import build_deployment
from vllm_operator.render.pdb import build_pdb
from vllm_operator.render.service import build_service

GOLDEN = Path(__file__).parents[1] / "golden"


def _render(case: str) -> str:
    svc = isvc(**GOLDEN_CASES[case])
    plan = plan_for(svc)
    docs = [
        build_deployment(svc, plan, image=DEFAULT_SERVING_IMAGE, replicas=svc.spec.replicas),
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
