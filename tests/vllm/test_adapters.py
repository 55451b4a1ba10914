"""LoRA adapters on the real CPU vLLM, through the client the operator and the warmup use.

The server runs as the operator's Deployment starts it for a service with adapters
(``--enable-lora`` and the planned capacity, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``);
the adapters are tiny random-weight ones made for the tiny model
(scripts/make_tiny_adapter.py), whose B matrices are not zero, so with greedy decoding a
request through an adapter answers differently from the base model.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from devenv.vllm_server import REPO_ROOT, OneServer, VllmServer
from vllm_operator.models.inference_service import Adapter, command_flags
from vllm_operator.reconcile.adapters import sync_server
from vllm_operator.servers.adapters import (
    AdapterApiError,
    load_adapter,
    loaded_adapters,
    unload_adapter,
)
from vllm_operator.servers.pods import PodClient
from vllm_operator.tuning.lora import RUNTIME_UPDATING_ENV, DeclaredAdapter, LoRAAsk, plan_lora
from vllm_operator.warmup.run import WarmupOptions, run_warmup

pytestmark = pytest.mark.vllm

SCRIPT = REPO_ROOT / "scripts" / "make_tiny_adapter.py"
# The flags the tuner plans for one adapter (tuning/lora.py), spelled as rendered.
LORA_FLAGS = tuple(command_flags(plan_lora(LoRAAsk((DeclaredAdapter("sql"),))).settings))


@pytest.fixture(scope="module")
def adapters(vllm_python: Path) -> dict[str, str]:
    made = {}
    for name in ("tiny-lora-a", "tiny-lora-b", "tiny-lora-r32"):
        done = subprocess.run(
            [str(vllm_python), str(SCRIPT), "--name", name],
            capture_output=True,
            text=True,
            check=True,
        )
        made[name] = done.stdout.strip().splitlines()[-1]
    return made


@pytest.fixture
def lora_server(
    vllm_servers: OneServer,
    vllm_python: Path,
    tiny_models: dict[str, Path],
    vllm_log_dir: Path,
) -> VllmServer:
    return vllm_servers.get(
        tiny_models["tiny-llama"],
        python=vllm_python,
        log_dir=vllm_log_dir,
        served_model_name="base",
        max_model_len=1024,
        extra_args=LORA_FLAGS,
        env={RUNTIME_UPDATING_ENV: "True"},
    )


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


async def _text(http: httpx.AsyncClient, url: str, model: str) -> tuple[int, str]:
    response = await http.post(
        f"{url}/v1/completions",
        json={"model": model, "prompt": "The operator tunes", "max_tokens": 8, "temperature": 0},
        timeout=60,
    )
    if response.status_code != 200:
        return response.status_code, response.text
    return 200, str(response.json()["choices"][0]["text"])


async def test_an_adapter_loaded_at_run_time_answers_replaces_and_goes(
    lora_server: VllmServer, adapters: dict[str, str], http: httpx.AsyncClient
) -> None:
    url = lora_server.url
    await unload_adapter(http, url, "sql")  # a reused server may have it from before
    base = await _text(http, url, "base")
    await load_adapter(http, url, "sql", adapters["tiny-lora-a"])
    assert (await loaded_adapters(http, url)) == {"sql": adapters["tiny-lora-a"]}
    with_a = await _text(http, url, "sql")
    assert with_a[0] == 200 and with_a != base, "the adapter changed nothing"
    # Loading it again from the same path is a no-op, not an error.
    await load_adapter(http, url, "sql", adapters["tiny-lora-a"])
    # Replaced in place: the same name now answers with the other adapter's weights.
    await load_adapter(http, url, "sql", adapters["tiny-lora-b"], replace=True)
    assert (await loaded_adapters(http, url)) == {"sql": adapters["tiny-lora-b"]}
    with_b = await _text(http, url, "sql")
    assert with_b[0] == 200 and with_b not in (base, with_a)
    await unload_adapter(http, url, "sql")
    assert (await loaded_adapters(http, url)) == {}
    status, body = await _text(http, url, "sql")
    assert status == 404 and "does not exist" in body
    assert await _text(http, url, "base") == base
    await unload_adapter(http, url, "sql")  # unloading what is gone is fine


async def test_a_rank_above_the_limit_and_a_missing_path_are_refused_in_vllms_words(
    lora_server: VllmServer, adapters: dict[str, str], http: httpx.AsyncClient
) -> None:
    url = lora_server.url
    with pytest.raises(AdapterApiError, match="LoRA rank 32 is greater than max_lora_rank 16"):
        await load_adapter(http, url, "big", adapters["tiny-lora-r32"])
    with pytest.raises(AdapterApiError, match="No adapter found for /nonexistent/lora") as err:
        await load_adapter(http, url, "nope", "/nonexistent/lora")
    assert err.value.status == 404
    assert "big" not in await loaded_adapters(http, url)


async def test_one_pass_brings_a_server_to_the_declared_set(
    lora_server: VllmServer, adapters: dict[str, str], http: httpx.AsyncClient
) -> None:
    host, port = lora_server.url.removeprefix("http://").split(":")
    pod = {"metadata": {"name": "p1"}, "status": {"podIP": host}}

    def declared(*names: str) -> list[Adapter]:
        return [
            Adapter.model_validate({"name": n, "source": {"image": {"path": adapters[p]}}})
            for n, p in (("a", "tiny-lora-a"), ("b", "tiny-lora-b"), ("gone", "tiny-lora-a"))
            if n in names
        ]

    try:
        first = await sync_server(PodClient(http), pod, declared("a", "gone"), 16, port=int(port))
        assert first.errors == {} and set(first.loaded) == {"a", "gone"}
        second = await sync_server(PodClient(http), pod, declared("a", "b"), 16, port=int(port))
        assert second.errors == {}
        assert (await loaded_adapters(http, lora_server.url)) == {
            "a": adapters["tiny-lora-a"],
            "b": adapters["tiny-lora-b"],
        }
    finally:
        for name in ("a", "b", "gone"):
            await unload_adapter(http, lora_server.url, name)


async def test_warmup_loads_the_adapters_and_sends_a_request_through_each(
    lora_server: VllmServer, adapters: dict[str, str], http: httpx.AsyncClient
) -> None:
    for name in ("sql", "missing"):
        await unload_adapter(http, lora_server.url, name)
    options = WarmupOptions(
        endpoint=lora_server.url,
        budget_s=240,
        max_tokens=4,
        max_num_seqs=8,
        adapters=(("sql", adapters["tiny-lora-a"]), ("missing", "/nonexistent/lora")),
    )
    report = await run_warmup(options)
    assert report.succeeded, report.message
    assert report.adapters_loaded == ["sql"]
    assert "No adapter found" in report.adapter_failures["missing"]
    through = [r for r in report.requests if r.phase == "adapter"]
    assert len(through) == 1 and through[0].error is None
    assert "1 of 2 adapters loaded (not: missing)" in report.message
    assert (await loaded_adapters(http, lora_server.url)) == {"sql": adapters["tiny-lora-a"]}
    await unload_adapter(http, lora_server.url, "sql")
