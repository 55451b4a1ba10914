"""A start that fails ends the process with exit code 1 and one line saying why (2 when the
credentials are unusable, checked before anything starts).

Before, Kopf retried a failing startup handler every 60 s and watched nothing meanwhile,
and an apiserver without the CRDs got a warning from Kopf and a process that lived on,
reconciling nothing: the kubelet saw a healthy pod. The operator runs for real here
(``vllm-operator run``), against a local HTTP server standing in for the apiserver.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.operator_start import stripped_env

ENTRY = Path(sys.executable).parent / "vllm-operator"
# A start that neither fails nor gets anywhere is killed after this (the bug), never timed.
WATCHDOG_S = 60
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: nobody, user: {{token: unused}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: nobody}}}}]
current-context: fake
"""


def run_until_exit(kubeconfig: Path, tmp_path: Path) -> tuple[int, str]:
    """``vllm-operator run`` to its end: (exit code, output). One that outlives the watchdog
    (the bug) is killed, and the test fails on ``TimeoutExpired``."""
    proc = subprocess.run(
        [str(ENTRY), "run", "--kubeconfig", str(kubeconfig), "--metrics-port", "0",
         "--health-port", "0", "--log-format", "plain"],
        capture_output=True, text=True, env=stripped_env(), cwd=tmp_path, timeout=WATCHDOG_S,
        check=False,
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


# What the discovery paths answer; anything else is a 404, as for a group not served.
DISCOVERY = {
    "/api": {"kind": "APIVersions", "versions": ["v1"]},
    "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": []},
    "/apis": {"kind": "APIGroupList", "groups": []},
}


class _NoCRDs(http.server.BaseHTTPRequestHandler):
    """An apiserver with none of our CRDs (nor anything else): discovery answers, every
    other path is a 404 Status."""

    def do_GET(self) -> None:
        found = DISCOVERY.get(self.path.split("?")[0])
        status = 200 if found else 404
        body = json.dumps(found or {"kind": "Status", "status": "Failure", "code": 404,
                                    "reason": "NotFound", "message": "the server could "
                                    "not find the requested resource"}).encode()  # fmt: skip
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def apiserver_without_crds() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NoCRDs)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (None, "cannot use kubeconfig {path}: No such file or directory"),
        ("apiVersion: v1\nclusters: [\n", "kubeconfig {path} is not YAML: "),
        ("apiVersion: v1\nkind: Config\n", "cannot use kubeconfig {path}: Invalid kube-config"),
    ],
    ids=["missing", "not YAML", "no context"],
)
def test_an_unusable_kubeconfig_is_one_line_naming_the_file_and_exit_2(
    tmp_path: Path, text: str | None, said: str
) -> None:
    """Checked before Kopf starts: no traceback, no warning of Kopf's, one line."""
    path = tmp_path / "kubeconfig"
    if text is not None:
        path.write_text(text)
    code, output = run_until_exit(path, tmp_path)
    assert code == 2, output
    assert output.startswith("vllm-operator run: " + said.format(path=path)), output
    assert output.count("\n") == 1, output
    if text == "apiVersion: v1\nclusters: [\n":
        assert "(line 3, column 1)" in output, output


def test_no_credentials_at_all_says_where_it_looked_and_exits_2(tmp_path: Path) -> None:
    """No --kubeconfig, no KUBECONFIG, no ~/.kube/config and not a pod."""
    proc = subprocess.run(
        [str(ENTRY), "run", "--metrics-port", "0", "--health-port", "0"],
        capture_output=True, text=True, cwd=tmp_path, timeout=WATCHDOG_S, check=False,
        env={k: v for k, v in stripped_env(HOME=str(tmp_path)).items()
             if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")},
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert output.startswith("vllm-operator run: no credentials: ~/.kube/config"), output
    assert "give --kubeconfig or set KUBECONFIG" in output and output.count("\n") == 1, output


def test_an_apiserver_without_the_crds_exits_1_naming_them(
    apiserver_without_crds: int, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG.format(port=apiserver_without_crds))
    code, output = run_until_exit(kubeconfig, tmp_path)
    assert code == 1, output
    stopped = [line for line in output.splitlines() if "The operator stopped:" in line]
    assert len(stopped) == 1, output
    for crd in ("inferenceservices", "inferencebenchmarks", "gpunodes"):
        assert f"{crd}.inference.vllm-operator.dev" in stopped[0]
