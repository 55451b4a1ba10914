"""Where the local cluster lives and which loopback ports it takes (from the environment),
what `up` recorded about it (`cluster.json`), and where its binaries are (build.sh)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devenv.cluster import node as real_node
from devenv.cluster import nodes as fake_nodes
from devenv.cluster.processes import ClusterError

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
BUILD_SCRIPT = HERE / "build.sh"
STAGES_FILE = HERE / "kwok-stages.yaml"


# The fake pods' addresses. As root: ranges reserved for test networks, apart from the
# real node's (node.TEST_NET's lower half and its Services), made local on `lo` by the
# cluster for as long as it runs (cluster.py): a real local process can listen on a pod's
# IP, nothing sent to one leaves the machine, and, unlike loopback addresses, Endpoints
# and EndpointSlices take them, so a Service of fake pods gets endpoints as in a real
# cluster (with loopback ones the endpoint controllers retried with 422s for as long as
# the pods lived). One range per cluster that may run at once: the shared cluster's, a
# private control plane's beside it (e2e/chart_fixtures.py), and the side cluster's
# (SIDE_SLOT). Without root no route can be added: loopback ranges then, and Services of
# fake pods have no endpoints.
FAKE_POD_CIDRS = ("198.19.0.0/17", "198.19.128.0/17", "198.18.192.0/18")
LOOPBACK_POD_CIDRS = ("127.64.0.0/16", "127.65.0.0/16", "127.66.0.0/16")
SHARED, PRIVATE, SIDE = 0, 1, 2

# VLLM_OP_CLUSTER_SLOT=1: the side cluster, a second shared cluster beside the first.
# `make test` runs the cluster tests that need no real node on it while the first runs
# those that do. Its default ports are the first's plus SLOT_PORT_STEP (a private control
# plane's +5000 on top stays below 32768, out of Linux's ephemeral range), its state
# folder is .cluster-1/, its fake pods take the SIDE range, and it has no real node: one
# machine has room for one (its address, bridge and routes).
SIDE_SLOT = 1
SLOT_PORT_STEP = 1000


def default_pod_cidr(which: int = SHARED) -> str:
    """The fake pods' range of the shared cluster, of a private one beside it, or of the
    side cluster (SHARED, PRIVATE, SIDE)."""
    return (FAKE_POD_CIDRS if os.geteuid() == 0 else LOOPBACK_POD_CIDRS)[which]


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
    # The fake pods' IPs: local addresses, so a real local process can listen on a pod's
    # IP (see FAKE_POD_CIDRS).
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
        slot = _env_int("VLLM_OP_CLUSTER_SLOT", 0)
        if slot not in (0, SIDE_SLOT):
            raise ClusterError(
                f"VLLM_OP_CLUSTER_SLOT {slot} is not 0 (the shared cluster) or "
                f"{SIDE_SLOT} (the side cluster beside it)"
            )
        step = SLOT_PORT_STEP * slot
        folder = ".cluster" if slot == 0 else f".cluster-{slot}"
        return cls(
            state_dir=Path(os.environ.get("VLLM_OP_CLUSTER_DIR") or REPO / folder).resolve(),
            etcd_port=_env_int("VLLM_OP_ETCD_PORT", 23790 + step),
            etcd_peer_port=_env_int("VLLM_OP_ETCD_PEER_PORT", 23800 + step),
            apiserver_port=_env_int("VLLM_OP_APISERVER_PORT", 26443 + step),
            controller_manager_port=_env_int("VLLM_OP_CONTROLLER_MANAGER_PORT", 20257 + step),
            scheduler_port=_env_int("VLLM_OP_SCHEDULER_PORT", 20259 + step),
            kwok_port=_env_int("VLLM_OP_KWOK_PORT", 20248 + step),
            pod_cidr=os.environ.get("VLLM_OP_POD_CIDR")
            or default_pod_cidr(SIDE if slot else SHARED),
            service_cidr=os.environ.get("VLLM_OP_SERVICE_CIDR", real_node.SERVICE_CIDR),
            nodes_file=Path(
                os.environ.get("VLLM_OP_CLUSTER_NODES") or fake_nodes.DEFAULT_NODES_FILE
            ),
            stages_file=Path(os.environ.get("VLLM_OP_KWOK_STAGES") or STAGES_FILE),
            timeout_s=float(os.environ.get("VLLM_OP_CLUSTER_TIMEOUT", "120")),
            real_node=real_node.enabled() and slot == 0,
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


def resolve_binaries(*, build: bool = True) -> Path:
    """The folder with every binary: `VLLM_OP_K8S_BIN`, or build.sh's cache (building it
    first if needed). build.sh prints its progress on stderr, which passes through."""
    if not build:
        info = read_info(Settings.from_env())
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


def read_info(settings: Settings) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(settings.info_file.read_text())
        return data
    except (OSError, ValueError):
        return None
