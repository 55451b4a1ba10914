"""What measured tuning runs measured, kept for later plans: one record per (model, its
revision, vLLM version or image, GPU product, GPUs per replica, interconnect, arguments).

The tuner's figures are predictions (a memory model calibrated against vLLM's own startup
logs, a performance roofline); a measured tuning run (InferenceTuning) measures each
trial's goodput (requests per second that meet the SLO), TTFT and TPOT under the user's
workload. Each measurement becomes a :class:`Measurement` record, which keeps the
prediction beside the figure, so that ``measured / predicted - 1``
(:func:`prediction_error`) says how far the tuner was off on that shape.

Where they live: the ConfigMap ``vllm-operator-measurements`` in the operator's own
namespace (``k8s/measurements.py`` merges new records into it), one record per data key,
the key a short stable hash of what the record was measured on (:func:`record_key`): a
later measurement of the same arguments on the same shape, workload and SLO replaces the
earlier one, any other adds a key. ``vllm-operator tune --measurements FILE`` reads a list
of records or that ConfigMap, and shows the records of the planned shape beside the plan
(:func:`compare`).

Pure: no Kubernetes, no clock; a malformed record is a :class:`MeasurementsError` that
names the record (its index, and its ConfigMap key) and the field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any, Final, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from vllm_operator.constants import MEASUREMENTS_CONFIG_MAP
from vllm_operator.models.base import ApiModel, Manifest, field_errors
from vllm_operator.models.workload import SLO
from vllm_operator.releases.version import Version, version_of_image
from vllm_operator.tuning.gpus import match_product
from vllm_operator.tuning.results import Plan, TuningResult

# Flags that say where and how the server listens or logs, not how it performs: two
# records differing only in them measured the same thing.
NOT_TUNING: Final = frozenset(
    {
        "host",
        "port",
        "model",
        "served-model-name",
        # The weights' revision is the record's modelRevision, not a setting of the plan.
        "revision",
        "tokenizer-revision",
        "download-dir",
        "api-key",
        "shutdown-timeout",
        "uvicorn-log-level",
        "disable-log-requests",
        "disable-log-stats",
        "disable-uvicorn-access-log",
        "enable-log-requests",
    }
)


class MeasurementsError(ValueError):
    """A measurements file or ConfigMap that cannot be read; the message names the record
    and the field."""


class LatencyPercentiles(ApiModel):
    """A latency's median and 99th percentile, milliseconds."""

    p50: float = Field(ge=0, description="Median, ms.")
    p99: float = Field(ge=0, description="99th percentile, ms.")

    @model_validator(mode="after")
    def _ordered(self) -> LatencyPercentiles:
        if self.p99 < self.p50:
            raise ValueError(f"p99 ({self.p99:g}) is below p50 ({self.p50:g})")
        return self


class WorkloadSummary(ApiModel):
    """The workload a record was measured under, in brief."""

    prompt_tokens_mean: float = Field(gt=0, description="Mean prompt length, tokens.")
    output_tokens_mean: float = Field(gt=0, description="Mean output length, tokens.")
    peak_concurrency: int | None = Field(
        default=None, ge=1, description="Requests in flight at the peak the SLO is for."
    )


class MeasuredBy(ApiModel):
    """The measured tuning run (InferenceTuning) and trial a record comes from."""

    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    trial: str = Field(min_length=1)


class Measurement(ApiModel):
    """One measured configuration: what it ran on, with which arguments, and what it did."""

    model: str = Field(min_length=1, description="The model's name (spec.model.name or repo).")
    model_revision: str | None = Field(default=None, description="The weights' revision.")
    vllm_version: str | None = Field(default=None, description="The vLLM version served.")
    image: str | None = Field(default=None, description="The serving image.")
    gpu_product: str = Field(min_length=1, description="The GPU product (the node's label).")
    gpu_count: int = Field(ge=1, description="GPUs of one replica.")
    interconnect: str | None = Field(
        default=None, description="How the replica's GPUs are joined (NVLink, PCIe)."
    )
    arguments: dict[str, str] = Field(
        default_factory=dict,
        description="vLLM's arguments, flag (no dashes) -> value; a switch is true or false.",
    )
    replicas: int = Field(
        default=1,
        ge=1,
        description="Replicas the goodput was measured over (a trial beside the service: 1; "
        "in place: the service's).",
    )
    goodput_per_second: float = Field(
        ge=0, description="Measured goodput: the highest rate whose requests met the SLO."
    )
    ttft: LatencyPercentiles = Field(description="Time to first token at the goodput, ms.")
    tpot: LatencyPercentiles = Field(description="Time per output token at the goodput, ms.")
    slo_attainment: float = Field(
        ge=0, le=1, description="Share of the requests at the goodput that met the SLO."
    )
    slo: SLO = Field(description="The SLO the goodput was measured against.")
    workload: WorkloadSummary = Field(description="The workload it was measured under.")
    predicted_goodput_per_second: float | None = Field(
        default=None, ge=0, description="The tuner's goodput for these arguments, then."
    )
    measured_at: datetime = Field(description="When the measurement ended.")
    tuning: MeasuredBy | None = Field(default=None, description="Where it was measured.")

    @field_validator("arguments")
    @classmethod
    def _flags(cls, value: dict[str, str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for flag, setting in value.items():
            name = flag.lstrip("-")
            if not name or any(c.isspace() for c in name):
                raise ValueError(f"{flag!r} is not a vLLM flag name")
            # A bare flag is a switch turned on, as the operator's overrides write it.
            out[name] = "true" if setting == "" else str(setting)
        return dict(sorted(out.items()))

    @model_validator(mode="after")
    def _release(self) -> Measurement:
        if self.vllm_version is None and self.image is None:
            raise ValueError("give vllmVersion or image: a measurement is of one vLLM release")
        if self.vllm_version is not None and Version.parse(self.vllm_version) is None:
            raise ValueError(f"vllmVersion {self.vllm_version!r} is not a version like 0.19.1")
        return self

    @property
    def version(self) -> Version | None:
        """The vLLM version measured: vllmVersion, else the image's tag."""
        if self.vllm_version is not None:
            return Version.parse(self.vllm_version)
        return version_of_image(self.image) if self.image else None

    def tuned_arguments(self) -> dict[str, str]:
        """The arguments that bear on performance (:data:`NOT_TUNING` left out)."""
        return {k: v for k, v in self.arguments.items() if k not in NOT_TUNING}


def record_key(record: Measurement) -> str:
    """The record's ConfigMap key: 16 hex digits of a hash of what it was measured on
    (model, revision, release, GPUs, interconnect, tuned arguments, SLO, workload), never
    of what it measured or when: a new measurement of the same thing takes its key."""
    identity = {
        "model": record.model,
        "modelRevision": record.model_revision,
        "vllmVersion": record.vllm_version,
        "image": record.image,
        "gpuProduct": record.gpu_product,
        "gpuCount": record.gpu_count,
        "interconnect": record.interconnect,
        "arguments": record.tuned_arguments(),
        "slo": record.slo.to_wire(),
        "workload": record.workload.to_wire(),
    }
    if record.replicas != 1:
        # Only when not one: the keys of records made before the field stay as they were.
        identity["replicas"] = record.replicas
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def prediction_error(record: Measurement) -> float | None:
    """``measured / predicted - 1`` of the goodput (0.25: measured 25 % above the
    prediction); None without a prediction to compare with (none, or zero)."""
    predicted = record.predicted_goodput_per_second
    if not predicted:
        return None
    return record.goodput_per_second / predicted - 1


def _model_words(name: str) -> str:
    """A model's name without its organisation, lower case: a repo id and the catalog's
    name of it compare equal."""
    return name.rstrip("/").rsplit("/", 1)[-1].lower()


def _same_gpu(a: str, b: str) -> bool:
    """The same GPU product: the same catalog entry where both are known, else the same
    words (NVIDIA-H100-80GB-HBM3 is H100-80GB)."""
    known_a, known_b = match_product(a), match_product(b)
    if known_a is not None and known_b is not None:
        return known_a.name == known_b.name
    return a.lower() == b.lower()


@dataclasses.dataclass(frozen=True)
class Shape:
    """What a plan runs on: the model, the GPU product and the GPUs of one replica, and
    (optionally) the vLLM version."""

    model: str
    gpu_product: str
    gpu_count: int
    vllm_version: str | None = None

    @classmethod
    def of_plan(cls, plan: Plan) -> Shape:
        return cls(plan.model.name, plan.gpu.name, plan.gpus_per_replica, plan.vllm_version)

    def holds(self, record: Measurement) -> bool:
        if _model_words(record.model) != _model_words(self.model):
            return False
        if record.gpu_count != self.gpu_count or not _same_gpu(
            record.gpu_product, self.gpu_product
        ):
            return False
        if self.vllm_version is None:
            return True
        wanted = Version.parse(self.vllm_version)
        return wanted is not None and record.version == wanted

    def describe(self) -> str:
        version = f", vLLM {self.vllm_version}" if self.vllm_version else ""
        return f"{self.model} on {self.gpu_count}x {self.gpu_product}{version}"


Format = Literal["yaml", "json"]


def _location(index: int, key: str | None) -> str:
    return f"record {index}" + (f" (data.{key})" if key is not None else "")


def _record(raw: Any, index: int, key: str | None) -> Measurement:
    where = _location(index, key)
    if not isinstance(raw, Mapping):
        raise MeasurementsError(f"{where}: expected a mapping of fields, got {type(raw).__name__}")
    try:
        return Measurement.model_validate(raw)
    except ValidationError as exc:
        raise MeasurementsError(f"{where}: {field_errors(exc, whole='(record)')}") from None


@dataclasses.dataclass(frozen=True)
class Measurements:
    """A set of records by key (:func:`record_key`)."""

    records: Mapping[str, Measurement] = dataclasses.field(default_factory=dict)

    def __iter__(self) -> Iterator[Measurement]:
        return iter(self.records.values())

    def __len__(self) -> int:
        return len(self.records)

    @classmethod
    def of(cls, records: Iterable[Measurement]) -> Measurements:
        """The records by key; of two with one key, the later measured stays."""
        out: dict[str, Measurement] = {}
        for record in records:
            key = record_key(record)
            if key not in out or record.measured_at >= out[key].measured_at:
                out[key] = record
        return cls(dict(sorted(out.items())))

    @classmethod
    def parse(cls, text: str) -> Measurements:
        """Records from YAML or JSON: a list of records, or a ConfigMap manifest whose
        ``data`` holds one record (YAML or JSON text) per key. An empty text is none."""
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise MeasurementsError(f"not YAML or JSON: {exc}") from None
        if doc is None:
            return cls()
        if isinstance(doc, list):
            return cls.of(_record(raw, i, None) for i, raw in enumerate(doc))
        if isinstance(doc, Mapping) and doc.get("kind") == "ConfigMap":
            return cls.from_config_map(doc)
        raise MeasurementsError(
            "expected a list of measurement records or a ConfigMap manifest "
            f"(kind: ConfigMap, data: one record per key), got {type(doc).__name__}"
        )

    @classmethod
    def from_config_map(cls, config_map: Mapping[str, Any]) -> Measurements:
        data = config_map.get("data") or {}
        if not isinstance(data, Mapping):
            raise MeasurementsError("ConfigMap data: expected a mapping of keys to records")
        records = []
        for index, (key, text) in enumerate(data.items()):
            try:
                raw = yaml.safe_load(text) if isinstance(text, str) else text
            except yaml.YAMLError as exc:
                where = _location(index, key)
                raise MeasurementsError(f"{where}: not YAML or JSON: {exc}") from None
            records.append(_record(raw, index, str(key)))
        return cls.of(records)

    @classmethod
    def readable(cls, config_map: Mapping[str, Any]) -> tuple[Measurements, list[str]]:
        """The ConfigMap's records that parse, and one line per key that does not (its
        key and why): for planning, where a broken record is skipped, never fatal."""
        data = config_map.get("data") or {}
        if not isinstance(data, Mapping):
            return cls(), ["data: expected a mapping of keys to records"]
        records: list[Measurement] = []
        skipped: list[str] = []
        for index, (key, text) in enumerate(data.items()):
            try:
                records += cls.from_config_map({"data": {key: text}}).records.values()
            except MeasurementsError as exc:
                skipped.append(str(exc).replace("record 0 ", f"record {index} ", 1))
        return cls.of(records), skipped

    def data(self) -> dict[str, str]:
        """The ConfigMap's ``data``: each record as compact JSON under its key."""
        return {key: record_text(record) for key, record in self.records.items()}

    def config_map(self, namespace: str) -> Manifest:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": MEASUREMENTS_CONFIG_MAP, "namespace": namespace},
            "data": self.data(),
        }

    def dump(self, fmt: Format = "yaml", *, config_map_namespace: str | None = None) -> str:
        """The records as a list (or as the ConfigMap, given its namespace), YAML or JSON."""
        doc: Any = (
            [r.to_wire() for r in self.records.values()]
            if config_map_namespace is None
            else self.config_map(config_map_namespace)
        )
        if fmt == "json":
            return json.dumps(doc, indent=2) + "\n"
        return yaml.safe_dump(doc, sort_keys=False, width=100)

    def lookup(self, shape: Shape) -> list[Measurement]:
        """The records of the same model on the same GPU product and count (and vLLM
        version, where the shape names one), latest first."""
        found = [r for r in self.records.values() if shape.holds(r)]
        return sorted(found, key=lambda r: r.measured_at, reverse=True)


def record_text(record: Measurement) -> str:
    """One record as the ConfigMap holds it: compact JSON, keys in a fixed order."""
    return json.dumps(record.to_wire(), separators=(",", ":"))


@dataclasses.dataclass(frozen=True)
class Comparison:
    """A measurement of the planned shape beside the plan.

    ``differences``: flag -> (the plan's value, None where the plan does not set it; the
    measured one), for each flag the record sets to another value than the plan: empty
    when the plan's arguments are what was measured. A flag the plan sets and the record
    does not is no difference (a record may hold only the flags its trial changed).
    ``predicted_goodput_per_second``: the plan's own prediction where the arguments are
    the plan's and one was given, else the record's; ``error``: measured / predicted - 1."""

    key: str
    record: Measurement
    differences: Mapping[str, tuple[str | None, str | None]]
    predicted_goodput_per_second: float | None
    error: float | None

    @property
    def same_arguments(self) -> bool:
        return not self.differences


def _differences(
    planned: Mapping[str, str], measured: Mapping[str, str]
) -> dict[str, tuple[str | None, str | None]]:
    return {
        flag: (planned.get(flag), value)
        for flag, value in sorted(measured.items())
        if flag not in NOT_TUNING and planned.get(flag) != value
    }


def compare(
    result: TuningResult,
    measurements: Measurements,
    *,
    predicted_goodput_per_second: float | None = None,
) -> list[Comparison]:
    """The measurements of ``result``'s shape (a :class:`Plan`'s; nothing for a result
    that is not a plan), those of the plan's own arguments first, then the latest."""
    if not isinstance(result, Plan):
        return []
    planned = {a.name: a.value for a in result.arguments}
    keys = {id(r): k for k, r in measurements.records.items()}
    out: list[Comparison] = []
    for record in measurements.lookup(Shape.of_plan(result)):
        differences = _differences(planned, record.arguments)
        predicted = record.predicted_goodput_per_second
        if not differences and predicted_goodput_per_second is not None:
            predicted = predicted_goodput_per_second
        error = record.goodput_per_second / predicted - 1 if predicted else None
        out.append(Comparison(keys[id(record)], record, differences, predicted, error))
    return sorted(out, key=lambda c: not c.same_arguments)
