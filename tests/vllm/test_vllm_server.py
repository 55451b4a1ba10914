"""The real CPU vLLM helper: it starts, serves, reports its KV cache, and stops cleanly."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest

from devenv import vllm_server as server_module
from devenv.vllm_server import (
    TINY_MODELS,
    OneServer,
    VllmServer,
    VllmServerError,
    live_group_members,
    parse_kv_cache_capacity,
)

GIB = 1 << 30


@pytest.mark.parametrize(
    ("line", "pool", "tokens", "max_model_len", "concurrency"),
    [
        pytest.param(
            "(EngineCore pid=19744) INFO 11-29 21:46:32 [kv_cache_utils.py:2327] CPU KV cache "
            "size: 1,048,576 tokens, Maximum concurrency for 2,048 tokens per request: 512.00x",
            "CPU", 1_048_576, 2048, 512.0,
            id="the CPU line of vLLM 0.32 with its log prefix",
        ),
        pytest.param(
            "INFO [kv_cache_utils.py:2327] GPU KV cache size: 389,712 tokens, "
            "Maximum concurrency for 32,768 tokens per request: 11.89x",
            "GPU", 389_712, 32768, 11.89,
            id="the GPU line",
        ),
        pytest.param(
            "GPU + host KV cache size: 12 tokens, Maximum concurrency for 4 tokens per request: "
            "3.00x",
            "GPU + host", 12, 4, 3.0,
            id="the line with host offload",
        ),
    ],
)  # fmt: skip
def test_kv_cache_line_is_parsed(
    line: str, pool: str, tokens: int, max_model_len: int, concurrency: float
) -> None:
    capacity = parse_kv_cache_capacity(f"before\n{line}\nafter\n")
    assert capacity is not None
    assert (capacity.pool, capacity.tokens) == (pool, tokens)
    assert (capacity.max_model_len, capacity.max_concurrency) == (max_model_len, concurrency)
    assert capacity.line == line


def test_a_log_without_the_line_has_no_capacity() -> None:
    assert parse_kv_cache_capacity("INFO starting\nINFO loading weights\n") is None


@pytest.mark.vllm
@pytest.mark.parametrize("name", TINY_MODELS)
def test_tiny_model_is_served_and_its_kv_cache_matches_its_shape(
    name: str,
    vllm_servers: OneServer,
    vllm_python: Path,
    tiny_models: dict[str, Path],
    vllm_log_dir: Path,
) -> None:
    model = tiny_models[name]
    shape = json.loads((model / "tiny-model.json").read_text())
    server = vllm_servers.get(model, python=vllm_python, kv_cache_space_gib=1, log_dir=vllm_log_dir)
    capacity = server.kv_cache_capacity()
    print(f"\n{name}: healthy after {server.startup_s:.1f}s; {capacity.line}")
    assert capacity.pool == "CPU"
    # 1 GiB / (2 x layers x KV heads x head dim x 2 bytes), exactly.
    assert capacity.tokens == GIB // shape["kv_bytes_per_token"]
    assert capacity.max_model_len == shape["shape"]["max_position_embeddings"]
    reply = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={
            "model": server.model_name,
            "messages": [{"role": "user", "content": "Hello!"}],
            "max_tokens": 8,
            "ignore_eos": True,
        },
        timeout=60,
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 8


@pytest.mark.vllm
def test_stopping_the_server_ends_its_whole_process_group(
    vllm_server: VllmServer, vllm_servers: OneServer
) -> None:
    assert vllm_server.running and vllm_server.is_healthy()
    assert vllm_server.process is not None
    group = vllm_server.process.pid
    assert len(live_group_members(group)) >= 3  # API server, engine core, worker
    vllm_servers.stop()
    assert not vllm_server.running
    assert live_group_members(group) == []


def test_a_second_exclusive_server_waits_for_the_machine_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_OP_CACHE", str(tmp_path))
    first = server_module._acquire_machine_lock(timeout_s=1)
    try:
        started = time.monotonic()
        with pytest.raises(VllmServerError, match=f"pid {os.getpid()}"):
            server_module._acquire_machine_lock(timeout_s=0.6)
        assert time.monotonic() - started >= 0.6
    finally:
        os.close(first)
    os.close(server_module._acquire_machine_lock(timeout_s=0))  # free again once released


def test_the_server_starts_eager_unless_told_to_keep_vllms_compile() -> None:
    fast = VllmServer("/models/m", python="/bin/python", port=1)
    assert "--enforce-eager" in fast.command()
    compiled = VllmServer("/models/m", python="/bin/python", port=1, fast_start=False)
    assert "--enforce-eager" not in compiled.command()
    # Two servers that differ only in the mode are not interchangeable.
    assert fast.settings != compiled.settings
