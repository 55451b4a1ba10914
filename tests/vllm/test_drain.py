"""Graceful drain, as the operator's Deployment sets it up: on SIGTERM a vLLM started with
``--shutdown-timeout`` (the value the Deployment renders) finishes the streams in flight
before it exits, instead of cutting them. This is what lets a scale-down remove a pod
without failing the requests it still holds."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from e2e.vllm_server import OneServer, stream_completion

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
    results: list[dict[str, Any]] = [{} for _ in range(4)]
    started = [threading.Event() for _ in results]
    threads = [
        threading.Thread(
            target=stream_completion,
            args=(server.url, server.model_name, out, ev),
            kwargs={"tokens": TOKENS},
        )
        for out, ev in zip(results, started, strict=True)
    ]
    for t in threads:
        t.start()
    for ev in started:
        assert ev.wait(60), "no stream started"
    # As the kubelet does after the preStop hook: SIGTERM to the container's main process.
    sent = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(timeout=DRAIN_SECONDS + 30)
    for out in results:
        assert "error" not in out, out
        assert out["finish"] == "length", out
        assert out["usage"]["completion_tokens"] == TOKENS, out
    # ... and then it exits by itself, within the drain budget.
    server.process.wait(timeout=DRAIN_SECONDS)
    print(f"4 streams of {TOKENS} tokens finished; server exited {time.monotonic() - sent:.1f} s "
          "after SIGTERM")  # fmt: skip
