"""A run's results as ConfigMap contents: every request when they fit, as many as fit
(evenly spread, the rest counted) when they do not, and back again."""

from __future__ import annotations

import base64
import random
from typing import Any

import pytest

from tests.determinism import same_across_processes
from vllm_operator.bench.archive import CONFIG_MAP_LIMIT, RESULTS_KEY, pack, unpack


def _request(i: int, rng: random.Random) -> dict[str, Any]:
    sent = i * 0.1 + rng.random() * 1e-3
    return {
        "index": i,
        "scheduled": round(i * 0.1, 9),
        "sent": round(sent, 9),
        "first_token": round(sent + rng.random() * 0.2, 9),
        "end": round(sent + 1 + rng.random(), 9),
        # Random instants compress badly, as real ones do.
        "chunk_times": [round(sent + rng.random(), 9) for _ in range(16)],
        "status": 200,
        "prompt_tokens_planned": 100,
        "output_tokens_planned": 16,
        "prompt_tokens": 100,
        "completion_tokens": 16,
        "error": None,
        "error_detail": None,
    }


def _results(*sizes: int) -> dict[str, Any]:
    rng = random.Random(7)
    return {
        "version": 1,
        "spec": {"targetRef": {"name": "x"}},
        "model": "m",
        "levels": [
            {
                "passed": True,
                "stats": {"requests": n},
                "requests": [_request(i, rng) for i in range(n)],
            }
            for n in sizes
        ],
    }


def _config_map(packed_patch: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "b-results"},
        **packed_patch,
    }


def test_results_that_fit_are_kept_whole_and_come_back_unchanged() -> None:
    results = _results(30, 20)
    packed = pack(results)
    assert (packed.requests, packed.kept, packed.dropped) == (50, 50, 0)
    assert packed.data["requests"] == "50" and packed.data["requestsDropped"] == "0"
    back = unpack(_config_map(packed.patch()))
    assert back == {**results, "requests_dropped": 0}


def packed_archive() -> object:
    return pack(_results(40)).binary


def test_packing_is_deterministic() -> None:
    same_across_processes("tests.bench.test_archive:packed_archive")


def test_too_many_requests_keep_as_many_as_fit_evenly_spread_and_say_so() -> None:
    results = _results(3000, 1000)
    limit = 64 * 1024
    packed = pack(results, limit=limit)
    size = len(packed.binary[RESULTS_KEY]) + sum(len(v) for v in packed.data.values())
    assert size <= limit
    assert 0 < packed.kept < 4000 and packed.dropped == 4000 - packed.kept
    assert packed.data["requestsDropped"] == str(packed.dropped)
    back = unpack(_config_map(packed.patch()))
    assert back["requests_dropped"] == packed.dropped
    kept = [lv["requests"] for lv in back["levels"]]
    assert sum(map(len, kept)) == packed.kept
    # Spread over both levels in proportion, and over each level's whole span.
    assert len(kept[0]) == pytest.approx(3 * len(kept[1]), abs=2)
    assert kept[0][0]["index"] == 0 and kept[0][-1]["index"] > 2900
    # The summaries still describe every request.
    assert [lv["stats"]["requests"] for lv in back["levels"]] == [3000, 1000]
    # As many as fit: the room left (limit less the 8 KiB margin) is nearly all used.
    assert size > (limit - 8 * 1024) * 0.97


def test_the_default_limit_is_the_config_map_limit() -> None:
    packed = pack(_results(20000))
    assert len(packed.binary[RESULTS_KEY]) < CONFIG_MAP_LIMIT
    assert packed.dropped > 0


def test_results_that_cannot_fit_at_all_are_refused() -> None:
    results = _results(5)
    results["client"] = {"noise": base64.b64encode(random.Random(1).randbytes(20000)).decode()}
    with pytest.raises(ValueError, match="even without requests"):
        pack(results, limit=16 * 1024)


def test_a_config_map_without_results_says_so() -> None:
    with pytest.raises(ValueError, match=r"no binaryData key results\.json\.gz"):
        unpack({"metadata": {"name": "b-results"}, "data": {}})
    with pytest.raises(ValueError, match="not gzipped JSON"):
        unpack({"binaryData": {RESULTS_KEY: base64.b64encode(b"plain").decode()}})
