"""CustomResourceDefinitions generated from the pydantic models.

pydantic emits JSON Schema (draft 2020-12); Kubernetes wants a *structural* OpenAPI v3
schema: every node typed, no ``$ref``, no ``anyOf`` at the top of a property except for
int-or-string, no ``title``, ``additionalProperties`` never beside ``properties``, and
boolean ``exclusiveMinimum``. This module converts one into the other and adds what a
CRD carries beyond the schema (subresources, printer columns, short names).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, NoDefault
from pydantic_core import core_schema

from vllm_operator.constants import GROUP, VERSION
from vllm_operator.models import (
    GPUNode,
    InferenceBenchmark,
    InferenceService,
    InferenceTuning,
    ModelCache,
)
from vllm_operator.models.inference_tuning import MAX_TUNING_NAME

Schema = dict[str, Any]

_DROP_KEYS: Final = {"title", "discriminator", "examples"}
# The apiserver only lets CEL rules at the root see metadata.name and generateName.
_ISVC_NAME_RULE: Final = {
    "rule": "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$') && "
    "size(self.metadata.name) <= 50",
    "message": "metadata.name must be a DNS-1035 label of at most 50 characters "
    "(it names the Service and the Deployment)",
}

# A tuning's trials are InferenceServices named <tuning>-<trial> (a trial name has at most
# 20 characters), themselves at most 50 characters.
_TUNING_NAME_RULE: Final = {
    "rule": "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$') && "
    f"size(self.metadata.name) <= {MAX_TUNING_NAME}",
    "message": f"metadata.name must be a DNS-1035 label of at most {MAX_TUNING_NAME} "
    "characters (its trials' InferenceServices are <name>-<trial>)",
}


class _DefaultsSchema(GenerateJsonSchema):
    """Gives fields built by a default factory their default in the schema.

    The apiserver applies defaults only inside objects that exist; with a default on
    ``spec.gpu`` it creates the object, so what a user reads back with kubectl shows every
    default in force, and CEL rules never meet a missing map or list.
    """

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        factory = schema.get("default_factory")
        if factory is None:
            return schema.get("default", NoDefault)
        value = factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            # The whole defaulted object, not {}: CEL rules on it are checked against the
            # default itself, before the apiserver fills the nested defaults in.
            return value.model_dump(by_alias=True, exclude_none=True, mode="json")
        return value


def _resolve(node: Any, defs: Mapping[str, Schema]) -> Any:
    """Inline every ``$ref`` (the models have no recursive types)."""
    if isinstance(node, list):
        return [_resolve(x, defs) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        extra = {k: v for k, v in node.items() if k != "$ref"}
        target.update(extra)
        return _resolve(target, defs)
    return {k: _resolve(v, defs) for k, v in node.items()}


def _structural(node: Any) -> Any:
    """Rewrite one resolved JSON-schema node into structural OpenAPI v3."""
    if isinstance(node, list):
        return [_structural(x) for x in node]
    if not isinstance(node, dict):
        return node
    out: Schema = {}
    for key, value in node.items():
        if key in _DROP_KEYS:
            continue
        out[key] = _structural(value)

    # Optional[X] arrives as anyOf [X, null]: the field is simply optional.
    any_of = out.get("anyOf")
    if isinstance(any_of, list) and not out.get("x-kubernetes-int-or-string"):
        non_null = [s for s in any_of if s.get("type") != "null"]
        if len(non_null) == 1:
            del out["anyOf"]
            merged = dict(non_null[0])
            merged.update(out)
            out = merged
            if out.get("default", ...) is None:
                del out["default"]
        elif any(s.get("type") == "null" for s in any_of):
            out["anyOf"] = non_null
    if out.get("default", ...) is None:
        del out["default"]

    if "const" in out:
        out["enum"] = [out.pop("const")]
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        value = out.get(bound)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[plain] = value
            out[bound] = True
    # Map keys are checked by CEL rules where it matters; OpenAPI in CRDs has no
    # patternProperties or propertyNames.
    pattern_props = out.pop("patternProperties", None)
    out.pop("propertyNames", None)
    if isinstance(pattern_props, dict) and pattern_props:
        out["additionalProperties"] = next(iter(pattern_props.values()))
    if "properties" in out:
        out.setdefault("type", "object")
        out.pop("additionalProperties", None)
        if not out["properties"]:
            del out["properties"]
            out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("additionalProperties") is True:
        del out["additionalProperties"]
        out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("x-kubernetes-int-or-string"):
        # Structural schemas allow anyOf under int-or-string only without types inside.
        out.pop("anyOf", None)
        out.pop("type", None)
    if out.get("type") == "array" and "items" in out and "uniqueItems" in out:
        del out["uniqueItems"]
    if "description" in out and isinstance(out["description"], str):
        out["description"] = " ".join(out["description"].split())
    return out


def openapi_schema(model: type[BaseModel]) -> Schema:
    """A model's structural OpenAPI v3 schema."""
    raw = model.model_json_schema(
        by_alias=True, mode="validation", schema_generator=_DefaultsSchema
    )
    defs = raw.pop("$defs", {})
    resolved = _resolve(raw, defs)
    result: Schema = _structural(resolved)
    return result


def _root_schema(
    model: type[BaseModel], *, spec_required: bool, root_rules: list[Schema] | None = None
) -> Schema:
    fields = openapi_schema(model)["properties"]
    spec = fields["spec"]
    status = fields["status"]
    root: Schema = {
        "type": "object",
        "description": " ".join((model.__doc__ or "").split()),
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": "APIVersion defines the versioned schema of this object.",
            },
            "kind": {"type": "string", "description": "Kind is the type of this object."},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    if spec_required:
        root["required"] = ["spec"]
    if root_rules:
        root["x-kubernetes-validations"] = root_rules
    return root


_AGE: Final = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


def _ready_column() -> Schema:
    return {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
    }


def _crd(
    *,
    kind: str,
    plural: str,
    singular: str,
    scope: str,
    short_names: list[str],
    schema: Schema,
    columns: list[Schema],
    scale: Schema | None = None,
) -> Schema:
    subresources: Schema = {"status": {}}
    if scale is not None:
        subresources["scale"] = scale
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": "vllm-operator"},
        },
        "spec": {
            "group": GROUP,
            "scope": scope,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": short_names,
                "categories": ["vllm", "all"] if scope == "Namespaced" else ["vllm"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": subresources,
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def inference_service_crd() -> Schema:
    """The InferenceService CRD, with the scale subresource for kubectl scale and HPAs."""
    return _crd(
        kind="InferenceService",
        plural="inferenceservices",
        singular="inferenceservice",
        scope="Namespaced",
        short_names=["vis"],
        schema=_root_schema(InferenceService, spec_required=True, root_rules=[_ISVC_NAME_RULE]),
        scale={
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
        columns=[
            _ready_column(),
            {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas"},
            {"name": "Ready-Replicas", "type": "integer", "jsonPath": ".status.readyReplicas"},
            {"name": "Warmed", "type": "integer", "jsonPath": ".status.warmedReplicas"},
            {"name": "Model", "type": "string", "jsonPath": ".status.servedModelName"},
            {"name": "GPUs", "type": "string", "jsonPath": ".status.tuning.gpusPerReplica"},
            {
                "name": "Reason",
                "type": "string",
                "priority": 1,
                "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
            },
            _AGE,
        ],
    )


def inference_benchmark_crd() -> Schema:
    """The InferenceBenchmark CRD."""
    return _crd(
        kind="InferenceBenchmark",
        plural="inferencebenchmarks",
        singular="inferencebenchmark",
        scope="Namespaced",
        short_names=["ibench", "vbench"],
        schema=_root_schema(InferenceBenchmark, spec_required=True),
        columns=[
            {"name": "Target", "type": "string", "jsonPath": ".spec.targetRef.name"},
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {
                "name": "RPS",
                "type": "number",
                "jsonPath": ".status.headline.requestsPerSecond",
            },
            {
                "name": "TTFT-P99-ms",
                "type": "number",
                "jsonPath": ".status.headline.fromScheduled.ttft.p99",
            },
            {
                "name": "SLO-Attainment",
                "type": "number",
                "jsonPath": ".status.headline.sloAttainment",
            },
            {
                "name": "Knee",
                "type": "number",
                "priority": 1,
                "jsonPath": ".status.kneeRatePerSecond",
            },
            _AGE,
        ],
    )


def gpu_node_crd() -> Schema:
    """The cluster-scoped GPUNode CRD."""
    return _crd(
        kind="GPUNode",
        plural="gpunodes",
        singular="gpunode",
        scope="Cluster",
        short_names=["gpun"],
        schema=_root_schema(GPUNode, spec_required=False),
        columns=[
            _ready_column(),
            {"name": "GPUs", "type": "integer", "jsonPath": ".status.gpuCount"},
            {"name": "Product", "type": "string", "jsonPath": ".status.gpus[0].product"},
            {"name": "Interconnect", "type": "string", "jsonPath": ".status.interconnect"},
            {"name": "Power", "type": "string", "jsonPath": ".spec.power.policy"},
            {
                "name": "Driver",
                "type": "string",
                "priority": 1,
                "jsonPath": ".status.driverVersion",
            },
            _AGE,
        ],
    )


def model_cache_crd() -> Schema:
    """The ModelCache CRD."""
    return _crd(
        kind="ModelCache",
        plural="modelcaches",
        singular="modelcache",
        scope="Namespaced",
        short_names=["vmc"],
        schema=_root_schema(ModelCache, spec_required=True),
        columns=[
            _ready_column(),
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Repo", "type": "string", "jsonPath": ".spec.source.huggingFace.repo"},
            {"name": "Downloaded", "type": "integer", "jsonPath": ".status.bytesDownloaded"},
            {"name": "Total", "type": "integer", "jsonPath": ".status.bytesTotal"},
            {"name": "Claim", "type": "string", "jsonPath": ".status.claimName"},
            {
                "name": "Commit",
                "type": "string",
                "priority": 1,
                "jsonPath": ".status.commit",
            },
            {
                "name": "Reason",
                "type": "string",
                "priority": 1,
                "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
            },
            _AGE,
        ],
    )


def inference_tuning_crd() -> Schema:
    """The InferenceTuning CRD."""
    return _crd(
        kind="InferenceTuning",
        plural="inferencetunings",
        singular="inferencetuning",
        scope="Namespaced",
        short_names=["itune"],
        schema=_root_schema(InferenceTuning, spec_required=True, root_rules=[_TUNING_NAME_RULE]),
        columns=[
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Target", "type": "string", "jsonPath": ".spec.targetRef.name"},
            {"name": "Trials", "type": "string", "jsonPath": ".status.trials[*].state"},
            {"name": "Winner", "type": "string", "jsonPath": ".status.winner.trial"},
            {
                "name": "Margin",
                "type": "number",
                "priority": 1,
                "jsonPath": ".status.winner.marginOverIncumbent",
            },
            {
                "name": "Reason",
                "type": "string",
                "priority": 1,
                "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
            },
            _AGE,
        ],
    )


def all_crds() -> list[Schema]:
    """Every CRD of the project, in a stable order."""
    return [
        inference_service_crd(),
        inference_benchmark_crd(),
        gpu_node_crd(),
        model_cache_crd(),
        inference_tuning_crd(),
    ]
