"""The catalog of invalid manifests shared by the unit and cluster tiers."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CATALOG = Path(__file__).parent / "data" / "invalid_manifests.yaml"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


@dataclass(frozen=True)
class InvalidCase:
    id: str
    kind: str
    manifest: dict[str, Any]
    field: str
    admission_only: bool


def invalid_cases() -> list[InvalidCase]:
    data = yaml.safe_load(CATALOG.read_text())
    return [
        InvalidCase(
            id=c["id"],
            kind=c["kind"],
            manifest=merge_patch(data["bases"][c["kind"]], c["patch"]),
            field=c["field"],
            admission_only=bool(c.get("admission_only", False)),
        )
        for c in data["cases"]
    ]


def valid_bases() -> dict[str, dict[str, Any]]:
    bases: dict[str, dict[str, Any]] = yaml.safe_load(CATALOG.read_text())["bases"]
    return bases
