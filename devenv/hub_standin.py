"""A local stand-in for the Hugging Face Hub: serves folders as model repos over HTTP.

``huggingface_hub`` (and so vLLM, transformers and ``vllm-operator download``) talks to
whatever ``HF_ENDPOINT`` names. This server speaks the part of the Hub's HTTP API they use
to find and fetch a model's files, and nothing else:

- ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}``: the model info,
  with the commit (``sha``) and ``siblings``; with ``?blobs=true`` (``files_metadata=True``)
  each sibling's ``size`` and ``blobId``, and ``lfs`` {``size``, ``sha256``, ``pointerSize``}
  for the files the Hub keeps in LFS (weights, or anything of 10 MiB and more).
- ``GET /api/models/{repo}/tree/{rev}[/{path}]`` (``?recursive=true``): the file listing
  ``snapshot_download`` reads (one page, no ``Link`` header).
- ``HEAD`` and ``GET /{repo}/resolve/{rev}/{path}``: the file, with the headers the library
  keys on (``X-Repo-Commit``, ``ETag``, and for LFS files ``X-Linked-Etag`` = the sha256 and
  ``X-Linked-Size``), ``Content-Length``, ``Accept-Ranges``; ``Range: bytes=N-[M]`` answers
  206 with ``Content-Range``, a range past the end 416. Files are served directly (the Hub
  redirects LFS files to a CDN; the library handles both).
- Errors as the Hub sends them, so ``huggingface_hub.utils.hf_raise_for_status`` raises its
  own typed errors: 404 with ``X-Error-Code: RepoNotFound`` (a repo not served),
  ``RevisionNotFound`` (a revision other than ``main`` and the commit), ``EntryNotFound`` (a
  file not in the repo); for a gated repo 401 ``GatedRepo`` without a token and 403
  ``GatedRepo`` with a wrong one. As on the Hub, a gated repo's model info is public; its
  files are not.

Each folder is one repo at one commit: the sha1 of its files' names and contents, so the
same folder always has the same commit. Hidden files and folders are not served.

For the tests, under ``/_`` (never a repo name):

- ``GET /_stats``: requests per (method, repo, endpoint, file) and bytes served per file;
  ``POST /_reset`` zeroes them. The counts show what a rollout costs at the Hub.
- ``POST /_corrupt?repo=R&file=F[&times=N]``: serve wrong bytes (same length) for that file,
  the next N GETs or (without ``times``) until ``times=0``.
- ``POST /_throttle?bytesPerSecond=N``: cap every file response at N bytes/s (0: no cap).

Standard library only (Python 3.11): it runs as a pod from the CPU vLLM image with this
file mounted from a ConfigMap, where neither this project nor third-party code is
importable. Run it::

    python devenv/hub_standin.py --port 8080 --repo tiny/llama=DIR \\
        [--gated tiny/llama-gated=DIR --token SECRET] [--bytes-per-second N]

It prints ``listening on HOST:PORT`` once it accepts connections (``--port 0`` picks a free
port). Tests start it in a thread with :func:`start`.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

# What the Hub keeps in LFS: the weight formats its default .gitattributes names, and
# anything too big for a plain git blob (the Hub refuses non-LFS files of 10 MiB and more).
LFS_SUFFIXES = (
    ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx",
    ".model", ".npz", ".tflite",
)  # fmt: skip
LFS_MIN_SIZE = 10 * 1024 * 1024
# A git-lfs pointer file's size: what the Hub reports as lfs.pointerSize.
LFS_POINTER_SIZE = 134
CHUNK = 64 * 1024
REPO_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
COMMIT_DATE = "2026-12-01T00:00:00.000Z"


@dataclasses.dataclass(frozen=True)
class RepoFile:
    """One file of a served repo."""

    name: str  # path inside the repo, with "/"
    path: Path
    size: int
    blob_id: str  # git's blob sha1, the Hub's blobId (and the ETag of a non-LFS file)
    sha256: str
    lfs: bool

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.blob_id


@dataclasses.dataclass(frozen=True)
class Repo:
    """A folder served as a model repo at one commit."""

    name: str
    folder: Path
    commit: str
    files: dict[str, RepoFile]
    gated: bool

    @classmethod
    def load(cls, name: str, folder: Path, *, gated: bool = False) -> Repo:
        if not REPO_NAME.match(name):
            raise ValueError(f"{name!r} is not ORG/NAME")
        if not folder.is_dir():
            raise ValueError(f"{folder} is not a folder")
        files: dict[str, RepoFile] = {}
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder)
            if not path.is_file() or any(part.startswith(".") for part in rel.parts):
                continue
            data = path.read_bytes()
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            files[rel.as_posix()] = RepoFile(
                name=rel.as_posix(),
                path=path,
                size=len(data),
                blob_id=blob,
                sha256=hashlib.sha256(data).hexdigest(),
                lfs=path.suffix in LFS_SUFFIXES or len(data) >= LFS_MIN_SIZE,
            )
        commit = hashlib.sha1()
        for f in files.values():
            commit.update(f"{f.name}\0{f.blob_id}\n".encode())
        return cls(name=name, folder=folder, commit=commit.hexdigest(), files=files, gated=gated)

    def folders(self) -> list[str]:
        """Every folder that holds a file, as a repo path."""
        out = set()
        for name in self.files:
            parts = name.split("/")[:-1]
            out.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        return sorted(out)


class HubError(Exception):
    """An error answer, as the Hub sends it."""

    def __init__(self, status: int, code: str | None, message: str, *, commit: str = "") -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


@dataclasses.dataclass
class State:
    """What the server serves and what it counted; shared by the handler threads."""

    repos: dict[str, Repo]
    token: str | None = None
    bytes_per_second: int = 0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    requests: Counter[tuple[str, str, str, str]] = dataclasses.field(default_factory=Counter)
    bytes_served: Counter[tuple[str, str]] = dataclasses.field(default_factory=Counter)
    # (repo, file) -> GETs still to corrupt; -1: every one.
    corrupt: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)

    def count(self, method: str, repo: str, endpoint: str, file: str) -> None:
        with self.lock:
            self.requests[(method, repo, endpoint, file)] += 1

    def served(self, repo: str, file: str, n: int) -> None:
        with self.lock:
            self.bytes_served[(repo, file)] += n

    def take_corruption(self, repo: str, file: str) -> bool:
        with self.lock:
            left = self.corrupt.get((repo, file), 0)
            if left == 0:
                return False
            if left > 0:
                self.corrupt[(repo, file)] = left - 1
            return True

    def stats(self) -> dict[str, Any]:
        with self.lock:
            requests = [
                {"method": m, "repo": r, "endpoint": e, "file": f, "count": n}
                for (m, r, e, f), n in sorted(self.requests.items())
            ]
            served: dict[str, dict[str, int]] = {}
            for (repo, file), n in sorted(self.bytes_served.items()):
                served.setdefault(repo, {})[file] = n
            return {
                "requests": requests,
                "bytesServed": served,
                "totalRequests": sum(self.requests.values()),
                "totalBytes": sum(self.bytes_served.values()),
            }

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.bytes_served.clear()


class Handler(BaseHTTPRequestHandler):
    server_version = "hub-standin/1"
    protocol_version = "HTTP/1.1"
    state: State  # set on the subclass by make_server
    verbose = False

    # -- dispatch ---------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        parts = [unquote(p) for p in url.path.split("/") if p]
        try:
            if parts and parts[0].startswith("_"):
                self._control(method, parts[0], query)
            elif len(parts) >= 3 and parts[:2] == ["api", "models"]:
                self._api(method, parts[2:], query)
            elif len(parts) >= 5 and parts[2] == "resolve":
                self._resolve(method, f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]))
            else:
                self.state.count(method, "", "unknown", url.path)
                raise HubError(404, None, f"{url.path} is not served by the Hub stand-in")
        except HubError as err:
            self._error(method, err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # -- the Hub's API ----------------------------------------------------------------------

    def _api(self, method: str, rest: list[str], query: dict[str, str]) -> None:
        # rest: ORG NAME [revision REV | tree REV [PATH...]]
        if len(rest) < 2:
            raise HubError(404, None, "no repo named")
        repo_name = f"{rest[0]}/{rest[1]}"
        tail = rest[2:]
        endpoint = "info" if not tail or tail[0] == "revision" else tail[0]
        self.state.count(method, repo_name, endpoint, "")
        repo = self._repo(repo_name)
        if method not in ("GET", "HEAD"):
            raise HubError(405, None, f"{method} is not served")
        if not tail:
            self._json(method, self._info(repo, blobs=_true(query.get("blobs"))))
        elif tail[0] == "revision" and len(tail) >= 2:
            self._revision(repo, "/".join(tail[1:]))
            self._json(method, self._info(repo, blobs=_true(query.get("blobs"))))
        elif tail[0] == "tree" and len(tail) >= 2:
            self._revision(repo, tail[1])
            self._json(method, self._tree(repo, "/".join(tail[2:]), _true(query.get("recursive"))))
        else:
            raise HubError(404, None, f"/api/models/{repo_name}/{'/'.join(tail)} is not served")

    def _info(self, repo: Repo, *, blobs: bool) -> dict[str, Any]:
        siblings = []
        for f in repo.files.values():
            sibling: dict[str, Any] = {"rfilename": f.name}
            if blobs:
                sibling |= {"size": f.size, "blobId": f.blob_id}
                if f.lfs:
                    sibling["lfs"] = {
                        "size": f.size,
                        "sha256": f.sha256,
                        "pointerSize": LFS_POINTER_SIZE,
                    }
            siblings.append(sibling)
        return {
            "_id": repo.commit[:24],
            "id": repo.name,
            "modelId": repo.name,
            "author": repo.name.split("/")[0],
            "sha": repo.commit,
            "lastModified": COMMIT_DATE,
            "createdAt": COMMIT_DATE,
            "private": False,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "library_name": "transformers",
            "siblings": siblings,
            "spaces": [],
            "usedStorage": sum(f.size for f in repo.files.values()),
        }

    def _tree(self, repo: Repo, under: str, recursive: bool) -> list[dict[str, Any]]:
        prefix = f"{under.strip('/')}/" if under.strip("/") else ""
        if prefix and prefix[:-1] not in repo.folders():
            raise HubError(
                404, "EntryNotFound", f"{under} does not exist on main", commit=repo.commit
            )

        def wanted(name: str) -> bool:
            if not name.startswith(prefix):
                return False
            return recursive or "/" not in name[len(prefix) :]

        entries: list[dict[str, Any]] = []
        for folder in repo.folders():
            if wanted(folder):
                oid = hashlib.sha1(folder.encode()).hexdigest()
                entries.append({"type": "directory", "oid": oid, "size": 0, "path": folder})
        for f in repo.files.values():
            if wanted(f.name):
                entry: dict[str, Any] = {
                    "type": "file",
                    "oid": f.blob_id,
                    "size": f.size,
                    "path": f.name,
                }
                if f.lfs:
                    entry["lfs"] = {
                        "oid": f.sha256,
                        "size": f.size,
                        "pointerSize": LFS_POINTER_SIZE,
                    }
                entries.append(entry)
        return entries

    # -- files ------------------------------------------------------------------------------

    def _resolve(self, method: str, repo_name: str, revision: str, name: str) -> None:
        self.state.count(method, repo_name, "resolve", name)
        repo = self._repo(repo_name)
        self._revision(repo, revision)
        self._authorize(repo)
        file = repo.files.get(name)
        if file is None:
            raise HubError(
                404, "EntryNotFound", f"{name} does not exist on {revision}", commit=repo.commit
            )
        start, end = 0, file.size - 1
        status = HTTPStatus.OK
        wanted = self.headers.get("Range")
        if wanted and method == "GET":
            match = re.fullmatch(r"bytes=(\d*)-(\d*)", wanted.strip())
            if match is None:
                raise HubError(416, None, f"unsupported Range {wanted!r}")
            first, last = match.groups()
            if first:
                start = int(first)
                end = min(int(last), file.size - 1) if last else file.size - 1
            elif last:  # the last N bytes
                start = max(file.size - int(last), 0)
            if start >= file.size or start > end:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{file.size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = HTTPStatus.PARTIAL_CONTENT
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{file.etag}"')
        if file.lfs:
            self.send_header("X-Linked-Etag", f'"{file.sha256}"')
            self.send_header("X-Linked-Size", str(file.size))
        if status == HTTPStatus.PARTIAL_CONTENT:
            self.send_header("Content-Range", f"bytes {start}-{end}/{file.size}")
        self.end_headers()
        if method == "HEAD":
            return
        corrupt = self.state.take_corruption(repo.name, file.name)
        self._send_file(repo.name, file, start, end, corrupt=corrupt)

    def _send_file(self, repo: str, file: RepoFile, start: int, end: int, *, corrupt: bool) -> None:
        with file.path.open("rb") as fh:
            fh.seek(start)
            left = end - start + 1
            while left > 0:
                rate = self.state.bytes_per_second
                size = min(left, CHUNK, max(rate // 10, 1024) if rate else CHUNK)
                data = fh.read(size)
                if not data:
                    break
                if corrupt:
                    data = bytes(b ^ 0xFF for b in data)
                began = time.monotonic()
                self.wfile.write(data)
                self.state.served(repo, file.name, len(data))
                left -= len(data)
                if rate:
                    time.sleep(max(len(data) / rate - (time.monotonic() - began), 0))

    # -- checks -----------------------------------------------------------------------------

    def _repo(self, name: str) -> Repo:
        repo = self.state.repos.get(name)
        if repo is None:
            raise HubError(404, "RepoNotFound", "Repository not found")
        return repo

    def _revision(self, repo: Repo, revision: str) -> None:
        if revision not in ("main", repo.commit):
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")

    def _authorize(self, repo: Repo) -> None:
        if not repo.gated:
            return
        sent = self.headers.get("Authorization", "")
        token = sent.removeprefix("Bearer ").strip() if sent.startswith("Bearer ") else ""
        if not token:
            raise HubError(
                401,
                "GatedRepo",
                f"Access to model {repo.name} is restricted. You must have access to it and be"
                " authenticated to access it. Please log in.",
            )
        if token != self.state.token:
            raise HubError(
                403,
                "GatedRepo",
                f"Access to model {repo.name} is restricted and you are not in the authorized"
                f" list. Visit https://huggingface.co/{repo.name} to ask for access.",
            )

    # -- the tests' controls ----------------------------------------------------------------

    def _control(self, method: str, what: str, query: dict[str, str]) -> None:
        state = self.state
        if what == "_stats" and method == "GET":
            self._json(method, state.stats())
        elif what == "_reset" and method == "POST":
            state.reset()
            self._json(method, {"reset": True})
        elif what == "_corrupt" and method == "POST":
            repo = self._repo(query.get("repo", ""))
            file = query.get("file", "")
            if file not in repo.files:
                raise HubError(404, "EntryNotFound", f"{file} is not in {repo.name}")
            times = int(query.get("times", "-1"))
            with state.lock:
                state.corrupt[(repo.name, file)] = times
            self._json(method, {"repo": repo.name, "file": file, "times": times})
        elif what == "_throttle" and method == "POST":
            state.bytes_per_second = max(int(query.get("bytesPerSecond", "0")), 0)
            self._json(method, {"bytesPerSecond": state.bytes_per_second})
        else:
            raise HubError(404, None, f"{method} /{what} is not a control of the stand-in")

    # -- answers ----------------------------------------------------------------------------

    def _json(self, method: str, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(data)

    def _error(self, method: str, err: HubError) -> None:
        data = json.dumps({"error": err.message}).encode()
        self.send_response(err.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if err.code:
            self.send_header("X-Error-Code", err.code)
        self.send_header("X-Error-Message", err.message)
        if err.commit:
            self.send_header("X-Repo-Commit", err.commit)
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        if self.verbose:
            sys.stderr.write(f"{self.address_string()} {format % args}\n")


def _true(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")


def make_server(
    repos: Sequence[Repo],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    bytes_per_second: int = 0,
    verbose: bool = False,
) -> tuple[ThreadingHTTPServer, State]:
    """A bound (not yet serving) server for ``repos``, and its shared state."""
    state = State(repos={r.name: r for r in repos}, token=token, bytes_per_second=bytes_per_second)
    handler = type("BoundHandler", (Handler,), {"state": state, "verbose": verbose})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server, state


@dataclasses.dataclass
class Running:
    """A stand-in serving in a thread of this process (see :func:`start`)."""

    server: ThreadingHTTPServer
    state: State
    thread: threading.Thread

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def repo(self, name: str) -> Repo:
        return self.state.repos[name]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def start(repos: Sequence[Repo], **kwargs: Any) -> Running:
    """Serve ``repos`` on 127.0.0.1 (a free port unless told) in a daemon thread."""
    server, state = make_server(repos, **kwargs)
    thread = threading.Thread(target=server.serve_forever, name="hub-standin", daemon=True)
    thread.start()
    return Running(server=server, state=state, thread=thread)


def _repo_arg(text: str) -> tuple[str, Path]:
    name, sep, folder = text.partition("=")
    if not sep or not REPO_NAME.match(name) or not folder:
        raise argparse.ArgumentTypeError(f"{text!r} is not ORG/NAME=DIR")
    return name, Path(folder)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="default: %(default)s")
    parser.add_argument("--port", type=int, default=8080, help="0: any free port")
    parser.add_argument(
        "--repo", type=_repo_arg, action="append", default=[], metavar="ORG/NAME=DIR"
    )
    parser.add_argument(
        "--gated",
        type=_repo_arg,
        action="append",
        default=[],
        metavar="ORG/NAME=DIR",
        help="a repo whose files need --token",
    )
    parser.add_argument("--token", default=os.environ.get("HUB_STANDIN_TOKEN"))
    parser.add_argument("--bytes-per-second", type=int, default=0, help="0: no cap")
    parser.add_argument(
        "--corrupt",
        action="append",
        default=[],
        metavar="ORG/NAME:FILE",
        help="serve wrong bytes for this file (repeatable)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log every request")
    args = parser.parse_args(argv)
    if args.gated and not args.token:
        parser.error("--gated needs --token")
    try:
        repos = [Repo.load(n, d) for n, d in args.repo] + [
            Repo.load(n, d, gated=True) for n, d in args.gated
        ]
    except ValueError as err:
        parser.error(str(err))
    if not repos:
        parser.error("no --repo or --gated")
    server, state = make_server(
        repos,
        host=args.host,
        port=args.port,
        token=args.token,
        bytes_per_second=args.bytes_per_second,
        verbose=args.verbose,
    )
    for spec in args.corrupt:
        repo, _, file = spec.partition(":")
        if repo not in state.repos or file not in state.repos[repo].files:
            parser.error(f"--corrupt {spec}: no such repo file")
        state.corrupt[(repo, file)] = -1
    host, port = server.server_address[:2]
    for repo in repos:
        print(
            f"serving {repo.name} at commit {repo.commit}: {len(repo.files)} files"
            f"{' (gated)' if repo.gated else ''}",
            flush=True,
        )
    print(f"listening on {host!s}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
