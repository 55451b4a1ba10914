"""Graceful drain, as the operator's Deployment sets it up: on SIGTERM a vLLM started with
``--shutdown-timeout`` (the value the Deployment renders) finishes the streams in flight
before it exits, instead of cutting them. This is what lets a scale-down remove a pod
without failing the requests it still holds."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from devenv.vllm_server import OneServer, Streams
from vllm_operator.render.deployment import DRAIN_SECONDS

TOKENS = 1200


@pytest.mark.vllm
def test_sigterm_lets_the_streams_in_flight_finish(
    vllm_servers: OneServer,
    vllm_python: Path,
    tiny_models: dict[str, Path],
    vllm_log_dir: Path,
) -> None:
    server = vllm_servers.get(
        tiny_models["tiny-llama"],
        python=vllm_python,
        log_dir=vllm_log_dir,
        extra_args=("--shutdown-timeout", str(DRAIN_SECONDS)),
    )
    assert server.process is not None
    streams = Streams(server.url, server.model_name, count=4, tokens=TOKENS)
    streams.start()
    # As the kubelet does after the preStop hook: SIGTERM to the container's main process.
    sent = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    streams.finish(DRAIN_SECONDS + 30)
    # ... and then it exits by itself, within the drain budget.
    server.process.wait(timeout=DRAIN_SECONDS)
    print(f"4 streams of {TOKENS} tokens finished; server exited {time.monotonic() - sent:.1f} s "
          "after SIGTERM")  # fmt: skip
