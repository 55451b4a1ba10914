"""The fault server drains on stop as vLLM does with ``--shutdown-timeout``: a generation in
flight when the stop comes is answered with a drain, and cut without one. It serves the
latency that ``$VLLM_FAULT_LATENCY`` sets for the vLLM arguments it is started with, per
request in flight; bad rules fail its start. Timings are checked as bounds only (a rule's
delay is the least a request waits), never to the millisecond."""

from __future__ import annotations

import json
import threading
import time
from argparse import Namespace
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from devenv.cluster.fault_server import MODES, _serve_args, config_for
from devenv.fakes.openai_server import Config, Delay, FakeOpenAI


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


# --------------------------------------------------------------------------- latency per argument

RULES = {
    "max-num-seqs=8": {"ttftSeconds": 0.3, "tokenSeconds": 0.01},
    "max-num-seqs=64,enforce-eager": {"ttftSeconds": 0.0, "tokenSeconds": 0.05},
    "no-enable-prefix-caching": {"ttftSeconds": 0.02, "outputTokens": 3},
    "default": {"ttftSeconds": 0.0, "tokenSeconds": 0.0},
}


def _args(monkeypatch: pytest.MonkeyPatch, argv: list[str], rules: object = RULES) -> Namespace:
    monkeypatch.delenv("VLLM_FAULT_MODE", raising=False)
    monkeypatch.setenv("VLLM_FAULT_LATENCY", json.dumps(rules))
    return _serve_args(argv)


@pytest.mark.parametrize(
    ("argv", "rule"),
    [
        pytest.param(
            ["m", "--max-num-seqs", "8", "--port", "8000"],
            "max-num-seqs=8",
            id="a value as its own word",
        ),
        pytest.param(
            ["m", "--max-num-seqs=8"], "max-num-seqs=8", id="a value after an equals sign"
        ),
        pytest.param(
            ["m", "--enforce-eager", "--max-num-seqs", "64"],
            "max-num-seqs=64,enforce-eager",
            id="every condition of a key, in any order",
        ),
        pytest.param(
            ["m", "--max-num-seqs", "64"], "default", id="one condition of two is not enough"
        ),
        pytest.param(
            ["m", "--no-enable-prefix-caching", "--max-num-seqs", "8"],
            "max-num-seqs=8",
            id="the first key that holds wins",
        ),
        pytest.param(
            ["m", "--no-enable-prefix-caching"],
            "no-enable-prefix-caching",
            id="a switch turned off",
        ),
        pytest.param(
            ["m", "--unknown-flag", "8", "--max-num-seqs", "16"],
            "default",
            id="unknown flags are skipped",
        ),
    ],
)
def test_the_first_rule_whose_arguments_hold_is_served(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], rule: str
) -> None:
    args = _args(monkeypatch, argv)
    assert args.mode == "ok"  # no mode given: latency alone
    assert args.rule is not None and args.rule.key == rule


def test_default_is_tried_last_wherever_it_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    rules = {"default": {"ttftSeconds": 1}, "max-num-seqs=8": {"ttftSeconds": 2}}
    assert _args(monkeypatch, ["--max-num-seqs", "8"], rules).rule.ttft_seconds == 2
    assert _args(monkeypatch, ["--max-num-seqs", "9"], rules).rule.ttft_seconds == 1


def test_no_matching_rule_keeps_the_modes_delays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_FAULT_MODE", "slow")
    monkeypatch.setenv("VLLM_FAULT_LATENCY", json.dumps({"max-num-seqs=8": {"ttftSeconds": 1}}))
    args = _serve_args(["--max-num-seqs", "4"])
    assert args.rule is None
    assert config_for(args).ttft == MODES["slow"].ttft


def test_a_rule_replaces_the_modes_delays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_FAULT_MODE", "slow")
    monkeypatch.setenv("VLLM_FAULT_LATENCY", json.dumps(RULES))
    config = config_for(_serve_args(["--no-enable-prefix-caching"]))
    assert config.ttft == Delay(value=0.02) and config.output_tokens == 3
    assert MODES["slow"].ttft == Delay(value=0.4)  # the mode itself is left alone


@pytest.mark.parametrize(
    ("rules", "words"),
    [
        pytest.param("{not json", ["is not JSON"], id="not JSON"),
        pytest.param([1], ["a JSON object of rules"], id="not an object"),
        pytest.param(
            {"max-num-seq=8": {}},
            ["'max-num-seq=8'", "max-num-seq is not an argument", "nearest: max-num-seqs"],
            id="a flag vLLM does not have",
        ),
        pytest.param(
            {"max-num-seqs": {}},
            ["max-num-seqs takes a value"],
            id="a value flag without its value",
        ),
        pytest.param(
            {"default": {"ttftSeconds": "fast"}},
            ["'default'", "ttftSeconds must be a number"],
            id="a delay that is no number",
        ),
        pytest.param(
            {"default": {"ttftSeconds": -1}},
            ["ttftSeconds must be a number of seconds >= 0"],
            id="a negative delay",
        ),
        pytest.param(
            {"default": {"outputTokens": 0.5}},
            ["outputTokens must be a whole number"],
            id="a fraction of a token",
        ),
        pytest.param({"default": {"ttft": 1}}, ["unknown field ttft"], id="an unknown field"),
        pytest.param(
            {"enforce-eager": 0.3},
            ["'enforce-eager'", "expected an object"],
            id="a rule that is no object",
        ),
    ],
)
def test_bad_latency_rules_fail_the_start_naming_the_fault(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    rules: object,
    words: list[str],
) -> None:
    monkeypatch.delenv("VLLM_FAULT_MODE", raising=False)
    monkeypatch.setenv("VLLM_FAULT_LATENCY", rules if isinstance(rules, str) else json.dumps(rules))
    with pytest.raises(SystemExit) as exited:
        _serve_args(["--port", "8000"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "$VLLM_FAULT_LATENCY" in err
    for word in words:
        assert word in err


def _first_token(url: str, client: httpx.Client | None = None) -> tuple[float, float]:
    """(seconds from sending a streamed completion to its first token, the instant of
    that token)."""
    body = {"model": "fake-model", "prompt": "hi", "max_tokens": 2, "stream": True}
    client = client or httpx.Client(timeout=10)
    start = time.monotonic()
    with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                now = time.monotonic()
                return now - start, now
    raise AssertionError("no token came")


def _first_token_seconds(url: str) -> float:
    return _first_token(url)[0]


def _at_once(url: str, n: int) -> list[tuple[float, float]]:
    """``n`` streamed completions sent together (clients made first: making one takes
    longer than the delays measured here)."""
    clients = [httpx.Client(timeout=10) for _ in range(n)]
    try:
        with ThreadPoolExecutor(max_workers=n) as pool:
            return list(pool.map(lambda c: _first_token(url, c), clients))
    finally:
        for client in clients:
            client.close()


def test_the_served_first_token_waits_as_the_matched_rule_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slow = config_for(_args(monkeypatch, ["m", "--max-num-seqs", "8"]))
    fast = config_for(_args(monkeypatch, ["m", "--max-num-seqs", "16"]))
    timings = {}
    for name, config in (("slow", slow), ("fast", fast)):
        server = FakeOpenAI(config).start()
        try:
            timings[name] = _first_token_seconds(server.url)
        finally:
            server.stop()
    assert timings["slow"] >= 0.3
    assert timings["fast"] < timings["slow"]


def test_requests_in_flight_each_get_their_own_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight requests at once to a 0.3 s rule: each waits at least 0.3 s for its first
    token, and the eight first tokens come together, not one delay apart (served one
    after the other they would span 2.1 s)."""
    server = FakeOpenAI(config_for(_args(monkeypatch, ["--max-num-seqs", "8"]))).start()
    try:
        timings = _at_once(server.url, 8)
    finally:
        server.stop()
    assert min(waited for waited, _ in timings) >= 0.3
    instants = [at for _, at in timings]
    assert max(instants) - min(instants) < 0.3


def test_latency_can_grow_with_the_requests_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.05 s plus 0.1 s per other request in flight: alone a request waits about 0.05 s;
    of six sent together, the ones that found others in flight wait longer."""
    rules = {"default": {"ttftSeconds": 0.05, "ttftSecondsPerRequestInFlight": 0.1}}
    server = FakeOpenAI(config_for(_args(monkeypatch, [], rules))).start()
    try:
        alone = _first_token_seconds(server.url)
        loaded = [waited for waited, _ in _at_once(server.url, 6)]
    finally:
        server.stop()
    assert alone >= 0.05
    assert max(loaded) >= 0.05 + 0.1
    assert max(loaded) > alone
