"""What the operator reads back from its Jobs (warmup, benchmark load): whether one has
finished, and the report its last pod left as the termination message."""

from __future__ import annotations

import json
from typing import Any, Final, Literal

from vllm_operator.k8s.api import ClusterAPI
from vllm_operator.models.base import Manifest

JobState = Literal["Running", "Succeeded", "Failed"]
# The label the Job controller puts on a Job's pods.
JOB_NAME_LABEL: Final = "batch.kubernetes.io/job-name"


def job_state(job: Manifest) -> JobState:
    """Finished or not, from the Job's conditions (the success/failure targets count too)."""
    for cond in job.get("status", {}).get("conditions", []):
        if cond.get("status") == "True" and cond.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "Succeeded"
        if cond.get("status") == "True" and cond.get("type") in ("Failed", "FailureTarget"):
            return "Failed"
    return "Running"


async def job_report(api: ClusterAPI, ns: str, job_name: str) -> dict[str, Any]:
    """The report of the Job's pods (:func:`report_of`), listed."""
    return report_of(await api.list("v1", "Pod", ns, label_selector=job_pods_selector(job_name)))


def report_of(pods: list[Manifest]) -> dict[str, Any]:
    """The JSON report the Job's latest pod left as its termination message; a message
    that is not JSON comes back as ``{"message": ...}``, none as ``{}``."""
    by_age = sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp", ""))
    for pod in reversed(by_age):
        for status in pod.get("status", {}).get("containerStatuses", []):
            message = status.get("state", {}).get("terminated", {}).get("message")
            if message:
                try:
                    report: dict[str, Any] = json.loads(message)
                except ValueError:
                    return {"message": message.strip()[:500]}
                return report
    return {}


def job_pods_selector(job_name: str) -> str:
    """The label selector of a Job's pods."""
    return f"{JOB_NAME_LABEL}={job_name}"
