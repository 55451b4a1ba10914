"""A real Kubernetes control plane as local processes on loopback, for the cluster tier.

There is no container engine on the machines this project is built on, so kind and its
relatives cannot run. The upstream components can, as plain processes, the way envtest
suites run them: etcd, kube-apiserver, kube-controller-manager (garbage collection,
Deployments, ReplicaSets, Jobs, HPA, service-account tokens), kube-scheduler, and kwok,
which plays the kubelet for fake nodes (GPU capacity included) and drives pods through
the stages in `kwok-stages.yaml`.

Everything lives in one state folder (`<repo>/.cluster/` unless `VLLM_OP_CLUSTER_DIR`
says otherwise): certificates, etcd's data, kubeconfigs, a log per component and a pid
file per component. Each component runs in its own session, so `down` ends it and every
process it started with one signal to its process group.

    python -m devenv.cluster up | down | status | env
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import fcntl
import ipaddress
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devenv.cluster import node as real_node
from devenv.cluster import nodes as fake_nodes
from devenv.cluster import pki

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
BUILD_SCRIPT = HERE / "build.sh"
STAGES_FILE = HERE / "kwok-stages.yaml"

# The cluster's name, in the kubeconfig as cluster, user and context: the e2e guard
# recognises our own cluster by it.
CLUSTER_NAME = "vllm-operator-e2e"

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


@dataclass(frozen=True)
class Settings:
    """Where the cluster lives and which loopback ports it takes, from the environment.

    The default ports sit in the 2xxxx range, away from the usual ones (2379/2380 of a
    system etcd, 6443 of a real apiserver, 10250-10259 of kubelets and control planes), so
    the local cluster runs beside any of them.
    """

    state_dir: Path
    etcd_port: int
    etcd_peer_port: int
    apiserver_port: int
    controller_manager_port: int
    scheduler_port: int
    kwok_port: int
    # Pod IPs are loopback addresses, so a real local process can listen on a pod's IP.
    pod_cidr: str
    # ClusterIPs: kube-proxy on the real node implements them (node.py).
    service_cidr: str
    nodes_file: Path
    # kwok's Stage objects: how fake nodes and pods move through their lives.
    stages_file: Path
    # Upper bound for each component to become healthy.
    timeout_s: float
    # A real kubelet + containerd node beside the fake ones (node.py); needs root.
    real_node: bool = True

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            state_dir=Path(os.environ.get("VLLM_OP_CLUSTER_DIR") or REPO / ".cluster").resolve(),
            etcd_port=_env_int("VLLM_OP_ETCD_PORT", 23790),
            etcd_peer_port=_env_int("VLLM_OP_ETCD_PEER_PORT", 23800),
            apiserver_port=_env_int("VLLM_OP_APISERVER_PORT", 26443),
            controller_manager_port=_env_int("VLLM_OP_CONTROLLER_MANAGER_PORT", 20257),
            scheduler_port=_env_int("VLLM_OP_SCHEDULER_PORT", 20259),
            kwok_port=_env_int("VLLM_OP_KWOK_PORT", 20248),
            pod_cidr=os.environ.get("VLLM_OP_POD_CIDR", "127.64.0.0/16"),
            service_cidr=os.environ.get("VLLM_OP_SERVICE_CIDR", real_node.SERVICE_CIDR),
            nodes_file=Path(
                os.environ.get("VLLM_OP_CLUSTER_NODES") or fake_nodes.DEFAULT_NODES_FILE
            ),
            stages_file=Path(os.environ.get("VLLM_OP_KWOK_STAGES") or STAGES_FILE),
            timeout_s=float(os.environ.get("VLLM_OP_CLUSTER_TIMEOUT", "120")),
            real_node=real_node.enabled(),
        )

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def pki_dir(self) -> Path:
        return self.state_dir / "pki"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"

    @property
    def info_file(self) -> Path:
        return self.state_dir / "cluster.json"

    @property
    def apiserver_url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"


class ClusterError(RuntimeError):
    """The cluster could not be started, or a command against it failed."""


# --------------------------------------------------------------------------- binaries


def resolve_binaries(*, build: bool = True) -> Path:
    """The folder with every binary: `VLLM_OP_K8S_BIN`, or build.sh's cache (building it
    first if needed). build.sh prints its progress on stderr, which passes through."""
    if not build:
        info = _read_info(Settings.from_env())
        if info and Path(info["bin_dir"]).is_dir():
            return Path(info["bin_dir"])
        raise ClusterError("the binaries' folder is unknown until `up` has run once")
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False
    )
    if proc.returncode != 0:
        raise ClusterError(f"{BUILD_SCRIPT} failed with exit code {proc.returncode}")
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise ClusterError(f"{BUILD_SCRIPT} printed no binaries folder")
    return Path(lines[-1]).resolve()


# --------------------------------------------------------------------------- processes


@dataclass(frozen=True)
class PidFile:
    """A component's pid and the executable it was started from.

    The executable guards against pid reuse: a pid whose /proc cmdline starts with
    something else is not ours any more, and is never signalled.
    """

    pid: int
    exe: str

    @staticmethod
    def path(settings: Settings, name: str) -> Path:
        return settings.run_dir / f"{name}.pid"

    @classmethod
    def read(cls, settings: Settings, name: str) -> PidFile | None:
        try:
            pid, exe = cls.path(settings, name).read_text().splitlines()[:2]
            return cls(int(pid), exe)
        except (OSError, ValueError):
            return None

    def write(self, settings: Settings, name: str) -> None:
        settings.run_dir.mkdir(parents=True, exist_ok=True)
        self.path(settings, name).write_text(f"{self.pid}\n{self.exe}\n")

    def alive(self) -> bool:
        """True while the process runs and is still the one we started."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
            argv0 = Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            return False
        # After the parenthesised command name: state, ppid, process group, session.
        state, _, _, session = stat.rsplit(")", 1)[1].split()[:4]
        if state == "Z":
            _reap(self.pid)
            return False
        # Every component leads its own session. An empty cmdline means the process is
        # still inside execve, before the kernel published its new argv (Popen can return
        # that early, with vfork).
        return int(session) == self.pid and argv0 in (self.exe, "")


def _reap(pid: int) -> None:
    # A component started by this very process (pytest's session fixture) stays a zombie
    # until its parent waits for it.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _start(settings: Settings, name: str, argv: Sequence[str]) -> PidFile:
    settings.logs_dir.mkdir(parents=True, exist_ok=True)
    with (settings.logs_dir / f"{name}.log").open("ab") as log:
        log.write(f"=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=settings.state_dir,
            # Own session and process group: `down` signals the group, so nothing the
            # component spawned outlives it, and a Ctrl-C in the terminal that ran `up`
            # does not reach it.
            start_new_session=True,
        )
    pidfile = PidFile(proc.pid, argv[0])
    pidfile.write(settings, name)
    return pidfile


def _stop(settings: Settings, name: str, *, grace_s: float = 15.0) -> bool:
    """Ends one component's process group; True if something was running."""
    pidfile = PidFile.read(settings, name)
    if pidfile is None:
        return False
    running = pidfile.alive()
    if running:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pidfile.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while pidfile.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if pidfile.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pidfile.pid, signal.SIGKILL)
            while pidfile.alive():
                time.sleep(0.05)
    PidFile.path(settings, name).unlink(missing_ok=True)
    return running


# --------------------------------------------------------------------------- health


def _ssl_context(settings: Settings, *, client: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(settings.pki_dir / "ca.crt"))
    if client:
        ctx.load_cert_chain(settings.pki_dir / f"{client}.crt", settings.pki_dir / f"{client}.key")
    return ctx


def _http_ok(url: str, ctx: ssl.SSLContext | None = None) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=3) as resp:
            body = resp.read().decode(errors="replace")
            return resp.status == 200, body.strip()
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}: {exc.read().decode(errors='replace').strip()[:500]}"
    except (OSError, ssl.SSLError) as exc:
        return False, str(exc)


def health(settings: Settings, name: str) -> tuple[bool, str]:
    """Asks one component whether it is healthy (ready, for the apiserver)."""
    if name == "etcd":
        ok, body = _http_ok(f"http://127.0.0.1:{settings.etcd_port}/health")
        return ok and '"health":"true"' in body.replace(" ", ""), body
    if name == "kube-apiserver":
        return _http_ok(f"{settings.apiserver_url}/readyz", _ssl_context(settings, client="admin"))
    if name == "kube-controller-manager":
        return _http_ok(
            f"https://127.0.0.1:{settings.controller_manager_port}/healthz",
            _ssl_context(settings, client=None),
        )
    if name == "kube-scheduler":
        return _http_ok(
            f"https://127.0.0.1:{settings.scheduler_port}/readyz",
            _ssl_context(settings, client=None),
        )
    if name == "kwok":
        return _http_ok(f"http://127.0.0.1:{settings.kwok_port}/healthz")
    raise ValueError(name)


def _log_tail(settings: Settings, name: str, lines: int = 30) -> str:
    try:
        text = (settings.logs_dir / f"{name}.log").read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _wait_healthy(settings: Settings, name: str, pidfile: PidFile) -> None:
    """Polls the component's health endpoint until it answers OK, failing fast if the
    process died and with the log's tail on timeout."""
    deadline = time.monotonic() + settings.timeout_s
    delay = 0.05
    last = ""
    while True:
        if not pidfile.alive():
            raise ClusterError(
                f"{name} exited while starting; last lines of {settings.logs_dir / name}.log:\n"
                + _log_tail(settings, name)
            )
        ok, last = health(settings, name)
        if ok:
            return
        if time.monotonic() > deadline:
            raise ClusterError(
                f"{name} not healthy after {settings.timeout_s:.0f} s ({last}); last lines of "
                f"its log:\n" + _log_tail(settings, name)
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def wait_until(what: str, check: Callable[[], bool], timeout_s: float = 60) -> None:
    """Polls `check` with back-off until it is true; raises ClusterError on timeout.

    For conditions that `kubectl wait` cannot express (an event with some reason exists,
    say); whatever it can express should use it.
    """
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while not check():
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


# --------------------------------------------------------------------------- configuration


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(settings: Settings, path: Path, client: str) -> None:
    """A kubeconfig for one client identity, certificates embedded so it can be copied."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CLUSTER_NAME,
                "cluster": {
                    "server": settings.apiserver_url,
                    "certificate-authority-data": _b64(settings.pki_dir / "ca.crt"),
                },
            }
        ],
        "users": [
            {
                "name": f"{CLUSTER_NAME}-{client}",
                "user": {
                    "client-certificate-data": _b64(settings.pki_dir / f"{client}.crt"),
                    "client-key-data": _b64(settings.pki_dir / f"{client}.key"),
                },
            }
        ],
        "contexts": [
            {
                "name": CLUSTER_NAME,
                "context": {"cluster": CLUSTER_NAME, "user": f"{CLUSTER_NAME}-{client}"},
            }
        ],
        "current-context": CLUSTER_NAME,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)


def _component_kubeconfig(settings: Settings, client: str) -> Path:
    return settings.state_dir / "kubeconfigs" / f"{client}.kubeconfig"


def _argv(settings: Settings, name: str, bin_dir: Path) -> list[str]:
    p = settings.pki_dir
    exe = str(bin_dir / name)
    if name == "etcd":
        peer = f"http://127.0.0.1:{settings.etcd_peer_port}"
        client = f"http://127.0.0.1:{settings.etcd_port}"
        return [
            exe,
            "--name=default",
            f"--data-dir={settings.state_dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--initial-cluster-state=new",
            # A disposable test cluster: durability is not worth fsync's latency.
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ]
    if name == "kube-apiserver":
        node_flags = real_node.apiserver_flags() if settings.real_node else []
        replaced = {f.split("=")[0] for f in node_flags}
        argv = [
            exe,
            f"--etcd-servers=http://127.0.0.1:{settings.etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={settings.apiserver_port}",
            f"--tls-cert-file={p / 'apiserver.crt'}",
            f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            f"--service-cluster-ip-range={settings.service_cidr}",
            "--authorization-mode=Node,RBAC",
            # On top of the default set (which already has ValidatingAdmissionPolicy,
            # GA since 1.30, and the webhooks); listed so the need is visible here.
            # PodNodeSelector and PodTolerationRestriction let a namespace send all its pods
            # to the real node (node.real_node_namespace).
            "--enable-admission-plugins=NodeRestriction,ValidatingAdmissionPolicy,"
            "PodNodeSelector,PodTolerationRestriction",
            "--allow-privileged=true",
            # The `kubernetes` Service's endpoint would be 127.0.0.1, which endpoint
            # validation rejects (loopback); no pod here talks to it anyway.
            "--endpoint-reconciler-type=none",
            # The aggregation layer (metrics-server, custom metrics for an HPA): the
            # apiserver proxies to extension servers as front-proxy-client, and they trust
            # the user it names in these headers.
            f"--requestheader-client-ca-file={p / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={p / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={p / 'front-proxy-client.key'}",
            "--profiling=false",
        ]
        return [a for a in argv if a.split("=")[0] not in replaced] + node_flags
    if name == "kube-controller-manager":
        kc = str(_component_kubeconfig(settings, "controller-manager"))
        return [
            exe,
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={settings.controller_manager_port}",
            f"--tls-cert-file={p / 'serving.crt'}",
            f"--tls-private-key-file={p / 'serving.key'}",
            f"--service-account-private-key-file={p / 'sa.key'}",
            f"--root-ca-file={p / 'ca.crt'}",
            f"--cluster-signing-cert-file={p / 'ca.crt'}",
            f"--cluster-signing-key-file={p / 'ca.key'}",
            f"--service-cluster-ip-range={settings.service_cidr}",
            "--cluster-name=" + CLUSTER_NAME,
            # Each controller acts as its own service account, under the bootstrap RBAC
            # roles, as in a kubeadm cluster.
            "--use-service-account-credentials=true",
            "--controllers=*",
            # Its default lies under /usr/libexec, which it would create.
            f"--flex-volume-plugin-dir={settings.state_dir / 'flexvolume'}",
            # One instance: leader election would only delay the start.
            "--leader-elect=false",
            # The default client rate (20/s) throttles the start, where each controller
            # fetches its own service-account token, and bursts of test objects.
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--profiling=false",
        ]
    if name == "kube-scheduler":
        kc = str(_component_kubeconfig(settings, "scheduler"))
        return [
            exe,
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={settings.scheduler_port}",
            f"--tls-cert-file={p / 'serving.crt'}",
            f"--tls-private-key-file={p / 'serving.key'}",
            "--leader-elect=false",
            "--profiling=false",
        ]
    if name == "kwok":
        return [
            exe,
            f"--kubeconfig={_component_kubeconfig(settings, 'kwok')}",
            f"--config={settings.stages_file}",
            f"--manage-nodes-with-annotation-selector={fake_nodes.KWOK_NODE_SELECTOR}",
            f"--cidr={settings.pod_cidr}",
            "--node-ip=127.0.0.1",
            # kwok renews each node's Lease, as a kubelet does; otherwise the node
            # lifecycle controller would mark the nodes unreachable and evict their pods.
            "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{settings.kwok_port}",
        ]
    raise ValueError(name)


def _read_info(settings: Settings) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(settings.info_file.read_text())
        return data
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------- kubectl


@dataclass(frozen=True)
class ClusterHandle:
    """What a caller needs to use a running cluster: kubeconfig, binaries, kubectl."""

    kubeconfig: Path
    kubectl_path: Path
    helm_path: Path | None
    bin_dir: Path | None
    # True for the local control plane this module runs; False for a cluster the user
    # pointed KUBECONFIG at (VLLM_OP_E2E_USE_EXISTING=1).
    local: bool
    settings: Settings | None = None

    def env(self) -> dict[str, str]:
        """The environment for a subprocess that should talk to this cluster."""
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        if self.bin_dir is not None:
            env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return env

    def kubectl(
        self,
        *args: str,
        check: bool = True,
        input: str | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """Runs kubectl against this cluster; raises with stderr on failure when `check`."""
        argv = [str(self.kubectl_path), f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(
            argv,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=self.env(),
        )
        if check and proc.returncode != 0:
            raise ClusterError(
                f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr.strip()}"
            )
        return proc

    def kubectl_json(self, *args: str) -> Any:
        """Runs kubectl with `-o json` and returns the parsed document."""
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def apply(self, manifest: Any, *, namespace: str | None = None) -> None:
        """Applies one object or a list of objects given as Python data."""
        docs = manifest if isinstance(manifest, list) else [manifest]
        ns = ["-n", namespace] if namespace else []
        self.kubectl("apply", *ns, "-f", "-", input=yaml.safe_dump_all(docs))


def _handle(settings: Settings, bin_dir: Path) -> ClusterHandle:
    helm = bin_dir / "helm"
    return ClusterHandle(
        kubeconfig=settings.kubeconfig,
        kubectl_path=bin_dir / "kubectl",
        helm_path=helm if helm.exists() else None,
        bin_dir=bin_dir,
        local=True,
        settings=settings,
    )


# --------------------------------------------------------------------------- up / down


def running(settings: Settings, names: Sequence[str] = COMPONENTS) -> dict[str, bool]:
    """Which components have a live process (health not asked)."""
    result = {}
    for name in names:
        pidfile = PidFile.read(settings, name)
        result[name] = pidfile is not None and pidfile.alive()
    return result


def is_healthy(settings: Settings) -> bool:
    """Every component runs and answers its health check (the real node's too)."""
    control_plane = all(running(settings).values()) and all(
        health(settings, n)[0] for n in COMPONENTS
    )
    return control_plane and (not settings.real_node or real_node.is_healthy(settings))


def _say(msg: str) -> None:
    print(f"[cluster] {msg}", file=sys.stderr, flush=True)


# Kept when the state is reset: logs for post-mortems, the lock because others may hold it.
_KEPT = ("logs", "lock", real_node.HOST_RECORD)


def _fresh_state(settings: Settings) -> None:
    """Empties the state folder but for its logs (a new run appends) and its lock."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    for child in settings.state_dir.iterdir():
        if child.name in _KEPT:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


@contextlib.contextmanager
def locked(settings: Settings) -> Iterator[None]:
    """Serialises up, down and session bookkeeping between processes (two test sessions
    started at once must not both start etcd on one port)."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    with (settings.state_dir / "lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def up(settings: Settings | None = None, *, owner: str = "cli") -> ClusterHandle:
    """Starts the cluster, or reuses it if every component is already running and healthy.

    `owner` is recorded for a cluster this call starts: test sessions stop a cluster that a
    test session started, and leave alone one started from the command line.
    """
    settings = settings or Settings.from_env()
    with locked(settings):
        return _up(settings, owner)


def _up(settings: Settings, owner: str) -> ClusterHandle:
    if is_healthy(settings):
        info = _read_info(settings)
        if info is not None:
            _say(f"reusing the running cluster in {settings.state_dir}")
            if owner == "cli" and info.get("owner") != "cli":
                # Started for tests, now wanted from the command line: tests leave it up.
                settings.info_file.write_text(json.dumps(info | {"owner": "cli"}, indent=2))
            return _handle(settings, Path(info["bin_dir"]))
    if any(running(settings).values()) or any(real_node.running(settings).values()):
        _say("a partial cluster is running; stopping it first")
        _down(settings, quiet=False)
    elif (settings.state_dir / real_node.HOST_RECORD).exists():
        real_node.stop(settings, quiet=False)  # a crashed run left the host changed

    bin_dir = resolve_binaries()
    started = time.monotonic()
    _fresh_state(settings)
    node_bin = real_node.prepare(settings) if settings.real_node else None
    service_ip = str(next(ipaddress.ip_network(settings.service_cidr).hosts()))
    pki.generate(settings.pki_dir, service_ip=service_ip)
    write_kubeconfig(settings, settings.kubeconfig, "admin")
    for client in ("controller-manager", "scheduler", "kwok"):
        write_kubeconfig(settings, _component_kubeconfig(settings, client), client)

    try:
        for group in (("etcd",), ("kube-apiserver",), COMPONENTS[2:]):
            # Components of one group start together; each group needs the one before.
            pids = {n: _start(settings, n, _argv(settings, n, bin_dir)) for n in group}
            for n, pidfile in pids.items():
                _wait_healthy(settings, n, pidfile)
                _say(f"{n} healthy after {time.monotonic() - started:.1f} s")
        handle = _handle(settings, bin_dir)
        _register_nodes(settings, handle)
        if node_bin is not None:
            real_node.start(settings, handle, node_bin)
        # Pods are refused until their namespace's `default` ServiceAccount exists, which
        # the controller-manager creates: waiting for it proves that controller works.
        wait_until(
            "the default ServiceAccount",
            lambda: handle.kubectl("get", "serviceaccount", "default", check=False).returncode == 0,
            settings.timeout_s,
        )
    except BaseException:
        _say(f"start failed; logs are in {settings.logs_dir}")
        _down(settings, quiet=True)
        raise
    settings.info_file.write_text(
        json.dumps(
            {"bin_dir": str(bin_dir), "owner": owner, "settings": dataclasses.asdict(settings)},
            default=str,
            indent=2,
        )
    )
    _say(f"cluster up in {time.monotonic() - started:.1f} s; KUBECONFIG={settings.kubeconfig}")
    return handle


def _register_nodes(settings: Settings, handle: ClusterHandle) -> None:
    manifests = fake_nodes.render_nodes(settings.nodes_file)
    handle.apply(manifests)
    handle.kubectl(
        "wait",
        "--for=condition=Ready",
        "node",
        "-l",
        f"{fake_nodes.LABEL_E2E_NODE}=true",
        f"--timeout={int(settings.timeout_s)}s",
        timeout=settings.timeout_s + 10,
    )
    _say(f"{len(manifests)} fake nodes Ready")


def down(settings: Settings | None = None, *, quiet: bool = False) -> None:
    """Stops every component this state folder started and removes all but the logs.

    Idempotent: a stopped or half-started cluster is cleaned up the same way.
    """
    settings = settings or Settings.from_env()
    if not settings.state_dir.is_dir():
        return
    with locked(settings):
        _down(settings, quiet=quiet)


def _down(settings: Settings, *, quiet: bool) -> None:
    real_node.stop(settings, quiet=quiet)
    for name in reversed(COMPONENTS):
        if _stop(settings, name) and not quiet:
            _say(f"stopped {name}")
    _fresh_state(settings)


def join(settings: Settings) -> None:
    """Records that this process uses the cluster (see `leave`)."""
    with locked(settings):
        users = settings.state_dir / "users"
        users.mkdir(exist_ok=True)
        (users / str(os.getpid())).touch()


def leave(settings: Settings, *, stop: bool = True) -> None:
    """Drops this process's use of the cluster, and stops the cluster if a test session
    started it and no other live process still uses it.

    Two test sessions in one working tree share one cluster; whichever ends last stops
    it, so neither pulls it from under the other.
    """
    with locked(settings):
        users = settings.state_dir / "users"
        (users / str(os.getpid())).unlink(missing_ok=True)
        others = [
            u
            for u in (users.iterdir() if users.is_dir() else ())
            if Path(f"/proc/{u.name}").exists()
        ]
        info = _read_info(settings)
        if stop and not others and info is not None and info.get("owner") == "pytest":
            _down(settings, quiet=False)


def status(settings: Settings | None = None) -> bool:
    """Prints each component's state; True when all are running and healthy."""
    settings = settings or Settings.from_env()
    all_ok = True
    for name in COMPONENTS:
        pidfile = PidFile.read(settings, name)
        if pidfile is None or not pidfile.alive():
            state, ok = "stopped", False
        else:
            ok, detail = health(settings, name)
            state = f"pid {pidfile.pid}, " + ("healthy" if ok else f"unhealthy: {detail[:200]}")
        all_ok &= ok
        print(f"{name:<24} {state}")
    if settings.real_node:
        for name, alive in real_node.running(settings).items():
            ok = alive and real_node.health(name)[0]
            all_ok &= ok
            print(
                f"{name:<24} " + ("healthy" if ok else "running, unhealthy" if alive else "stopped")
            )
    print(f"{'state folder':<24} {settings.state_dir}")
    if all_ok:
        print(f"{'kubeconfig':<24} {settings.kubeconfig}")
    return all_ok


def env_lines(settings: Settings | None = None) -> Iterator[str]:
    """Shell lines that point kubectl and helm at the cluster."""
    settings = settings or Settings.from_env()
    info = _read_info(settings)
    if info is None:
        raise ClusterError(f"no cluster in {settings.state_dir}; run `python -m devenv.cluster up`")
    yield f"export KUBECONFIG={settings.kubeconfig}"
    yield f'export PATH={info["bin_dir"]}:"$PATH"'


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devenv.cluster",
        description="Local Kubernetes control plane (etcd, apiserver, controller-manager, "
        "scheduler, kwok) for the cluster tests.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="start (or reuse) the cluster and register the fake nodes")
    sub.add_parser("down", help="stop everything `up` started; idempotent")
    sub.add_parser("status", help="report each component; exit 1 unless all are healthy")
    sub.add_parser("env", help="print export lines for KUBECONFIG and PATH (eval them)")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            up()
            for line in env_lines():
                print(line)
        elif args.command == "down":
            down()
        elif args.command == "status":
            return 0 if status() else 1
        elif args.command == "env":
            for line in env_lines():
                print(line)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
