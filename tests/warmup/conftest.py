"""Fixtures of the warmup tests: the fake OpenAI server, and the real-vLLM fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from devenv.fakes.openai_server import Config, FakeOpenAI
from devenv.vllm_fixtures import (  # noqa: F401  (fixtures, used by name)
    _vllm_one_server,
    tiny_models,
    vllm_log_dir,
    vllm_python,
    vllm_servers,
)


def small_model(**knobs: Any) -> Config:
    """The fake server as a small model: a 256-token context (a short warmup plan) and 4
    tokens in every answer, whatever max_tokens asks."""
    return replace(Config(max_model_len=256, output_tokens=4), **knobs)


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI(small_model()).start()
    yield server
    server.stop()
