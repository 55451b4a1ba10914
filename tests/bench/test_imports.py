"""The bench runs in a plain Job: no Kopf, no Kubernetes client, no NVML. Its pure modules
import no HTTP client and no clock."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import vllm_operator.bench

BENCH = Path(vllm_operator.bench.__file__).parent
PURE = (
    "workload", "arrivals", "stats", "search", "result", "records", "archive", "resources",
)  # fmt: skip


def test_bench_imports_no_kopf_kubernetes_client_or_nvml() -> None:
    code = (
        "import sys\n"
        "import vllm_operator.bench.cli, vllm_operator.bench.run, vllm_operator.bench.report\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('kopf', 'kubernetes', 'kubernetes_asyncio', 'pynvml'))\n"
        "print(','.join(bad))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""


def imported(module: str) -> set[str]:
    tree = ast.parse((BENCH / f"{module}.py").read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_no_io_clock_or_environment(module: str) -> None:
    forbidden = {
        "time", "os", "aiohttp", "httptools", "httpx", "asyncio", "socket", "subprocess",
        "datetime", "ssl",
    }  # fmt: skip
    if module == "result":
        forbidden.discard("datetime")  # a type in the result, never datetime.now()
    assert not imported(module) & forbidden


def test_the_cli_module_is_cheap_to_import() -> None:
    # The top-level CLI imports every component's module to build its parser.
    code = (
        "import sys, vllm_operator.bench.cli\n"
        "print(','.join(m for m in ('httptools', 'rich', 'httpx') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""
