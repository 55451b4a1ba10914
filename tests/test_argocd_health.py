"""The Argo CD health checks (deploy/argocd/health/*.lua), run by a real Lua 5.1
interpreter (lupa embeds PUC Lua; Argo CD runs gopher-lua, which follows Lua 5.1), on
status snapshots of every kind, and kstatus (sigs.k8s.io/cli-utils, what Flux and
`kubectl wait`-style tools read) on the same snapshots.

Each row states both verdicts. They must agree through the mapping
Healthy <-> Current, Progressing <-> InProgress, Degraded <-> Failed, except on the rows
marked ``differs``, which say why (kstatus calls an object without conditions Current,
and reads only its generic conditions and Ready).

The InferenceService snapshots are computed by the operator's own ``compute_status``, so
they are the statuses the operator really writes.

The same snapshots are the cases of Argo CD's layout of built-in checks
(deploy/argocd/resource_customizations/<group>/<Kind>/: health.lua, health_test.yaml,
testdata/), golden files here (UPDATE_GOLDEN=1 rewrites them), run as Argo CD's own test
runner reads them: each case's input through the kind's health.lua, its status and
message compared.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from lupa import lua51

from tests.specs import isvc, plan_for
from vllm_operator.constants import WARMED_UP_CONDITION
from vllm_operator.reconcile.phases import phase_conditions
from vllm_operator.reconcile.status import Observed, Problem, compute_status

REPO = Path(__file__).resolve().parents[1]
HEALTH = REPO / "deploy" / "argocd" / "health"


def _render_cm() -> Any:
    """deploy/argocd/render_cm.py, which installs the scripts: its SCRIPTS (kind → file
    name in health/) and LAYOUT (Argo CD's folder of built-in checks for our group)."""
    spec = importlib.util.spec_from_file_location("render_cm", HEALTH.parent / "render_cm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_RENDER_CM = _render_cm()
SCRIPTS: dict[str, str] = dict(_RENDER_CM.SCRIPTS)
LAYOUT: Path = _RENDER_CM.LAYOUT
GROUP = "inference.vllm-operator.dev/v1alpha1"
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
TO_KSTATUS = {"Healthy": "Current", "Progressing": "InProgress", "Degraded": "Failed"}


@dataclass(frozen=True)
class Snapshot:
    kind: str
    obj: dict[str, Any]
    argo: str
    kstatus: str
    differs: str | None = None


# --------------------------------------------------------------------------- helpers


def _cond(type_: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-11-29T12:00:00Z",
    }


def _obj(kind: str, generation: int, status: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": GROUP,
        "kind": kind,
        "metadata": {"name": "x", "generation": generation},
        "spec": {},
    }
    if kind != "GPUNode":
        body["metadata"]["namespace"] = "team-a"
    if status is not None:
        body["status"] = status
    return body


def _deployment(*, replicas: int, ready: int, updated: int | None = None) -> dict[str, Any]:
    return {
        "metadata": {"generation": 1},
        "status": {
            "observedGeneration": 1,
            "replicas": replicas,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "updatedReplicas": replicas if updated is None else updated,
        },
    }


def _pod(*, warmed: bool) -> dict[str, Any]:
    conds = [
        {"type": "ContainersReady", "status": "True"},
        {"type": "Ready", "status": "True" if warmed else "False"},
        {"type": WARMED_UP_CONDITION, "status": "True" if warmed else "False"},
    ]
    return {"metadata": {"name": "p"}, "status": {"conditions": conds}}


def _isvc(
    *,
    spec: dict[str, Any] | None = None,
    deployment: dict[str, Any] | None = None,
    pods: list[dict[str, Any]] | None = None,
    problems: list[Problem] | None = None,
    generation_ahead: int = 0,
) -> dict[str, Any]:
    """An InferenceService with the status the operator computes for this observation."""
    svc = isvc(**(spec if spec is not None else {"warmup": {"enabled": False}}))
    observed = Observed(
        tuning=plan_for(svc),
        desired_replicas=svc.spec.replicas,
        deployment=deployment,
        pods=pods or [],
        problems=problems or [],
    )
    status = compute_status(svc, observed, now=NOW).to_wire()
    body = _obj("InferenceService", (svc.metadata.generation or 1) + generation_ahead, status)
    body["metadata"]["name"] = svc.metadata.name
    return body


def _edit(body: dict[str, Any], **status: Any) -> dict[str, Any]:
    out = copy.deepcopy(body)
    out["status"].update(status)
    return out


_READY_SVC = _isvc(deployment=_deployment(replicas=1, ready=1))

_BENCH_CONDS = {
    "Pending": [
        _cond("Ready", "False", "Pending", "waiting for the target to be Ready"),
        _cond("Reconciling", "True", "Pending", "waiting for the target to be Ready"),
    ],
    "Running": [
        _cond("Ready", "False", "Running", "level 2 of 5"),
        _cond("Reconciling", "True", "Running", "level 2 of 5"),
    ],
    "Succeeded": [_cond("Ready", "True", "Succeeded", "5 levels measured")],
    "Failed": [
        _cond("Ready", "False", "JobFailed", "the load generator exited 1"),
        _cond("Stalled", "True", "JobFailed", "the load generator exited 1"),
    ],
}


def _phased(
    kind: str, phase: str, reason: str, message: str, *, extra: list[dict[str, Any]] = ()
) -> dict[str, Any]:
    """A phased kind's object as its reconcile writes it: Ready, Reconciling and Stalled
    from the phase (reconcile/phases.py), and ``extra`` conditions after them."""
    ready = phase in ("Ready", "Succeeded")
    stalled = phase == "Failed"
    reconciling = phase in ("Pending", "Running", "Downloading")
    conds = phase_conditions(
        reason, message, ready=ready, reconciling=reconciling, stalled=stalled, now=NOW,
        generation=1, previous=[],
    )  # fmt: skip
    wire = [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in conds]
    return _obj(kind, 1, {"observedGeneration": 1, "phase": phase, "conditions": [*wire, *extra]})


_GPU_OK = [
    _cond("Ready", "True", "InventoryRead", "read 2 GPU(s) through NVML"),
    _cond("PowerCapped", "False", "AtDefaultOrAbove"),
    _cond("LinkDegraded", "False", "AtMaximum"),
    _cond("ClocksThrottled", "False", "NotThrottled"),
]


def _gpu(*replace: dict[str, Any]) -> list[dict[str, Any]]:
    by_type = {c["type"]: c for c in _GPU_OK}
    for c in replace:
        by_type[c["type"]] = c
    return list(by_type.values())


_NO_CONDITIONS = "kstatus calls an object without any condition Current"
_GPU_FACT = "kstatus reads only Ready and the generic conditions; GPU faults are facts"

SNAPSHOTS: dict[str, Snapshot] = {
    # ---- InferenceService (statuses from compute_status)
    "a new service without status is progressing": Snapshot(
        "InferenceService",
        _obj("InferenceService", 1, None),
        "Progressing",
        "Current",
        differs=_NO_CONDITIONS,
    ),
    "a service whose Deployment does not exist yet is progressing": Snapshot(
        "InferenceService", _isvc(), "Progressing", "InProgress"
    ),
    "a service rolling out one of two replicas is progressing": Snapshot(
        "InferenceService",
        _isvc(
            spec={"warmup": {"enabled": False}, "replicas": 2},
            deployment=_deployment(replicas=2, ready=1),
        ),
        "Progressing",
        "InProgress",
    ),
    "a service with old replicas terminating is progressing": Snapshot(
        "InferenceService",
        _isvc(deployment=_deployment(replicas=2, ready=1, updated=1)),
        "Progressing",
        "InProgress",
    ),
    "a service warming up its pods is progressing": Snapshot(
        "InferenceService",
        _isvc(spec={}, deployment=_deployment(replicas=1, ready=0), pods=[_pod(warmed=False)]),
        "Progressing",
        "InProgress",
    ),
    "a service with every replica ready is healthy": Snapshot(
        "InferenceService", _READY_SVC, "Healthy", "Current"
    ),
    "a warmed-up service is healthy": Snapshot(
        "InferenceService",
        _isvc(spec={}, deployment=_deployment(replicas=1, ready=1), pods=[_pod(warmed=True)]),
        "Healthy",
        "Current",
    ),
    "a service scaled to zero is healthy": Snapshot(
        "InferenceService",
        _isvc(
            spec={"warmup": {"enabled": False}, "replicas": 0},
            deployment=_deployment(replicas=0, ready=0),
        ),
        "Healthy",
        "Current",
    ),
    "a service no node can hold is degraded": Snapshot(
        "InferenceService",
        _isvc(problems=[Problem("NoNodeHasEnoughGPUs", "A replica needs 16 GPUs on one node")]),
        "Degraded",
        "Failed",
    ),
    "a service naming a missing Secret is degraded": Snapshot(
        "InferenceService",
        _isvc(
            deployment=_deployment(replicas=1, ready=1),
            problems=[Problem("SecretNotFound", "Secret hf does not exist")],
        ),
        "Degraded",
        "Failed",
    ),
    "a ready service whose new generation is not observed yet is progressing": Snapshot(
        "InferenceService",
        _isvc(deployment=_deployment(replicas=1, ready=1), generation_ahead=1),
        "Progressing",
        "InProgress",
    ),
    "a stalled service whose fix is not observed yet is progressing": Snapshot(
        "InferenceService",
        _isvc(problems=[Problem("WeightsDoNotFit", "70B in 24 GiB")], generation_ahead=2),
        "Progressing",
        "InProgress",
    ),
    "a service with status but no conditions is progressing": Snapshot(
        "InferenceService",
        _edit(_READY_SVC, conditions=[]),
        "Progressing",
        "Current",
        differs=_NO_CONDITIONS,
    ),
    # ---- InferenceBenchmark
    "a benchmark without status is progressing": Snapshot(
        "InferenceBenchmark",
        _obj("InferenceBenchmark", 1, None),
        "Progressing",
        "Current",
        differs=_NO_CONDITIONS,
    ),
    "a pending benchmark is progressing": Snapshot(
        "InferenceBenchmark",
        _obj(
            "InferenceBenchmark",
            1,
            {"observedGeneration": 1, "phase": "Pending", "conditions": _BENCH_CONDS["Pending"]},
        ),
        "Progressing",
        "InProgress",
    ),
    "a running benchmark is progressing": Snapshot(
        "InferenceBenchmark",
        _obj(
            "InferenceBenchmark",
            1,
            {"observedGeneration": 1, "phase": "Running", "conditions": _BENCH_CONDS["Running"]},
        ),
        "Progressing",
        "InProgress",
    ),
    # A phase without the conditions (a status written before they were, or by hand):
    # the phase decides. Argo CD's own runner failed here on string.lower, which an
    # argocd-cm script does not get (test_the_sandbox_is_argo_cds_for_argocd_cm_scripts).
    "a running benchmark with a phase and no conditions yet is progressing": Snapshot(
        "InferenceBenchmark",
        _obj("InferenceBenchmark", 1, {"observedGeneration": 1, "phase": "Running"}),
        "Progressing",
        "Current",
        differs=_NO_CONDITIONS,
    ),
    "a succeeded benchmark is healthy": Snapshot(
        "InferenceBenchmark",
        _obj(
            "InferenceBenchmark",
            1,
            {
                "observedGeneration": 1,
                "phase": "Succeeded",
                "conditions": _BENCH_CONDS["Succeeded"],
            },
        ),
        "Healthy",
        "Current",
    ),
    "a failed benchmark is degraded": Snapshot(
        "InferenceBenchmark",
        _obj(
            "InferenceBenchmark",
            1,
            {"observedGeneration": 1, "phase": "Failed", "conditions": _BENCH_CONDS["Failed"]},
        ),
        "Degraded",
        "Failed",
    ),
    "a benchmark edited after it succeeded is progressing until observed": Snapshot(
        "InferenceBenchmark",
        _obj(
            "InferenceBenchmark",
            2,
            {
                "observedGeneration": 1,
                "phase": "Succeeded",
                "conditions": _BENCH_CONDS["Succeeded"],
            },
        ),
        "Progressing",
        "InProgress",
    ),
    "a failed benchmark with a phase but no Stalled condition is degraded": Snapshot(
        "InferenceBenchmark",
        _obj("InferenceBenchmark", 1, {"observedGeneration": 1, "phase": "Failed"}),
        "Degraded",
        "Current",
        differs="kstatus reads conditions, not phase: a benchmark must mirror Failed as "
        "Stalled=True for Flux to see it",
    ),
    # ---- ModelCache and InferenceTuning: conditions as their reconciles write them
    # (reconcile/phases.py), so the snapshots are the operator's own.
    "a model cache without status is progressing": Snapshot(
        "ModelCache", _obj("ModelCache", 1, None), "Progressing", "Current", differs=_NO_CONDITIONS
    ),
    "a downloading model cache is progressing": Snapshot(
        "ModelCache",
        _phased("ModelCache", "Downloading", "Downloading", "3.1 of 14.2 GiB"),
        "Progressing",
        "InProgress",
    ),
    "a model cache whose download finished is healthy": Snapshot(
        "ModelCache", _phased("ModelCache", "Ready", "Downloaded", "14.2 GiB"), "Healthy", "Current"
    ),
    "a model cache being deleted while services use it is progressing": Snapshot(
        "ModelCache",
        _phased("ModelCache", "Deleting", "InUse", "InferenceService chat serves from it"),
        "Progressing",
        "InProgress",
    ),
    "a model cache whose download failed is degraded": Snapshot(
        "ModelCache",
        _phased("ModelCache", "Failed", "GatedRepo", "the Hub refused the token"),
        "Degraded",
        "Failed",
    ),
    "a running tuning is progressing": Snapshot(
        "InferenceTuning",
        _phased("InferenceTuning", "Running", "Measuring", "trial 2 of 4"),
        "Progressing",
        "InProgress",
    ),
    "a succeeded tuning is healthy": Snapshot(
        "InferenceTuning",
        _phased("InferenceTuning", "Succeeded", "WinnerFound", "seqs-32: 100 % over"),
        "Healthy",
        "Current",
    ),
    "a succeeded tuning whose result went stale is healthy and says so": Snapshot(
        "InferenceTuning",
        _phased(
            "InferenceTuning",
            "Succeeded",
            "WinnerFound",
            "seqs-32: 100 % over",
            extra=[_cond("Stale", "True", "WorkloadChanged", "peakConcurrency 4 -> 9")],
        ),
        "Healthy",
        "Current",
    ),
    "a failed tuning is degraded": Snapshot(
        "InferenceTuning",
        _phased("InferenceTuning", "Failed", "TargetNotReady", "svc is not Ready"),
        "Degraded",
        "Failed",
    ),
    # ---- GPUNode
    "a GPU node the agent has not reported yet is progressing": Snapshot(
        "GPUNode", _obj("GPUNode", 1, None), "Progressing", "Current", differs=_NO_CONDITIONS
    ),
    "a GPU node with every GPU in order is healthy": Snapshot(
        "GPUNode",
        _obj("GPUNode", 1, {"observedGeneration": 1, "conditions": _gpu()}),
        "Healthy",
        "Current",
    ),
    "a GPU node whose power policy is not applied yet is progressing": Snapshot(
        "GPUNode",
        _obj("GPUNode", 3, {"observedGeneration": 2, "conditions": _gpu()}),
        "Progressing",
        "InProgress",
    ),
    "a GPU node capped by its own power policy is healthy": Snapshot(
        "GPUNode",
        _obj(
            "GPUNode",
            1,
            {
                "observedGeneration": 1,
                "conditions": _gpu(
                    _cond("PowerCapped", "True", "CappedByPowerPolicy", "GPU 0: limit 300 W")
                ),
            },
        ),
        "Healthy",
        "Current",
    ),
    "a GPU node with throttled clocks is healthy and says so": Snapshot(
        "GPUNode",
        _obj(
            "GPUNode",
            1,
            {
                "observedGeneration": 1,
                "conditions": _gpu(
                    _cond(
                        "ClocksThrottled", "True", "SwThermalSlowdown", "GPU 1: SwThermalSlowdown"
                    )
                ),
            },
        ),
        "Healthy",
        "Current",
    ),
    "a GPU node silently power capped is degraded": Snapshot(
        "GPUNode",
        _obj(
            "GPUNode",
            1,
            {
                "observedGeneration": 1,
                "conditions": _gpu(
                    _cond(
                        "PowerCapped",
                        "True",
                        "LimitBelowDefault",
                        "GPU 0 (RTX 4090): limit 300 W, default 450 W",
                    )
                ),
            },
        ),
        "Degraded",
        "Current",
        differs=_GPU_FACT,
    ),
    "a GPU node with a narrowed PCIe link is degraded": Snapshot(
        "GPUNode",
        _obj(
            "GPUNode",
            1,
            {
                "observedGeneration": 1,
                "conditions": _gpu(
                    _cond("LinkDegraded", "True", "PCIeWidthReduced", "GPU 0: x8 of x16")
                ),
            },
        ),
        "Degraded",
        "Current",
        differs=_GPU_FACT,
    ),
    "a GPU node whose NVML cannot be read is degraded": Snapshot(
        "GPUNode",
        _obj(
            "GPUNode",
            1,
            {
                "observedGeneration": 1,
                "conditions": [
                    _cond("Ready", "False", "NVMLUnavailable", "libnvidia-ml.so.1 not found")
                ],
            },
        ),
        "Degraded",
        "InProgress",
        differs="kstatus cannot tell a Ready=False that will pass from one that will not",
    ),
    "a GPU node reported stalled is degraded": Snapshot(
        "GPUNode",
        _obj(
            "GPUNode",
            1,
            {
                "observedGeneration": 1,
                "conditions": [
                    _cond("Stalled", "True", "PowerOutOfRange", "600 W is above the maximum 450 W"),
                    *_gpu(),
                ],
            },
        ),
        "Degraded",
        "Failed",
    ),
}


# --------------------------------------------------------------------------- runners


def _to_lua(runtime: Any, value: Any) -> Any:
    if isinstance(value, dict):
        return runtime.table_from({k: _to_lua(runtime, v) for k, v in value.items()})
    if isinstance(value, list):
        return runtime.table_from([_to_lua(runtime, v) for v in value])
    return value


# What Argo CD opens for a script from argocd-cm (util/lua/lua.go, runLua: useOpenLibs off
# unless the customization sets it): package, base, table and a safe os (time and date);
# no string or math library, and so no string methods either ("x"):lower() is an error,
# the string metatable coming from the string library). Its built-in scripts get them all.
_ARGOCD_CM_SANDBOX = """
local safe_os = { time = os.time, date = os.date }
debug.setmetatable("", nil)
string, math, io, coroutine, debug = nil, nil, nil, nil, nil
package.loaded.string, package.loaded.math, package.loaded.io = nil, nil, nil
package.loaded.coroutine, package.loaded.debug = nil, nil
os = safe_os
package.loaded.os = safe_os
"""


def _sandboxed(obj: dict[str, Any]) -> Any:
    """A Lua 5.1 with only what Argo CD gives an argocd-cm script, ``obj`` as its global."""
    runtime = lua51.LuaRuntime(unpack_returned_tuples=False)
    assert runtime.eval("_VERSION") == "Lua 5.1"
    runtime.execute(_ARGOCD_CM_SANDBOX)
    runtime.globals().obj = _to_lua(runtime, json.loads(json.dumps(obj)))
    return runtime


def argo_health(kind: str, obj: dict[str, Any]) -> tuple[str, str]:
    """(status, message) from the Lua script for ``kind``, as Argo CD runs it from
    argocd-cm: the object as the global ``obj``, the script's return value as the health."""
    runtime = _sandboxed(obj)
    result = runtime.execute((HEALTH / SCRIPTS[kind]).read_text())
    return str(result["status"]), str(result["message"])


@cache
def _kstatus_binary() -> str:
    proc = subprocess.run(
        ["bash", str(REPO / "tests" / "kstatus" / "build.sh")],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert proc.returncode == 0, f"building tests/kstatus failed:\n{proc.stderr}"
    return proc.stdout.strip().splitlines()[-1]


@cache
def _kstatus_all() -> dict[str, str]:
    names = list(SNAPSHOTS)
    proc = subprocess.run(
        [_kstatus_binary()],
        input=json.dumps([SNAPSHOTS[n].obj for n in names]),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return {n: v["status"] for n, v in zip(names, json.loads(proc.stdout), strict=True)}


# --------------------------------------------------------------------------- tests


def test_there_are_at_least_twenty_snapshots_over_every_kind_and_verdict() -> None:
    assert len(SNAPSHOTS) >= 20
    assert (
        {s.kind for s in SNAPSHOTS.values()}
        == set(SCRIPTS)
        == {
            "InferenceService",
            "InferenceBenchmark",
            "InferenceTuning",
            "ModelCache",
            "GPUNode",
        }
    )
    assert {s.argo for s in SNAPSHOTS.values()} == {"Healthy", "Progressing", "Degraded"}
    # Every case the issue names: progressing, healthy, degraded, stalled, stale generation.
    assert any("stalled" in n or "no node" in n for n in SNAPSHOTS)
    assert any("not observed yet" in n for n in SNAPSHOTS)


@pytest.mark.parametrize("name", list(SNAPSHOTS))
def test_the_argo_cd_health_check(name: str) -> None:
    snap = SNAPSHOTS[name]
    status, message = argo_health(snap.kind, snap.obj)
    assert status == snap.argo, message
    assert message  # Argo CD shows it beside the status


@pytest.mark.parametrize("name", list(SNAPSHOTS))
def test_kstatus_gives_the_matching_verdict(name: str) -> None:
    snap = SNAPSHOTS[name]
    got = _kstatus_all()[name]
    assert got == snap.kstatus
    if snap.differs is None:
        assert TO_KSTATUS[snap.argo] == got, "Argo CD and kstatus disagree"
    else:
        assert TO_KSTATUS[snap.argo] != got, f"no longer differs ({snap.differs}): unmark it"


def test_the_health_checks_use_only_lua_5_1() -> None:
    # Lua 5.2+ features gopher-lua does not have: goto, integer division, bit operators,
    # and the utf8 library.
    assert sorted(p.name for p in HEALTH.glob("*.lua")) == sorted(set(SCRIPTS.values()))
    for script in HEALTH.glob("*.lua"):
        text = script.read_text()
        for token in ("goto ", "//", " & ", " | ", "<<", ">>", "utf8."):
            assert token not in text.replace("-- ", "--"), f"{script.name} uses {token!r}"


def test_the_sandbox_is_argo_cds_for_argocd_cm_scripts() -> None:
    """What failed in a user's Argo CD passed with full Lua: string.lower (the
    InferenceBenchmark check called it until 2026-12-07). Here it fails, and so do the
    string methods and math; the base and table libraries and os.time remain."""
    runtime = _sandboxed({"status": {"phase": "Running"}})
    for script in (
        "return string.lower(obj.status.phase)",
        "return obj.status.phase:lower()",
        "return math.floor(1.5)",
    ):
        with pytest.raises(Exception, match=r"attempt to (index|call)"):
            runtime.execute(script)
    assert runtime.execute("return table.concat({'a', tostring(1)}, ' ') .. #obj.status.phase") == (
        "a 17"
    )
    assert runtime.execute("return type(os.time())") == "number"
    assert runtime.execute("return os.execute") is None


def test_a_broken_script_would_fail_these_tests() -> None:
    # The runner really executes the script: a status it cannot index raises, and a
    # script returning something else is seen as such.
    runtime = lua51.LuaRuntime()
    runtime.globals().obj = _to_lua(runtime, {"metadata": {}})
    result = runtime.execute('local hs = {} hs.status = "Healthy" hs.message = "x" return hs')
    assert result["status"] == "Healthy"
    with pytest.raises(Exception, match="attempt to index"):
        runtime.execute("return obj.status.conditions")


# --------------------------------------------------------------------------- Argo CD's layout


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _argo_cases() -> dict[str, str]:
    """Path under LAYOUT → text: each kind's health_test.yaml (Argo CD's format: a list of
    ``healthStatus`` and ``inputPath``) and its testdata/, from SNAPSHOTS and what the
    kind's script says of each (its status checked against the snapshot's first)."""
    files: dict[str, str] = {}
    tests: dict[str, list[dict[str, Any]]] = {}
    for name, snap in SNAPSHOTS.items():
        status, message = argo_health(snap.kind, snap.obj)
        assert status == snap.argo, (name, message)
        path = f"testdata/{_slug(name)}.yaml"
        files[f"{snap.kind}/{path}"] = yaml.safe_dump(snap.obj, sort_keys=False)
        tests.setdefault(snap.kind, []).append(
            {"healthStatus": {"status": status, "message": message}, "inputPath": path}
        )
    for kind, cases in tests.items():
        files[f"{kind}/health_test.yaml"] = yaml.safe_dump({"tests": cases}, sort_keys=False)
    return files


def _layout_files() -> dict[str, str]:
    return {
        p.relative_to(LAYOUT).as_posix(): p.read_text()
        for p in sorted(LAYOUT.glob("*/*.yaml")) + sorted(LAYOUT.glob("*/testdata/*.yaml"))
    }


def test_argo_cds_test_files_are_the_snapshots() -> None:
    want = _argo_cases()
    if os.environ.get("UPDATE_GOLDEN"):
        for name in set(_layout_files()) - set(want):
            (LAYOUT / name).unlink()
        for name, text in want.items():
            (LAYOUT / name).parent.mkdir(parents=True, exist_ok=True)
            (LAYOUT / name).write_text(text)
    got = _layout_files()
    assert sorted(got) == sorted(want), "run with UPDATE_GOLDEN=1 and review the diff"
    for name, text in want.items():
        assert got[name] == text, f"{name} is stale: run with UPDATE_GOLDEN=1"


def test_every_kind_has_argo_cds_layout() -> None:
    assert sorted(p.name for p in LAYOUT.iterdir()) == sorted(SCRIPTS)
    for kind in SCRIPTS:
        assert {p.name for p in (LAYOUT / kind).iterdir()} == {
            "health.lua",
            "health_test.yaml",
            "testdata",
        }, kind


@pytest.mark.parametrize("kind", sorted(SCRIPTS))
def test_the_layout_passes_as_argo_cds_test_runner_reads_it(kind: str) -> None:
    """What Argo CD's runner does with a health_test.yaml: every case's input through the
    folder's own health.lua (in the argocd-cm sandbox here: stricter than the built-in
    one), its status and message as the file says."""
    folder = LAYOUT / kind
    script = (folder / "health.lua").read_text()
    cases = yaml.safe_load((folder / "health_test.yaml").read_text())["tests"]
    assert cases
    for case in cases:
        obj = yaml.safe_load((folder / case["inputPath"]).read_text())
        result = _sandboxed(obj).execute(script)
        got = {"status": str(result["status"]), "message": str(result["message"])}
        assert got == case["healthStatus"], case["inputPath"]
