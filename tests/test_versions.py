"""One version everywhere: the package's ``__version__`` (the one place, read by the
build), the installed distribution, ``vllm-operator --version``, the chart's version and
appVersion (the image tag the chart pulls by default), the warmup image default and the
newest CHANGELOG entry."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import yaml

from vllm_operator import __version__
from vllm_operator.settings import OperatorSettings

REPO = Path(__file__).resolve().parents[1]


def test_every_place_names_the_packages_version() -> None:
    chart = yaml.safe_load((REPO / "charts" / "vllm-operator" / "Chart.yaml").read_text())
    printed = subprocess.run(
        [sys.executable, "-m", "vllm_operator.cli", "--version"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.split()[-1]  # fmt: skip
    changelog = (REPO / "CHANGELOG.md").read_text()
    newest = re.search(r"^## (\S+)", changelog, flags=re.M)
    assert newest is not None
    found = {
        "distribution": importlib.metadata.version("vllm-operator"),
        "vllm-operator --version": printed,
        "Chart.yaml version": chart["version"],
        "Chart.yaml appVersion": chart["appVersion"],
        "warmup image default": OperatorSettings.model_fields["warmup_image"].default.rsplit(
            ":", 1
        )[1],
        "CHANGELOG": newest.group(1),
    }
    assert found == dict.fromkeys(found, __version__)


def test_the_license_is_the_one_the_metadata_names() -> None:
    assert "Apache-2.0" in (REPO / "pyproject.toml").read_text()
    text = (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
