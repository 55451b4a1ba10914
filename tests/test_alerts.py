"""The chart's alerts (templates/alerts.yaml) under Prometheus' own tools: `promtool check
rules` parses every expression, and `promtool test rules` fires each rule from synthetic
series and checks its labels and annotations, with a series beside it that must not fire.

promtool comes from Debian's prometheus package (scripts/promtool.sh; `make test` and
`make test-unit` pass its path in PROMTOOL, and then a missing one fails the tests).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from devenv.ci import skip_or_fail
from tests.test_chart import render

REPO = Path(__file__).resolve().parents[1]


def _promtool() -> str:
    given = os.environ.get("PROMTOOL")
    if given is not None:
        assert given and os.access(given, os.X_OK), f"PROMTOOL={given!r} is not a program"
        return given
    found = shutil.which("promtool") or next(
        (str(p) for p in sorted(Path.home().glob(".cache/vllm-operator/bin/promtool-*/promtool"))),
        None,
    )
    if found is None:
        skip_or_fail("no promtool: make promtool (scripts/promtool.sh) fetches it")
    return found


def _rules(values: dict[str, str] | None = None) -> dict[str, Any]:
    docs = render({"alerts.enabled": "true", **(values or {})})
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    return {"groups": rule["spec"]["groups"]}


def _alerts(rules: dict[str, Any]) -> list[str]:
    return [r["alert"] for g in rules["groups"] for r in g["rules"]]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_promtool(), *args], capture_output=True, text=True, timeout=120)


def test_no_rule_without_alerts_enabled_and_each_rule_has_its_switch() -> None:
    assert not [d for d in render() if d["kind"] == "PrometheusRule"]
    every = _alerts(_rules())
    assert len(every) == 9
    left = _alerts(_rules({"alerts.rules.kvCacheFull.enabled": "false"}))
    assert left == [a for a in every if a != "VllmKVCacheFull"]


def test_every_expression_parses_with_prometheus_own_parser(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(_rules()))
    proc = _run("check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 9 rules found" in proc.stdout


SVC = 'namespace="team", inference_service="chat"'
OTHER = 'namespace="team", inference_service="idle"'


def cond(condition: str, reason: str, who: str = SVC) -> str:
    """kube-state-metrics' series of one InferenceService condition."""
    return (
        "vllm_operator_inferenceservice_status_condition"
        f'{{condition="{condition}", reason="{reason}", {who}}}'
    )


def gpunode(node: str, condition: str, reason: str) -> str:
    labels = f'node="{node}", condition="{condition}", reason="{reason}"'
    return f"vllm_operator_gpunode_status_condition{{{labels}}}"


def _case(series: list[tuple[str, str]], at: str, alert: str, fired: list[dict[str, Any]]) -> Any:
    return {
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series],
        "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": fired}],
    }


def _fired(labels: dict[str, str], summary: str, description: str) -> dict[str, Any]:
    return {
        "exp_labels": labels,
        "exp_annotations": {"summary": summary, "description": description},
    }


CASES = [
    _case(
        [
            (cond("Ready", "RollingOut"), "0x10"),
            # The reason changes mid-outage: still one outage.
            (cond("Ready", "WarmingUp"), "_x10 0x10"),
            (cond("Ready", "AllReplicasReady", OTHER), "1x20"),
        ],
        "17m", "InferenceServiceNotReady",
        [_fired({"severity": "warning", "namespace": "team", "inference_service": "chat"},
                "InferenceService team/chat is not Ready",
                "Ready has been False for 15m. kubectl describe vis -n team chat shows the "
                "reason; docs/troubleshooting.md explains it.")],
    ),
    _case(
        [(cond("Stalled", "InvalidArgument"), "1x10"),
         (cond("Stalled", "NoProblems", OTHER), "0x10")],
        "6m", "InferenceServiceStalled",
        [_fired({"severity": "warning", "condition": "Stalled", "reason": "InvalidArgument",
                 "namespace": "team", "inference_service": "chat"},
                "InferenceService team/chat is stalled (InvalidArgument)",
                "Stalled=True: nothing changes until the spec, a Secret or PVC, the nodes or "
                "the pods' cause does. docs/troubleshooting.md, reason InvalidArgument.")],
    ),
    _case(
        [(cond("WarmedUp", "WarmupFailed"), "0x15"),
         (cond("WarmedUp", "WarmingUp", OTHER), "0x15")],
        "11m", "InferenceServiceWarmupFailed",
        [_fired({"severity": "warning", "condition": "WarmedUp", "reason": "WarmupFailed",
                 "namespace": "team", "inference_service": "chat"},
                "Warmup failed in InferenceService team/chat",
                "A pod failed its warmup and stays out of the Service; the WarmedUp "
                "condition's message has the warmup report's reason.")],
    ),
    _case(
        [("vllm_operator_reconcile_total{kind=\"InferenceService\", result=\"error\"}", "0+6x40"),
         ("vllm_operator_reconcile_total{kind=\"InferenceBenchmark\", result=\"error\"}", "3x40")],
        "30m", "VllmOperatorReconcileErrors",
        [_fired({"severity": "warning", "kind": "InferenceService"},
                "vllm-operator reconciles of InferenceService keep failing",
                "Reconciles end in an error the operator does not retry by itself (100m/s): "
                "read the operator's log.")],
    ),
    _case(
        [("vllm_operator_reconcile_total{kind=\"InferenceService\", result=\"ok\"}", "1x20")],
        "11m", "VllmOperatorAbsent",
        [_fired({"severity": "critical"}, "vllm-operator is down or not scraped",
                "No series of the operator for 10m: its pod is not running, or its "
                "ServiceMonitor (metrics.serviceMonitor) does not reach it. Nothing is "
                "reconciled meanwhile.")],
    ),
    _case(
        [("vllm_operator_queue_depth", "0x20")], "15m", "VllmOperatorAbsent", [],
    ),
    _case(
        [("vllm:kv_cache_usage_perc{pod=\"chat-0\", " + SVC + "}", "0.97x20"),
         ("vllm:kv_cache_usage_perc{pod=\"chat-1\", " + SVC + "}", "0.5x20")],
        "16m", "VllmKVCacheFull",
        [_fired({"severity": "warning", "pod": "chat-0", "namespace": "team",
                 "inference_service": "chat"},
                "KV cache of chat-0 (team/chat) is 97% full",
                "Above 0.95 for 15m: requests are preempted or wait. Add replicas "
                "(spec.replicas, spec.autoscaling) or lower max-num-seqs.")],
    ),
    _case(
        [("vllm:num_requests_waiting{pod=\"chat-0\", " + SVC + "}", "6x15"),
         ("vllm:num_requests_waiting{pod=\"chat-1\", " + SVC + "}", "6x15"),
         ("vllm:num_requests_waiting{pod=\"idle-0\", " + OTHER + "}", "6x15")],
        "11m", "VllmRequestsWaiting",
        [_fired({"severity": "warning", "namespace": "team", "inference_service": "chat"},
                "12 requests wait in InferenceService team/chat",
                "More than 10 requests have waited for a batch slot for 10m: the replicas "
                "are full.")],
    ),
    _case(
        [
            # chat: half its requests slower than 0.5 s; idle: 1 in 1000 (within budget).
            ("vllm:time_to_first_token_seconds_bucket{le=\"0.5\", " + SVC + "}", "0+50x70"),
            ("vllm:time_to_first_token_seconds_count{" + SVC + "}", "0+100x70"),
            ("vllm:time_to_first_token_seconds_bucket{le=\"0.5\", " + OTHER + "}", "0+999x70"),
            ("vllm:time_to_first_token_seconds_count{" + OTHER + "}", "0+1000x70"),
        ],
        "65m", "VllmTTFTBudgetBurn",
        [_fired({"severity": "critical", "namespace": "team", "inference_service": "chat"},
                "InferenceService team/chat burns its TTFT error budget 14.4x too fast",
                "Over the last hour and the last 5 minutes, the share of requests that "
                "waited longer than 0.5 s for their first token was more than 14.4 times the "
                "error budget of an objective of 0.99.")],
    ),
    _case(
        [(gpunode("gpu-1", "PowerCapped", "LimitBelowDefault"), "1x20"),
         (gpunode("gpu-2", "ClocksThrottled", "HwSlowdown"), "1x20")],
        "16m", "GPUNodeDegraded",
        [_fired({"severity": "warning", "node": "gpu-1", "condition": "PowerCapped",
                 "reason": "LimitBelowDefault"},
                "GPUNode gpu-1 is PowerCapped (LimitBelowDefault)",
                "A power limit below the default, or a GPU link below its best, costs "
                "throughput: kubectl get gpunode gpu-1 -o yaml.")],
    ),
]  # fmt: skip


def test_each_rule_fires_on_its_series_and_not_beside_them(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_rules()))
    tests = tmp_path / "tests.yaml"
    tests.write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "tests": CASES}))
    tested = {t["alert_rule_test"][0]["alertname"] for t in CASES}
    assert tested == set(_alerts(_rules())), "every alert has a case"
    proc = _run("test", "rules", str(tests))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _headings_by_anchor(markdown: str) -> dict[str, str]:
    """The headings of ``markdown`` by the anchor a source host (GitHub's rule) gives
    them: lower case, every character but letters, digits, spaces, hyphens and
    underscores dropped, spaces turned into hyphens."""
    headings = {}
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            headings[re.sub(r"[^\w\- ]", "", title).replace(" ", "-")] = line
    return headings


# What each alert's section of docs/troubleshooting.md is about, in its heading.
SECTION_WORDS = {
    "InferenceServiceNotReady": "`Ready=False`",
    "InferenceServiceStalled": "`Stalled=True`",
    "InferenceServiceWarmupFailed": "`WarmedUp`",
    "VllmOperatorReconcileErrors": "The operator itself",
    "VllmOperatorAbsent": "The operator itself",
    "VllmKVCacheFull": "`VllmKVCacheFull`",
    "VllmRequestsWaiting": "`VllmRequestsWaiting`",
    "VllmTTFTBudgetBurn": "`VllmTTFTBudgetBurn`",
    "GPUNodeDegraded": "GPUNode",
}


def test_each_alert_points_at_its_section_of_the_troubleshooting_guide() -> None:
    base = "https://docs.example.com/vllm-operator/troubleshooting"
    every = [r for g in _rules({"alerts.runbookURL": base})["groups"] for r in g["rules"]]
    assert len(every) == 9
    headings = _headings_by_anchor((REPO / "docs" / "troubleshooting.md").read_text())
    for rule in every:
        url = rule["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page == base and anchor in headings, (rule["alert"], url)
        section = headings[anchor]
        assert section.startswith("## "), (rule["alert"], section)
        assert SECTION_WORDS[rule["alert"]] in section, (rule["alert"], section)
    # Without the value, no rule carries a runbook_url (there is no address to point at).
    assert not [
        r for g in _rules()["groups"] for r in g["rules"] if "runbook_url" in r["annotations"]
    ]
