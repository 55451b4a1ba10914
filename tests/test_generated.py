"""scripts/generate.py: the one table of generated files. Every file in it is current in
the repo, and its check catches a stale, a missing and an extra file."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def _generate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate", REPO / "scripts" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_generated_file_is_current() -> None:
    assert _generate().stale(REPO) == []


def test_the_check_names_stale_missing_and_extra_files_and_writing_mends_them(
    tmp_path: Path,
) -> None:
    gen = _generate()
    for folder, _, _ in gen.TARGETS:
        shutil.copytree(REPO / folder, tmp_path / folder, dirs_exist_ok=True)
    (tmp_path / "docs" / "reference.md").write_text("edited by hand\n")
    victim = next((tmp_path / "crds").glob("*.yaml"))
    victim.unlink()
    (tmp_path / "charts/vllm-operator/files/crds/old.example.dev.yaml").write_text("x: 1\n")
    # The Argo CD layout's folders, one per kind: a kind's removed script and a script of
    # a kind that is gone, one folder down.
    argo = tmp_path / "deploy/argocd/resource_customizations/inference.vllm-operator.dev"
    (argo / "GPUNode" / "health.lua").unlink()
    (argo / "OldKind").mkdir()
    (argo / "OldKind" / "health.lua").write_text("return {}\n")
    assert sorted(gen.stale(tmp_path)) == sorted(
        [
            "docs/reference.md",
            f"crds/{victim.name}",
            "charts/vllm-operator/files/crds/old.example.dev.yaml",
            f"{argo.relative_to(tmp_path)}/GPUNode/health.lua",
            f"{argo.relative_to(tmp_path)}/OldKind/health.lua",
        ]
    )
    assert gen.main(["--check", "--repo", str(tmp_path)]) == 1
    assert gen.main(["--repo", str(tmp_path)]) == 0
    assert gen.stale(tmp_path) == []
