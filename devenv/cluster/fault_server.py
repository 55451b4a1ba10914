"""A misbehaving OpenAI-compatible server on a pod's address, for the warmup failure tests.

It is the tests' one fake server (devenv/fakes/openai_server.py, in a thread), listening where a
pod's container would, in one of the modes below: ``fail`` (every generation answers 500),
``slow`` (every generation waits before its first token, so a warmup takes a while),
``cpu`` (every generation spends 50 ms of CPU before its first token, so its latency
follows how much CPU it gets) or ``ok``. Two ways in:

- ``python -m devenv.cluster.fault_server --host H --port P --mode M``, by hand;
- ``vllm serve ARGS...`` of the fault-server image (devenv/images/fault-server) on the real
  node: ARGS are the operator's rendered vLLM arguments, of which only ``--host`` and
  ``--port`` are read, and ``--shutdown-timeout``: on SIGTERM the server drains as vLLM
  does (no new connection; generations in flight finish for up to that many seconds); the
  mode comes from ``$VLLM_FAULT_MODE`` (the InferenceService's ``spec.podTemplate.env``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from devenv.fakes.openai_server import Config, Delay, FakeOpenAI

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


def _serve_args(argv: list[str]) -> argparse.Namespace:
    """``serve`` and vLLM's arguments: the address from them, the mode from the environment."""
    parser = argparse.ArgumentParser(prog="vllm serve (fault server)")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--shutdown-timeout", type=float, default=0.0)
    args, _ignored = parser.parse_known_args(argv)
    mode = os.environ.get(MODE_ENV, "")
    if mode not in MODES:
        parser.error(f"${MODE_ENV} must be one of {', '.join(sorted(MODES))}, not {mode!r}")
    args.mode = mode
    return args


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
    server = FakeOpenAI(MODES[args.mode], host=args.host, bind_port=args.port).start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    print(f"fault server ({args.mode}) on {server.url}", flush=True)
    done.wait()
    print(f"fault server: stopping, mode=drain timeout={args.shutdown_timeout:g}s", flush=True)
    server.stop(drain_s=args.shutdown_timeout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
