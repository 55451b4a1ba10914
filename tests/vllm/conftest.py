"""Tests of the real CPU vLLM helper (``e2e.vllm_server``)."""

from e2e.vllm_fixtures import (  # noqa: F401  (fixtures, used by name)
    _vllm_one_server,
    tiny_models,
    vllm_log_dir,
    vllm_python,
    vllm_server,
    vllm_servers,
)
