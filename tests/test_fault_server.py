"""The fault server drains on stop as vLLM does with ``--shutdown-timeout``: a generation in
flight when the stop comes is answered with a drain, and cut without one."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from devenv.cluster.fault_server import _serve_args
from devenv.fakes.openai_server import Config, FakeOpenAI


def _in_flight_then_stop(drain_s: float) -> int | str:
    server = FakeOpenAI(Config(ttft=lambda _n: 1.0)).start()
    outcome: list[int | str] = []

    def ask() -> None:
        try:
            body = {"model": "fake-model", "prompt": "hi", "max_tokens": 2}
            response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=10)
            outcome.append(response.status_code)
        except httpx.HTTPError as exc:
            outcome.append(type(exc).__name__)

    client = threading.Thread(target=ask)
    client.start()
    deadline = time.monotonic() + 5
    while not server.received and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.received, "the request never reached the server"
    server.stop(drain_s=drain_s)
    client.join(timeout=15)
    return outcome[0]


def test_a_request_in_flight_is_answered_with_a_drain() -> None:
    assert _in_flight_then_stop(drain_s=5) == 200


def test_a_request_in_flight_is_cut_without_one() -> None:
    assert _in_flight_then_stop(drain_s=0) != 200


@pytest.mark.parametrize(
    ("argv", "timeout"),
    [(["--port", "8000"], 0.0), (["m", "--shutdown-timeout", "30", "--port", "8000"], 30.0)],
)
def test_the_rendered_shutdown_timeout_is_read(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], timeout: float
) -> None:
    monkeypatch.setenv("VLLM_FAULT_MODE", "ok")
    assert _serve_args(argv).shutdown_timeout == timeout
