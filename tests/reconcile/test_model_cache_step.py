"""The ModelCache's decision (``next_step``) as a table: an observation in, the step out
(status, objects to apply and delete, finalizer, when to look again), with no fake API."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.reconcile.test_model_cache import CACHE, NOW, SETTINGS
from vllm_operator.constants import DOWNLOAD_REASON_REPO_NOT_FOUND
from vllm_operator.models import ModelCache, ModelCacheStatus
from vllm_operator.models.base import Manifest
from vllm_operator.reconcile.model_cache import (
    DOWNLOAD_POLL_SECONDS,
    PENDING_POLL_SECONDS,
    Observed,
    next_step,
)
from vllm_operator.reconcile.steps import Ref

CLAIM: Manifest = {
    "apiVersion": "v1",
    "kind": "PersistentVolumeClaim",
    "metadata": {"name": "tiny-weights"},
    "spec": {"resources": {"requests": {"storage": "1Gi"}}},
}
JOB_REF = Ref("batch/v1", "Job", "tiny-download", "team-a")


def _cache(retain: bool = False) -> ModelCache:
    body = copy.deepcopy(CACHE)
    body["spec"]["storage"]["retain"] = retain
    return ModelCache.model_validate(body)


def _job(state: str | None) -> Manifest:
    status = {"conditions": [{"type": state, "status": "True"}]} if state else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "tiny-download"},
        "status": status,
    }


def _pod(phase: str, report: dict[str, Any] | None = None) -> Manifest:
    status: dict[str, Any] = {"phase": phase, "podIP": "10.0.0.7"}
    if report is not None:
        message = json.dumps(report)
        status["containerStatuses"] = [{"state": {"terminated": {"message": message}}}]
    return {
        "metadata": {"name": "tiny-download-x", "creationTimestamp": "2026-12-02T08:00:00Z"},
        "status": status,
    }


@dataclass(frozen=True)
class Row:
    observed: Observed
    phase: str | None  # None: no status written
    reason: str | None
    requeue: float | None
    applied: list[str] = field(default_factory=list)
    deleted: list[Ref] = field(default_factory=list)
    finalizer: bool | None = None
    retain: bool = False


DOWNLOADING = {"phase": "Downloading", "bytesDownloaded": 1 << 20, "bytesTotal": 4 << 20}
DONE = {"commit": "abc123", "bytesTotal": 4 << 20, "filesTotal": 6}
OURS = {"finalized": True}
ROWS = {
    "a new cache gets our finalizer, its claim and the download Job": Row(
        Observed(), "Pending", "DownloadStarting", PENDING_POLL_SECONDS,
        applied=["PersistentVolumeClaim/tiny-weights", "Job/tiny-download"], finalizer=True,
    ),
    "a running download puts its pod's progress into status": Row(
        Observed(claim=CLAIM, job=_job(None), job_pods=[_pod("Running")], progress=DOWNLOADING,
                 **OURS),
        "Downloading", "Downloading", DOWNLOAD_POLL_SECONDS,
    ),
    "a finished download is Ready with its commit": Row(
        Observed(claim=CLAIM, job=_job("Complete"), job_pods=[_pod("Succeeded", DONE)], **OURS),
        "Ready", "Downloaded", None,
    ),
    "a download that failed for good is Failed with the Job's reason": Row(
        Observed(
            claim=CLAIM,
            job=_job("Failed"),
            job_pods=[_pod("Failed", {"reason": DOWNLOAD_REASON_REPO_NOT_FOUND, "message": "no"})],
            **OURS,
        ),
        "Failed", DOWNLOAD_REASON_REPO_NOT_FOUND, None,
    ),
    "a finished Job whose pod is gone is run again to check the files": Row(
        Observed(claim=CLAIM, job=_job("Complete"), **OURS),
        "Pending", "Rechecking", PENDING_POLL_SECONDS, deleted=[JOB_REF],
    ),
    "a claim deleted by hand is made again and the old Job goes": Row(
        Observed(job=_job(None), **OURS),
        "Pending", "ClaimCreated", PENDING_POLL_SECONDS,
        applied=["PersistentVolumeClaim/tiny-weights"], deleted=[JOB_REF],
    ),
    "a cache in use waits to be deleted, and says by whom": Row(
        Observed(deleting=True, users=["chat"], **OURS), "Deleting", "InUse", None,
    ),
    "a cache no one uses goes: our finalizer comes off": Row(
        Observed(deleting=True, **OURS), None, None, None, finalizer=False,
    ),
    "a retained claim loses its owner before the cache goes": Row(
        Observed(deleting=True, claim=CLAIM, **OURS), None, None, None,
        applied=["PersistentVolumeClaim/tiny-weights"], finalizer=False, retain=True,
    ),
}  # fmt: skip


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_next_step(row: Row) -> None:
    step = next_step(_cache(row.retain), row.observed, NOW, settings=SETTINGS)
    assert [f"{m['kind']}/{m['metadata']['name']}" for m in step.apply] == row.applied
    assert list(step.delete) == row.deleted
    assert (step.finalizer, step.requeue) == (row.finalizer, row.requeue)
    if row.phase is None:
        assert step.status is None and step.events == ()
        return
    assert step.status is not None and step.status.phase == row.phase
    ready = next(c for c in step.status.conditions if c.type == "Ready")
    assert ready.reason == row.reason
    assert [(e.reason, e.warning) for e in step.events] == [(row.reason, row.phase == "Failed")]


def test_a_retained_claim_keeps_its_size_and_drops_its_owner() -> None:
    step = next_step(
        _cache(retain=True), Observed(deleting=True, claim=CLAIM), NOW, settings=SETTINGS
    )
    (claim,) = step.apply
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert "ownerReferences" not in claim["metadata"]
    assert step.finalizer is None  # not ours to remove


def test_progress_and_the_commit_reach_the_status() -> None:
    seen = Observed(claim=CLAIM, job=_job(None), job_pods=[_pod("Running")], progress=DOWNLOADING)
    running = next_step(_cache(), seen, NOW, settings=SETTINGS)
    assert running.status is not None
    assert (running.status.bytes_downloaded, running.status.bytes_total) == (1 << 20, 4 << 20)
    assert "(1.0 MiB of 4.0 MiB, 25 %)" in running.status.conditions[0].message
    stored = ModelCacheStatus(phase="Downloading")
    pods = [_pod("Succeeded", DONE)]
    seen = Observed(stored=stored, claim=CLAIM, job=_job("Complete"), job_pods=pods)
    done = next_step(_cache(), seen, NOW, settings=SETTINGS)
    assert done.status is not None
    assert (done.status.commit, done.status.completion_time) == ("abc123", NOW)
