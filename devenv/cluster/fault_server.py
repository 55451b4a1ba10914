"""A misbehaving OpenAI-compatible server on a pod's address, for the warmup failure tests
and the measured tuning runs on fake GPU nodes.

It is the tests' one fake server (devenv/fakes/openai_server.py, in a thread), listening where a
pod's container would, in one of the modes below: ``fail`` (every generation answers 500),
``slow`` (every generation waits before its first token, so a warmup takes a while),
``cpu`` (every generation spends 50 ms of CPU before its first token, so its latency
follows how much CPU it gets) or ``ok``. Two ways in:

- ``python -m devenv.cluster.fault_server --host H --port P --mode M``, by hand;
- ``vllm serve ARGS...`` of the fault-server image (devenv/images/fault-server) on the real
  node: ARGS are the operator's rendered vLLM arguments. ``--host`` and ``--port`` say
  where to listen, and ``--shutdown-timeout`` how to stop: on SIGTERM the server drains as
  vLLM does (no new connection; generations in flight finish for up to that many seconds).
  The mode comes from ``$VLLM_FAULT_MODE`` (the InferenceService's ``spec.podTemplate.env``).

Latency per argument (``$VLLM_FAULT_LATENCY``), so that a measured tuning run over fake GPU
nodes sees each trial's arguments change what it measures: a JSON object whose keys match
vLLM arguments and whose values are the latency to serve with, for example::

    {"max-num-seqs=8": {"ttftSeconds": 0.3, "tokenSeconds": 0.005},
     "max-num-seqs=64,enforce-eager": {"ttftSeconds": 0.05, "tokenSeconds": 0.02},
     "default": {"ttftSeconds": 0.1, "tokenSeconds": 0.01,
                 "ttftSecondsPerRequestInFlight": 0.002, "outputTokens": 16}}

A key is ``flag=value`` conditions joined by commas, all of which must hold (``flag`` alone:
a switch that is on; ``no-flag`` or ``flag=false``: off), or ``default``. The server reads
its own arguments as vLLM's parser would for the release the operator tests (the flags of
that release only; anything else, the model's name included, is skipped), takes the first
key in the object's order whose conditions hold (``default`` last, wherever it stands), and
serves every generation with its ``ttftSeconds`` before the first token,
``tokenSeconds`` between tokens, ``ttftSecondsPerRequestInFlight`` more before the first
token for each other generation in flight when it arrives (latency that grows with load)
and ``outputTokens`` tokens (else the mode's 4). These replace the mode's own delays;
without ``$VLLM_FAULT_MODE`` the mode is ``ok``. Each request's delays run on timers of its
own, so N requests in flight each get theirs (they overlap, not queue), unless
``ttftSecondsPerRequestInFlight`` says otherwise. A key naming no flag of vLLM, a value
that is no number or an unknown field fails the start with a message that names it; no
key matching is fine (the mode's delays stay, and the start line says so).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from devenv.fakes.openai_server import Config, Delay, FakeOpenAI
from vllm_operator.releases.arguments import arguments_for, command_values
from vllm_operator.releases.version import TESTED_VERSION

# Every answer is 4 tokens, whatever max_tokens asks: a warmup or a benchmark that runs
# through the fault server spends its time in the mode's misbehaviour, not in tokens.
MODES = {
    "fail": Config(generate_status=500, max_model_len=256, output_tokens=4),
    "slow": Config(ttft=Delay(value=0.4), max_model_len=2048, output_tokens=4),
    "ok": Config(max_model_len=2048, output_tokens=4),
    # 50 ms of CPU before each first token: latency that a noisy neighbour moves.
    "cpu": Config(cpu_seconds=0.05, max_model_len=2048, output_tokens=4),
}
MODE_ENV = "VLLM_FAULT_MODE"
LATENCY_ENV = "VLLM_FAULT_LATENCY"
DEFAULT_RULE = "default"
_FIELDS = {
    "ttftSeconds": "ttft_seconds",
    "tokenSeconds": "token_seconds",
    "ttftSecondsPerRequestInFlight": "ttft_per_in_flight",
    "outputTokens": "output_tokens",
}


class LatencyError(ValueError):
    """``$VLLM_FAULT_LATENCY`` that cannot be served; the message names the key and field."""


@dataclasses.dataclass(frozen=True)
class LatencyRule:
    """One key of ``$VLLM_FAULT_LATENCY``: the arguments it matches, and its latency."""

    key: str
    conditions: Mapping[str, str]  # flag -> value, as command_values reads them; {}: default
    ttft_seconds: float = 0.0
    token_seconds: float = 0.0
    ttft_per_in_flight: float = 0.0
    output_tokens: int | None = None

    def holds(self, values: Mapping[str, str]) -> bool:
        return all(_same(values.get(flag), wanted) for flag, wanted in self.conditions.items())

    def configure(self, base: Config) -> Config:
        """The mode's config with this rule's latency instead of the mode's delays."""
        return dataclasses.replace(
            base,
            ttft=Delay(value=self.ttft_seconds),
            itl=Delay(value=self.token_seconds),
            ttft_per_in_flight=self.ttft_per_in_flight,
            output_tokens=self.output_tokens or base.output_tokens,
        )

    def describe(self) -> str:
        load = (
            f" + {self.ttft_per_in_flight:g} s per request in flight"
            if self.ttft_per_in_flight
            else ""
        )
        return (
            f"latency rule {self.key!r}: first token after {self.ttft_seconds:g} s{load}, "
            f"{self.token_seconds:g} s per token"
        )


def _same(have: str | None, wanted: str) -> bool:
    if have is None:
        return False
    if have == wanted:
        return True
    try:
        return math.isclose(float(have), float(wanted))
    except ValueError:
        return False


def _conditions(key: str) -> dict[str, str]:
    table = arguments_for(TESTED_VERSION).arguments
    conditions: dict[str, str] = {}
    for part in key.split(","):
        term = part.strip()
        flag = term.partition("=")[0].strip().lstrip("-")
        if not flag:
            raise LatencyError(f"${LATENCY_ENV}: key {key!r}: an empty condition")
        read = command_values([f"--{term.lstrip('-')}"])
        if not read:
            near = table.nearest(flag) if table is not None else None
            hint = f" (nearest: {near})" if near else ""
            raise LatencyError(
                f"${LATENCY_ENV}: key {key!r}: {flag} is not an argument of vLLM "
                f"{TESTED_VERSION}{hint}"
            )
        ((name, value),) = read.items()
        if value == "":
            raise LatencyError(f"${LATENCY_ENV}: key {key!r}: {flag} takes a value ({flag}=...)")
        conditions[name] = value
    return conditions


def _number(key: str, field: str, value: Any, *, integer: bool = False) -> float:
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok or value < (1 if integer else 0):
        kind = "a whole number >= 1" if integer else "a number of seconds >= 0"
        raise LatencyError(f"${LATENCY_ENV}: key {key!r}: {field} must be {kind}, not {value!r}")
    return float(value)


def parse_latency(text: str) -> list[LatencyRule]:
    """The rules of ``$VLLM_FAULT_LATENCY``, in the order they are tried (``default``
    last). Raises :class:`LatencyError` naming the key and field at fault."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LatencyError(f"${LATENCY_ENV} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise LatencyError(f"${LATENCY_ENV} must be a JSON object of rules, not {doc!r}")
    rules: list[LatencyRule] = []
    default: LatencyRule | None = None
    for key, body in doc.items():
        if not isinstance(body, dict):
            raise LatencyError(f"${LATENCY_ENV}: key {key!r}: expected an object, not {body!r}")
        unknown = sorted(set(body) - set(_FIELDS))
        if unknown:
            raise LatencyError(
                f"${LATENCY_ENV}: key {key!r}: unknown field {unknown[0]} "
                f"(fields: {', '.join(_FIELDS)})"
            )
        fields: dict[str, Any] = {}
        for wire, name in _FIELDS.items():
            if body.get(wire) is None:
                continue
            integer = wire == "outputTokens"
            number = _number(key, wire, body[wire], integer=integer)
            fields[name] = int(number) if integer else number
        if key.strip() == DEFAULT_RULE:
            default = LatencyRule(DEFAULT_RULE, {}, **fields)
        else:
            rules.append(LatencyRule(key, _conditions(key), **fields))
    return [*rules, *([default] if default else [])]


def choose_rule(rules: Sequence[LatencyRule], argv: Sequence[str]) -> LatencyRule | None:
    """The first rule whose conditions the vLLM arguments ``argv`` meet."""
    values = command_values(argv)
    return next((rule for rule in rules if rule.holds(values)), None)


def _serve_args(argv: list[str]) -> argparse.Namespace:
    """``serve`` and vLLM's arguments: the address from them, the mode and the latency
    rules from the environment."""
    parser = argparse.ArgumentParser(prog="vllm serve (fault server)")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--shutdown-timeout", type=float, default=0.0)
    args, _ignored = parser.parse_known_args(argv)
    latency = os.environ.get(LATENCY_ENV, "")
    mode = os.environ.get(MODE_ENV, "") or ("ok" if latency else "")
    if mode not in MODES:
        parser.error(f"${MODE_ENV} must be one of {', '.join(sorted(MODES))}, not {mode!r}")
    args.mode = mode
    args.rule = None
    if latency:
        try:
            args.rule = choose_rule(parse_latency(latency), argv)
        except LatencyError as exc:
            parser.error(str(exc))
    return args


def config_for(args: argparse.Namespace) -> Config:
    """The mode's behaviour, with the chosen latency rule's delays when there is one."""
    base = MODES[args.mode]
    rule: LatencyRule | None = getattr(args, "rule", None)
    return rule.configure(base) if rule is not None else dataclasses.replace(base)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        args = _serve_args(argv[1:])
    else:
        parser = argparse.ArgumentParser(prog="python -m devenv.cluster.fault_server")
        parser.add_argument("--host", required=True)
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--mode", choices=sorted(MODES), required=True)
        parser.add_argument("--shutdown-timeout", type=float, default=0.0)
        args = parser.parse_args(argv)
    server = FakeOpenAI(config_for(args), host=args.host, bind_port=args.port).start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    rule: LatencyRule | None = getattr(args, "rule", None)
    latency = ""
    if os.environ.get(LATENCY_ENV) and argv[:1] == ["serve"]:
        latency = f", {rule.describe()}" if rule else ", no latency rule matched its arguments"
    print(f"fault server ({args.mode}{latency}) on {server.url}", flush=True)
    done.wait()
    print(f"fault server: stopping, mode=drain timeout={args.shutdown_timeout:g}s", flush=True)
    server.stop(drain_s=args.shutdown_timeout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
