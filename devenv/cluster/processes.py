"""The harness's processes: each started in a session of its own, with a pid file, and
stopped with its whole process group; polls and waits; ClusterError.

The components of the control plane (components.py) and of the real node (node.py)
outlive the Python process that started them (`up` returns, they keep running), so what
runs is known from the pid files under the state folder's `run/`, not from a Popen. Each
component leads its own session: `stop` ends it and everything it started with one
signal to its process group, and a Ctrl-C in the terminal that ran `up` does not reach it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from devenv.cluster.settings import Settings


class ClusterError(RuntimeError):
    """The cluster could not be started, or a command against it failed."""


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


def start(settings: Settings, name: str, argv: Sequence[str]) -> PidFile:
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


def stop(settings: Settings, name: str, *, grace_s: float = 15.0) -> bool:
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


def running(settings: Settings, names: Sequence[str]) -> dict[str, bool]:
    """Which components have a live process (health not asked)."""
    result = {}
    for name in names:
        pidfile = PidFile.read(settings, name)
        result[name] = pidfile is not None and pidfile.alive()
    return result


def http_ok(url: str, ctx: ssl.SSLContext | None = None) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=3) as resp:
            body = resp.read().decode(errors="replace")
            return resp.status == 200, body.strip()
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}: {exc.read().decode(errors='replace').strip()[:500]}"
    except (OSError, ssl.SSLError) as exc:
        return False, str(exc)


def log_tail(settings: Settings, name: str, lines: int = 30) -> str:
    try:
        text = (settings.logs_dir / f"{name}.log").read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


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


def say(msg: str) -> None:
    print(f"[cluster] {msg}", file=sys.stderr, flush=True)
