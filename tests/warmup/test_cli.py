"""``vllm-operator warmup``: exit code, JSON on stdout, the termination message."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from devenv.fakes.openai_server import FakeOpenAI
from vllm_operator.warmup.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, add_parser, main

FAST = ["--max-concurrency", "2", "--max-tokens", "2", "--max-model-len", "128"]


def test_success_prints_the_report_and_writes_the_termination_message(
    fake: FakeOpenAI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "termination-log"
    code = main(["--endpoint", fake.url, "--budget", "20", "--termination-log", str(log), *FAST])
    out = json.loads(capsys.readouterr().out)
    assert code == EXIT_OK
    assert out["outcome"] == "Succeeded"
    assert out["cold_ttft_s"] is not None and out["warm_ttft_s"] is not None
    assert out["requests_sent"] > 0 and out["requests_failed"] == 0
    assert "requests" not in out
    assert json.loads(log.read_text())["outcome"] == "Succeeded"


def test_full_output_lists_every_request(
    fake: FakeOpenAI, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--endpoint", fake.url, "--termination-log", "", "--full", *FAST])
    out = json.loads(capsys.readouterr().out)
    assert code == EXIT_OK
    assert len(out["requests"]) == out["requests_sent"]


def test_failure_exits_non_zero_with_the_reason(
    fake: FakeOpenAI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.behaviour.generate_status = 500
    log = tmp_path / "no-such-dir" / "termination-log"  # unwritable: must not matter
    code = main(["--endpoint", fake.url, "--termination-log", str(log), *FAST])
    captured = capsys.readouterr()
    assert code == EXIT_FAILED
    assert json.loads(captured.out)["outcome"] == "ServerErrors"
    assert "Warmup failed (ServerErrors)" in captured.err
    assert "HTTP 500" in captured.err


def test_invalid_arguments_exit_with_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--endpoint", "http://127.0.0.1:1", "--budget", "-1"]) == EXIT_USAGE
    assert "invalid arguments" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--endpoint", "http://x", "--cudagraph-capture-sizes", "1,a"])
    assert exc.value.code == EXIT_USAGE


def test_subcommand_registers_on_a_parent_cli() -> None:
    parser = argparse.ArgumentParser(prog="vllm-operator")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        ["warmup", "--endpoint", "http://pod:8000", "--api", "chat", "--max-ttft", "2"]
    )
    assert args.func.__name__ == "run_from_args"
    assert args.apis == ("chat",) and args.max_ttft_s == 2.0
