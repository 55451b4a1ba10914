"""Every generated file of the repo, from one table: write them, or check that they are
current (`make verify` runs the check; CI runs `make verify` through the tests).

    python scripts/generate.py           # write every generated file
    python scripts/generate.py --check   # exit 1 naming each stale, missing or extra file

The files: the CRDs in crds/ and their copy in the Helm chart (from the pydantic models),
docs/reference.md (from the CRDs), Argo CD's argocd-cm patch (from the Lua health checks
in deploy/argocd/health/), the node agent's manifests in deploy/agent/ (from
agent/manifests.py), and the agent tests' NVML answer files (from
devenv/fakes/answer_sets.py; the ones recorded on real GPUs, under h200/, are not
generated), the chart's README (its values table, from values.yaml's comments), and the
chart's RBAC (from the controller table, operator/vllm_operator/k8s/controllers.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _crds() -> dict[str, str]:
    from vllm_operator.cli import crd_files

    return crd_files()


def _reference() -> dict[str, str]:
    from vllm_operator.render.reference import render_reference

    return {"reference.md": render_reference()}


def _agent() -> dict[str, str]:
    from vllm_operator.agent.manifests import deploy_files

    return deploy_files()


def _agent_fixtures() -> dict[str, str]:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from devenv.fakes.answer_sets import render

    return render()


def _script(path: str) -> Any:
    """A renderer that lives beside what it renders, outside the package, loaded by path."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, REPO / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _argocd() -> dict[str, str]:
    text: str = _script("deploy/argocd/render_cm.py").render()
    return {"argocd-cm-patch.yaml": text}


def _argocd_layout() -> dict[str, str]:
    files: dict[str, str] = _script("deploy/argocd/render_cm.py").layout()
    return files


def _chart_readme() -> dict[str, str]:
    files: dict[str, str] = _script("scripts/chart_readme.py").render()
    return files


def _chart_rbac() -> dict[str, str]:
    files: dict[str, str] = _script("scripts/chart_rbac.py").render()
    return files


# (folder, glob of what it holds that is generated, renderer of {path in the folder:
# text}). A folder whose glob is set owns every file it matches: one the renderer no
# longer makes is stale too.
TARGETS: tuple[tuple[str, str | None, Callable[[], dict[str, str]]], ...] = (
    ("crds", "*.yaml", _crds),
    ("charts/vllm-operator/files/crds", "*.yaml", _crds),
    ("docs", None, _reference),
    ("deploy/argocd", None, _argocd),
    ("deploy/argocd/resource_customizations/inference.vllm-operator.dev", "*/health.lua",
     _argocd_layout),  # fmt: skip
    ("deploy/agent", "*.yaml", _agent),
    ("tests/agent/fixtures", "*.yaml", _agent_fixtures),
    ("charts/vllm-operator", None, _chart_readme),
    ("charts/vllm-operator/templates", None, _chart_rbac),
)


def _owned(folder: Path, glob: str) -> list[str]:
    """The paths in ``folder`` (relative, with /) that ``glob`` matches."""
    return [p.relative_to(folder).as_posix() for p in sorted(folder.glob(glob))]


def stale(repo: Path = REPO) -> list[str]:
    """Paths (relative to ``repo``) that differ from what their renderer makes now."""
    found: list[str] = []
    for folder, owned, render in TARGETS:
        files = render()
        for name, text in files.items():
            path = repo / folder / name
            if not path.is_file() or path.read_text() != text:
                found.append(f"{folder}/{name}")
        if owned:
            found += [
                f"{folder}/{name}"
                for name in _owned(repo / folder, owned)
                if name not in files
            ]
    return found


def write(repo: Path = REPO) -> list[str]:
    written: list[str] = []
    for folder, owned, render in TARGETS:
        files = render()
        out = repo / folder
        out.mkdir(parents=True, exist_ok=True)
        if owned:
            for name in _owned(out, owned):
                if name not in files:
                    (out / name).unlink()
        for name, text in files.items():
            path = out / name
            if not path.is_file() or path.read_text() != text:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                written.append(f"{folder}/{name}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/generate.py", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
    parser.add_argument("--repo", type=Path, default=REPO, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.check:
        found = stale(args.repo)
        for path in found:
            print(f"stale: {path}")
        if found:
            print("run: python scripts/generate.py (or make generate)")
            return 1
        print("every generated file is current")
        return 0
    for path in write(args.repo):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
