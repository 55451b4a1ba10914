"""``make dev``: the whole thing on this machine, in one command.

Starts (or reuses) the local control plane, installs the CRDs, starts the operator as a
background process, applies the sample InferenceService and waits until it is Ready,
then shows it. ``python -m e2e.dev down`` stops the operator; ``make cluster-down`` the
rest.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from e2e.cluster import pod_runner
from e2e.cluster.cluster import ClusterHandle, Settings, up

REPO = Path(__file__).parents[1]
SAMPLE = REPO / "examples" / "dev-sample.yaml"
NAMESPACE = "dev"


def _pid_file(settings: Settings) -> Path:
    return settings.state_dir / "run" / "operator.pid"


def _running(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def start_operator(cluster: ClusterHandle, settings: Settings) -> int:
    pid_file = _pid_file(settings)
    pid = _running(pid_file)
    if pid is not None:
        print(f"[dev] the operator is already running (pid {pid})")
        return pid
    log_path = settings.state_dir / "logs" / "operator.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    env = cluster.env()
    env.setdefault("VLLM_OPERATOR_KUBECONFIG", str(cluster.kubeconfig))
    env.setdefault("VLLM_OPERATOR_RESYNC_SECONDS", "30")
    env.setdefault("VLLM_OPERATOR_METRICS_PORT", "28080")
    env.setdefault("VLLM_OPERATOR_HEALTH_PORT", "28081")
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_operator.cli", "run"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
            start_new_session=True,
        )
    pid_file.write_text(str(proc.pid))
    print(f"[dev] started the operator (pid {proc.pid}, log {log_path})")
    return proc.pid


def stop_operator(settings: Settings) -> None:
    pid_file = _pid_file(settings)
    pid = _running(pid_file)
    if pid is None:
        print("[dev] the operator is not running")
        return
    os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _running(pid_file) is not None:
        time.sleep(0.2)
    pid_file.unlink(missing_ok=True)
    print(f"[dev] stopped the operator (pid {pid})")


def dev_up(timeout: int) -> int:
    settings = Settings.from_env()
    started = time.monotonic()
    cluster = up(settings)
    print(f"[dev] control plane ready; export KUBECONFIG={cluster.kubeconfig}")
    crds = str(REPO / "crds")
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", crds)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", crds)
    start_operator(cluster, settings)
    runner = pod_runner.start(settings.state_dir, cluster.kubeconfig)
    print(f"[dev] the pod runner puts a real CPU vLLM behind marked pods (pid {runner})")
    if cluster.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0:
        cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", str(SAMPLE))
    print(f"[dev] applied {SAMPLE.relative_to(REPO)}; waiting for Ready")
    proc = cluster.kubectl(
        "wait",
        "--for=condition=Ready",
        "isvc/tiny-chat",
        "-n",
        NAMESPACE,
        f"--timeout={timeout}s",
        timeout=timeout + 10,
        check=False,
    )
    print(cluster.kubectl("get", "isvc,deploy,pods", "-n", NAMESPACE, "-o", "wide").stdout)
    if proc.returncode != 0:
        print(cluster.kubectl("describe", "isvc", "tiny-chat", "-n", NAMESPACE).stdout)
        print("[dev] the sample did not become Ready", file=sys.stderr)
        return 1
    status = json.loads(
        cluster.kubectl("get", "isvc", "tiny-chat", "-n", NAMESPACE, "-o", "json").stdout
    )["status"]
    print("[dev] effective vLLM arguments:")
    for arg in status["tuning"]["arguments"]:
        print(f"  --{arg['name']}={arg['value']}  ({arg['source']}: {arg['reason']})")
    print(
        f"[dev] tiny-chat is Ready after {time.monotonic() - started:.1f} s; in-cluster "
        f"endpoint {status['endpoint']}"
    )
    warm = status.get("warmup") or {}
    print(
        f"[dev] warmup: cold TTFT {warm.get('lastColdTtftMilliseconds')} ms, warm TTFT "
        f"{warm.get('lastWarmTtftMilliseconds')} ms"
    )
    return chat(cluster)


def chat(cluster: ClusterHandle) -> int:
    """One real chat completion from the sample, sent to its Ready pod's address: the
    local cluster has no Service proxy (kube-proxy needs a real node, and the
    EndpointSlice controller refuses endpoints on loopback addresses)."""
    import httpx

    pods = json.loads(
        cluster.kubectl(
            "get",
            "pods",
            "-n",
            NAMESPACE,
            "-l",
            "inference.vllm-operator.dev/inference-service=tiny-chat",
            "-o",
            "json",
        ).stdout
    )["items"]
    ready = [
        p
        for p in pods
        if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"])
    ]
    if not ready:
        print("[dev] no Ready pod to ask", file=sys.stderr)
        return 1
    url = f"http://{ready[0]['status']['podIP']}:8000/v1/chat/completions"
    body = {
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": "Say hello to the operator."}],
        "max_tokens": 24,
    }
    response = httpx.post(url, json=body, timeout=60)
    response.raise_for_status()
    answer = response.json()
    print(f"[dev] POST {url}")
    print(
        f"[dev] answer ({answer['usage']['completion_tokens']} tokens; the weights are "
        f"random): {answer['choices'][0]['message']['content']!r}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.dev", description=__doc__)
    parser.add_argument("action", choices=["up", "down"], nargs="?", default="up")
    parser.add_argument("--timeout", type=int, default=300, help="seconds to wait for Ready")
    args = parser.parse_args(argv)
    if args.action == "down":
        settings = Settings.from_env()
        stop_operator(settings)
        pod_runner.stop(settings.state_dir)
        return 0
    return dev_up(args.timeout)


if __name__ == "__main__":
    sys.exit(main())
