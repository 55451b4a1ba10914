"""`make release`: the release artifacts in dist/, with no registry access.

- the wheel and the sdist (`python -m build`; the version is vllm_operator.__version__);
- the chart, packaged (`helm package`: vllm-operator-<version>.tgz);
- the operator image, built from the Dockerfile on this machine as the cluster tests build
  it (devenv/cluster/images.py: Debian base, Python base, the Dockerfile unchanged), tagged
  vllm-operator:<version> and saved as an OCI archive (`podman save --format
  oci-archive`). Load it with `podman load`, or push it to your registry with
  `skopeo copy oci-archive:dist/... docker://<your registry>/vllm-operator:<version>`;
- SHA256SUMS over all of them.

Every artifact must carry the package's version; the script stops otherwise.

    python scripts/release.py              # everything
    python scripts/release.py --no-image   # without the image (no podman needed)
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "operator"))

from vllm_operator import __version__  # noqa: E402


def _run(*argv: str) -> None:
    print("+", " ".join(argv), file=sys.stderr)
    subprocess.run(argv, check=True, cwd=REPO)


def _helm() -> str:
    from devenv.cluster.settings import resolve_binaries

    return str(resolve_binaries() / "helm")


def build_python(dist: Path) -> list[Path]:
    _run(sys.executable, "-m", "build", "--outdir", str(dist), str(REPO))
    found = sorted(dist.glob(f"vllm_operator-{__version__}*"))
    kinds = {p.suffix for p in found}
    if kinds != {".whl", ".gz"}:
        raise SystemExit(f"expected a wheel and an sdist of {__version__} in {dist}: {found}")
    return found


def build_chart(dist: Path) -> Path:
    _run(_helm(), "package", str(REPO / "charts" / "vllm-operator"), "-d", str(dist))
    chart = dist / f"vllm-operator-{__version__}.tgz"
    if not chart.exists():
        raise SystemExit(
            f"helm package wrote no {chart.name}: is Chart.yaml's version {__version__}?"
        )
    return chart


def build_image(dist: Path) -> Path:
    from devenv.cluster import images

    built = images.build_operator(images.build_python(images.build_debian()))
    tag = f"vllm-operator:{__version__}"
    images.podman("tag", built, tag)
    archive = dist / f"vllm-operator-image-{__version__}.oci.tar"
    archive.unlink(missing_ok=True)
    images.podman("save", "--format", "oci-archive", "-o", str(archive), tag)
    return archive


def checksums(paths: list[Path], dist: Path) -> Path:
    lines = []
    for path in sorted(paths):
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        lines.append(f"{digest.hexdigest()}  {path.name}\n")
    out = dist / "SHA256SUMS"
    out.write_text("".join(lines))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the release artifacts into dist/.")
    parser.add_argument("--dist", default=str(REPO / "dist"), help="output folder (dist/)")
    parser.add_argument("--no-image", action="store_true", help="leave out the image archive")
    args = parser.parse_args(argv)
    dist = Path(args.dist)
    if dist.exists():
        shutil.rmtree(dist)
    dist.mkdir(parents=True)
    made = [*build_python(dist), build_chart(dist)]
    if not args.no_image:
        made.append(build_image(dist))
    sums = checksums(made, dist)
    for path in [*made, sums]:
        print(f"{path.relative_to(dist.parent) if path.is_relative_to(dist.parent) else path}"
              f"  {path.stat().st_size:,} bytes")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
