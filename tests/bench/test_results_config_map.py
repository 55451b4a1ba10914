"""``vllm-operator bench`` and the results ConfigMap: the upload the Job asks for with
``--results-config-map`` (against a local stand-in for the apiserver's one endpoint it
calls, reached through a kubeconfig as a run outside the cluster has it), a run that goes on when
the upload fails, the report redrawn from the ConfigMap, and errors in the termination log.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.fakes.openai_server import Config, Delay
from tests.bench.conftest import ServerFactory
from vllm_operator.bench.archive import pack, unpack
from vllm_operator.bench.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, main

TOKEN = "test-token"


@dataclass
class FakeApiserver:
    """Answers PATCH of ConfigMaps with ``status``; records every request."""

    status: int = 200
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    def handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_PATCH(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                fake.requests.append(
                    {
                        "path": self.path,
                        "content_type": self.headers["Content-Type"],
                        "authorization": self.headers["Authorization"],
                        "body": json.loads(body),
                    }
                )
                answer = json.dumps({"kind": "ConfigMap", "metadata": {"name": "x"}}).encode()
                if fake.status != 200:
                    answer = json.dumps({"kind": "Status", "reason": "Forbidden"}).encode()
                self.send_response(fake.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_: Any) -> None:
                pass

        return Handler


@pytest.fixture
def apiserver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApiserver]:
    fake = FakeApiserver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": fake.url}}],
                "users": [{"name": "u", "user": {"token": TOKEN}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    # As outside a cluster: no in-cluster account, a kubeconfig instead.
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    yield fake
    server.shutdown()


def _run(server_url: str, tmp_path: Path, *extra: str) -> tuple[int, Path]:
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text(
        "\n".join(
            json.dumps({"prompt": f"tell me about {i}", "output_tokens": 3}) for i in range(8)
        )
    )
    log = tmp_path / "termination-log"
    code = main(
        [
            "--endpoint", server_url, "--model", "fake-model", "--api", "completions",
            "--dataset-file", str(dataset), "--arrival", "closed", "--concurrency", "2",
            "--requests", "8", "--output-dir", str(tmp_path / "out"), "--no-html",
            "--no-progress", "--termination-log", str(log), *extra,
        ]
    )  # fmt: skip
    return code, log


def test_the_job_writes_every_request_into_its_results_config_map(
    fake_server: ServerFactory, apiserver: FakeApiserver, tmp_path: Path
) -> None:
    server = fake_server(Config(ttft=Delay(value=0.005)))
    code, log = _run(
        server.url, tmp_path, "--results-config-map", "b-results", "--results-namespace", "team-a"
    )
    assert code == EXIT_OK
    (request,) = apiserver.requests
    assert request["path"] == "/api/v1/namespaces/team-a/configmaps/b-results"
    assert request["content_type"] == "application/strategic-merge-patch+json"
    assert request["authorization"] == f"Bearer {TOKEN}"
    assert set(request["body"]) == {"data", "binaryData"}  # labels and owner stay as they are
    assert request["body"]["data"]["requests"] == "8"
    assert request["body"]["data"]["requestsDropped"] == "0"
    results = unpack({"kind": "ConfigMap", **request["body"]})
    written = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results == {**written, "requests_dropped": 0}
    assert [r["index"] for r in results["levels"][0]["requests"]] == list(range(8))
    # The operator learns from the termination message that the data is there.
    assert json.loads(log.read_text())["resultsConfigMap"] == "b-results"


def test_a_refused_upload_leaves_the_run_standing_without_claiming_the_config_map(
    fake_server: ServerFactory,
    apiserver: FakeApiserver,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    apiserver.status = 403
    server = fake_server(Config())
    code, log = _run(
        server.url, tmp_path, "--results-config-map", "b-results", "--results-namespace", "team-a"
    )
    assert code == EXIT_OK
    assert len(apiserver.requests) == 1, "a 403 is not retried"
    assert "Could not write the results ConfigMap" in caplog.text and "403" in caplog.text
    status = json.loads(log.read_text())
    assert "resultsConfigMap" not in status and status["headline"]["requests"] == 8


def test_a_failed_run_leaves_its_error_in_the_termination_log(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"prompt": "ok"}\nnot json\n')
    argv = ["--endpoint", "http://127.0.0.1:9", "--model", "m", "--rate", "1",
            "--output-dir", str(tmp_path), "--termination-log", str(log)]  # fmt: skip
    assert main([*argv, "--dataset-file", str(bad)]) == EXIT_USAGE
    assert log.read_text().startswith("dataset line 2: not JSON")
    assert main(argv) == EXIT_FAILED
    assert "preflight request" in log.read_text()


@pytest.mark.parametrize("form", ["json", "yaml", "stdin"])
def test_the_report_is_redrawn_from_a_results_config_map(
    form: str,
    fake_server: ServerFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = fake_server(Config())
    assert _run(server.url, tmp_path)[0] == EXIT_OK
    original = json.loads((tmp_path / "out" / "results.json").read_text())
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "b-results", "namespace": "team-a"},
        **pack(original).patch(),
    }
    source = tmp_path / "cm.txt"
    if form == "yaml":
        source.write_text(yaml.safe_dump(config_map))
    else:
        source.write_text(json.dumps(config_map))
    if form == "stdin":
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(source.read_bytes())))
    report = tmp_path / "report"
    code = main(
        ["--from-results", "-" if form == "stdin" else str(source), "--output-dir", str(report)]
    )
    assert code == EXIT_OK
    assert json.loads((report / "results.json").read_text()) == {**original, "requests_dropped": 0}
    assert "<svg" in (report / "report.html").read_text()


def test_a_file_that_holds_no_results_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "cm.json"
    source.write_text(json.dumps({"kind": "ConfigMap", "metadata": {"name": "b"}, "data": {}}))
    assert main(["--from-results", str(source), "--output-dir", str(tmp_path)]) == EXIT_USAGE
    assert "no binaryData key results.json.gz" in capsys.readouterr().err
