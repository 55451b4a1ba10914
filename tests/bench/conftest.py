"""Fixtures of the bench tests: the fake streaming server (its own process), and the real
vLLM fixtures for the tests marked ``vllm``."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from devenv.fakes.openai_server import Config, FakeServerProcess
from devenv.vllm_fixtures import (  # noqa: F401  (fixtures, used by name)
    _vllm_one_server,
    tiny_models,
    vllm_log_dir,
    vllm_python,
    vllm_servers,
)

ServerFactory = Callable[[Config], FakeServerProcess]


@pytest.fixture
def fake_server() -> Iterator[ServerFactory]:
    """Start fake servers with a given config; every one is stopped after the test."""
    started: list[FakeServerProcess] = []

    def start(config: Config) -> FakeServerProcess:
        server = FakeServerProcess(config).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
