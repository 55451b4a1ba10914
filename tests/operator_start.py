"""A short real start of ``vllm-operator run`` as a uid with no passwd entry.

The image runs as 65532 and OpenShift picks random uids: neither has a passwd entry, so
``getpass.getuser()`` (Kopf's default identity) and ``Path.home()`` (``kubernetes_asyncio``
at import) raise unless something else names the user and the home. The uid comes from an
unprivileged user namespace (``unshare --user``), which maps it onto ours, so the
interpreter stays readable wherever it is installed (``setpriv`` would lose access to a
Python under ``/root``). The operator points at a port where nothing listens; once Kopf
reports our login activity done (identity computed, kubeconfig loaded, startup handler
run) it is stopped with SIGTERM.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import threading
from pathlib import Path

from devenv.ci import skip_or_fail

# The line Kopf logs after our login handler: everything before connecting has run.
LOGGED_IN = "Activity 'login' succeeded."
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: nowhere, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: nobody, user: {token: unused}}]
contexts: [{name: nowhere, context: {cluster: nowhere, user: nobody}}]
current-context: nowhere
"""


def as_uid_without_passwd(uid: int) -> list[str]:
    """The command prefix that runs as ``uid:uid``; skips where that cannot be arranged."""
    try:
        pwd.getpwuid(uid)
    except KeyError:
        pass
    else:
        skip_or_fail(f"uid {uid} has a passwd entry here; the test would prove nothing")
    unshare = shutil.which("unshare")
    prefix = [unshare or "unshare", "--user", f"--map-user={uid}", f"--map-group={uid}"]
    probe = (
        subprocess.run([*prefix, "true"], capture_output=True, check=False, timeout=30)
        if unshare
        else None
    )
    if probe is None or probe.returncode != 0:
        skip_or_fail("no unprivileged user namespaces (unshare --user) to run as another uid")
    return prefix


def start_and_stop(argv: list[str], env: dict[str, str], tmp_path: Path) -> tuple[int, str]:
    """Run ``argv run`` until it has logged in, then SIGTERM it: (exit code, output)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    proc = subprocess.Popen(
        [*argv, "run", "--kubeconfig", str(kubeconfig), "--metrics-port", "0",
         "--health-port", "0", "--log-format", "plain"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    # A start that neither crashes nor logs in is killed, failing the test below.
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if LOGGED_IN in line:
                proc.send_signal(signal.SIGTERM)
                lines.extend(proc.stdout)
                break
        code = proc.wait()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return code, "".join(lines)


def stripped_env(**extra: str) -> dict[str, str]:
    """Ours, less anything that names the user or the home (as in the image)."""
    names = ("USER", "LOGNAME", "LNAME", "USERNAME", "HOME")
    env = {k: v for k, v in os.environ.items() if k not in names and not k.startswith("VLLM_")}
    return env | extra
