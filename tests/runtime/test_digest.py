"""Which InferenceService events lead to a reconcile."""

from __future__ import annotations

import copy
from typing import Any

from vllm_operator.runtime.dispatch import reconcile_relevant


def service() -> dict[str, Any]:
    return {
        "apiVersion": "inference.vllm-operator.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {
            "name": "s",
            "namespace": "n",
            "generation": 3,
            "resourceVersion": "100",
            "labels": {"team": "a"},
            "managedFields": [{"manager": "vllm-operator"}],
        },
        "spec": {"replicas": 2, "autoscaling": {"enabled": True}},
        "status": {
            "readyReplicas": 2,
            "conditions": [{"type": "Ready", "status": "True"}],
            "autoscaling": {"value": "0.5", "decision": "Steady"},
        },
    }


def test_the_autoscalers_own_status_writes_need_no_reconcile() -> None:
    before = service()
    after = copy.deepcopy(before)
    after["metadata"]["resourceVersion"] = "101"
    after["metadata"]["managedFields"].append({"manager": "vllm-operator-autoscaler"})
    after["status"]["autoscaling"] = {"value": "0.7", "decision": "ScaleDownHeld"}
    assert reconcile_relevant(after) == reconcile_relevant(before)


def test_every_other_change_does() -> None:
    before = reconcile_relevant(service())
    changes = [
        lambda b: b["spec"].update(replicas=3),  # the autoscaler's scale write lands here
        lambda b: b["metadata"]["labels"].update(team="b"),
        lambda b: b["metadata"].update(deletionTimestamp="2026-11-30T00:00:00Z"),
        lambda b: b["metadata"].update(generation=4),
        lambda b: b["status"].update(readyReplicas=1),
        lambda b: b["status"]["conditions"][0].update(status="False"),
    ]
    for change in changes:
        body = service()
        change(body)
        assert reconcile_relevant(body) != before
