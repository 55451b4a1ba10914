"""A misbehaving OpenAI-compatible server on a pod's address, for the warmup failure tests.

The pod runner starts it instead of vLLM for pods annotated
``e2e.vllm-operator.dev/runner: fake-fail`` (every generation answers 500) or
``fake-slow`` (every generation waits before its first token, so a warmup takes a while).
It is the warmup tests' own fake server (tests/warmup/fake_server.py), listening where a
pod's container would.
"""

from __future__ import annotations

import argparse
import signal
import threading

from tests.warmup.fake_server import Behaviour, FakeOpenAI

MODES = {
    "fail": Behaviour(generate_status=500),
    "slow": Behaviour(ttft=lambda _n: 0.4, max_model_len=2048),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.cluster.fault_server")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--mode", choices=sorted(MODES), required=True)
    args = parser.parse_args(argv)
    server = FakeOpenAI(behaviour=MODES[args.mode], host=args.host, bind_port=args.port).start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    print(f"fault server ({args.mode}) on {server.url}", flush=True)
    done.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
