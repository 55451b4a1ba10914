"""A run's full results as a ConfigMap's contents, and back.

The InferenceBenchmark's load Job keeps every request it sent in ``results.json`` (see
:mod:`vllm_operator.bench.report`), but a Job's files go with its pod. So at the end the
Job writes them into the benchmark's results ConfigMap: ``results.json`` gzipped under
``binaryData`` (``results.json.gz``), with a few counts as plain ``data`` that
``kubectl get configmap -o yaml`` shows.

A ConfigMap holds at most 1 MiB (``data`` and ``binaryData`` together). When the gzipped
results do not fit, as many requests are kept as fit, evenly spaced over the run (so the
timeline still spans it), and ``requestsDropped`` says how many were left out. The
per-level summaries (``stats``) always describe every request.

Pure: no I/O, no clock; the upload is :mod:`vllm_operator.bench.upload`.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

RESULTS_KEY: Final = "results.json.gz"
FORMAT: Final = "gzip of vllm-operator bench results.json (JSON_VERSION 1)"
# What the apiserver allows for data and binaryData together (its validation's limit).
CONFIG_MAP_LIMIT: Final = 1024 * 1024
# Room left for the plain data entries and rounding.
_MARGIN: Final = 8 * 1024
_PLACEHOLDER: Final = "@@vllm-operator-requests-{}@@"


@dataclass(frozen=True)
class Packed:
    """What goes into the ConfigMap: ``data`` (text) and ``binaryData`` (raw bytes)."""

    data: dict[str, str]
    binary: dict[str, bytes]
    requests: int
    kept: int

    @property
    def dropped(self) -> int:
        return self.requests - self.kept

    def patch(self) -> dict[str, Any]:
        """A merge patch that writes these contents into the ConfigMap."""
        return {
            "data": self.data,
            "binaryData": {k: base64.b64encode(v).decode() for k, v in self.binary.items()},
        }


def _select(total: int, keep: int) -> list[int]:
    """``keep`` indexes of ``range(total)``, evenly spaced, the first one included."""
    if keep >= total:
        return list(range(total))
    return [(j * total) // keep for j in range(keep)]


def pack(results: dict[str, Any], *, limit: int = CONFIG_MAP_LIMIT) -> Packed:
    """The ConfigMap contents for a run's JSON form (``report.result_json``), within
    ``limit`` bytes: every request when they fit, else as many as fit."""
    levels = results.get("levels", [])
    # Each request serialised once; a probe only joins and compresses the kept ones.
    encoded = [
        [json.dumps(r, separators=(",", ":")) for r in lv.get("requests", [])] for lv in levels
    ]
    total = sum(len(e) for e in encoded)
    owner = [i for i, e in enumerate(encoded) for _ in e]
    position = [j for e in encoded for j in range(len(e))]

    def document(keep: int) -> str:
        chosen: list[list[str]] = [[] for _ in encoded]
        for g in _select(total, keep):
            chosen[owner[g]].append(encoded[owner[g]][position[g]])
        shell = {
            **results,
            "requests_dropped": total - keep,
            "levels": [{**lv, "requests": _PLACEHOLDER.format(i)} for i, lv in enumerate(levels)],
        }
        text = json.dumps(shell, separators=(",", ":"))
        for i, reqs in enumerate(chosen):
            text = text.replace(json.dumps(_PLACEHOLDER.format(i)), "[" + ",".join(reqs) + "]")
        return text

    def data(keep: int) -> dict[str, str]:
        return {
            "format": FORMAT,
            "requests": str(total),
            "requestsKept": str(keep),
            "requestsDropped": str(total - keep),
        }

    def compress(keep: int) -> bytes:
        return gzip.compress(document(keep).encode(), compresslevel=9, mtime=0)

    def fits(keep: int) -> bytes | None:
        blob = compress(keep)
        size = len(blob) + sum(len(v.encode()) for v in data(keep).values())
        return blob if size <= limit - _MARGIN else None

    # A guess from an evenly spread sample spares compressing a huge run whole.
    sample = min(total, 500)
    per_request = len(compress(sample)) / max(sample, 1)
    guess = int((limit - _MARGIN) / per_request)
    blob = fits(total) if total <= guess * 2 else None
    if blob is not None:
        return Packed(data(total), {RESULTS_KEY: blob}, total, total)
    # Too big: the largest count that fits, searched from the guess.
    keep, blob = _largest_fitting(total, fits, guess=guess)
    if blob is None:
        raise ValueError(
            f"the results do not fit in a ConfigMap of {limit} bytes even without requests"
        )
    return Packed(data(keep), {RESULTS_KEY: blob}, total, keep)


def _largest_fitting(
    total: int, fits: Callable[[int], bytes | None], *, guess: int
) -> tuple[int, bytes | None]:
    """The largest ``k`` below ``total`` with ``fits(k)`` (assumed monotone), and its blob:
    grow from the guess while it fits, then bisect (each probe costs about ``k``)."""
    lo, best, hi = -1, None, total
    k = max(0, min(total - 1, guess))
    while hi - lo > 1:
        blob = fits(k)
        if blob is not None:
            lo, best = k, blob
        else:
            hi = k
        k = min(hi - 1, max(lo + 1, lo * 5 // 4)) if hi == total else (lo + hi) // 2
    return lo, best


def unpack(config_map: dict[str, Any]) -> dict[str, Any]:
    """The run's JSON form from a results ConfigMap (as ``kubectl get -o json`` prints
    it: ``binaryData`` values in base64)."""
    encoded = (config_map.get("binaryData") or {}).get(RESULTS_KEY)
    if not encoded:
        name = config_map.get("metadata", {}).get("name", "the ConfigMap")
        raise ValueError(f"{name} has no binaryData key {RESULTS_KEY} (no results written yet?)")
    try:
        data: dict[str, Any] = json.loads(gzip.decompress(base64.b64decode(encoded)))
    except (binascii.Error, OSError, ValueError) as exc:
        raise ValueError(f"{RESULTS_KEY} is not gzipped JSON in base64: {exc}") from exc
    return data
