"""Stable YAML text for generated files (CRDs, manifests) so regeneration is diffable."""

from __future__ import annotations

from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    """Block style, no aliases, long lines kept so CEL rules stay on one line."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str_presenter)


def dump(obj: Any, *, header: str | None = None) -> str:
    """One YAML document, with an optional comment header."""
    text = yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=10_000, allow_unicode=True)
    if header:
        text = "".join(f"# {line}\n" for line in header.splitlines()) + text
    return text
