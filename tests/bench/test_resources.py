"""Latency against resources: what the sampler reads, what a level's figures say, and a run
against the fake server whose /metrics reports what it serves."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import httpx
import pytest

from devenv.fakes.openai_server import KV_REQUESTS, Config, Delay
from tests.bench.conftest import ServerFactory
from vllm_operator.bench.report import resources_heatmap_svg
from vllm_operator.bench.resources import Sample, parse_sample, summarize_resources
from vllm_operator.bench.sampler import ResourceSampler
from vllm_operator.releases.metrics import MetricsError


def vllm_text(
    *,
    running: float = 0,
    waiting: float = 0,
    kv: float = 0.0,
    e2e: float = 0.0,
    queue: float = 0.0,
    finished: float = 0,
    preemptions: float = 0,
) -> str:
    return (
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0"}} {running}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0"}} {waiting}\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f'vllm:kv_cache_usage_perc{{engine="0"}} {kv}\n'
        "# TYPE vllm:e2e_request_latency_seconds histogram\n"
        f'vllm:e2e_request_latency_seconds_sum{{engine="0"}} {e2e}\n'
        f'vllm:e2e_request_latency_seconds_count{{engine="0"}} {finished}\n'
        "# TYPE vllm:request_queue_time_seconds histogram\n"
        f'vllm:request_queue_time_seconds_sum{{engine="0"}} {queue}\n'
        f'vllm:request_queue_time_seconds_count{{engine="0"}} {finished}\n'
        "# TYPE vllm:request_success counter\n"
        f'vllm:request_success_total{{engine="0",finished_reason="length"}} {finished}\n'
        "# TYPE vllm:num_preemptions counter\n"
        f'vllm:num_preemptions_total{{engine="0"}} {preemptions}\n'
    )


def dcgm_text(util: tuple[float, ...], copy: tuple[float, ...], power: tuple[float, ...]) -> str:
    lines = []
    for name, values in (
        ("DCGM_FI_DEV_GPU_UTIL", util),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", copy),
        ("DCGM_FI_DEV_POWER_USAGE", power),
    ):
        lines.append(f"# TYPE {name} gauge")
        lines += [f'{name}{{gpu="{i}",UUID="GPU-{i}"}} {v}' for i, v in enumerate(values)]
    return "\n".join(lines) + "\n"


def test_a_vllm_scrape_reads_its_gauges_and_preemptions() -> None:
    s = parse_sample("u", vllm_text(running=3, waiting=1, kv=0.4, preemptions=2), at=5.0)
    assert s.vllm is not None
    assert (s.vllm.running, s.vllm.waiting, s.vllm.kv_cache_usage) == (3, 1, 0.4)
    assert s.preemptions == 2 and s.at == 5.0
    assert s.gpu_util is None and s.power_w is None


def test_a_dcgm_scrape_averages_utilisation_over_gpus_and_sums_power() -> None:
    s = parse_sample("u", dcgm_text((90, 70), (40, 60), (300, 250)), at=0.0)
    assert s.vllm is None
    assert s.gpu_util == pytest.approx(0.8)
    assert s.mem_copy_util == pytest.approx(0.5)
    assert s.power_w == pytest.approx(550)


def test_a_scrape_with_neither_vllm_nor_dcgm_is_an_error() -> None:
    with pytest.raises(MetricsError, match="neither"):
        parse_sample("u", "# TYPE up gauge\nup 1\n", at=0.0)
    with pytest.raises(MetricsError):
        parse_sample("u", "not { prometheus", at=0.0)


def test_a_level_averages_requests_by_littles_law_and_names_the_nearest_saturation() -> None:
    # 10 s apart: 40 s spent in the server by 10 finished requests, 10 s of it queued:
    # 3 running and 1 waiting on average, though the gauges read 0 at both ends.
    first = parse_sample("u", vllm_text(kv=0.2, e2e=100, queue=20, finished=50), at=0.0)
    mid = parse_sample("u", vllm_text(running=6, kv=0.9, e2e=110, queue=25, finished=55), at=5.0)
    last = parse_sample("u", vllm_text(kv=0.3, e2e=140, queue=30, finished=60), at=10.0)
    stats = summarize_resources([[first, mid, last]])
    assert stats is not None
    assert stats.running_mean == pytest.approx(3.0)
    assert stats.waiting_mean == pytest.approx(1.0)
    assert stats.running_max == 6
    assert stats.kv_cache_usage_max == pytest.approx(0.9)
    assert stats.kv_cache_usage_mean == pytest.approx(1.4 / 3)
    assert stats.preemptions == 0
    assert stats.saturation == {"kv-cache": 0.9, "queue": 0.25}
    assert stats.nearest == "kv-cache"


def test_a_preemption_counts_as_a_full_kv_cache() -> None:
    a = parse_sample("u", vllm_text(kv=0.5, e2e=0, finished=0, preemptions=1), at=0.0)
    b = parse_sample("u", vllm_text(kv=0.6, e2e=10, finished=10, preemptions=4), at=10.0)
    stats = summarize_resources([[a, b]])
    assert stats is not None and stats.preemptions == 3
    assert stats.saturation["kv-cache"] == 1.0


def test_gpu_figures_from_an_exporter_beside_the_server() -> None:
    vllm = [
        parse_sample("v", vllm_text(kv=0.1, e2e=0, finished=0), at=0.0),
        parse_sample("v", vllm_text(kv=0.1, e2e=20, finished=20), at=10.0),
    ]
    gpu = [
        parse_sample("g", dcgm_text((96,), (50,), (280,)), at=0.0),
        parse_sample("g", dcgm_text((98,), (54,), (290,)), at=10.0),
    ]
    stats = summarize_resources([vllm, gpu])
    assert stats is not None
    assert stats.urls == 2 and stats.samples == 4
    assert stats.gpu_utilization_mean == pytest.approx(0.97)
    assert stats.memory_bandwidth_mean == pytest.approx(0.52)
    assert stats.power_watts_mean == pytest.approx(285)
    assert stats.power_fraction_mean is None  # no limit exported
    assert stats.running_mean == pytest.approx(2.0)
    assert stats.nearest == "gpu"


def test_reads_that_all_failed_say_why_and_none_tried_is_nothing() -> None:
    failed = summarize_resources([[], []], errors=4, last_error="http://x/metrics: 404")
    assert failed is not None
    assert (failed.samples, failed.scrape_errors, failed.nearest) == (0, 4, None)
    assert failed.last_error == "http://x/metrics: 404" and failed.saturation == {}
    assert summarize_resources([[]]) is None


def test_the_sampler_reads_at_each_end_and_in_between_and_counts_failures() -> None:
    reads = {"good": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "bad":
            return httpx.Response(404, text="no")
        reads["good"] += 1
        n = reads["good"]
        return httpx.Response(200, text=vllm_text(kv=0.1 * n, e2e=n * 2.0, finished=n))

    async def go() -> Sample | None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            sampler = ResourceSampler(
                ["http://good/metrics", "http://bad/metrics"], interval_s=0.05, client=client
            )
            async with sampler:
                await sampler.start()
                # Reads between the ends: wait for them (a loaded machine is slow), bounded.
                for _ in range(200):
                    if reads["good"] >= 3:
                        break
                    await asyncio.sleep(0.05)
                stats = await sampler.stop()
                assert stats is not None
                assert stats.samples == reads["good"] >= 4
                assert stats.scrape_errors == reads["good"]  # the bad URL failed each time
                assert "http://bad/metrics" in (stats.last_error or "")
                # A second level starts afresh.
                await sampler.start()
                again = await sampler.stop()
                assert again is not None and again.samples == 2
        return None

    asyncio.run(go())


def test_the_sampler_refuses_no_url_and_a_bad_interval() -> None:
    with pytest.raises(ValueError, match="no URL"):
        ResourceSampler([])
    with pytest.raises(ValueError, match="positive"):
        ResourceSampler(["http://x/metrics"], interval_s=0)


def _bench(url: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable, "-m", "vllm_operator.cli", "bench", "--endpoint", url,
            "--concurrency", "2", "--sweep-concurrencies", "2,6", "--duration", "3",
            "--prompt-tokens", "fixed:8", "--output-tokens", "fixed:10",
            "--output-dir", str(out), "--no-progress", "--seed", "3", *extra,
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_run_reads_the_servers_metrics_through_every_level(
    fake_server: ServerFactory, tmp_path: Path
) -> None:
    # Each request spends 0.1 + 9 x 0.02 = 0.28 s in the server: the closed loop keeps its
    # concurrency there (less the client's gap between one request's end and the next).
    server = fake_server(Config(ttft=Delay(value=0.1), itl=Delay(value=0.02), log=False))
    done = _bench(server.url, tmp_path, "--metrics-url", "server", "--metrics-interval", "0.25")
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((tmp_path / "results.json").read_text())
    by_concurrency = {lv["stats"]["concurrency"]: lv["resources"] for lv in data["levels"]}
    for concurrency, res in by_concurrency.items():
        print(f"concurrency {concurrency}: {res}")
        assert res["urls"] == 1 and res["scrape_errors"] == 0
        assert res["samples"] >= 8  # 3 s at 4 per second, and one at each end
        # Little's law from the server's own sums: the concurrency, less the client's gaps
        # and the level's ramp and drain (0.88 and 0.92 of it measured on 2 idle cores).
        assert 0.6 * concurrency <= res["running_mean"] <= concurrency + 0.01, res
        assert res["waiting_mean"] == 0
        assert res["kv_cache_usage_max"] <= concurrency / KV_REQUESTS
        assert res["nearest"] == "kv-cache"
    assert by_concurrency[6]["running_mean"] > by_concurrency[2]["running_max"]
    html = (tmp_path / "report.html").read_text()
    assert "Latency against resources" in html
    assert "<svg" in html.split("Latency against resources")[1]


def test_without_metrics_urls_nothing_is_read(fake_server: ServerFactory, tmp_path: Path) -> None:
    server = fake_server(Config(log=False))
    done = _bench(server.url, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((tmp_path / "results.json").read_text())
    assert [lv["resources"] for lv in data["levels"]] == [None, None]
    assert data["knee_resource"] is None
    assert "Latency against resources" not in (tmp_path / "report.html").read_text()


def test_a_bad_metrics_url_or_interval_is_a_usage_error(tmp_path: Path) -> None:
    done = _bench("http://127.0.0.1:9", tmp_path, "--metrics-url", "ftp://x")
    assert done.returncode == 2 and "--metrics-url" in done.stderr, done.stderr
    done = _bench("http://127.0.0.1:9", tmp_path, "--metrics-interval", "0")
    assert done.returncode == 2 and "--metrics-interval" in done.stderr, done.stderr


def test_a_metrics_url_that_fails_is_counted_and_the_run_goes_on(
    fake_server: ServerFactory, tmp_path: Path
) -> None:
    server = fake_server(Config(log=False))
    done = _bench(server.url, tmp_path, "--metrics-url", f"{server.url}/no-metrics-here")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Resources not read" in done.stdout and "404" in done.stdout, done.stdout
    data = json.loads((tmp_path / "results.json").read_text())
    for lv in data["levels"]:
        assert lv["stats"]["failed"] == 0
        res = lv["resources"]
        assert res["samples"] == 0 and res["scrape_errors"] >= 2 and res["nearest"] is None


def test_the_heat_map_colours_each_resource_and_outlines_the_knee() -> None:
    levels = []
    for rate, p99, kv, gpu in ((2, 0.03, 0.2, 0.3), (4, 0.035, 0.4, 0.55), (8, 0.06, 0.7, 0.8)):
        sat = {"kv-cache": kv, "gpu": gpu}
        levels.append(
            {
                "stats": {"rate_per_second": rate, "from_scheduled": {"ttft": {"p99": p99}}},
                "resources": {"saturation": sat, "nearest": "gpu"},
            }
        )
    data = {
        "levels": levels,
        "knee": {"load": 8, "unit": "req/s"},
        "knee_resource": {"resource": "gpu", "saturation": 0.8, "load": 8},
    }
    root = ElementTree.fromstring(resources_heatmap_svg(data))
    texts = [e.text for e in root.iter() if e.tag.endswith("text")]
    assert "GPU utilisation" in texts and "KV cache" in texts
    assert [t for t in texts if t and t.endswith(" ms")] == ["30 ms", "35 ms", "60 ms"]
    cells = [e for e in root.iter() if e.tag.endswith("rect") and e.get("fill") != "none"]
    assert len(cells) == 6  # two resources by three levels
    assert len({c.get("fill") for c in cells}) == 6  # each saturation its own colour
    [outline] = [e for e in root.iter() if e.tag.endswith("rect") and e.get("fill") == "none"]
    assert float(outline.get("x") or 0) > max(float(c.get("x") or 0) for c in cells[:4])
    assert any("nearest saturation GPU utilisation (80%)" in (t or "") for t in texts)
    assert resources_heatmap_svg({"levels": [{"stats": {}, "resources": None}]}) == ""
    # A knee no measured resource explains (a CPU vLLM: its bottleneck is the CPU) says so.
    data["knee_resource"] = {"resource": "queue", "saturation": 0.003, "load": 8}
    root = ElementTree.fromstring(resources_heatmap_svg(data))
    foot = [e.text or "" for e in root.iter() if (e.text or "").startswith("knee ")]
    assert foot == [
        "knee 8 req/s: no measured resource near saturation (nearest queue (waiting share), "
        "0%): the limit is one the metrics do not show (CPU, network, the client) in the "
        "outlined level"
    ]
