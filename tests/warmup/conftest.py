"""Fixtures of the warmup tests: the fake OpenAI server, and the real-vLLM fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devenv.fake_openai import Behaviour, FakeOpenAI
from devenv.vllm_fixtures import (  # noqa: F401  (fixtures, used by name)
    _vllm_one_server,
    tiny_models,
    vllm_log_dir,
    vllm_python,
    vllm_servers,
)


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI(Behaviour()).start()
    yield server
    server.stop()
