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

This module starts, stops and reports on the cluster (`up`, `down`, `join`/`leave`,
`status`) and hands callers a `ClusterHandle`. The rest is in its neighbours: settings.py
(where the cluster lives, its ports, the binaries), components.py (each component's
command line and health check), processes.py (pid files, start, stop, waits),
kubeconfig.py and pki.py (credentials), node.py (the real node), nodes.py (the fake ones).

    python -m devenv.cluster up | down | status | env
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devenv.cluster import components, pki, processes
from devenv.cluster import node as real_node
from devenv.cluster import nodes as fake_nodes
from devenv.cluster.components import COMPONENTS
from devenv.cluster.kubeconfig import component_kubeconfig, write_kubeconfig
from devenv.cluster.processes import ClusterError, PidFile, say, wait_until
from devenv.cluster.settings import Settings, read_info, resolve_binaries

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


def is_healthy(settings: Settings) -> bool:
    """Every component runs and answers its health check (the real node's too)."""
    control_plane = all(processes.running(settings, COMPONENTS).values()) and all(
        components.health(settings, n)[0] for n in COMPONENTS
    )
    return control_plane and (not settings.real_node or real_node.is_healthy(settings))


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
        info = read_info(settings)
        if info is not None:
            say(f"reusing the running cluster in {settings.state_dir}")
            if owner == "cli" and info.get("owner") != "cli":
                # Started for tests, now wanted from the command line: tests leave it up.
                settings.info_file.write_text(json.dumps(info | {"owner": "cli"}, indent=2))
            return _handle(settings, Path(info["bin_dir"]))
    if any(processes.running(settings, COMPONENTS).values()) or any(
        real_node.running(settings).values()
    ):
        say("a partial cluster is running; stopping it first")
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
        write_kubeconfig(settings, component_kubeconfig(settings, client), client)

    pod_network(settings.pod_cidr)  # a range it may not take: refused before anything starts
    try:
        _pod_route(settings, "replace")
        for group in (("etcd",), ("kube-apiserver",), COMPONENTS[2:]):
            # Components of one group start together; each group needs the one before.
            pids = {
                n: processes.start(settings, n, components.argv(settings, n, bin_dir))
                for n in group
            }
            for n, pidfile in pids.items():
                components.wait_healthy(settings, n, pidfile)
                say(f"{n} healthy after {time.monotonic() - started:.1f} s")
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
        say(f"start failed; logs are in {settings.logs_dir}")
        _down(settings, quiet=True)
        raise
    settings.info_file.write_text(
        json.dumps(
            {"bin_dir": str(bin_dir), "owner": owner, "settings": dataclasses.asdict(settings)},
            default=str,
            indent=2,
        )
    )
    say(f"cluster up in {time.monotonic() - started:.1f} s; KUBECONFIG={settings.kubeconfig}")
    return handle


def pod_network(cidr: str) -> ipaddress.IPv4Network | None:
    """The fake pods' range when the cluster must make it local (not loopback), else None.
    Refuses a range that is neither loopback nor in the test-network range the real node
    uses, or that overlaps the real node's pods or Services: nothing here may take an
    address that could be someone else's."""
    try:
        net = ipaddress.IPv4Network(cidr)
    except ValueError as err:
        raise ClusterError(f"VLLM_OP_POD_CIDR {cidr!r} is not an IPv4 range: {err}") from None
    if net.is_loopback:
        return None
    test_net = ipaddress.IPv4Network(real_node.TEST_NET)
    taken = [ipaddress.IPv4Network(c) for c in (real_node.POD_CIDR, real_node.SERVICE_CIDR)]
    if not net.subnet_of(test_net) or any(net.overlaps(t) for t in taken):
        raise ClusterError(
            f"VLLM_OP_POD_CIDR {cidr} must lie in 127.0.0.0/8 or in {test_net} apart from "
            f"the real node's {real_node.POD_CIDR} and {real_node.SERVICE_CIDR}"
        )
    return net


def _pod_route(settings: Settings, action: str) -> None:
    """Adds (``replace``) or removes (``del``) the route that makes the fake pods' range
    local on ``lo`` (see settings.FAKE_POD_CIDRS); nothing for a loopback range."""
    net = pod_network(settings.pod_cidr)
    if net is None:
        return
    done = subprocess.run(
        ["ip", "route", action, "local", str(net), "dev", "lo"], capture_output=True, text=True
    )
    if done.returncode != 0 and action != "del":
        raise ClusterError(f"ip route {action} local {net} dev lo: {done.stderr.strip()}")


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
    say(f"{len(manifests)} fake nodes Ready")


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
        if processes.stop(settings, name) and not quiet:
            say(f"stopped {name}")
    with contextlib.suppress(ClusterError):  # a range never taken, since up refused it
        _pod_route(settings, "del")
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
        info = read_info(settings)
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
            ok, detail = components.health(settings, name)
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
    info = read_info(settings)
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
