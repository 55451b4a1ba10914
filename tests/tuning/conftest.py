"""Shared builders for the tuner's tests."""

from __future__ import annotations

from devenv.vllm_fixtures import (  # noqa: F401  (fixtures, used by name)
    _vllm_one_server,
    tiny_models,
    vllm_log_dir,
    vllm_python,
    vllm_servers,
)
