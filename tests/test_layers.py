"""The import layers and contracts hold (import-linter, in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[1]


def test_import_linter_contracts_hold() -> None:
    exe = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(exe), str(REPO / "pyproject.toml")],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_nothing_is_importable_as_operator() -> None:
    import operator
    import sysconfig

    assert not (REPO / "operator" / "__init__.py").exists()
    assert operator.__file__ is not None
    assert Path(operator.__file__).parent == Path(sysconfig.get_paths()["stdlib"])
