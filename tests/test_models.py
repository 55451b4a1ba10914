"""The API models accept what the CRDs accept and reject what they reject."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from tests.catalog import invalid_cases, valid_bases
from vllm_operator.models import GPUNode, InferenceBenchmark, InferenceService, InferenceTuning
from vllm_operator.models.base import CONDITION_MESSAGE_MAX, ApiModel, Condition
from vllm_operator.models.conditions import CLIPPED, condition

KINDS: dict[str, type[ApiModel]] = {
    "InferenceService": InferenceService,
    "InferenceBenchmark": InferenceBenchmark,
    "GPUNode": GPUNode,
    "InferenceTuning": InferenceTuning,
}
EXAMPLE_DIR = Path(__file__).parents[1] / "examples"
EXAMPLES = sorted(EXAMPLE_DIR.rglob("*.yaml"))


def _documents(path: Path) -> list[dict[str, object]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.parametrize("path", EXAMPLES, ids=[str(p.relative_to(EXAMPLE_DIR)) for p in EXAMPLES])
def test_every_example_is_a_valid_object(path: Path) -> None:
    docs = [d for d in _documents(path) if d.get("kind") in KINDS]
    assert docs, f"{path.name} holds none of our kinds"
    for doc in docs:
        KINDS[str(doc["kind"])].model_validate(doc)


def test_there_are_examples_of_every_kind() -> None:
    kinds = {d.get("kind") for p in EXAMPLES for d in _documents(p)}
    assert set(KINDS) <= kinds


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_catalog_bases_are_valid(kind: str) -> None:
    KINDS[kind].model_validate(valid_bases()[kind])


CASES = [c for c in invalid_cases() if not c.admission_only]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_models_reject_each_invalid_manifest(case: object) -> None:
    from tests.catalog import InvalidCase

    assert isinstance(case, InvalidCase)
    with pytest.raises(ValidationError) as err:
        KINDS[case.kind].model_validate(case.manifest)
    # The error names the field (pydantic spells the path with dots, in camelCase).
    leaf = case.field.split(".")[-1].split("[")[0]
    assert leaf in str(err.value), f"error does not name {case.field}: {err.value}"


def test_the_catalog_has_at_least_25_invalid_services_and_benchmarks() -> None:
    cases = [c for c in invalid_cases() if c.kind in ("InferenceService", "InferenceBenchmark")]
    assert len(cases) >= 25
    assert len({c.id for c in invalid_cases()}) == len(invalid_cases()), "ids must be unique"


def test_defaults_fill_a_minimal_service() -> None:
    isvc = InferenceService.model_validate(valid_bases()["InferenceService"])
    spec = isvc.spec
    assert spec.replicas == 1
    assert spec.gpu.count == "auto"
    assert spec.tuning.profile == "Balanced"
    assert spec.warmup.enabled is True
    assert spec.autoscaling.enabled is False
    assert spec.node.shm_size == "auto"
    assert spec.model.source.hugging_face is not None
    assert spec.model.source.hugging_face.revision == "main"


def test_wire_form_round_trips() -> None:
    isvc = InferenceService.model_validate(valid_bases()["InferenceService"])
    again = InferenceService.model_validate(isvc.to_wire())
    assert again == isvc
    assert "tokenSecretRef" not in str(isvc.to_wire()), "unset optional fields are left out"


def test_gpu_count_accepts_auto_and_numbers() -> None:
    base = valid_bases()["InferenceService"]
    for count in ("auto", 1, 8, 16):
        doc = {**base, "spec": {**base["spec"], "gpu": {"count": count}}}
        assert InferenceService.model_validate(doc).spec.gpu.count == count


def test_field_errors_name_each_field_as_kubernetes_writes_it() -> None:
    """One entry per field, list items by index, a union's members left out of the path
    and their reasons joined; past the limit, how many more."""
    from vllm_operator.models.base import field_errors

    with pytest.raises(ValidationError) as caught:
        _Spec.model_validate({"count": "lots", "items": [{"name": "a"}, {}], "size": "x"})
    assert field_errors(caught.value) == (
        "count: Input should be a valid integer, unable to parse string as an integer or "
        "Input should be 'auto'; items[1].name: Field required; "
        "size: Input should be a valid integer, unable to parse string as an integer"
    )
    assert field_errors(caught.value, limit=1).endswith("; and 2 more")
    with pytest.raises(ValidationError) as whole:
        _Item.model_validate(["not", "a", "mapping"])
    assert field_errors(whole.value, whole="(record)") == (
        "(record): Input should be a valid dictionary or instance of _Item"
    )


def test_the_values_users_read_in_status_are_each_described() -> None:
    """Every error kind the load client records and every clock event reason the node
    agent reports is named in its field's description (so in kubectl explain and
    docs/reference.md)."""
    from vllm_operator.agent.readings import CLOCK_EVENT_GPU_IDLE, CLOCK_EVENT_REASONS
    from vllm_operator.bench import records
    from vllm_operator.models.gpu_node import Clocks
    from vllm_operator.models.inference_benchmark import LevelResult

    described = LevelResult.model_fields["errors_by_kind"].description or ""
    kinds = [v for k, v in vars(records).items() if k.isupper() and isinstance(v, str)]
    assert len(kinds) >= 11
    assert [k for k in kinds if k not in described] == []
    assert records.http_error(503) in described
    described = Clocks.model_fields["throttle_reasons"].description or ""
    reasons = [n for bit, n in CLOCK_EVENT_REASONS.items() if bit != CLOCK_EVENT_GPU_IDLE]
    assert [r for r in reasons if r not in described] == []


class _Item(BaseModel):
    name: str


class _Spec(BaseModel):
    count: int | Literal["auto"]
    items: list[_Item]
    size: int


def test_a_condition_message_past_metav1s_limit_is_cut_and_marked() -> None:
    now = datetime(2026, 12, 7, tzinfo=UTC)
    long = "x" * (CONDITION_MESSAGE_MAX + 10)
    made = condition("Ready", False, "Failed", long, now=now, generation=1)
    assert len(made.message) == CONDITION_MESSAGE_MAX and made.message.endswith(CLIPPED)
    exact = "y" * CONDITION_MESSAGE_MAX
    assert condition("Ready", False, "Failed", exact, now=now, generation=1).message == exact
    # The model itself holds metav1.Condition's limits: what the apiserver would refuse.
    for bad in ({"reason": ""}, {"reason": "Not one word"}, {"type": "no spaces allowed"}):
        fields = {"type": "Ready", "status": "True", "reason": "Ok", "message": "",
                  "lastTransitionTime": now, **bad}  # fmt: skip
        with pytest.raises(ValueError, match="String should"):
            Condition.model_validate(fields)
