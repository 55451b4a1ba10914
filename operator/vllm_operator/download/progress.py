"""``GET /progress`` while a download runs: the report's document, read by the operator.

The operator polls it at the pod's IP for the ModelCache's status (phase, bytes and files
done of total), so a download's progress is visible without a log or a volume to read.
Standard library only, in a daemon thread; any other path answers 404.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from vllm_operator.constants import DOWNLOAD_PROGRESS_PATH
from vllm_operator.download.report import Report


class ProgressServer:
    """Serves ``report`` on ``host:port`` (``port`` 0: any free port) until stopped."""

    def __init__(self, report: Report, *, port: int, host: str = "0.0.0.0") -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                if self.path.split("?")[0] != DOWNLOAD_PROGRESS_PATH:
                    self._send(404, {"error": f"{self.path} not found"})
                    return
                self._send(200, report.document())

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # one line per poll would drown the download's own lines

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="download-progress", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> ProgressServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
