"""The one error of a request to our own pods (a vLLM server, a download Job's progress
endpoint): the pod did not answer, or answered with an error. The operator's reconciles
catch it, and nothing of the HTTP client, so the client stays inside servers/."""

from __future__ import annotations


class PodHTTPError(RuntimeError):
    """A request to a pod failed: no answer (``status`` None) or an HTTP error status."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
