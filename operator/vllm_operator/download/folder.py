"""The model folder on disk: the repo's files, the files being fetched, and the marker.

``DIR`` (the cache volume's model folder) holds the repo's files under their own names and
nothing else that ``vllm serve DIR`` could take for one of them: vLLM globs
``DIR/*.safetensors`` (``*.bin``, ``*.pt``) and ``DIR/*.json``, and Python's glob skips
names that start with a dot. So everything of ours is hidden:

- ``DIR/.vllm-operator-complete.json``, the marker, written last, once every file is in
  place and verified, and removed first when a download begins;
- ``DIR/.cache/vllm-operator/partial/<sha256 or blob id>.part``: a file being fetched,
  named for its content (the Hub's LFS sha256, or git's blob id for small files), so a pod
  killed mid-file leaves bytes the next pod appends to, and a file only takes its real name
  once its size and hash are checked;
- ``DIR/.cache/vllm-operator/verified.json``: name → content key of every file verified in
  place, so a resumed download hashes each file once.

A file in ``DIR`` that the repo at this commit does not have (another revision's shard) is
removed before downloading: vLLM would load every ``*.safetensors`` it finds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from vllm_operator.constants import DOWNLOAD_MARKER

HASH_CHUNK = 8 * 1024 * 1024
# Not ours to remove: the folder ext4 makes at the root of a fresh volume.
KEEP = frozenset({"lost+found"})


@dataclass(frozen=True)
class RemoteFile:
    """One file of the repo at the resolved commit, as the Hub lists it."""

    name: str  # path inside the repo, "/"-separated
    size: int
    blob_id: str | None = None  # git's blob sha1 (every file)
    sha256: str | None = None  # LFS files only

    @property
    def key(self) -> str:
        """Names the file's content: its partial file and its record use it."""
        if self.sha256:
            return self.sha256
        if self.blob_id:
            return self.blob_id
        return hashlib.sha1(f"{self.name}\0{self.size}".encode()).hexdigest()


@dataclass(frozen=True)
class Snapshot:
    """A repo resolved at one commit: what the folder must hold."""

    repo: str
    revision: str
    commit: str
    files: tuple[RemoteFile, ...]

    @property
    def bytes_total(self) -> int:
        return sum(f.size for f in self.files)

    def marker(self) -> dict[str, Any]:
        return {
            "repo": self.repo,
            "revision": self.revision,
            "commit": self.commit,
            "files": [{"name": f.name, "size": f.size} for f in self.files],
            "bytes": self.bytes_total,
        }


def safe_name(name: str) -> bool:
    """A repo path that stays inside the folder."""
    path = PurePosixPath(name)
    return bool(name) and not path.is_absolute() and ".." not in path.parts and "\\" not in name


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on ``path``'s filesystem."""
    return shutil.disk_usage(path).free


def file_problem(path: Path, file: RemoteFile) -> str | None:
    """Why ``path`` is not ``file`` (size, then the Hub's sha256 or git blob id); None if it is."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "missing"
    if size != file.size:
        return f"{size} bytes, the Hub lists {file.size}"
    if file.sha256:
        digest = hashlib.sha256()
        expected, kind = file.sha256, "sha256"
    elif file.blob_id:
        digest = hashlib.sha1(b"blob %d\0" % size)
        expected, kind = file.blob_id, "git blob id"
    else:
        return None
    with path.open("rb") as fh:
        while chunk := fh.read(HASH_CHUNK):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        return f"{kind} {digest.hexdigest()[:12]}…, the Hub lists {expected[:12]}…"
    return None


class ModelFolder:
    """``DIR`` and our hidden bookkeeping inside it (see the module's docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state = root / ".cache" / "vllm-operator"
        self.partials = self.state / "partial"
        self.records = self.state / "verified.json"
        self.marker = root / DOWNLOAD_MARKER

    def final(self, file: RemoteFile) -> Path:
        return self.root / file.name

    def partial(self, file: RemoteFile) -> Path:
        return self.partials / f"{file.key}.part"

    def partial_size(self, file: RemoteFile) -> int:
        try:
            return self.partial(file).stat().st_size
        except FileNotFoundError:
            return 0

    # -- the marker -------------------------------------------------------------------------

    def read_marker(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.marker.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def write_marker(self, snapshot: Snapshot) -> None:
        _write_json(self.marker, snapshot.marker())

    def remove_marker(self) -> None:
        self.marker.unlink(missing_ok=True)

    def complete_for(self, repo: str, commit: str) -> dict[str, Any] | None:
        """The marker, if it says this folder holds ``repo`` at ``commit`` and every file it
        lists is there with its size; else None."""
        marker = self.read_marker()
        if not marker or marker.get("repo") != repo or marker.get("commit") != commit:
            return None
        files = marker.get("files")
        if not isinstance(files, list):
            return None
        for entry in files:
            name, size = entry.get("name"), entry.get("size")
            if not isinstance(name, str) or not safe_name(name):
                return None
            try:
                if (self.root / name).stat().st_size != size:
                    return None
            except OSError:
                return None
        return marker

    # -- files in place ---------------------------------------------------------------------

    def verified(self) -> dict[str, str]:
        try:
            data = json.loads(self.records.read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def record(self, files: Iterable[RemoteFile]) -> None:
        _write_json(self.records, {f.name: f.key for f in files})

    def in_place(self, file: RemoteFile, verified: dict[str, str]) -> bool:
        """Verified earlier (by its record) and still of its size."""
        if verified.get(file.name) != file.key:
            return False
        try:
            return self.final(file).stat().st_size == file.size
        except OSError:
            return False

    def place(self, file: RemoteFile) -> None:
        """Give a verified partial file its real name."""
        target = self.final(file)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.partial(file), target)

    def bytes_on_disk(self, files: Iterable[RemoteFile], done: set[str]) -> int:
        """Finished files plus the partial ones: what the download has on disk."""
        total = 0
        for f in files:
            total += f.size if f.name in done else self.partial_size(f)
        return total

    def remove_strays(self, snapshot: Snapshot) -> list[str]:
        """Remove visible files the repo does not have at this commit, and partial files of
        content it no longer wants; return the repo paths removed."""
        wanted = {f.name for f in snapshot.files}
        removed = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            here = Path(dirpath)
            rel = here.relative_to(self.root)
            dirnames[:] = [
                d for d in dirnames if not d.startswith(".") and not (rel == Path() and d in KEEP)
            ]
            for name in filenames:
                path = (rel / name).as_posix()
                if not name.startswith(".") and path not in wanted:
                    (here / name).unlink()
                    removed.append(path)
        keys = {f"{f.key}.part" for f in snapshot.files}
        if self.partials.is_dir():
            for part in self.partials.iterdir():
                if part.name not in keys:
                    part.unlink()
        return removed


def _write_json(path: Path, data: object) -> None:
    """Write ``path`` whole or not at all (a killed pod leaves the old one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as fh:
        json.dump(data, fh, separators=(",", ":"))
        fh.flush()
        with contextlib.suppress(OSError):
            os.fsync(fh.fileno())
    os.replace(tmp, path)
