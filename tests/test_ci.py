"""devenv.ci: a missing prerequisite skips on a laptop and fails under CI, naming the line."""

from __future__ import annotations

import pytest

from devenv import ci


@pytest.mark.parametrize(
    ("value", "expected"),
    [("", False), ("0", False), ("false", False), ("FALSE", False), ("true", True), ("1", True)],
)
def test_in_ci(monkeypatch: pytest.MonkeyPatch, value: str, expected: bool) -> None:
    monkeypatch.setenv("CI", value)
    assert ci.in_ci() is expected


def test_unset_is_not_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    assert ci.in_ci() is False


def test_outside_ci_it_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no real node"):
        ci.skip_or_fail("no real node")


def test_under_ci_it_fails_naming_the_callers_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception) as failed:
        ci.skip_or_fail("no real node")  # the line the message must name
    message = str(failed.value)
    assert message.startswith("no real node [tests/test_ci.py:")
    line = int(message.split("tests/test_ci.py:")[1].split("]")[0])
    assert line == test_under_ci_it_fails_naming_the_callers_line.__code__.co_firstlineno + 3
    assert "CI is set" in message
