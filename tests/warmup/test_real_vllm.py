"""``vllm-operator warmup`` against the real CPU vLLM serving the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devenv.vllm_server import OneServer, VllmServer
from vllm_operator.warmup.cli import EXIT_FAILED, EXIT_OK, main

pytestmark = pytest.mark.vllm


@pytest.fixture
def server(
    vllm_servers: OneServer, vllm_python: Path, tiny_models: dict[str, Path], vllm_log_dir: Path
) -> VllmServer:
    return vllm_servers.get(tiny_models["tiny-llama"], python=vllm_python, log_dir=vllm_log_dir)


def test_warmup_of_a_fresh_server_reports_cold_ttft_above_warm(
    vllm_servers: OneServer,
    vllm_python: Path,
    tiny_models: dict[str, Path],
    vllm_log_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    record_property: object,
) -> None:
    # A server that has served nothing yet, or the first request would not be cold; with
    # vLLM's default compile mode (not the tests' fast start), whose cold cost is the point.
    server = vllm_servers.get(
        tiny_models["tiny-llama"],
        python=vllm_python,
        fresh=True,
        fast_start=False,
        log_dir=vllm_log_dir,
    )
    log = tmp_path / "termination-log"
    # Warm TTFT is the median of the last 5 probes; cold TTFT is one request by definition.
    # On the CPU the cold penalty is small (about 5 to 60 ms measured), so this comparison
    # needs a machine that is not running other vLLM servers at the same time.
    code = main(
        ["--endpoint", server.url, "--budget", "240", "--settle-window", "5",
         "--termination-log", str(log)]
    )  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    with capsys.disabled():
        print(
            f"\nreal vLLM warmup: cold TTFT {report['cold_ttft_s']:.4f}s, "
            f"warm TTFT {report['warm_ttft_s']:.4f}s, {report['requests_sent']} requests "
            f"in {report['duration_s']:.1f}s (server healthy after {server.startup_s:.1f}s)"
        )
    assert code == EXIT_OK, report["message"]
    assert report["outcome"] == "Succeeded"
    assert report["model"] == server.model_name
    assert report["requests_failed"] == 0
    assert report["settled"]
    assert report["cold_ttft_s"] > report["warm_ttft_s"] > 0
    assert json.loads(log.read_text())["warm_ttft_s"] == report["warm_ttft_s"]


def test_unknown_model_name_is_a_server_error(
    server: VllmServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--endpoint", server.url, "--model", "no-such-model", "--termination-log", ""])
    report = json.loads(capsys.readouterr().out)
    assert code == EXIT_FAILED
    assert report["outcome"] == "ServerErrors"
    assert "HTTP 404" in report["message"] and "no-such-model" in report["message"]


def test_warm_ttft_above_the_limit_is_too_slow(
    server: VllmServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["--endpoint", server.url, "--max-ttft", "0.0001", "--budget", "120",
         "--termination-log", ""]
    )  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert code == EXIT_FAILED
    assert report["outcome"] == "TooSlow"
    assert "above the limit" in report["message"]
