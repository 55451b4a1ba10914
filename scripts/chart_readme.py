"""The chart's README: its values, one table per top-level section, from values.yaml's own
comments (the comment lines right above a key describe it) and defaults. Written and
checked by scripts/generate.py like every generated file, so the table cannot drift from
values.yaml.

Hand-written (about sixty lines) rather than helm-docs: that is a Go tool with its own
comment convention (`# --` on every key) and one more binary for CI to build.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1] / "charts" / "vllm-operator"
_KEY = re.compile(r"^(\s*)([A-Za-z0-9_.-]+|\"[^\"]+\"):(\s.*)?$")


def comments(text: str) -> dict[tuple[str, ...], str]:
    """The comment right above each key, by the key's path."""
    found: dict[tuple[str, ...], str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(re.sub(r"^#\s?(--\s)?", "", stripped))
            continue
        match = _KEY.match(line)
        if not stripped or stripped.startswith("- ") or match is None:
            pending = []
            continue
        indent, key = len(match.group(1)), match.group(2).strip('"')
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (*(k for _, k in stack), key)
        found[path] = " ".join(pending).strip()
        pending = []
        stack.append((indent, key))
    return found


def _leaves(value: Any, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], Any]]:
    if isinstance(value, dict) and value:
        return [leaf for k, v in value.items() for leaf in _leaves(v, (*path, str(k)))]
    return [(path, value)]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> dict[str, str]:
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    said = comments(text)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    out = [
        f"# {chart['name']} {chart['version']}\n",
        f"{' '.join(str(chart['description']).split())}\n",
        "Install and upgrade: see the repository's README (Install with Helm). Every value is "
        "below, with its default, from [values.yaml](values.yaml) (this file is generated "
        "from it: `python scripts/generate.py`); values.schema.json refuses a wrong one, "
        "naming the field.\n",
    ]
    for section, value in values.items():
        out.append(f"## `{section}`\n")
        if said.get((section,)) and isinstance(value, dict) and value:
            out.append(said[(section,)] + "\n")
        out.append("| value | default | meaning |\n| --- | --- | --- |")
        for path, default in _leaves(value, (section,)):
            shown = json.dumps(default, sort_keys=True)
            # A key without a comment of its own: its nearest described parent below the
            # section (alerts.rules.stalled.for: what alerts.rules.stalled says).
            meaning = next(
                (said[path[:n]] for n in range(len(path), 1, -1) if said.get(path[:n])), ""
            )
            if len(path) == 1:
                meaning = said.get(path, "")
            elif not meaning and said.get((section,)):
                meaning = "(the section's text above)"
            if not meaning:
                raise ValueError(f"values.yaml says nothing of {'.'.join(path)}")
            out.append(f"| `{'.'.join(path)}` | `{_cell(shown)}` | {_cell(meaning)} |")
        out.append("")
    return {"README.md": "\n".join(out)}
