"""The scale benchmark's pure parts (devenv/scale.py): Prometheus text to counter gains,
the nodes file it generates, and the medians and ratios of its report. The benchmark
itself runs a cluster (``make bench-scale``) and is no test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devenv import scale
from devenv.cluster import nodes as fake_nodes

OPERATOR_BEFORE = """\
# HELP vllm_operator_api_requests_total Requests the operator's reconcilers sent.
# TYPE vllm_operator_api_requests_total counter
vllm_operator_api_requests_total{resource="pods",verb="GET"} 10.0
vllm_operator_api_requests_total{resource="deployments",verb="PATCH"} 4.0
# HELP vllm_operator_api_requests_created Requests the operator's reconcilers sent.
# TYPE vllm_operator_api_requests_created gauge
vllm_operator_api_requests_created{resource="pods",verb="GET"} 1.7e+09
# HELP vllm_operator_reconcile_total Reconciles by kind and result.
# TYPE vllm_operator_reconcile_total counter
vllm_operator_reconcile_total{kind="InferenceService",result="ok"} 5.0
# HELP vllm_operator_queue_depth Objects waiting to be reconciled.
# TYPE vllm_operator_queue_depth gauge
vllm_operator_queue_depth 3.0
"""
OPERATOR_AFTER = """\
vllm_operator_api_requests_total{resource="pods",verb="GET"} 16.0
vllm_operator_api_requests_total{resource="deployments",verb="PATCH"} 4.0
vllm_operator_api_requests_total{resource="inferenceservices/status",verb="PATCH"} 2.0
vllm_operator_reconcile_total{kind="InferenceService",result="ok"} 8.0
vllm_operator_reconcile_total{kind="InferenceService",result="retry"} 1.0
vllm_operator_reconcile_total{kind="InferenceBenchmark",result="ok"} 7.0
vllm_operator_queue_depth 0.0
"""
NAMES = (scale.REQUESTS, scale.RECONCILES, scale.QUEUE_DEPTH)


def test_only_the_named_samples_are_read_and_created_timestamps_are_not() -> None:
    counters = scale.parse_counters(OPERATOR_BEFORE, NAMES)
    assert counters == {
        (scale.REQUESTS, (("resource", "pods"), ("verb", "GET"))): 10.0,
        (scale.REQUESTS, (("resource", "deployments"), ("verb", "PATCH"))): 4.0,
        (scale.RECONCILES, (("kind", "InferenceService"), ("result", "ok"))): 5.0,
        (scale.QUEUE_DEPTH, ()): 3.0,
    }
    assert scale.gauge(counters, scale.QUEUE_DEPTH) == 3.0
    assert scale.gauge(counters, "vllm_operator_absent") is None


def test_the_gain_between_two_scrapes_counts_new_samples_whole_and_drops_unchanged_ones() -> None:
    before = scale.parse_counters(OPERATOR_BEFORE, NAMES)
    after = scale.parse_counters(OPERATOR_AFTER, NAMES)
    w = scale.window(before, after, 12.345)
    assert w == {
        "seconds": 12.35,
        "requests": {"GET pods": 6.0, "PATCH inferenceservices/status": 2.0},
        # Only the InferenceService reconciles: the benchmark kind is not counted.
        "reconciles": {"ok": 3.0, "retry": 1.0},
    }


def test_the_apiservers_lists_are_summed_over_codes_and_told_apart_by_scope() -> None:
    text = """\
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1"} 3
apiserver_request_total{code="429",component="apiserver",dry_run="",group="",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1"} 1
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"} 9
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="GET",version="v1"} 50
apiserver_request_duration_seconds_bucket{le="0.1",resource="pods",verb="GET"} 50
"""  # noqa: E501
    counters = scale.parse_counters(text, (scale.APISERVER_REQUESTS,))
    w = scale.window({}, {}, 1.0, counters)
    assert w["apiserver_lists"] == {"nodes cluster": 4.0, "pods namespace": 9.0}


def test_the_nodes_file_loads_as_gpu_nodes_of_one_known_product_and_a_cpu_node(
    tmp_path: Path,
) -> None:
    path = tmp_path / "nodes.yaml"
    scale.write_nodes_file(path, nodes=20, gpus_per_node=16, services=2000)
    shapes = fake_nodes.load_shapes(path)
    gpu = [s for s in shapes if s.gpu is not None]
    assert len(shapes) == 21 and len(gpu) == 20
    assert {s.gpu.product_label for s in gpu if s.gpu} == {scale.GPU_LABEL}
    assert sum(s.gpu.count for s in gpu if s.gpu) == 320
    # 2,000 services on 20 nodes: room for 100 pods on each, twice over.
    assert {s.pods for s in gpu} == {200}
    node = fake_nodes.render_node(gpu[0])
    assert node["metadata"]["labels"][fake_nodes.LABEL_GPU_PRODUCT] == "NVIDIA-L4"
    assert node["status"]["allocatable"][fake_nodes.GPU_RESOURCE] == "16"


def test_the_product_is_one_the_tuner_knows_with_its_memory() -> None:
    from vllm_operator.tuning.gpus import match_product

    model = match_product(scale.GPU_PRODUCT, scale.GPU_MEMORY_MIB)
    assert model is not None and model.name == "L4"


def _window(requests: dict[str, float], reconciles: float, **extra: Any) -> dict[str, Any]:
    return {"seconds": 1.0, "requests": requests, "reconciles": {"ok": reconciles}, **extra}


def _runs() -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    for repeat, (raw_s, op_s) in enumerate([(10.0, 40.0), (12.0, 30.0), (11.0, 50.0)], 1):
        runs.append({"kind": "raw", "services": 100, "repeat": repeat, "seconds": raw_s})
        runs.append(
            {
                "kind": "children",
                "services": 100,
                "repeat": repeat,
                "seconds": raw_s * 2,
                "rejected_writes": {"PUT endpointslices 422": 10.0 * repeat},
            }
        )
        runs.append(
            {
                "kind": "operator",
                "services": 100,
                "repeat": repeat,
                "seconds": op_s,
                "rollin": _window({"GET pods": 300.0, "PATCH deployments": 100.0 * repeat}, 200),
                "steady": _window(
                    {"GET inferenceservices": 100.0 * repeat},
                    100,
                    apiserver_lists={"nodes cluster": 1.0, "pods namespace": 100.0},
                    overlapped=repeat == 3,
                ),
            }
        )
    return runs


def test_the_summary_gives_the_medians_and_the_ratio_of_the_medians() -> None:
    [entry] = scale.summarise(_runs())
    assert entry["raw_median_s"] == 11.0
    assert entry["operator_median_s"] == 40.0
    assert entry["ratio"] == pytest.approx(40.0 / 11.0)
    assert entry["ratios"] == pytest.approx([4.0, 2.5, 50.0 / 11.0])
    rollin, steady = entry["rollin"], entry["steady"]
    # Requests per reconcile of the repeats: 400/200, 500/200, 600/200.
    assert rollin["requests_per_reconcile"] == 2.5
    assert rollin["reconciles_per_service"] == 2.0
    assert rollin["requests_by_kind_per_service"] == {"GET pods": 3.0, "PATCH deployments": 2.0}
    assert steady["requests_per_service"] == 2.0
    assert steady["reconciles_per_service"] == 1.0
    assert steady["cluster_lists"] == {"nodes cluster": 1.0}
    assert steady["overlapped"] == 1
    # The children alone took twice the raw time in each repeat: the operator's time
    # against theirs is what the operator itself adds.
    assert entry["children_median_s"] == 22.0
    assert entry["children_ratio"] == 2.0
    assert entry["ratio_to_children"] == pytest.approx(40.0 / 22.0)
    assert entry["rejected_writes"] == {
        "raw": {},
        "children": {"PUT endpointslices 422": 20.0},
        "operator": {},
    }


def test_a_size_that_stopped_early_has_no_ratio_rather_than_a_wrong_one() -> None:
    runs = [{"kind": "raw", "services": 500, "repeat": 1, "seconds": 30.0}]
    [entry] = scale.summarise(runs)
    assert entry["raw_median_s"] == 30.0
    assert entry["operator_median_s"] is None and entry["ratio"] is None
    assert entry["children_median_s"] is None and entry["ratio_to_children"] is None


def test_the_markdown_report_fits_100_columns_and_names_the_fake_nodes_gpus() -> None:
    report = {
        "date": "2026-12-02 10:00 UTC",
        "machine": {"nproc": 2, "memory_gib": 23.5, "loadavg_start": "0.10 0.20 0.30"},
        "operator_tree": {"path": "/tmp/vop-before", "commit": "01a6171bdf9e1609", "dirty": False},
        "settings": {
            "nodes": 200,
            "gpus_per_node": 16,
            "resync_seconds": 60,
            "workers": None,
            "concurrency": 16,
            "repeats": 3,
        },
        "runs": _runs(),
        "summary": scale.summarise(_runs()),
        "error": "timed out after 1800 s waiting for 500 InferenceServices Ready: 12 ready; "
        "not Ready by reason: {'Progressing': 488} and a long tail to wrap around",
    }
    text = scale.markdown(report)
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "200 kwok fake nodes of 16 x NVIDIA L4 each" in text
    assert "| 100 | 11.0 | 22.0 | 40.0 | 3.64 | 1.82 | 2.50 | 2.00 |" in text
    assert "| 100 | 1 | 10.0 | 20.0 | 40.0 | 4.00 |" in text
    assert "- 100 services, children: PUT endpointslices 422 20" in text
    assert "| 100 | GET pods | 3.00 | - |" in text
    assert "**Stopped early**: timed out" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--services", "0"], "sizes must be positive"),
        (["--services", "2x"], "not a comma list"),
        (["--services", "100", "--nodes", "5", "--gpus-per-node", "16"], "the nodes have 80"),
        (["--operator-tree", "/nonexistent"], "has no operator/vllm_operator"),
    ],
    ids=["a size of zero", "a size that is no number", "100 services do not fit on 80 GPUs",
         "a tree without the operator"],
)  # fmt: skip
def test_options_that_cannot_work_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        scale.parse_options(argv)
    assert message in capsys.readouterr().err


def test_the_default_options_are_the_issues_sizes_and_2000_services_fit() -> None:
    opts = scale.parse_options([])
    assert opts.services == (200, 500) and opts.repeats == 3
    assert (opts.nodes, opts.gpus_per_node, opts.resync_seconds) == (200, 16, 60)
    assert opts.workers is None and opts.operator_tree == scale.REPO
    assert scale.parse_options(["--services", "200,2000"]).services == (200, 2000)


def test_cpu_time_is_read_after_a_command_name_with_spaces_and_parentheses() -> None:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    # utime stime ...
    stat = "4242 (python (x) y) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 3 0"
    assert scale.cpu_seconds(stat, 100) == 3.0
    assert scale.cpu_gained({"operator": 5.0, "apiserver": 9.0}, {"operator": 3.0}) == {
        "operator": 2.0
    }


def _applied() -> list[dict[str, Any]]:
    """A Deployment, Service and PDB as the apiserver returns what the operator applied
    for service s-00000 (abridged)."""
    label = {"inference.vllm-operator.dev/inference-service": "s-00000"}
    meta = {
        "namespace": "scale-op-500-1",
        "labels": {**label, "app.kubernetes.io/instance": "s-00000"},
        "uid": "u",
        "resourceVersion": "15",
        "creationTimestamp": "2026-12-05T00:06:59Z",
        "generation": 1,
        "managedFields": [{"manager": "vllm-operator"}],
        "ownerReferences": [{"kind": "InferenceService", "name": "s-00000", "uid": "o"}],
    }
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                **meta,
                "name": "s-00000",
                "annotations": {"deployment.kubernetes.io/revision": "1"},
            },
            "spec": {
                "selector": {"matchLabels": label},
                "template": {
                    "metadata": {"labels": label},
                    "spec": {"containers": [{"args": ["--served-model-name", "s-00000"]}]},
                },
            },
            "status": {"availableReplicas": 1},
        },
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {**meta, "name": "s-00000"},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": label}},
            "status": {"currentHealthy": 1},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {**meta, "name": "s-00000"},
            "spec": {
                "clusterIP": "198.18.141.185",
                "clusterIPs": ["198.18.141.185"],
                "selector": label,
                "ports": [{"port": 8000}],
            },
        },
    ]


def test_the_children_are_what_the_operator_applied_without_what_the_cluster_added() -> None:
    template = scale.children_template(_applied())
    # In the operator's order: the Service and budget, then the workload.
    assert [o["kind"] for o in template] == ["Service", "PodDisruptionBudget", "Deployment"]
    for obj in template:
        assert "status" not in obj
        assert set(obj["metadata"]) == {"namespace", "labels", "name"}
    assert "clusterIP" not in template[0]["spec"] and "clusterIPs" not in template[0]["spec"]
    # The input is left as it was.
    assert _applied()[0]["metadata"]["annotations"]


def test_a_copy_of_the_children_is_renamed_and_hidden_from_the_operators_watches() -> None:
    template = scale.children_template(_applied())
    service, budget, deployment = scale.children_of(template, "s-00000", "c-00042", "ns-x")
    key = scale.CHILDREN_LABEL_PREFIX + "inference-service"
    for obj in (service, budget, deployment):
        assert obj["metadata"]["name"] == "c-00042" and obj["metadata"]["namespace"] == "ns-x"
        # None of the operator's label keys is left: its watches select on them.
        assert obj["metadata"]["labels"] == {
            key: "c-00042",
            "app.kubernetes.io/instance": "c-00042",
        }
    assert service["spec"]["selector"] == {key: "c-00042"}
    assert budget["spec"]["selector"] == {"matchLabels": {key: "c-00042"}}
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["labels"] == {key: "c-00042"}
    assert pod["spec"]["containers"][0]["args"] == ["--served-model-name", "c-00042"]
    # A name that is only part of a string is not one to rename.
    assert scale.children_of(
        [{"kind": "ConfigMap", "metadata": {"name": "s-00000"}, "data": {"a": "xs-00000y"}}],
        "s-00000", "c-1", "ns",
    )[0]["data"] == {"a": "xs-00000y"}  # fmt: skip


def test_only_writes_refused_as_invalid_or_forbidden_count_as_rejected() -> None:
    text = "\n".join(
        f'apiserver_request_total{{code="{code}",resource="{res}",verb="{verb}"}} {n}'
        for verb, res, code, n in [
            ("PUT", "endpointslices", "422", 7),
            ("PUT", "endpoints", "422", 3),
            ("POST", "pods", "403", 2),
            ("PUT", "deployments", "409", 5),  # a race, retried: not rejected
            ("GET", "services", "404", 9),  # a read
            ("LIST", "pods", "422", 1),  # a read, however it ended
            ("PATCH", "pods", "200", 4),
        ]
    )
    counters = scale.parse_counters(text + "\n", (scale.APISERVER_REQUESTS,))
    assert scale.rejected_writes(counters) == {
        "POST pods 403": 2.0,
        "PUT endpoints 422": 3.0,
        "PUT endpointslices 422": 7.0,
    }
