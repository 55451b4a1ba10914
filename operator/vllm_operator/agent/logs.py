"""Log lines in the Kubernetes (klog) structured text format.

``I1129 21:40:00.123456    4711 loop.py:88] "Applied power limit" gpuNode="n1" gpu=0 watts=450``

A capitalised, past-tense message naming what happened, then the details as key=value
pairs (strings quoted), so the agent's lines read like the kubelet's beside them and can
be parsed the same way. Details are passed as ``extra=kv(key=value, ...)``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any, ClassVar


def kv(**fields: Any) -> dict[str, Any]:
    """Structured details for a log call: ``log.info("Did it", extra=kv(gpu=0))``."""
    return {"kv": fields}


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(str(value))


class KlogFormatter(logging.Formatter):
    """Formats records as klog text lines."""

    _LEVELS: ClassVar[dict[str, str]] = {
        "DEBUG": "I",
        "INFO": "I",
        "WARNING": "W",
        "ERROR": "E",
        "CRITICAL": "F",
    }

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, tz=UTC)
        head = (
            f"{self._LEVELS.get(record.levelname, 'I')}{when:%m%d %H:%M:%S.%f} "
            f"{os.getpid():7d} {record.filename}:{record.lineno}]"
        )
        parts = [head, json.dumps(record.getMessage())]
        fields: dict[str, Any] = getattr(record, "kv", {}) or {}
        parts.extend(f"{key}={_value(value)}" for key, value in fields.items())
        if record.exc_info:
            parts.append(f"err={_value(self.formatException(record.exc_info))}")
        return " ".join(parts)


def setup(level: str = "INFO") -> None:
    """Send the agent's log lines to stderr in klog format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KlogFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
