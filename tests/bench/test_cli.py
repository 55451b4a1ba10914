"""``vllm-operator bench``: flags and spec files to one spec, outputs, exit codes."""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.fakes.openai_server import Config, Delay
from tests.bench.conftest import ServerFactory
from vllm_operator.bench.cli import (
    EXIT_ERRORS,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SLO,
    EXIT_USAGE,
    add_parser,
    compact_status,
    configure,
    main,
    parse_distribution,
    spec_from_args,
)
from vllm_operator.models.inference_benchmark import (
    InferenceBenchmarkSpec,
    InferenceBenchmarkStatus,
)


def flags(*argv: str) -> argparse.Namespace:
    return configure(argparse.ArgumentParser()).parse_args(list(argv))


def spec(*argv: str) -> InferenceBenchmarkSpec:
    return InferenceBenchmarkSpec.model_validate(spec_from_args(flags(*argv)))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("128", {"type": "Fixed", "value": 128}),
        ("fixed:64", {"type": "Fixed", "value": 64}),
        ("uniform:10-2000", {"type": "Uniform", "min": 10, "max": 2000}),
        ("normal:500,100", {"type": "Normal", "mean": 500, "stddev": 100}),
        (
            "lognormal:300,0.9,10,2000",
            {"type": "LogNormal", "median": 300, "sigma": 0.9, "min": 10, "max": 2000},
        ),
        (
            "buckets:1-127:40,128-255:60",
            {
                "type": "Buckets",
                "buckets": [
                    {"min": 1, "max": 127, "weight": 40.0},
                    {"min": 128, "max": 255, "weight": 60.0},
                ],
            },
        ),
    ],
    ids=["a bare number is fixed", "fixed", "uniform", "normal", "lognormal clamped", "buckets"],
)
def test_distribution_flags(text: str, expected: dict[str, Any]) -> None:
    assert parse_distribution(text) == expected


@pytest.mark.parametrize(
    "text", ["uniform:5", "normal:1", "zipf:3", "buckets:1-2"], ids=lambda t: f"{t} is refused"
)
def test_bad_distribution_flags(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="bad distribution"):
        parse_distribution(text)


def test_flags_build_the_spec_the_job_would_get() -> None:
    s = spec(
        "--endpoint", "http://x", "--prompt-tokens", "lognormal:300,0.9,10,2000",
        "--output-tokens", "uniform:50-1500", "--arrival", "pulse", "--rate", "4",
        "--pulse", "0.4,10,60", "--duration", "120", "--slo-ttft-ms", "500",
        "--api", "completions", "--seed", "9",
    )  # fmt: skip
    assert s.arrival.process == "Pulse" and s.arrival.rate_per_second == 4
    assert s.arrival.pulse is not None and s.arrival.pulse.fraction == 0.4
    assert s.duration_seconds == 120 and s.requests is None
    assert s.slo.ttft_p99_milliseconds == 500
    assert s.endpoint.api == "Completions" and s.seed == 9
    assert s.workload.prompt_tokens is not None and s.workload.prompt_tokens.type == "LogNormal"


def test_concurrency_alone_means_a_closed_loop_and_requests_default_to_100() -> None:
    s = spec("--endpoint", "http://x", "--concurrency", "8")
    assert s.arrival.process == "ClosedLoop" and s.arrival.concurrency == 8
    assert s.requests == 100


def test_sweep_and_search_flags() -> None:
    sweep = spec("--endpoint", "http://x", "--sweep-rates", "1,2,4", "--sweep-concurrencies", "8")
    assert sweep.mode == "Sweep" and sweep.sweep is not None
    assert sweep.sweep.rates_per_second == [1, 2, 4] and sweep.sweep.concurrencies == [8]
    search = spec("--endpoint", "http://x", "--search", "1,64", "--slo-ttft-ms", "200")
    assert search.mode == "Search" and search.search is not None
    assert (search.search.min_rate_per_second, search.search.max_rate_per_second) == (1, 64)


def test_an_open_loop_without_a_rate_is_refused() -> None:
    with pytest.raises(ValueError, match="needs --rate"):
        spec_from_args(flags("--endpoint", "http://x", "--arrival", "gamma"))


def test_the_subcommand_registers_on_the_top_level_cli() -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--endpoint", "http://x", "--rate", "3"])
    assert args.command == "bench" and args.rate == 3 and callable(args.func)


def test_compact_status_fits_the_termination_message() -> None:
    level = {
        "ratePerSecond": 1.0,
        "requests": 10,
        "buckets": [{"minPromptTokens": i, "maxPromptTokens": i, "requests": 1} for i in range(50)],
        "fromScheduled": {"ttft": {"p50": 1.0, "p99": 2.0}},
    }
    status = {"levels": [level] * 40, "headline": level, "kneeRatePerSecond": 3.0}
    text = compact_status(status)
    assert len(text.encode()) <= 4096
    parsed = json.loads(text)
    assert parsed["kneeRatePerSecond"] == 3.0 and parsed["headline"]["requests"] == 10
    InferenceBenchmarkStatus.model_validate(parsed)
    few = {**level, "buckets": level["buckets"][:3]}
    small = {"levels": [few], "headline": few}
    assert json.loads(compact_status(small)) == small


# --- running against the fake server -----------------------------------------------------


def svgs(html: str) -> list[ET.Element]:
    out = []
    start = 0
    while (i := html.find("<svg", start)) >= 0:
        j = html.index("</svg>", i) + len("</svg>")
        out.append(ET.fromstring(html[i:j]))  # well-formed XML, or this raises
        start = j
    return out


def test_a_sweep_writes_json_status_html_and_the_termination_message(
    fake_server: ServerFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = fake_server(Config(ttft=Delay(value=0.01), itl=Delay(value=0.002)))
    out = tmp_path / "out"
    log = tmp_path / "termination-log"
    code = main(
        [
            "--endpoint", server.url, "--prompt-tokens", "buckets:1-127:50,128-255:50",
            "--output-tokens", "4", "--sweep-rates", "10,20,40", "--requests", "30",
            "--slo-ttft-ms", "200", "--output-dir", str(out), "--termination-log", str(log),
            "--no-progress", "--lag-limit-ms", "100",
        ]
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert code == EXIT_OK
    assert "fake-model" in printed and "40 req/s" in printed
    results = json.loads((out / "results.json").read_text())
    assert [lv["stats"]["rate_per_second"] for lv in results["levels"]] == [10, 20, 40]
    assert all(len(lv["requests"]) == 30 for lv in results["levels"])
    assert results["tokenizer"] == "server"
    first = results["levels"][0]["requests"][0]
    assert first["prompt_tokens"] == first["prompt_tokens_planned"]  # exact prompt lengths
    status = InferenceBenchmarkStatus.model_validate_json((out / "status.json").read_text())
    assert len(status.levels) == 3 and status.headline is not None
    assert status.headline.rate_per_second == 40
    assert status.headline.from_scheduled is not None
    assert status.headline.from_scheduled.ttft is not None
    assert [b.min_prompt_tokens for b in status.headline.buckets] == [1, 128]
    InferenceBenchmarkStatus.model_validate_json(log.read_text())
    html = (out / "report.html").read_text()
    plots = svgs(html)
    assert len(plots) == 3  # latency vs load, per bucket, timeline
    assert "Latency from the scheduled send time vs load" in html


def test_an_endpoint_given_as_the_openai_clients_base_url_works(
    fake_server: ServerFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """http://host:8000/v1 (the OpenAI SDK's base_url) asked for /v1/v1/models: a 404."""
    server = fake_server(Config(ttft=Delay(value=0.001)))
    out = tmp_path / "out"
    code = main(
        [
            "--endpoint", server.url.rstrip("/") + "/v1/", "--concurrency", "2",
            "--requests", "4", "--prompt-tokens", "16", "--output-tokens", "4",
            "--output-dir", str(out), "--no-html", "--no-progress",
        ]
    )  # fmt: skip
    assert code == EXIT_OK, capsys.readouterr()
    results = json.loads((out / "results.json").read_text())
    assert results["endpoint"] == server.url.rstrip("/")
    assert [r["error"] for r in results["levels"][0]["requests"]] == [None] * 4


def test_the_spec_file_of_an_inference_benchmark_drives_the_run(
    fake_server: ServerFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = fake_server(Config(ttft=Delay(value=0.005)))
    manifest = {
        "apiVersion": "inference.vllm-operator.dev/v1alpha1",
        "kind": "InferenceBenchmark",
        "metadata": {"name": "b", "namespace": "default"},
        "spec": {
            "targetRef": {"name": "svc"},
            "workload": {
                "promptTokens": {"type": "Uniform", "min": 8, "max": 64},
                "outputTokens": {"type": "Fixed", "value": 3},
            },
            "arrival": {"process": "Gamma", "ratePerSecond": 30, "burstiness": 0.5},
            "requests": 20,
            "endpoint": {"api": "Completions"},
        },
    }
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(manifest))
    out = tmp_path / "out"
    argv = ["--spec-file", str(path), "--endpoint", server.url, "--model", "fake-model"]
    code = main([*argv, "--output-dir", str(out), "--no-html"])
    assert code == EXIT_OK, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    assert results["spec"]["arrival"]["process"] == "Gamma"
    assert results["levels"][0]["stats"]["completed"] == 20
    assert not (out / "report.html").exists()
    # Flags that describe the run conflict with the spec file.
    assert main([*argv, "--rate", "5"]) == EXIT_USAGE
    assert "--rate conflict with --spec-file" in capsys.readouterr().err


def test_an_unreachable_server_fails_before_any_level(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["--endpoint", "http://127.0.0.1:9", "--model", "m", "--rate", "1",
         "--output-dir", str(tmp_path)]
    )  # fmt: skip
    assert code == EXIT_FAILED
    assert "preflight request" in capsys.readouterr().err


def test_fail_on_slo_exits_3_when_the_headline_misses(
    fake_server: ServerFactory, tmp_path: Path
) -> None:
    server = fake_server(Config(ttft=Delay(value=0.03)))
    # The exit for errors is out of the way: on a busy machine a request can still be
    # waiting for its connection when its 10 ms TTFT deadline passes, and one never sent of
    # ten is 10 % of errors (exit 4). This test is about the SLO's exit.
    argv = [
        "--endpoint", server.url, "--rate", "20", "--requests", "10", "--output-tokens", "2",
        "--output-dir", str(tmp_path), "--no-html", "--no-progress", "--fail-on-slo",
        "--lag-limit-ms", "100", "--max-error-fraction", "1",
    ]  # fmt: skip
    assert main([*argv, "--slo-ttft-ms", "10"]) == EXIT_SLO
    assert main([*argv, "--slo-ttft-ms", "500"]) == EXIT_OK


def test_a_search_finds_the_highest_rate_that_meets_the_slo(
    fake_server: ServerFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An in-flight cap of 1 and 50 ms per request: ~20 req/s is the most that can meet a
    # 150 ms TTFT deadline; the search must stop between its passing and failing probes.
    server = fake_server(Config(ttft=Delay(value=0.05)))
    out = tmp_path / "out"
    code = main(
        [
            "--endpoint", server.url, "--output-tokens", "1", "--arrival", "constant",
            "--search", "5,80", "--max-probes", "6", "--duration", "2",
            "--slo-ttft-ms", "150", "--max-in-flight", "1", "--output-dir", str(out),
            "--no-progress", "--no-html", "--lag-limit-ms", "25",
        ]
    )  # fmt: skip
    assert code == EXIT_OK
    results = json.loads((out / "results.json").read_text())
    best = results["best_rate_per_second"]
    assert best is not None and 5 <= best < 25
    rates = [lv["stats"]["rate_per_second"] for lv in results["levels"]]
    assert rates[:3] == [5, 10, 20] and len(rates) <= 6
    assert "Highest rate meeting the SLO" in capsys.readouterr().out


# --- failing on errors (issue 21) ---------------------------------------------------------


def _errors_argv(server_url: str, out: Path, *extra: str) -> list[str]:
    return [
        "--endpoint", server_url, "--model", "fake-model", "--rate", "200", "--requests", "40",
        "--output-tokens", "2", "--prompt-tokens", "4", "--output-dir", str(out), "--no-html",
        "--no-progress", "--lag-limit-ms", "100", *extra,
    ]  # fmt: skip


def test_a_run_whose_requests_mostly_failed_exits_non_zero_and_says_why(
    fake_server: ServerFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 21: most requests failed and the exit status was 0 (without --fail-on-slo).
    Every second request answers HTTP 500: half of them errored, more than the default
    maxErrorFraction (0.05) allows."""
    server = fake_server(Config(fail_every=2))
    log = tmp_path / "termination-log"
    argv = _errors_argv(server.url, tmp_path / "out", "--termination-log", str(log))
    assert main(argv) == EXIT_ERRORS
    captured = capsys.readouterr()
    assert "more than maxErrorFraction 0.05 allows" in captured.err
    assert "HTTP500 20" in captured.err and "20 of 40 requests (50.0%)" in captured.err
    assert "Failed:" in captured.out
    report = json.loads(log.read_text())
    assert report["failure"]["reason"] == "TooManyRequestErrors"
    assert "HTTP500 20" in report["failure"]["message"]
    measured = {k: v for k, v in report.items() if k != "failure"}
    status = InferenceBenchmarkStatus.model_validate(measured)
    assert status.headline is not None and status.headline.errored == 20
    assert status.headline.unsent == 0 and status.headline.connections_opened is not None
    # The results are still written: the run is a record of what happened.
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["levels"][0]["stats"]["errored"] == 20


def test_the_error_threshold_is_the_users_to_set(
    fake_server: ServerFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A server each: the preflight is the first request, which must not be one that fails.
    out = tmp_path / "out"
    server = fake_server(Config(fail_every=2))
    assert main(_errors_argv(server.url, out, "--max-error-fraction", "0.6")) == EXIT_OK
    server = fake_server(Config(fail_every=2))
    assert main(_errors_argv(server.url, out, "--max-error-fraction", "0.4")) == EXIT_ERRORS
    assert "more than maxErrorFraction 0.4 allows" in capsys.readouterr().err


def test_a_few_errors_pass_the_default_threshold(
    fake_server: ServerFactory, tmp_path: Path
) -> None:
    # Every 25th generation request fails (the preflight is the first): 1 of 40 (2.5 %).
    server = fake_server(Config(fail_every=25))
    assert InferenceBenchmarkSpec.model_fields["max_error_fraction"].default == 0.05
    assert main(_errors_argv(server.url, tmp_path / "out")) == EXIT_OK
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["levels"][0]["stats"]["errored"] == 1


def test_the_error_threshold_reaches_the_spec_and_conflicts_with_a_spec_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = spec("--endpoint", "http://x", "--rate", "1", "--max-error-fraction", "0.2")
    assert s.max_error_fraction == 0.2
    assert spec("--endpoint", "http://x", "--rate", "1").max_error_fraction == 0.05
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec_from_args(flags("--endpoint", "http://x", "--rate", "1"))))
    argv = ["--spec-file", str(path), "--endpoint", "http://x", "--max-error-fraction", "1"]
    assert main(argv) == EXIT_USAGE
    assert "--max-error-fraction conflict with --spec-file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max-error-fraction", "1.5"),
        ("--max-error-fraction", "-0.1"),
        ("--max-error-fraction", "most"),
        ("--max-connections", "0"),
        ("--max-connections", "2.5"),
        ("--spin-ms", "11"),
        ("--spin-ms", "-1"),
    ],
    ids=lambda v: v,
)
def test_a_bad_value_exits_2_naming_the_flag(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--endpoint", "http://127.0.0.1:9", "--rate", "1", flag, value])
    assert exited.value.code == EXIT_USAGE
    assert f"argument {flag}" in capsys.readouterr().err


def test_the_connection_cap_flag_reaches_the_client(
    fake_server: ServerFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = fake_server(Config(ttft=Delay(value=0.02), log=False))
    out = tmp_path / "out"
    server.take_stats()
    argv = _errors_argv(server.url, out, "--max-connections", "2")
    assert main(argv) == EXIT_OK, capsys.readouterr().err
    assert server.take_stats()["generation_peak"] <= 2
    results = json.loads((out / "results.json").read_text())
    assert results["client"]["max_connections"] == 2
    assert results["levels"][0]["stats"]["max_connections"] == 2


def test_the_help_gives_the_default_connection_cap() -> None:
    from vllm_operator.bench.client import DEFAULT_MAX_CONNECTIONS

    text = configure(argparse.ArgumentParser()).format_help()
    assert f"default: {DEFAULT_MAX_CONNECTIONS}," in " ".join(text.split())


def test_compact_status_keeps_the_failure_whatever_it_drops() -> None:
    failure = {"reason": "TooManyRequestErrors", "message": "at 1 req/s, 9 of 10 requests"}
    huge = {"levels": [{"requests": 1, "errorsByKind": {"x" * 5000: 1}}], "failure": failure}
    huge["headline"] = {"requests": 1, "note": "y" * 5000}
    text = compact_status(huge)
    assert len(text.encode()) <= 4096
    assert json.loads(text)["failure"] == failure


def test_a_sweep_too_large_for_the_message_keeps_every_level_slimmed() -> None:
    """Issue 44: a three-level sweep with chaos phases lost its levels (and the headline's
    TTFT P99) to the 4 KiB termination message; the key numbers of each are kept now."""
    level = {
        "ratePerSecond": 2.0,
        "requests": 40,
        "succeeded": 40,
        "sloAttainment": 1.0,
        "clientSaturated": True,
        "scheduleLagP99Milliseconds": 20.0,
        "buckets": [{"minPromptTokens": i, "maxPromptTokens": i, "requests": 1} for i in range(8)],
        "fromScheduled": {
            "ttft": {"p50": 30.0, "p90": 50.0, "p99": 59.0, "max": 61.0},
            "e2e": {"p50": 300.0, "p99": 420.0},
            "tpot": {"p99": 9.0},
        },
        "fromSend": {"ttft": {"p50": 20.0, "p99": 40.0}},
        "errorsByKind": {"ttft-deadline": 0},
    }
    levels = [{**level, "ratePerSecond": r} for r in (2.0, 4.0, 8.0)]
    chaos = {"perturbation": "network", "ratePerSecond": 3.2, "verdict": "v" * 300,
             "baseline": level, "perturbed": level}  # fmt: skip
    status = {"levels": levels, "chaos": [chaos] * 3, "chaosNote": "n" * 100}
    # Too large even with every bucket dropped.
    unbucketed = [{k: v for k, v in lv.items() if k != "buckets"} for lv in levels]
    assert len(json.dumps({**status, "levels": unbucketed}).encode()) > 4096
    kept = json.loads(compact_status(status))
    assert [lv["ratePerSecond"] for lv in kept["levels"]] == [2.0, 4.0, 8.0]
    assert kept["levels"][0]["fromScheduled"] == {"ttft": {"p99": 59.0}, "e2e": {"p99": 420.0}}
    assert kept["levels"][0]["clientSaturated"] is True
    assert len(kept["chaos"]) == 3
    # The chaos phases keep the medians and tails the verdict compares (CI of d499962: the
    # CPU pinning e2e read the phases' TTFT from the send, and it was gone).
    phase = kept["chaos"][0]["perturbed"]
    assert phase["fromSend"]["ttft"] == {"p50": 20.0, "p99": 40.0}
    assert phase["fromScheduled"]["ttft"]["p90"] == 50.0
    InferenceBenchmarkStatus.model_validate(kept)
