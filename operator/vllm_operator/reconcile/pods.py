"""Why the service's pods do not become ready, read from the pods and the Deployment.

Pure: the pods' container states and scheduling condition, the vLLM container's log tail
(the kubelet puts it in the terminated state's ``message``: the container's
``terminationMessagePolicy`` is ``FallbackToLogsOnError``, so no log request is made) and
the Deployment's ``Progressing`` condition become one ``PodProblem`` with a documented
reason (docs/troubleshooting.md). ``stalled``: no progress can come without a change (a
crash loop, an image that cannot be pulled, a progress deadline that passed); the other
problems are on their way to one or may clear by themselves (a node may be added, the
container restarts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from vllm_operator.models.base import Manifest
from vllm_operator.models.conditions import manifest_condition, pod_condition
from vllm_operator.render.deployment import CONTAINER


@dataclass(frozen=True)
class PodProblem:
    reason: str
    message: str
    stalled: bool


# What the log tail of a vLLM container that exited says, most specific first: (reason,
# what it means for the user, the lines that name it).
_CAUSES: list[tuple[str, str, re.Pattern[str]]] = [
    (
        "GPUOutOfMemory",
        "vLLM ran out of GPU memory; lower gpu-memory-utilization, max-num-seqs or "
        "max-model-len (spec.tuning.overrides), or give a replica more GPUs",
        re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory"),
    ),
    (
        "KVCacheDoesNotFit",
        "the KV cache left after the weights cannot hold the context asked for; lower "
        "max-model-len, raise gpu-memory-utilization, or give a replica more GPUs",
        re.compile(
            r"No available memory for the cache blocks|larger than the available KV cache"
            r"|KV cache is needed"
        ),
    ),
    (
        "ModelAccessDenied",
        "the model repository refused the download (a gated or private model): check "
        "spec.model.source.huggingFace.tokenSecretRef and that its token was granted access",
        re.compile(
            r"GatedRepoError|401 Client Error|403 Client Error|gated repo|Access to model .* "
            r"is restricted|Invalid credentials|Invalid user token",
            re.IGNORECASE,
        ),
    ),
    (
        "ModelNotFound",
        "the model was not found: check the repository id (spec.model.source.huggingFace."
        "repo) or the path in the image or volume",
        re.compile(
            r"RepositoryNotFoundError|404 Client Error|not a valid model identifier"
            r"|HFValidationError|Repo id must be in the form"
            r"|LocalEntryNotFoundError|outgoing traffic has been disabled"
            r"|Cannot find the requested files|does not appear to have a file named"
            r"|No such file or directory: '[^']*config\.json'"
        ),
    ),
    (
        "InvalidArgument",
        "the vLLM in the image refused an argument: the image may run another vLLM than "
        "status.tuning.vllmVersion says (set spec.vllmVersion), or an override is wrong",
        re.compile(
            r"unrecognized arguments:|error: argument --|: error: (?:invalid|the following)"
            r"|invalid choice:"
        ),
    ),
]

_PULL = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
# The kubelet retries these itself without a change only by backing off further.
_PULL_STALLED = {"ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
_CONFIG = {"CreateContainerConfigError"}
_CREATE = {"CreateContainerError", "RunContainerError", "StartError"}
_LINE = 300
_LOOPING = 2


def _line(text: str, pattern: re.Pattern[str] | None) -> str:
    """The log line that names the cause (else the last line), shortened."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return ""
    chosen = lines[-1]
    if pattern is not None:
        chosen = next((ln for ln in reversed(lines) if pattern.search(ln)), chosen)
    return chosen if len(chosen) <= _LINE else chosen[: _LINE - 3] + "..."


def _exited(
    pod: str, container: str, terminated: dict[str, Any], limit: str | None
) -> tuple[str, str]:
    """(reason, message) for a container that exited."""
    where = f"Pod {pod}, container {container}"
    if terminated.get("reason") == "OOMKilled":
        within = f" of {limit}" if limit else ""
        return (
            "OOMKilled",
            f"{where}: killed for using more than its memory limit{within} (host memory, "
            "not GPU memory). Raise spec.node.memory, or lower what vLLM keeps in host "
            "memory (swap-space, cpu-offload-gb, the CPU KV cache).",
        )
    log = str(terminated.get("message") or "")
    code = terminated.get("exitCode")
    for reason, meaning, pattern in _CAUSES:
        if pattern.search(log):
            return reason, f'{where} exited ({code}): {meaning}. Log: "{_line(log, pattern)}".'
    said = _line(log, None)
    tail = f' Last log line: "{said}".' if said else " It left no log."
    return "ContainerExited", f"{where} exited with code {code}.{tail}"


def _memory_limit(pod: Manifest, container: str) -> str | None:
    for c in pod.get("spec", {}).get("containers", []):
        if c.get("name") == container:
            limit = (c.get("resources") or {}).get("limits", {}).get("memory")
            return str(limit) if limit is not None else None
    return None


def _container_problem(pod: Manifest, status: dict[str, Any]) -> PodProblem | None:
    name = pod["metadata"]["name"]
    container = str(status.get("name"))
    state = status.get("state") or {}
    waiting = state.get("waiting") or {}
    why = waiting.get("reason")
    said = str(waiting.get("message") or "")[:_LINE]
    where = f"Pod {name}, container {container}"
    if why in _PULL:
        image = status.get("image") or "its image"
        return PodProblem(
            "ImagePullFailed",
            f"{where}: the image {image} cannot be pulled ({why}: {said or 'no detail'}). "
            "Check spec.image and that the node can reach its registry "
            "(spec.podTemplate.imagePullSecrets for credentials).",
            why in _PULL_STALLED,
        )
    if why in _CONFIG:
        return PodProblem("ContainerConfigError", f"{where}: {said or why}.", True)
    if why in _CREATE:
        return PodProblem("ContainerCreateFailed", f"{where}: {why}: {said or 'no detail'}.", False)
    terminated = state.get("terminated") or (status.get("lastState") or {}).get("terminated")
    if terminated is None or status.get("ready"):
        return None
    if state.get("running") and not status.get("restartCount"):
        return None
    reason, message = _exited(name, container, terminated, _memory_limit(pod, container))
    # Looping: backing off now, or restarted twice already and not ready (between two
    # back-offs the container runs again for a while; the service must not flap between
    # stalled and not).
    if why == "CrashLoopBackOff" or int(status.get("restartCount") or 0) >= _LOOPING:
        return PodProblem(reason, f"{message} It keeps crashing (CrashLoopBackOff).", True)
    return PodProblem(reason, f"{message} The kubelet restarts it.", False)


def unschedulable(pod: Manifest) -> str | None:
    """The scheduler's words on a pod it cannot place (PodScheduled False, Unschedulable),
    or None while it can; the pod problem and the rollout's stuck surge pod both read it."""
    scheduled = manifest_condition(pod, "PodScheduled") or {}
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        return str(scheduled.get("message") or "no node fits")
    return None


def _pod_problem(pod: Manifest) -> PodProblem | None:
    if (said := unschedulable(pod)) is not None:
        said = said[:_LINE]
        return PodProblem(
            "Unschedulable",
            f"Pod {pod['metadata']['name']} cannot be scheduled: {said}",
            False,
        )
    if pod_condition(pod, "Ready"):
        return None
    status = pod.get("status") or {}
    statuses = [*status.get("initContainerStatuses", []), *status.get("containerStatuses", [])]
    # The vLLM container first: its log tail names the cause.
    statuses.sort(key=lambda s: s.get("name") != CONTAINER)
    for container in statuses:
        found = _container_problem(pod, container)
        if found is not None:
            return found
    return None


def pod_problem(deployment: Manifest | None, pods: list[Manifest]) -> PodProblem | None:
    """Why the pods do not become ready, if a pod or the Deployment says; stalled ones
    first, then by pod name (so the same pods give the same answer)."""
    live = sorted(
        (p for p in pods if not p["metadata"].get("deletionTimestamp")),
        key=lambda p: str(p["metadata"]["name"]),
    )
    found = [f for f in map(_pod_problem, live) if f is not None]
    found.sort(key=lambda f: not f.stalled)
    first = found[0] if found else None
    progressing = manifest_condition(deployment or {}, "Progressing") or {}
    if progressing.get("reason") != "ProgressDeadlineExceeded":
        return first
    deadline = int((deployment or {}).get("spec", {}).get("progressDeadlineSeconds") or 0)
    passed = f"the Deployment made no progress for {deadline} s (ProgressDeadlineExceeded)"
    if first is not None:
        return PodProblem(first.reason, f"{first.message} And {passed}.", True)
    said = str(progressing.get("message") or "")[:_LINE]
    return PodProblem("ProgressDeadlineExceeded", f"{passed[0].upper()}{passed[1:]}: {said}", True)
