"""What a download reports: its phase and progress while it runs, its verdict at the end.

One document serves both: ``GET /progress`` answers it while the download runs (the
operator polls it at the pod's IP for the ModelCache's status), and the same document,
compact, is the container's termination message at the end, where Kubernetes caps it at
4096 bytes. ``bytesDownloaded`` is measured on disk (finished files plus partial ones), so
it is right after a resume and whatever the HTTP library buffers.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Final

from vllm_operator.constants import DOWNLOAD_EXIT_CODES

logger = logging.getLogger(__name__)

TERMINATION_MESSAGE_LIMIT: Final = 4096
DEFAULT_TERMINATION_LOG: Final = "/dev/termination-log"


class Phase(StrEnum):
    RESOLVING = "Resolving"
    DOWNLOADING = "Downloading"
    VERIFYING = "Verifying"
    COMPLETE = "Complete"
    FAILED = "Failed"


class DownloadError(Exception):
    """A download that cannot finish: ``reason`` (a key of ``DOWNLOAD_EXIT_CODES``) and a
    sentence that names the repo, revision or file and says what to do."""

    def __init__(self, reason: str, message: str) -> None:
        if reason not in DOWNLOAD_EXIT_CODES:
            raise ValueError(f"unknown download reason {reason!r}")
        super().__init__(message)
        self.reason = reason
        self.message = message

    @property
    def exit_code(self) -> int:
        return DOWNLOAD_EXIT_CODES[self.reason]


@dataclass
class Report:
    """The download's state, shared by the download and the progress server's threads.

    ``on_disk`` measures the bytes of the wanted files on disk; the download sets it once
    it knows the files.
    """

    phase: Phase = Phase.RESOLVING
    commit: str | None = None
    bytes_total: int = 0
    files_done: int = 0
    files_total: int = 0
    reason: str | None = None
    message: str = ""
    # The model's config.json once the download is complete: the operator plans the
    # services that use the cache from it.
    config: dict[str, object] | None = None
    on_disk: Callable[[], int] = field(default=lambda: 0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def update(self, **changes: object) -> None:
        with self._lock:
            for name, value in changes.items():
                if not hasattr(self, name) or name.startswith("_"):
                    raise AttributeError(name)
                setattr(self, name, value)

    def document(self) -> dict[str, object]:
        """The JSON document of ``/progress`` and of the termination message."""
        with self._lock:
            phase, on_disk = self.phase, self.on_disk
            doc: dict[str, object] = {
                "phase": str(phase),
                "commit": self.commit,
                "bytesDownloaded": 0,
                "bytesTotal": self.bytes_total,
                "filesDone": self.files_done,
                "filesTotal": self.files_total,
                "reason": self.reason,
                "message": self.message,
            }
            if self.config is not None:
                doc["config"] = self.config
        try:
            doc["bytesDownloaded"] = on_disk()
        except OSError as exc:  # a file renamed under the scan: the next poll is right
            logger.debug("Could not measure the files on disk: %s", exc)
        return doc

    def termination_message(self) -> str:
        """Compact JSON within Kubernetes' termination-message limit."""
        doc = self.document()
        text = json.dumps(doc, separators=(",", ":"))
        config = doc.get("config")
        if len(text.encode()) > TERMINATION_MESSAGE_LIMIT and isinstance(config, dict):
            # Its long entries first (label maps, auto_map); the shape the tuner reads is
            # numbers and short strings. Then none at all: the tuner falls back to its
            # catalog.
            doc["config"] = {k: v for k, v in config.items() if len(json.dumps(v)) <= 256}
            text = json.dumps(doc, separators=(",", ":"))
            if len(text.encode()) > TERMINATION_MESSAGE_LIMIT:
                del doc["config"]
                text = json.dumps(doc, separators=(",", ":"))
        while len(text.encode()) > TERMINATION_MESSAGE_LIMIT:
            message = str(doc["message"])
            doc["message"] = message[: max(len(message) - 256, 0)] + "…"
            text = json.dumps(doc, separators=(",", ":"))
        return text


def write_termination_message(report: Report, path: str | Path | None) -> bool:
    """Write the compact result where Kubernetes reads it; never raise (outside a pod the
    path usually does not exist, and the download's verdict must not depend on it)."""
    if path is None or str(path) == "":
        return False
    try:
        Path(path).write_text(report.termination_message())
    except OSError as exc:
        logger.warning("Could not write the termination message to %s: %s", path, exc)
        return False
    return True
