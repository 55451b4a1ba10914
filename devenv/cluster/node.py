"""One real node beside kwok's fake ones: containerd, runc, kubelet, kube-proxy, CoreDNS.

kwok plays the kubelet well enough for scheduling, topology and scale, but not for
anything a pod's own behaviour decides: images, the container's arguments and user,
probes, readiness gates, /dev/shm, preStop and the drain, Services and DNS. Those run here
on a real kubelet (v1.36, from the Go module proxy like the control plane) with
containerd 2.x and Debian's runc, from images built on this machine (images.py).

Why each odd setting is there is said where it is set below; in short: root here lacks
CAP_SYS_RESOURCE (containerd `restrict_oom_score_adj`, kubelet `oomScoreAdj: 0`), cgroups
are v1 (kubelet `failCgroupV1: false`, cgroupfs driver), there is no dummy netdev (the node
IP is a /32 on `lo`) and no IPVS (kube-proxy in iptables mode).

Network: everything lives in 198.18.0.0/15, the range reserved for test networks, with
an `unreachable` route for the whole range as a safety net. The node IP is 198.18.0.1;
pods get 198.18.1.0/24 on the bridge `vopbr0` with routes to 198.18.0.0/15 only (no
default route: a pod cannot address anything off this machine), and a FORWARD rule drops
whatever would leave the bridge for another interface. Services (ClusterIPs) are in
198.18.128.0/20; CoreDNS answers on the node IP; pods reach the apiserver (bound to
127.0.0.1) through a socat on the node IP, which the apiserver advertises as the
`kubernetes` Service's endpoint.

Which pods land here: the node is tainted `e2e.vllm-operator.dev/real-node:NoSchedule`,
so workloads of the fake-node tests never do. A namespace meant for it carries the
annotations of the PodNodeSelector and PodTolerationRestriction admission plugins
(`real_node_namespace` below), which give every pod created in it the node selector and
the toleration: the operator's own Deployments, warmup and benchmark Jobs need no change.

Everything done to the host is undone by `stop`: the sysctls the kubelet rewrites
(`vm.overcommit_memory`, `kernel.panic`, `kernel.panic_on_oops`) and ours
(`net.ipv4.ip_forward`) get their old values back, the iptables chains of kubelet,
kube-proxy, CNI and ours go, and so do the bridge, the routes, the address, the mounts
and the folders the kubelet makes outside its root.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import yaml

from devenv.cluster import images, processes
from devenv.cluster import nodes as fake_nodes
from devenv.cluster.kubeconfig import write_kubeconfig

if TYPE_CHECKING:
    from devenv.cluster.cluster import ClusterHandle
    from devenv.cluster.settings import Settings

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build-node.sh"

NODE_NAME: Final = "real-node"
NODE_IP: Final = "198.18.0.1"
TEST_NET: Final = "198.18.0.0/15"
POD_CIDR: Final = "198.18.1.0/24"
SERVICE_CIDR: Final = "198.18.128.0/20"
BRIDGE: Final = "vopbr0"
FORWARD_CHAIN: Final = "VOP-NODE-FORWARD"
KUBELET_PORT: Final = 20250
KUBELET_HEALTHZ_PORT: Final = 20348
KUBE_PROXY_HEALTHZ_PORT: Final = 20356
KUBE_PROXY_METRICS_PORT: Final = 20349
COREDNS_HEALTH_PORT: Final = 20380

# The taint and label that keep fake-node workloads off the real node and put the pods of
# a real-node namespace on it.
LABEL_REAL_NODE: Final = "e2e.vllm-operator.dev/real-node"
TAINT: Final = {"key": LABEL_REAL_NODE, "value": "true", "effect": "NoSchedule"}

# What the real node advertises: its CPU vLLM stands in for these GPUs (an L4 is unique
# among the fake nodes, so a service that asks for it lands here).
GPU_SHAPE: Final = fake_nodes.GPUShape(
    product="NVIDIA L4", count=4, memory_mib=23034, interconnect="pcie", topology="PHB"
)

COMPONENTS: Final = ("apiserver-proxy", "containerd", "kubelet", "kube-proxy", "coredns")
SYSCTLS: Final = (
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
    "net/ipv4/ip_forward",
)
# Outside the kubelet's --root-dir, made by it whatever its flags say.
HOST_PATHS: Final = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/run/netns",
)
HOST_RECORD: Final = "node-host.json"  # kept across _fresh_state until restored


class NodeError(RuntimeError):
    """The real node could not be started."""


def enabled() -> bool:
    """The real node runs unless VLLM_OP_REAL_NODE=0 (it needs root)."""
    return os.environ.get("VLLM_OP_REAL_NODE", "1") != "0"


def namespace_annotations() -> dict[str, str]:
    """A namespace's pods all go to the real node, whatever created them."""
    return {
        "scheduler.alpha.kubernetes.io/node-selector": f"{LABEL_REAL_NODE}=true",
        "scheduler.alpha.kubernetes.io/defaultTolerations": json.dumps(
            [{"key": TAINT["key"], "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
        ),
    }


def real_node_namespace(name: str, *, pod_security: str = "restricted") -> dict[str, Any]:
    """A Namespace whose pods land on the real node, with Pod Security enforced."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "annotations": namespace_annotations(),
            "labels": {
                "pod-security.kubernetes.io/enforce": pod_security,
                "pod-security.kubernetes.io/enforce-version": "latest",
                "pod-security.kubernetes.io/warn": "restricted",
            },
        },
    }


# --------------------------------------------------------------------------- binaries


def resolve_binaries() -> Path:
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise NodeError(f"{BUILD_SCRIPT} failed with exit code {proc.returncode}")
    return Path(proc.stdout.strip().splitlines()[-1])


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise NodeError(f"{shlex.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Layout:
    """Where the node's files go: state under the cluster's folder, images in the cache."""

    state: Path

    @classmethod
    def of(cls, settings: Settings) -> Layout:
        return cls(settings.state_dir / "node")

    @property
    def containerd_root(self) -> Path:
        # Outside the state folder, so imported images outlive `down`.
        return images.cache_dir() / "node" / "containerd-root"

    @property
    def socket(self) -> Path:
        return self.state / "containerd" / "containerd.sock"

    @property
    def kubelet_root(self) -> Path:
        return self.state / "kubelet"

    @property
    def cni_conf(self) -> Path:
        return self.state / "cni" / "net.d"


# --------------------------------------------------------------------------- host changes


def _read_sysctl(name: str) -> str:
    return Path("/proc/sys", name).read_text().strip()


def _write_sysctl(name: str, value: str) -> None:
    with contextlib.suppress(OSError):
        Path("/proc/sys", name).write_text(value)


def _record_host(settings: Settings) -> None:
    record = settings.state_dir / HOST_RECORD
    if record.exists():  # a crashed run's record: its values are the host's own
        return
    data = {
        "sysctls": {s: _read_sysctl(s) for s in SYSCTLS if Path("/proc/sys", s).exists()},
        "absent_paths": [p for p in HOST_PATHS if not Path(p).exists()],
    }
    record.write_text(json.dumps(data, indent=2))


def _iptables_cleanup() -> None:
    """Removes every chain of the kubelet, kube-proxy, CNI and ours, and the jumps to them."""
    ours = ("KUBE-", "CNI-", "VOP-")
    for tool in ("iptables", "ip6tables"):
        if shutil.which(tool) is None:
            continue
        for table in ("filter", "nat", "mangle"):
            dump = _run(f"{tool}-save", "-t", table, check=False).stdout
            chains = [line[1:].split()[0] for line in dump.splitlines() if line.startswith(":")]
            for line in dump.splitlines():
                if not line.startswith("-A "):
                    continue
                words = shlex.split(line)
                if words[1].startswith(ours):
                    continue  # flushed with its chain below
                target = words[words.index("-j") + 1] if "-j" in words else ""
                if target.startswith(ours):
                    _run(tool, "-t", table, "-D", *words[1:], check=False)
            for chain in chains:
                if chain.startswith(ours):
                    _run(tool, "-t", table, "-F", chain, check=False)
            for chain in chains:
                if chain.startswith(ours):
                    _run(tool, "-t", table, "-X", chain, check=False)


def _network_up() -> None:
    _run("ip", "addr", "replace", f"{NODE_IP}/32", "dev", "lo")
    _run("ip", "route", "replace", "unreachable", TEST_NET)
    if _run("ip", "link", "show", BRIDGE, check=False).returncode != 0:
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
    gateway = str(next(ipaddress.ip_network(POD_CIDR).hosts()))
    _run("ip", "addr", "replace", f"{gateway}/{POD_CIDR.split('/')[1]}", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    # Locally sent packets to a ClusterIP need a route before kube-proxy's DNAT rewrites
    # them; the bridge is local, so nothing leaves the machine either way.
    _run("ip", "route", "replace", SERVICE_CIDR, "dev", BRIDGE, "src", NODE_IP)
    _write_sysctl("net/ipv4/ip_forward", "1")
    # Nothing from the pod bridge is forwarded to another interface.
    _run("iptables", "-N", FORWARD_CHAIN, check=False)
    _run("iptables", "-F", FORWARD_CHAIN)
    _run("iptables", "-A", FORWARD_CHAIN, "-i", BRIDGE, "!", "-o", BRIDGE, "-j", "DROP")
    if _run("iptables", "-C", "FORWARD", "-j", FORWARD_CHAIN, check=False).returncode != 0:
        _run("iptables", "-I", "FORWARD", "1", "-j", FORWARD_CHAIN)


def _network_down() -> None:
    _run("ip", "route", "del", SERVICE_CIDR, check=False)
    _run("ip", "link", "del", BRIDGE, check=False)
    _run("ip", "route", "del", "unreachable", TEST_NET, check=False)
    _run("ip", "addr", "del", f"{NODE_IP}/32", "dev", "lo", check=False)
    _iptables_cleanup()


def mount_points() -> list[str]:
    """Every mount point of this process's mount namespace (/proc/self/mountinfo)."""
    return [
        line.split()[4].replace("\\040", " ")
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
    ]


def _unmount_under(*roots: Path) -> None:
    """Unmounts whatever the kubelet or containerd left mounted below these folders."""
    prefixes = [str(r.resolve()) + "/" for r in roots] + ["/run/netns/cni-"]
    points = [point for point in mount_points() if any(point.startswith(p) for p in prefixes)]
    for point in sorted(points, key=len, reverse=True):
        _run("umount", "-l", point, check=False)


def _remove_kube_cgroups() -> None:
    for controller in Path("/sys/fs/cgroup").iterdir():
        top = controller / "kubepods"
        if not top.is_dir():
            continue
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def _restore_host(settings: Settings) -> None:
    record = settings.state_dir / HOST_RECORD
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        data = None
    _network_down()
    _remove_kube_cgroups()
    if data is not None:
        for name, value in data["sysctls"].items():
            _write_sysctl(name, value)
        for path in data["absent_paths"]:
            p = Path(path)
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
    record.unlink(missing_ok=True)


# --------------------------------------------------------------------------- configuration


def _containerd_config(layout: Layout, pause: str) -> str:
    return f"""version = 3
root = "{layout.containerd_root}"
state = "{layout.state / "containerd" / "state"}"
[grpc]
  address = "{layout.socket}"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{pause}"
[plugins.'io.containerd.cri.v1.runtime']
  # Lowering a sandbox's oom_score_adj needs CAP_SYS_RESOURCE, which root lacks here.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{layout.cni_conf}"
"""


def _cni_config(layout: Layout) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": "vop-pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                # No masquerading: pods talk to the node, each other and Services only.
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(layout.state / "cni" / "ipam"),
                    "ranges": [[{"subnet": POD_CIDR}]],
                    # No default route: a pod can address the test network only.
                    "routes": [{"dst": TEST_NET}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
            {"type": "loopback"},
        ],
    }


# The kubelet's CPU manager policies the node runs under. ``none`` (the default): every
# container may run on every CPU, shared by cgroup weights. ``static``: a Guaranteed
# container with whole CPUs gets them to itself (its cpuset), and the others share what is
# left. The static policy needs CPU reserved for the system; 100m leaves the two-core node
# 1.9 allocatable CPUs (the reservation is rounded up to CPU 0, which is never given out).
CpuManagerPolicy = Literal["none", "static"]
STATIC_RESERVED_MILLICPU: Final = 100


def _kubelet_config(layout: Layout, cpu_manager: CpuManagerPolicy = "none") -> dict[str, Any]:
    policy: dict[str, Any] = {}
    if cpu_manager == "static":
        policy = {
            "cpuManagerPolicy": "static",
            "kubeReserved": {"cpu": f"{STATIC_RESERVED_MILLICPU}m"},
        }
    return {
        **policy,
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{layout.socket}",
        "failSwapOn": False,
        "address": NODE_IP,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": KUBELET_HEALTHZ_PORT,
        "podLogsDir": str(layout.state / "pod-logs"),
        # A test node on a private address: the apiserver reaches it for logs and exec.
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "registerNode": True,
        "registerWithTaints": [TAINT],
        "maxPods": 50,
        "serializeImagePulls": False,
        # Images are imported, never pulled: keep image GC away from them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
        },
        "resolvConf": "/etc/resolv.conf",
        "oomScoreAdj": 0,  # lowering it needs CAP_SYS_RESOURCE
        "clusterDNS": [NODE_IP],
        "clusterDomain": "cluster.local",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "nodeStatusUpdateFrequency": "5s",
    }


def _kube_proxy_config(layout: Layout) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(layout.state / "kube-proxy.kubeconfig")},
        "hostnameOverride": NODE_NAME,
        "mode": "iptables",
        "clusterCIDR": POD_CIDR,
        "bindAddress": NODE_IP,
        "healthzBindAddress": f"127.0.0.1:{KUBE_PROXY_HEALTHZ_PORT}",
        "metricsBindAddress": f"127.0.0.1:{KUBE_PROXY_METRICS_PORT}",
        # NodePorts on the node IP only, never on the machine's own interfaces.
        "nodePortAddresses": [f"{NODE_IP}/32"],
        "iptables": {"localhostNodePorts": False},
        # 0 leaves the host's conntrack sysctls alone.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }


def _corefile(settings: Settings) -> str:
    return f""".:53 {{
    bind {NODE_IP}
    errors
    health 127.0.0.1:{COREDNS_HEALTH_PORT}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {settings.kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
}}
"""


def _argv(name: str, settings: Settings, layout: Layout, bin_dir: Path) -> list[str]:
    if name == "apiserver-proxy":
        port = settings.apiserver_port
        return [
            shutil.which("socat") or "socat",
            f"TCP-LISTEN:{port},bind={NODE_IP},fork,reuseaddr",
            f"TCP:127.0.0.1:{port}",
        ]
    if name == "containerd":
        return [str(bin_dir / "containerd"), "--config", str(layout.state / "containerd.toml")]
    if name == "kubelet":
        return [
            str(bin_dir / "kubelet"),
            f"--config={layout.state / 'kubelet.yaml'}",
            f"--kubeconfig={layout.state / 'kubelet.kubeconfig'}",
            f"--root-dir={layout.kubelet_root}",
            f"--cert-dir={layout.kubelet_root / 'pki'}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={NODE_IP}",
            "--v=1",
        ]
    if name == "kube-proxy":
        return [str(bin_dir / "kube-proxy"), f"--config={layout.state / 'kube-proxy.yaml'}"]
    if name == "coredns":
        return [str(bin_dir / "coredns"), "-conf", str(layout.state / "Corefile")]
    raise ValueError(name)


def health(name: str) -> tuple[bool, str]:
    if name == "kubelet":
        return processes.http_ok(f"http://127.0.0.1:{KUBELET_HEALTHZ_PORT}/healthz")
    if name == "kube-proxy":
        return processes.http_ok(f"http://127.0.0.1:{KUBE_PROXY_HEALTHZ_PORT}/healthz")
    if name == "coredns":
        return processes.http_ok(f"http://127.0.0.1:{COREDNS_HEALTH_PORT}/health")
    return True, ""  # the socket and the proxy: checked by their process being alive


def _wait_socket(path: Path, proc_alive: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if not proc_alive():
            raise NodeError(f"containerd exited while starting (socket {path})")
        if time.monotonic() > deadline:
            raise NodeError(f"containerd made no socket at {path} in {timeout_s:.0f} s")
        time.sleep(0.1)


# --------------------------------------------------------------------------- up / down


def apiserver_flags() -> list[str]:
    """What the apiserver needs for a real node (replacing its loopback-only defaults)."""
    return [
        f"--advertise-address={NODE_IP}",
        # The `kubernetes` Service's endpoint is the socat on the node IP.
        "--endpoint-reconciler-type=lease",
        # `kubectl logs/exec` reach the kubelet by its InternalIP (no DNS for node names).
        "--kubelet-preferred-address-types=InternalIP,Hostname",
    ]


def prepare(settings: Settings) -> Path:
    """Before the control plane starts: binaries, images, the host's network."""
    bin_dir = resolve_binaries()
    _record_host(settings)
    _network_up()
    return bin_dir


def start(settings: Settings, handle: ClusterHandle, bin_dir: Path) -> None:
    """After the control plane is healthy: every node component, then the node Ready."""
    layout = Layout.of(settings)
    pause = images.build_all().pause
    layout.state.mkdir(parents=True, exist_ok=True)
    layout.cni_conf.mkdir(parents=True, exist_ok=True)
    layout.containerd_root.mkdir(parents=True, exist_ok=True)
    (layout.state / "containerd.toml").write_text(_containerd_config(layout, pause))
    (layout.cni_conf / "10-vop.conflist").write_text(json.dumps(_cni_config(layout), indent=2))
    (layout.state / "kubelet.yaml").write_text(yaml.safe_dump(_kubelet_config(layout)))
    (layout.state / "kube-proxy.yaml").write_text(yaml.safe_dump(_kube_proxy_config(layout)))
    (layout.state / "Corefile").write_text(_corefile(settings))
    write_kubeconfig(settings, layout.state / "kubelet.kubeconfig", "kubelet")
    write_kubeconfig(settings, layout.state / "kube-proxy.kubeconfig", "kube-proxy")

    started = time.monotonic()
    proxy = processes.start(
        settings, "apiserver-proxy", _argv("apiserver-proxy", settings, layout, bin_dir)
    )
    env_path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ["PATH"] = env_path  # containerd finds its shim on PATH
    containerd = processes.start(
        settings, "containerd", _argv("containerd", settings, layout, bin_dir)
    )
    _wait_socket(layout.socket, containerd.alive, settings.timeout_s)
    ensure_images(settings, bin_dir)
    for name in ("kubelet", "kube-proxy", "coredns"):
        pid = processes.start(settings, name, _argv(name, settings, layout, bin_dir))
        _wait_healthy_node(settings, name, pid)
        processes.say(f"{name} healthy after {time.monotonic() - started:.1f} s")
    if not proxy.alive():
        raise NodeError("the apiserver proxy (socat) exited")

    processes.wait_until(
        f"node {NODE_NAME} registered",
        lambda: handle.kubectl("get", "node", NODE_NAME, check=False).returncode == 0,
        settings.timeout_s,
    )
    labels = {
        "kubernetes.io/os": "linux",
        LABEL_REAL_NODE: "true",
        fake_nodes.LABEL_GPU_PRODUCT: GPU_SHAPE.product_label,
        fake_nodes.LABEL_GPU_MEMORY_MIB: str(GPU_SHAPE.memory_mib),
        fake_nodes.LABEL_GPU_COUNT: str(GPU_SHAPE.count),
        fake_nodes.LABEL_GPU_INTERCONNECT: GPU_SHAPE.interconnect,
        "nvidia.com/gpu.present": "true",
    }
    handle.kubectl(
        "label", "--overwrite", "node", NODE_NAME, *(f"{k}={v}" for k, v in labels.items())
    )
    annotations = {fake_nodes.ANNOTATION_GPU_PRODUCT_NAME: GPU_SHAPE.product}
    if GPU_SHAPE.topology:
        annotations[fake_nodes.ANNOTATION_GPU_TOPOLOGY] = GPU_SHAPE.topology
    handle.kubectl(
        "annotate", "--overwrite", "node", NODE_NAME, *(f"{k}={v}" for k, v in annotations.items())
    )
    _advertise_gpus(settings, handle)
    processes.wait_until(
        "the kubernetes Service's endpoint on the node IP",
        lambda: (
            NODE_IP
            in handle.kubectl(
                "get", "endpointslices", "-n", "default", "-o", "yaml", check=False
            ).stdout
        ),
        settings.timeout_s,
    )
    processes.say(f"real node {NODE_NAME} Ready after {time.monotonic() - started:.1f} s")


def _advertise_gpus(settings: Settings, handle: ClusterHandle) -> None:
    """The node Ready with its stand-in GPUs allocatable. Extended resources are advertised
    by patching the node's status (no device plugin): the CPU vLLM behind each "GPU" is the
    stand-in."""
    gpu = fake_nodes.GPU_RESOURCE.replace("/", "~1")
    patch = [{"op": "add", "path": f"/status/capacity/{gpu}", "value": str(GPU_SHAPE.count)}]
    handle.kubectl(
        "patch", "node", NODE_NAME, "--subresource=status", "--type=json",
        "-p", json.dumps(patch),
    )  # fmt: skip
    wait = f"--timeout={int(settings.timeout_s)}s"
    handle.kubectl(
        "wait", "--for=condition=Ready", f"node/{NODE_NAME}", wait, timeout=settings.timeout_s + 10
    )
    processes.wait_until(
        f"{fake_nodes.GPU_RESOURCE} allocatable on {NODE_NAME}",
        lambda: (
            handle.kubectl_json("get", "node", NODE_NAME)["status"]
            .get("allocatable", {})
            .get(fake_nodes.GPU_RESOURCE)
            == str(GPU_SHAPE.count)
        ),
        settings.timeout_s,
    )


def restart_kubelet(
    settings: Settings, handle: ClusterHandle, *, cpu_manager: CpuManagerPolicy
) -> None:
    """Restarts the kubelet under another CPU manager policy; the pods go on running.

    The kubelet refuses a checkpoint of another policy, so its CPU manager state goes with
    it. It admits the running pods again on start: a pod that no longer fits the new
    allocatable CPU is rejected, so restart with few pods on the node. Under ``none`` no
    cpuset is rewritten: a container the static policy kept to the shared CPUs stays there
    until it is restarted."""
    layout = Layout.of(settings)
    processes.stop(settings, "kubelet")
    config = _kubelet_config(layout, cpu_manager)
    (layout.state / "kubelet.yaml").write_text(yaml.safe_dump(config))
    (layout.kubelet_root / "cpu_manager_state").unlink(missing_ok=True)
    pid = processes.start(
        settings, "kubelet", _argv("kubelet", settings, layout, resolve_binaries())
    )
    _wait_healthy_node(settings, "kubelet", pid)
    # The new kubelet has posted its status once the allocatable CPU follows the policy.
    cores = int(handle.kubectl_json("get", "node", NODE_NAME)["status"]["capacity"]["cpu"])
    reserved = STATIC_RESERVED_MILLICPU if cpu_manager == "static" else 0
    want = f"{cores * 1000 - reserved}m" if reserved else str(cores)
    processes.wait_until(
        f"{NODE_NAME} with {want} CPUs allocatable ({cpu_manager} CPU manager)",
        lambda: (
            handle.kubectl_json("get", "node", NODE_NAME)["status"]["allocatable"].get("cpu")
            == want
        ),
        settings.timeout_s,
    )
    _advertise_gpus(settings, handle)
    processes.say(f"kubelet restarted with the {cpu_manager} CPU manager policy")


def _wait_healthy_node(settings: Settings, name: str, pidfile: processes.PidFile) -> None:
    deadline = time.monotonic() + settings.timeout_s
    last = ""
    while True:
        if not pidfile.alive():
            raise NodeError(
                f"{name} exited while starting; its log:\n" + processes.log_tail(settings, name)
            )
        ok, last = health(name)
        if ok:
            return
        if time.monotonic() > deadline:
            raise NodeError(
                f"{name} not healthy after {settings.timeout_s:.0f} s ({last}):\n"
                + processes.log_tail(settings, name)
            )
        time.sleep(0.2)


def ensure_images(settings: Settings, bin_dir: Path | None = None) -> images.Images:
    """Builds what changed since the node started and imports it into its containerd; the
    tags in force are recorded for built_images()."""
    layout = Layout.of(settings)
    bin_dir = bin_dir or resolve_binaries()
    built = images.build_all()
    images.import_into([str(bin_dir / "ctr"), "-a", str(layout.socket)], built.all())
    (layout.state / "images.json").write_text(json.dumps(built.__dict__, indent=2))
    return built


def built_images(settings: Settings) -> images.Images | None:
    """The images the running node was started with."""
    try:
        return images.Images(**json.loads((Layout.of(settings).state / "images.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def running(settings: Settings) -> dict[str, bool]:
    return processes.running(settings, COMPONENTS)


def is_healthy(settings: Settings) -> bool:
    return all(running(settings).values()) and all(health(n)[0] for n in COMPONENTS)


def crictl(settings: Settings, bin_dir: Path | None = None) -> list[str]:
    """The crictl command line for this node's containerd."""
    bin_dir = bin_dir or resolve_binaries()
    return [
        str(bin_dir / "crictl"),
        f"--runtime-endpoint=unix://{Layout.of(settings).socket}",
        "--timeout=30s",
    ]


def kill_container(settings: Settings, container_id: str) -> None:
    """SIGKILLs a container of a pod on this node behind the kubelet's back, as a crash
    would (``containerStatuses[].containerID``, with or without ``containerd://``); the
    kubelet then restarts it by the pod's restart policy."""
    cid = container_id.removeprefix("containerd://")
    _run(*crictl(settings), "stop", "--timeout=0", cid)


def stop(settings: Settings, *, quiet: bool = False) -> None:
    """Stops the node and undoes what it changed on the host; idempotent."""
    layout = Layout.of(settings)
    if processes.stop(settings, "kubelet") and not quiet:
        processes.say("stopped kubelet")
    bin_dir = None
    with contextlib.suppress(NodeError):
        bin_dir = resolve_binaries() if layout.socket.exists() else None
    if bin_dir is not None:
        # Through the CRI, so that CNI releases each pod's address and network namespace.
        _run(*crictl(settings, bin_dir), "rmp", "--all", "--force", check=False)
    for name in ("coredns", "kube-proxy"):
        if processes.stop(settings, name) and not quiet:
            processes.say(f"stopped {name}")
    if bin_dir is not None:
        _run(str(bin_dir / "kube-proxy"), "--cleanup", check=False)
    if processes.stop(settings, "containerd") and not quiet:
        processes.say("stopped containerd")
    _kill_shims(layout)
    processes.stop(settings, "apiserver-proxy")
    _unmount_under(layout.state)
    if (settings.state_dir / HOST_RECORD).exists():
        _restore_host(settings)


def _kill_shims(layout: Layout) -> None:
    """runc shims leave containerd's process group on purpose; end the ones of this node."""
    marker = str(layout.state).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"containerd-shim" in cmd and marker in cmd:
            with contextlib.suppress(OSError):
                os.kill(int(proc.name), signal.SIGKILL)
