"""``vllm-operator tune``: plan a model on a GPU shape offline and explain every setting.

Examples::

    vllm-operator tune meta-llama/Llama-3.1-70B-Instruct --gpu H100-80GB --count 8 \\
        --interconnect nvlink --prompt-p50 800 --prompt-p99 3000 --output-max 1024 \\
        --peak-concurrency 64
    vllm-operator tune ./my-model/ --gpu RTX-4090 --count 2 --interconnect pcie
    vllm-operator tune TheBloke/Llama-2-7B-GPTQ --gpu RTX-3090 -o args
    vllm-operator tune Llama-2-7B --gpu-node gpunode.yaml --set max-model-len=2048 -o yaml
    vllm-operator tune --service isvc.yaml --gpu L40S
    vllm-operator tune Llama-3.1-8B --gpu H100-80GB --measurements measured.yaml

The model is a folder holding ``config.json``, a ``config.json`` file, or a name from the
built-in catalog (repository ids and their -Instruct/-GPTQ/-AWQ variants). The GPUs are a
product and count (``--gpu``, ``--count``, ``--interconnect``) or a GPUNode manifest whose
status the node agent wrote (``--gpu-node``). Lengths are given as percentiles or maxima:
p50 and p99 make a log-normal distribution, p50 and max a log-normal clamped at max, max
alone a uniform one, p50 alone a fixed length.

``--measurements FILE`` reads what measured tuning runs measured (a list of records, or
the ``vllm-operator-measurements`` ConfigMap as ``kubectl get -o yaml`` prints it): the
records of the planned model on the same GPU product, GPUs per replica and vLLM version
are shown beside the plan, each with its goodput, the prediction and the error; a record of
the plan's own arguments, SLO and workload is used for the SLO answer, as the operator uses
the records it keeps (docs/measurements.md).

Nothing is downloaded and nothing is written; the command is pure computation over its
inputs. Exit status: 0 a plan fits, 1 nothing fits (or the model's shape is unknown),
2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Literal, TextIO

import yaml
from pydantic import ValidationError

from vllm_operator.cli_inputs import (
    InputError,
    add_gpu_arguments,
    gpu_profile,
    positive,
    read_measurements,
    read_service,
    refusal,
)
from vllm_operator.constants import DEFAULT_SERVING_IMAGE
from vllm_operator.models import lengths
from vllm_operator.models.inference_service import (
    HuggingFaceSource,
    ImageSource,
    InferenceServiceSpec,
    ModelSource,
    ModelSpec,
    NodeSpec,
    Quantization,
    QuantizationMethod,
    TuningSpec,
)
from vllm_operator.models.workload import SLO, LengthDistribution, Workload
from vllm_operator.releases.arguments import arguments_for, release_flags
from vllm_operator.releases.version import (
    TESTED_VERSION,
    DeployedVersion,
    Version,
    deployed_version,
)
from vllm_operator.tuning import catalog
from vllm_operator.tuning.architecture import ArchitectureError, from_config, missing_keys
from vllm_operator.tuning.learned import plan_learning
from vllm_operator.tuning.measurements import (
    Comparison,
    Measurements,
    Shape,
    compare,
)
from vllm_operator.tuning.plan import plan, spec_only
from vllm_operator.tuning.release import for_release, release_problem
from vllm_operator.tuning.request import resolve_model
from vllm_operator.tuning.results import (
    DoesNotFit,
    ModelInput,
    Plan,
    SloAnswer,
    SpecOnly,
    TuningResult,
)

__all__ = ["add_parser", "configure", "main", "run_from_args"]

EXIT_OK: Final = 0
EXIT_DOES_NOT_FIT: Final = 1
EXIT_USAGE: Final = 2


_METHODS: Final[dict[str, QuantizationMethod]] = {
    "none": "None",
    "gptq": "GPTQ",
    "awq": "AWQ",
    "fp8": "FP8",
    "bitsandbytes": "BitsAndBytes",
    "gguf": "GGUF",
    "compressed-tensors": "CompressedTensors",
}


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``tune``'s arguments to ``parser``."""
    parser.add_argument(
        "model",
        nargs="?",
        help="model folder with config.json, a config.json file, or a catalog name "
        f"({', '.join(catalog.names())})",
    )
    parser.add_argument(
        "--service",
        "-f",
        metavar="FILE",
        help="an InferenceService manifest: its model, workload, SLO, tuning and node settings",
    )
    hw = add_gpu_arguments(parser)
    hw.add_argument("--gpus-per-replica", default="auto", help="GPUs per replica: auto or a number")
    m = parser.add_argument_group("model")
    m.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"])
    m.add_argument(
        "--quantization",
        choices=sorted(_METHODS),
        help="how the checkpoint is quantized (default: from config.json or the name)",
    )
    m.add_argument("--bits", type=positive, help="bits per weight (GPTQ, AWQ, GGUF)")
    m.add_argument("--group-size", type=positive, help="quantization group size")
    w = parser.add_argument_group("workload (tokens)")
    for which in ("prompt", "output"):
        for stat in ("p50", "p99", "max"):
            w.add_argument(f"--{which}-{stat}", type=positive, metavar="N")
    w.add_argument("--peak-concurrency", type=positive, metavar="N", help="requests in flight")
    w.add_argument(
        "--replicas",
        type=positive,
        default=1,
        help="replicas sharing the peak (the fewest an SLO answer plans; it may need more)",
    )
    w.add_argument("--ttft-p99-ms", type=positive, metavar="MS", help="TTFT P99 objective")
    w.add_argument("--tpot-p99-ms", type=positive, metavar="MS", help="TPOT P99 objective")
    w.add_argument("--e2e-p99-ms", type=positive, metavar="MS", help="end-to-end P99 objective")
    t = parser.add_argument_group("tuning")
    t.add_argument(
        "--profile", choices=["Balanced", "Latency", "Throughput", "FastStart"], default=None
    )
    t.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a vLLM argument override, name without dashes (repeatable; always wins)",
    )
    t.add_argument(
        "--vllm-version",
        metavar="X.Y.Z",
        help=f"the vLLM release to plan for: its arguments are the ones written and checked "
        f"(default: {TESTED_VERSION}, the release the operator's tests run)",
    )
    t.add_argument(
        "--measurements",
        metavar="FILE",
        help="measured records (YAML or JSON list, or the vllm-operator-measurements "
        "ConfigMap): those of the planned shape are shown beside the plan, and one of "
        "its arguments, SLO and workload is used for its SLO answer",
    )
    t.add_argument("--cpu-pinning", action="store_true", help="exclusive cores")
    t.add_argument("--shm-size", help="/dev/shm size (default: planned)")
    parser.add_argument(
        "-o",
        "--output",
        choices=["table", "yaml", "json", "args"],
        default="table",
        help="table (default), yaml or json (machine-readable), args (the vLLM command line)",
    )
    parser.set_defaults(func=run_from_args)
    return parser


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``tune`` on a parent CLI's ``add_subparsers()`` object."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "tune",
        help="Plan vLLM settings for a model on given GPUs, offline, with a reason for each.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return configure(parser)


# --- inputs ---------------------------------------------------------------------------------


def _distribution(
    p50: int | None, p99: int | None, top: int | None, what: str
) -> LengthDistribution | None:
    if p50 is None and p99 is None and top is None:
        return None
    if p50 is None:
        if p99 is not None:
            raise InputError(f"--{what}-p99 needs --{what}-p50")
        assert top is not None
        return LengthDistribution(type="Uniform", min=1, max=top)
    if p99 is not None:
        if p99 < p50:
            raise InputError(f"--{what}-p99 is below --{what}-p50")
        return lengths.from_percentile(p50, p99, 0.99, top=top)
    if top is not None:
        if top < p50:
            raise InputError(f"--{what}-max is below --{what}-p50")
        return lengths.from_percentile(p50, top, 0.999, top=top)
    return LengthDistribution(type="Fixed", value=p50)


def _overrides(pairs: Sequence[str]) -> dict[str, str]:
    result: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().lstrip("-")
        if not sep or not key:
            raise InputError(f"--set {pair!r}: expected KEY=VALUE")
        result[key] = value.strip()
    return result


def _load_config(model: str) -> dict[str, Any] | None:
    """config.json from a folder or file path; None when ``model`` is not a path."""
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    elif not (path.is_file() and path.suffix == ".json"):
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise InputError(f"{path} is not a JSON object")
    return data


def _checkpoint_bytes(model: str) -> int | None:
    """The checkpoint's size beside config.json: model.safetensors.index.json's
    metadata.total_size, else a single model.safetensors file's size; None if neither."""
    path = Path(model)
    folder = path if path.is_dir() else path.parent
    try:
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        size = index["metadata"]["total_size"]
        return int(size) if isinstance(size, int | float) and size > 0 else None
    except (OSError, ValueError, KeyError, TypeError):
        pass
    single = folder / "model.safetensors"
    return single.stat().st_size if single.is_file() else None


def _model_spec(args: argparse.Namespace, base: ModelSpec | None) -> tuple[ModelSpec, str]:
    name = args.model
    if base is None and not name:
        raise InputError("give a model (folder, config.json or catalog name) or --service")
    if base is None:
        is_path = Path(name).exists()
        if not is_path and (name.startswith((".", "/", "~")) or name.count("/") > 1):
            raise InputError(
                f"MODEL {name}: no such folder (a local model is a folder with config.json; "
                "a Hugging Face repo is org/name; a catalog name has no slash)"
            )
        source = (
            ModelSource(image=ImageSource(path="/model"))
            if is_path or "/" not in name
            else ModelSource(hugging_face=HuggingFaceSource(repo=name))
        )
        label = Path(name).resolve().name if is_path else name
        base = ModelSpec(name=label[:200], source=source)
    updates: dict[str, Any] = {}
    if args.dtype != "auto":
        updates["dtype"] = args.dtype
    if args.quantization is not None:
        method = _METHODS[args.quantization]
        bits = args.bits or (4 if method in ("GPTQ", "AWQ") else None)
        updates["quantization"] = Quantization(
            method=method,
            bits=bits,
            group_size=args.group_size or (128 if method in ("GPTQ", "AWQ") else None),
        )
    return base.model_copy(update=updates), name or base.name or "model"


def tune(
    args: argparse.Namespace, measurements: Measurements | None = None
) -> tuple[TuningResult, ModelInput | None]:
    """Run the planner on parsed arguments (no printing); ``measurements``: the records
    ``--measurements`` read, used as the operator uses its own (tuning/learned.py)."""
    service = read_service(args.service) if args.service else None
    spec = service.spec if service else None
    model_spec, name = _model_spec(args, spec.model if spec else None)
    config = _load_config(args.model) if args.model else None
    profile = gpu_profile(args)
    base_workload = spec.workload if spec else Workload()
    prompt = _distribution(args.prompt_p50, args.prompt_p99, args.prompt_max, "prompt")
    output = _distribution(args.output_p50, args.output_p99, args.output_max, "output")
    workload = Workload(
        prompt_tokens=prompt or base_workload.prompt_tokens,
        output_tokens=output or base_workload.output_tokens,
        peak_concurrency=args.peak_concurrency or base_workload.peak_concurrency,
    )
    base_tuning = spec.tuning if spec else TuningSpec()
    tuning = TuningSpec(
        profile=args.profile or base_tuning.profile,
        overrides={**base_tuning.overrides, **_overrides(args.overrides)},
    )
    base_node = spec.node if spec else NodeSpec()
    node = base_node.model_copy(
        update={
            "cpu_pinning": args.cpu_pinning or base_node.cpu_pinning,
            **({"shm_size": args.shm_size} if args.shm_size else {}),
        }
    )
    slo = SLO(
        ttft_p99_milliseconds=args.ttft_p99_ms
        or (spec.slo.ttft_p99_milliseconds if spec else None),
        tpot_p99_milliseconds=args.tpot_p99_ms
        or (spec.slo.tpot_p99_milliseconds if spec else None),
        e2e_p99_milliseconds=args.e2e_p99_ms or (spec.slo.e2e_p99_milliseconds if spec else None),
    )
    deployed = _deployed(args.vllm_version, spec)
    release, refused = release_problem(tuning.overrides, deployed, where="--set {name}")
    if refused is not None:
        raise InputError(refused.message)
    assert release is not None
    version_note = arguments_for(deployed.version).note
    count: int | Literal["auto"] = "auto"
    if args.gpus_per_replica != "auto":
        if not str(args.gpus_per_replica).isdigit() or not 1 <= int(args.gpus_per_replica) <= 16:
            raise InputError("--gpus-per-replica must be auto or a number from 1 to 16")
        count = int(args.gpus_per_replica)
    elif spec is not None:
        count = spec.gpu.count
    try:
        model = resolve_model(
            model_spec,
            config=config,
            fallback_name=name,
            checkpoint_bytes=_checkpoint_bytes(args.model) if config is not None else None,
        )
    except ArchitectureError as exc:  # pragma: no cover - resolve_model swallows these
        raise InputError(str(exc)) from exc
    if model is None:
        if config is not None:
            missing = missing_keys(config)
            if missing:
                raise InputError(
                    f"{args.model}: config.json lacks {', '.join(missing)}, which the tuner "
                    "needs (or give the shape with --service and spec.model.architecture)"
                )
            try:
                from_config(config)
            except ArchitectureError as exc:
                raise InputError(f"{args.model}: {exc}") from exc
            raise InputError(f"{args.model}: config.json lacks the shape the tuner needs")
        near = catalog.nearest(name)
        result = spec_only(
            InferenceServiceSpec(model=model_spec, tuning=tuning),
            f"{name} is neither a folder with config.json nor in the tuner's catalog: give "
            "`vllm-operator tune` the model's folder or its config.json, or --service with "
            "spec.model.architecture"
            + (f" (nearest catalog names: {', '.join(near)})" if near else ""),
        )
        return for_release(result, release, deployed, version_note), None
    replicas = args.replicas if args.replicas != 1 or spec is None else spec.replicas
    planned = plan_learning(
        lambda measured: plan(
            model,
            profile,
            workload=workload,
            slo=slo,
            tuning=tuning,
            node=node,
            dtype=model_spec.dtype,
            gpu_count=count,
            replicas=replicas,
            vllm_version=deployed.version,
            across_nodes=True,
            measured=measured,
        ),
        measurements,
        version=str(deployed.version),
    )
    return for_release(planned, release, deployed, version_note), model


def _deployed(flag: str | None, spec: InferenceServiceSpec | None) -> DeployedVersion:
    """--vllm-version, else the service file's spec.vllmVersion or image tag, else the
    release the tests run."""
    if flag is not None:
        version = Version.parse(flag)
        if version is None:
            raise InputError(f"--vllm-version {flag!r} is not a version like 0.19.1")
        return DeployedVersion(version, "Spec")
    if spec is not None and (spec.vllm_version or spec.image):
        return deployed_version(
            explicit=spec.vllm_version,
            image=spec.image,
            default_image=DEFAULT_SERVING_IMAGE,
            default=TESTED_VERSION,
        )
    return DeployedVersion(TESTED_VERSION, "Default")


# --- output ---------------------------------------------------------------------------------


def _document(result: TuningResult, model: ModelInput | None) -> dict[str, Any]:
    doc: dict[str, Any] = {"result": result.kind}
    if model is not None:
        doc["model"] = {
            "name": model.name,
            "from": model.origin,
            "architecture": model.architecture.describe(),
            "weights": model.weight_format.describe(),
        }
    if isinstance(result, Plan):
        doc["gpus"] = {
            "node": result.gpu.describe(),
            "perReplica": result.gpus_per_replica,
            "indices": list(result.gpu_indices),
            "link": result.link,
            "replicasPerNode": result.replicas_per_node,
        }
        doc["tuning"] = result.effective_tuning().to_wire()
        doc["environment"] = [
            {"name": s.name, "value": s.value, "reason": s.reason} for s in result.environment
        ]
        doc["command"] = result.command_args()
        if result.slo is not None:
            doc["slo"] = _slo_document(result.slo)
    elif isinstance(result, DoesNotFit):
        doc["reason"] = result.reason
        doc["message"] = result.summary
        doc["options"] = [{"kind": o.kind, "summary": o.summary} for o in result.options]
        doc["notes"] = list(result.notes)
    else:
        doc["reason"] = result.reason
        doc["message"] = result.message
        doc["tuning"] = result.effective_tuning().to_wire()
    return doc


def _slo_document(answer: SloAnswer) -> dict[str, Any]:
    return {
        "met": answer.met,
        "targets": {f"{m.lower()}P99Milliseconds": t for m, t in answer.targets},
        "predicted": {f"{m.lower()}P99Milliseconds": v for m, v in answer.predicted},
        "peakConcurrency": answer.peak_concurrency,
        "replicas": answer.replicas,
        "replicasAsked": answer.replicas_asked,
        "gpusPerReplica": answer.gpus_per_replica,
        "goodputPerSecond": answer.goodput_per_second,
        "lines": list(answer.lines),
        "wouldMeet": list(answer.would_meet),
    }


def _print_slo(answer: SloAnswer, out: TextIO) -> None:
    verdict = "met" if answer.met else "NOT MET"
    print(
        f"\nSLO ({verdict}): {answer.replicas} replica(s) of {answer.gpus_per_replica} GPU(s) "
        f"= {answer.gpus} GPUs for the peak of {answer.peak_concurrency} requests"
        + (
            f"; goodput ~{answer.goodput_per_second:,.2f} requests/s"
            if answer.goodput_per_second is not None
            else ""
        ),
        file=out,
    )
    for line in answer.lines:
        print(f"  - {line}", file=out)


def _percent(error: float | None) -> str:
    return "-" if error is None else f"{error * 100:+.0f}%"


def _measured_document(
    result: TuningResult, path: str, comparisons: Sequence[Comparison]
) -> dict[str, Any]:
    doc: dict[str, Any] = {"file": path}
    if isinstance(result, Plan):
        doc["shape"] = Shape.of_plan(result).describe()
    records = []
    for c in comparisons:
        r = c.record
        entry: dict[str, Any] = {
            "key": c.key,
            "sameArguments": c.same_arguments,
            "goodputPerSecond": r.goodput_per_second,
            "predictedGoodputPerSecond": c.predicted_goodput_per_second,
            "predictionError": None if c.error is None else round(c.error, 4),
            "ttft": r.ttft.to_wire(),
            "tpot": r.tpot.to_wire(),
            "sloAttainment": r.slo_attainment,
            "slo": r.slo.to_wire(),
            "measuredAt": r.measured_at.isoformat(),
        }
        if c.differences:
            entry["differences"] = {
                flag: {"planned": planned, "measured": measured}
                for flag, (planned, measured) in c.differences.items()
            }
        if r.tuning is not None:
            entry["tuning"] = r.tuning.to_wire()
        records.append(entry)
    doc["records"] = records
    return doc


def _print_measured(
    result: TuningResult, path: str, comparisons: Sequence[Comparison], out: TextIO
) -> None:
    if not isinstance(result, Plan):
        return
    shape = Shape.of_plan(result).describe()
    if not comparisons:
        print(f"\nMeasured: no record in {path} is of {shape}", file=out)
        return
    print(f"\nMeasured ({len(comparisons)} record(s) of {shape}, from {path})", file=out)
    head = ("ARGUMENTS", "GOODPUT", "PREDICTED", "ERROR", "TTFT P50/P99", "TPOT P50/P99")
    rows = [(*head, "SLO MET", "MEASURED", "BY")]
    for c in comparisons:
        r = c.record
        by = f"{r.tuning.namespace}/{r.tuning.name} {r.tuning.trial}" if r.tuning else "-"
        rows.append(
            (
                "the plan's" if c.same_arguments else f"{len(c.differences)} differ",
                f"{r.goodput_per_second:.2f}/s",
                "-"
                if c.predicted_goodput_per_second is None
                else f"{c.predicted_goodput_per_second:.2f}/s",
                _percent(c.error),
                f"{r.ttft.p50:.0f}/{r.ttft.p99:.0f} ms",
                f"{r.tpot.p50:.1f}/{r.tpot.p99:.1f} ms",
                f"{r.slo_attainment * 100:.1f}%",
                r.measured_at.strftime("%Y-%m-%d"),
                by,
            )
        )
    width = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = "  ".join(f"{v:<{w}}" for v, w in zip(row, width, strict=True))
        print(f"  {cells}".rstrip(), file=out)
    for c in comparisons:
        if c.differences:
            changed = ", ".join(
                f"{flag} {measured or '(bare)'} (plan: {'unset' if planned is None else planned})"
                for flag, (planned, measured) in c.differences.items()
            )
            print(f"  {c.key}: measured with {changed}", file=out)


def _table(rows: Sequence[tuple[str, str, str, str]], out: TextIO) -> None:
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        print(
            f"  {row[0]:<{width[0]}}  {row[1]:<{width[1]}}  {row[2]:<{width[2]}}  {row[3]}",
            file=out,
        )


def _print_table(result: TuningResult, model: ModelInput | None, out: TextIO) -> None:
    if model is not None:
        arch = model.architecture
        print(f"Model    {model.name} (from {model.origin})", file=out)
        print(f"         {arch.describe()}; {model.weight_format.describe()}", file=out)
    if isinstance(result, DoesNotFit):
        print(f"GPUs     {result.gpu.describe() if result.gpu else '-'}", file=out)
        print(f"\nDOES NOT FIT ({result.reason}): {result.summary}", file=out)
        if result.options:
            print("\nWould fit:", file=out)
            for option in result.options:
                print(f"  - [{option.kind}] {option.summary}", file=out)
        for note in result.notes:
            print(f"  note: {note}", file=out)
        return
    if isinstance(result, SpecOnly):
        print(f"\nNOT PLANNED ({result.reason}): {result.message}", file=out)
        if result.arguments:
            args_rows = [(a.name, a.value, str(a.source), a.reason) for a in result.arguments]
            _table([("ARGUMENT", "VALUE", "SOURCE", "REASON"), *args_rows], out)
        return
    if result.nodes > 1:
        network = result.network.describe() if result.network else "network unknown"
        print(
            f"GPUs     {result.gpu.describe()} per node: {result.nodes} nodes per replica "
            f"(one pipeline stage each, {result.gpus_per_pod} GPUs per node, {network}); "
            "served as a LeaderWorkerSet group",
            file=out,
        )
    else:
        print(
            f"GPUs     {result.gpu.describe()}: {result.gpus_per_replica} per replica "
            f"(GPUs {', '.join(map(str, result.gpu_indices))}), "
            f"{result.replicas_per_node} replica(s) per node",
            file=out,
        )
    if result.slo is not None:
        _print_slo(result.slo, out)
    print(f"\nvLLM {result.vllm_version or TESTED_VERSION} arguments", file=out)
    _table(
        [("NAME", "VALUE", "SOURCE", "REASON")]
        + [(a.name, a.value, a.source, a.reason) for a in result.arguments],
        out,
    )
    if result.environment:
        print("\nEnvironment", file=out)
        _table(
            [("NAME", "VALUE", "SOURCE", "REASON")]
            + [(s.name, s.value, s.source, s.reason) for s in result.environment],
            out,
        )
    print("\nPod", file=out)
    _table(
        [("SETTING", "VALUE", "SOURCE", "REASON")]
        + [(s.name, s.value, s.source, s.reason) for s in result.pod.reasons],
        out,
    )
    print("\nPredictions (per replica)", file=out)
    p = result.predictions
    gib = 1024**3
    rows: list[tuple[str, str, str, str]] = [
        ("WHAT", "VALUE", "", "HOW"),
        ("weights", f"{(p.weights_bytes or 0) / gib:.2f} GiB", "", ""),
        ("kv-cache", f"{(p.kv_cache_bytes or 0) / gib:.2f} GiB", "", ""),
        ("max-concurrent-sequences", f"{p.max_concurrent_sequences}", "", "at the full context"),
    ]
    rows += [(s.name, s.value, "", s.reason) for s in result.prediction_reasons]
    _table(rows, out)
    if result.notes:
        print("\nNotes", file=out)
        for note in result.notes:
            print(f"  - {note}", file=out)
    print("\nCommand line", file=out)
    print("  vllm serve MODEL " + " ".join(result.command_args()), file=out)


def run_from_args(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    path: str | None = getattr(args, "measurements", None)
    try:
        measurements = read_measurements(path) if path else None
        result, model = tune(args, measurements)
    except (InputError, ValidationError) as exc:
        print(f"vllm-operator tune: {refusal(exc)}", file=sys.stderr)
        return EXIT_USAGE
    comparisons = compare(result, measurements) if measurements is not None else []
    if args.output == "table":
        _print_table(result, model, out)
        if path:
            _print_measured(result, path, comparisons, out)
    elif args.output == "args":
        if isinstance(result, Plan):
            print(" ".join(result.command_args()), file=out)
        elif isinstance(result, SpecOnly):
            print(" ".join(release_flags(result.arguments, result.vllm_version)), file=out)
        else:
            print(f"vllm-operator tune: {result.reason}: {result.message}", file=sys.stderr)
    else:
        doc = _document(result, model)
        if path:
            doc["measured"] = _measured_document(result, path, comparisons)
        if args.output == "json":
            print(json.dumps(doc, indent=2), file=out)
        else:
            print(yaml.safe_dump(doc, sort_keys=False, width=100), end="", file=out)
    return EXIT_OK if isinstance(result, Plan) else EXIT_DOES_NOT_FIT


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for tests and ``python -m vllm_operator.tune_cli``."""
    parser = configure(
        argparse.ArgumentParser(
            prog="vllm-operator tune",
            description=__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    args = parser.parse_args(None if argv is None else list(argv))
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
