"""``vllm-operator render``: every object the operator would apply for an InferenceService,
planned for a GPU shape, offline (as ``helm template`` does for a chart).

Examples::

    vllm-operator render -f isvc.yaml --gpu L40S
    vllm-operator render -f isvc.yaml --gpu H100-80GB --count 8 --interconnect nvlink
    vllm-operator render -f isvc.yaml --gpu-node gpunode.yaml -o json | kubectl diff -f -

The GPUs are given as to ``vllm-operator tune``: a product and count (``--gpu``,
``--count``, ``--interconnect``, ``--gpu-memory``) or a GPUNode manifest whose status the
node agent wrote (``--gpu-node``), and the network between nodes for a model no single node
holds. The objects are the reconcile's own (reconcile/preview.py runs its plan and decide
steps on a snapshot of nodes of that shape): the Service, the PodDisruptionBudget, the
HorizontalPodAutoscaler in autoscaling mode HPA, and the Deployment, or the
LeaderWorkerSet of a multi-node plan. A service served from a ModelCache needs the
ModelCache in the same file; it is assumed downloaded. InferenceTunings in the same file,
or given with ``--tuning`` (``kubectl get itune NAME -o yaml``), are taken as the
namespace's: the measured result the service would take from them (an in-place trial,
spec.tuning.measuredRef, spec.autoApply) is rendered, and the header says which, or why
none is applied. ``--measurements FILE`` (the records measured tuning runs kept: a list, or
the ``vllm-operator-measurements`` ConfigMap) is taken as the operator's store: the plan
learns from the records of its shape as the operator's does (docs/measurements.md).

What depends on the live cluster takes what a first apply would get, and the output's
header says what was assumed. ownerReferences are left out: the operator's own apply
makes each object owned by the InferenceService's uid, which only the cluster gives.

``-o yaml`` (the default) is a stream of documents, each object under comment lines with
the plan's reasons; ``-o json`` a List that ``kubectl apply -f -`` takes. Nothing is
written and nothing is contacted. Exit status: 0 rendered, 1 nothing fits (the tuner's
reason on stderr), 2 bad input (the flag, file or field named on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final, TextIO

from pydantic import ValidationError

from vllm_operator.cli_inputs import (
    InputError,
    add_gpu_arguments,
    gpu_node,
    gpu_profile,
    network_labels,
    read_documents,
    read_measurements,
    read_service,
    read_yaml,
    refusal,
)
from vllm_operator.constants import (
    GPU_RESOURCE,
    KIND_INFERENCE_TUNING,
    KIND_MODEL_CACHE,
    NODE_LABEL_GPU_COUNT,
    NODE_LABEL_GPU_INTERCONNECT,
    NODE_LABEL_GPU_MEMORY_MIB,
    NODE_LABEL_GPU_PRODUCT,
)
from vllm_operator.models import InferenceService
from vllm_operator.models.base import Manifest, field_errors
from vllm_operator.models.inference_service import EffectiveTuning
from vllm_operator.models.model_cache import ModelCache
from vllm_operator.reconcile.cache_use import cache_name_of
from vllm_operator.reconcile.preview import Preview, assume_downloaded, first_apply
from vllm_operator.render.lws import KIND as LWS_KIND
from vllm_operator.render.yaml import dump
from vllm_operator.settings import OperatorSettings
from vllm_operator.tuning.gpus import GPUProfile

__all__ = ["add_parser", "configure", "main", "run_from_args"]

EXIT_OK: Final = 0
EXIT_DOES_NOT_FIT: Final = 1
EXIT_USAGE: Final = 2

# The node the GPU flags describe, as the snapshot names it (copies of it for a group of
# several nodes are named -2, -3, ...).
NODE_NAME: Final = "gpu-node"
WORKLOADS: Final = ("Deployment", LWS_KIND)
_WIDTH: Final = 100
_MIB: Final = 1024**2


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``render``'s arguments to ``parser``."""
    parser.add_argument(
        "--service",
        "-f",
        metavar="FILE",
        required=True,
        help="an InferenceService manifest (with the ModelCache it names, if any)",
    )
    add_gpu_arguments(parser)
    parser.add_argument(
        "-n",
        "--namespace",
        help="the namespace of the objects when the manifest names none (default: none "
        "written, so kubectl uses its context's)",
    )
    parser.add_argument(
        "--default-image",
        help="the serving image of a service that names none (default: the operator's, "
        "VLLM_OPERATOR_DEFAULT_IMAGE)",
    )
    parser.add_argument(
        "--tuning",
        metavar="FILE",
        action="append",
        default=[],
        help="InferenceTunings (as kubectl get -o yaml prints them) to take as the "
        "namespace's: the measured result the service would take is rendered; repeatable "
        "(InferenceTunings in the --service file count too)",
    )
    parser.add_argument(
        "--measurements",
        metavar="FILE",
        help="measured records (a list, or the vllm-operator-measurements ConfigMap as "
        "kubectl get -o yaml prints it): the plan learns from those of its shape, as the "
        "operator's does from the ConfigMap",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=["yaml", "json"],
        default="yaml",
        help="yaml (default: documents, each under its reasons as comments) or json (a List)",
    )
    parser.set_defaults(func=run_from_args)
    return parser


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``render`` on a parent CLI's ``add_subparsers()`` object."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "render",
        help="Print every object the operator would apply for an InferenceService, offline.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return configure(parser)


# --- inputs ---------------------------------------------------------------------------------


def _service(args: argparse.Namespace) -> InferenceService:
    isvc = read_service(args.service)
    given = isvc.metadata.namespace
    if args.namespace and given and args.namespace != given:
        # kubectl refuses the same mismatch: the file's namespace is part of the object.
        raise InputError(
            f"{args.service}: metadata.namespace {given} differs from --namespace {args.namespace}"
        )
    if args.namespace and not given:
        meta = isvc.metadata.model_copy(update={"namespace": args.namespace})
        isvc = isvc.model_copy(update={"metadata": meta})
    return isvc


def _cache(args: argparse.Namespace, isvc: InferenceService) -> Manifest | None:
    """The ModelCache the service names, from the same file, as downloaded; None when it
    names none."""
    name = cache_name_of(isvc)
    if name is None:
        return None
    found = [
        d
        for d in read_documents(args.service)
        if isinstance(d, dict)
        and d.get("kind") == KIND_MODEL_CACHE
        and (d.get("metadata") or {}).get("name") == name
    ]
    if not found:
        raise InputError(
            f"{args.service}: spec.model.source.cache names ModelCache {name}, which the file "
            "does not hold; give its manifest in the same file (render assumes its download "
            "finished, and serves from the claim it names)"
        )
    try:
        ModelCache.model_validate(found[0])
    except ValidationError as exc:
        why = field_errors(exc)
        raise InputError(f"{args.service}: ModelCache {name} is invalid: {why}") from None
    return assume_downloaded(found[0])


def _items(doc: Any) -> list[Any]:
    """A document's objects: a List's items, or the document itself."""
    if isinstance(doc, dict) and doc.get("kind") == "List":
        items = doc.get("items")
        return list(items) if isinstance(items, list) else []
    return [doc]


def _tunings(args: argparse.Namespace, isvc: InferenceService) -> list[Manifest]:
    """The InferenceTunings of the service file and of each ``--tuning`` file (a List's
    items too), each taken as in the service's namespace. A ``--tuning`` file that holds
    none is refused: the preview would silently apply nothing."""
    found: list[Manifest] = []
    for path in [args.service, *args.tuning]:
        here = [
            item
            for doc in read_documents(path)
            for item in _items(doc)
            if isinstance(item, dict) and item.get("kind") == KIND_INFERENCE_TUNING
        ]
        if not here and path != args.service:
            raise InputError(f"--tuning {path}: the file holds no InferenceTuning")
        for item in here:
            meta = item.get("metadata")
            if not isinstance(meta, dict) or not meta.get("name"):
                raise InputError(f"{path}: an InferenceTuning without metadata.name")
            found.append({**item, "metadata": {**meta, "namespace": isvc.metadata.namespace}})
    return found


def _interconnect(profile: GPUProfile) -> str | None:
    """The interconnect label of a node with these GPUs: nvlink, or the topology kind of
    its slowest pair (pcie for a host bridge, as the agent writes it)."""
    worst = profile.worst_link(range(profile.count))
    if worst is None:
        return None
    if worst == "NVLink":
        return "nvlink"
    return "pcie" if worst == "PHB" else worst.lower()


def _node(args: argparse.Namespace, profile: GPUProfile) -> tuple[Manifest, Manifest | None]:
    """The Node the GPU flags describe, labelled as GPU Feature Discovery and the node
    agent label one, with its GPUs allocatable; and its GPUNode for ``--gpu-node``."""
    node = gpu_node(args)
    raw: Manifest | None = None
    name = NODE_NAME
    if node is not None:
        raw = read_yaml(args.gpu_node, "GPUNode")
        name = node.metadata.name
    labels = {
        NODE_LABEL_GPU_PRODUCT: profile.product,
        NODE_LABEL_GPU_COUNT: str(profile.count),
        NODE_LABEL_GPU_MEMORY_MIB: str(profile.memory_bytes // _MIB),
        **network_labels(args),
    }
    interconnect = _interconnect(profile)
    if interconnect is not None:
        labels[NODE_LABEL_GPU_INTERCONNECT] = interconnect
    manifest: Manifest = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {GPU_RESOURCE: str(profile.count)}},
    }
    return manifest, raw


def _settings(args: argparse.Namespace) -> OperatorSettings:
    overrides = {"default_image": args.default_image} if args.default_image else {}
    try:
        return OperatorSettings(**overrides)
    except ValidationError as exc:
        raise InputError(f"invalid operator settings: {field_errors(exc)}") from None


def render(args: argparse.Namespace) -> tuple[Preview, GPUProfile]:
    """The first apply of the service in ``args`` on nodes of the shape in ``args``."""
    isvc = _service(args)
    cache = _cache(args, isvc)
    tunings = _tunings(args, isvc)
    profile = gpu_profile(args)
    node, raw = _node(args, profile)
    preview = first_apply(
        isvc,
        node,
        gpu_node=raw,
        cache=cache,
        tunings=tunings,
        measurements=read_measurements(args.measurements) if args.measurements else None,
        settings=_settings(args),
        now=datetime.now(UTC).replace(microsecond=0),
    )
    return preview, profile


# --- output ---------------------------------------------------------------------------------


def objects(preview: Preview) -> list[Manifest]:
    """The children in apply order, as a file to apply by hand would hold them: without
    the owner reference (the service's uid is the cluster's to give) and without a
    namespace where the manifest named none."""
    uid = preview.service.metadata.uid
    result: list[Manifest] = []
    for child in preview.decision.children:
        meta = {
            key: value
            for key, value in child["metadata"].items()
            if not (key == "namespace" and value is None)
        }
        owners = [o for o in meta.pop("ownerReferences", []) if o.get("uid") != uid]
        if owners:  # pragma: no cover - every child of the reconcile is owned by the service
            meta["ownerReferences"] = owners
        result.append({**child, "metadata": meta})
    return result


def _wrap(text: str, indent: str = "", more: str = "  ") -> list[str]:
    return textwrap.wrap(
        text,
        width=_WIDTH,
        initial_indent=indent,
        subsequent_indent=indent + more,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [indent]


def _header(preview: Preview, profile: GPUProfile, args: argparse.Namespace) -> list[str]:
    isvc = preview.service
    ns = isvc.metadata.namespace
    where = f"{ns}/{isvc.metadata.name}" if ns else isvc.metadata.name
    lines = _wrap(
        f"vllm-operator render: InferenceService {where}: what the operator applies, in order"
    )
    lines += _wrap(f"GPUs: {profile.describe()} per node", more="    ")
    lines += ["assumed (nothing was read from a cluster):"]
    for said in preview.assumed:
        lines += _wrap(f"- {said}", "  ")
    lines += _wrap(
        "- Secrets and claims the spec names exist; warmup Jobs come one per pod once its "
        "server answers, none before",
        "  ",
    )
    lines += _wrap(
        "- ownerReferences: left out. The operator's own apply makes each object owned "
        "(controller) by the InferenceService's uid, the cluster's to give, so that garbage "
        "collection deletes it with the service. An object applied with a reference to a "
        "uid no object has would be deleted; without one, kubectl diff shows no change there",
        "  ",
    )
    if not ns:
        lines += _wrap(
            "- namespace: none given (metadata.namespace or -n), none written: kubectl "
            "uses its context's",
            "  ",
        )
    return lines


def _tuning_lines(tuning: EffectiveTuning, image: str) -> list[str]:
    planned = "the tuner" if tuning.planned_by == "Tuner" else "the spec alone (not planned)"
    lines = _wrap(
        f"vLLM {tuning.vllm_version or '?'} ({image}), planned by {planned}: "
        f"{tuning.gpus_per_replica or 1} GPU(s) per replica"
    )
    lines += ["vLLM arguments (after the operator's own: model, host, port, served name):"]
    for a in tuning.arguments:
        lines += _wrap(f"--{a.name} {a.value} [{a.source}]: {a.reason}", "  ", "    ")
    if tuning.environment:
        lines += ["environment:"]
        for e in tuning.environment:
            lines += _wrap(f"{e.name}={e.value} [{e.source}]: {e.reason}", "  ", "    ")
    if tuning.notes:
        lines += ["notes:"]
        for note in tuning.notes:
            lines += _wrap(f"- {note}", "  ")
    return lines


def _object_lines(preview: Preview, obj: Manifest) -> list[str]:
    kind, name = obj["kind"], obj["metadata"]["name"]
    lines = [f"{kind} {name}"]
    if kind in WORKLOADS:
        lines += _tuning_lines(preview.decision.tuning, preview.image)
    elif kind == "HorizontalPodAutoscaler":
        lines += _wrap("spec.autoscaling.mode HPA: the cluster's metrics adapter serves the metric")
    return lines


def write_yaml(
    preview: Preview, profile: GPUProfile, args: argparse.Namespace, out: TextIO
) -> None:
    print("\n".join(f"# {line}".rstrip() for line in _header(preview, profile, args)), file=out)
    for obj in objects(preview):
        print("---", file=out)
        print(dump(obj, header="\n".join(_object_lines(preview, obj))), end="", file=out)


def _does_not_fit(preview: Preview, err: TextIO) -> None:
    verdict = preview.planned.does_not_fit
    assert verdict is not None
    print(f"vllm-operator render: nothing fits ({verdict.reason}): {verdict.summary}", file=err)
    if verdict.options:
        print("Would fit:", file=err)
        for option in verdict.options:
            print(f"  - [{option.kind}] {option.summary}", file=err)
    for note in verdict.notes:
        print(f"  note: {note}", file=err)
    if preview.unselected is not None:
        print(f"  note: {preview.unselected}", file=err)


def run_from_args(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        preview, profile = render(args)
    except (InputError, ValidationError) as exc:
        print(f"vllm-operator render: {refusal(exc)}", file=sys.stderr)
        return EXIT_USAGE
    if preview.planned.does_not_fit is not None:
        _does_not_fit(preview, sys.stderr)
        return EXIT_DOES_NOT_FIT
    if not any(c["kind"] in WORKLOADS for c in preview.decision.children):
        # Nothing the preview assumes keeps the workload back; a problem that does is said.
        for problem in preview.decision.problems:
            print(f"vllm-operator render: {problem.reason}: {problem.message}", file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    tuning = preview.decision.tuning
    if tuning.planned_by == "SpecOnly" and tuning.notes:
        print(f"vllm-operator render: not planned: {tuning.notes[0]}", file=sys.stderr)
    if args.output == "json":
        items = objects(preview)
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2), file=out)
    else:
        write_yaml(preview, profile, args, out)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for tests and ``python -m vllm_operator.render_cli``."""
    parser = configure(
        argparse.ArgumentParser(
            prog="vllm-operator render",
            description=__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    args = parser.parse_args(None if argv is None else list(argv))
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
