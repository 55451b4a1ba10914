"""The warmup report: its compact form fits a termination message; writing it never fails."""

from __future__ import annotations

import json
from pathlib import Path

from vllm_operator.warmup.report import (
    TERMINATION_MESSAGE_LIMIT,
    Api,
    Failure,
    Outcome,
    RequestResult,
    WarmupReport,
    write_termination_message,
)


def report(**overrides: object) -> WarmupReport:
    fields: dict[str, object] = {
        "outcome": Outcome.SUCCEEDED,
        "message": "Warmed up",
        "endpoint": "http://127.0.0.1:8000",
        "duration_s": 12.5,
        "budget_s": 600.0,
        "cold_ttft_s": 1.2,
        "warm_ttft_s": 0.05,
    }
    return WarmupReport.model_validate({**fields, **overrides})


def test_termination_message_is_the_summary_without_the_requests() -> None:
    result = RequestResult(
        phase="probe", api=Api.CHAT, stream=True, concurrency=1, target_prompt_tokens=16,
        latency_s=0.1, ttft_s=0.05,
    )  # fmt: skip
    data = json.loads(report(requests=[result] * 500).termination_message())
    assert data["outcome"] == "Succeeded"
    assert data["cold_ttft_s"] == 1.2 and data["warm_ttft_s"] == 0.05
    assert "requests" not in data


def test_termination_message_always_fits_the_kubernetes_limit() -> None:
    failures = [Failure(phase="sweep", status_code=500, error="x" * 300) for _ in range(50)]
    big = report(outcome=Outcome.SERVER_ERRORS, message="m" * 5000, failures=failures)
    text = big.termination_message()
    assert len(text.encode()) <= TERMINATION_MESSAGE_LIMIT
    assert json.loads(text)["outcome"] == "ServerErrors"


def test_termination_message_is_written_where_asked(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    assert write_termination_message(report(), path)
    assert json.loads(path.read_text())["outcome"] == "Succeeded"


def test_an_unwritable_termination_path_does_not_fail_the_warmup(tmp_path: Path) -> None:
    assert not write_termination_message(report(), tmp_path / "missing" / "termination-log")
    assert not write_termination_message(report(), tmp_path)  # a directory
    assert not write_termination_message(report(), None)
