"""Tests of the real CPU vLLM helper (``devenv.vllm_server``)."""

from devenv.vllm_fixtures import (  # noqa: F401  (fixtures, used by name)
    _vllm_one_server,
    tiny_models,
    vllm_log_dir,
    vllm_python,
    vllm_server,
    vllm_servers,
)
