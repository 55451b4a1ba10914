"""Building blocks shared by every API type: the model base class and common fields.

Every API type is a pydantic model with camelCase aliases, so the same class validates a
manifest read from Kubernetes and produces the OpenAPI schema the CRDs are generated from.
Unknown fields are rejected here (the apiserver prunes them; the CLI and tests must not
silently drop a typo).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Final, Literal, TypeAlias, cast

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema
from pydantic.config import JsonDict

from vllm_operator.models.quantity import parse_quantity

# The validation library's names for the members of a union, which it puts in an error's
# location after the field: int, str, literal['auto'], function-after[...], a model's class.
_UNION_MEMBER = re.compile(r"^(int|str|float|bool|none|list|dict|[a-z-]+\[.*\]|[A-Z][A-Za-z0-9]*)$")


def field_path(loc: Sequence[int | str]) -> str:
    """A field's location as Kubernetes writes it: ``spec.adapters[0].name`` (a union's
    member names left out)."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not _UNION_MEMBER.match(part):
            path += f".{part}" if path else part
    return path


def field_errors(
    err: ValidationError, *, limit: int | None = None, whole: str = "(top level)"
) -> str:
    """A refusal as a user reads it: each field's path and what is wrong with it (a field
    that matched no member of a union: each member's reason, joined by "or"), joined by
    "; ", without the validation library's error codes, input echoes and links. Past
    ``limit`` fields, how many more there are; ``whole``: the name of an error of the
    object itself (no field)."""
    by_field: dict[str, list[str]] = {}
    for e in err.errors():
        why = str(e["msg"]).removeprefix("Value error, ")
        reasons = by_field.setdefault(field_path(e["loc"]) or whole, [])
        if why not in reasons:
            reasons.append(why)
    fields = list(by_field.items())
    shown = fields if limit is None else fields[:limit]
    text = "; ".join(f"{path}: {' or '.join(reasons)}" for path, reasons in shown)
    if len(fields) > len(shown):
        text += f"; and {len(fields) - len(shown)} more"
    return text


# A size in bytes as a Kubernetes quantity ("64Gi", "1.5G"). Kept as the string the user
# wrote; the schema marks it int-or-string as Kubernetes' own types do. More than 0 and at
# most 2^63-1 bytes (the apiserver clamps a larger quantity instead of refusing it), checked
# at admission by CEL and again here for a manifest that did not pass admission.
QUANTITY_PATTERN = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
INT64_MAX: Final = 2**63 - 1
_SIZE_RULE = (
    "isQuantity(self) && quantity(self).isGreaterThan(quantity('0')) "
    "&& quantity(self).isLessThan(quantity('8Ei'))"
)
SIZE_MESSAGE: Final = "must be a quantity of bytes more than 0 and below 8Ei (2^63 bytes)"


def _parsed(text: str) -> str:
    """``text`` when the quantity parser reads it (no sign, one decimal point, a unit it
    knows); raises ValueError naming it otherwise."""
    parse_quantity(text)
    return text


def check_size(text: str) -> str:
    """``text`` when it is a size Kubernetes can hold; raises ValueError saying why not."""
    try:
        value = parse_quantity(text)
    except ValueError as err:
        raise ValueError(f"{SIZE_MESSAGE}; {err}") from None
    if not 0 < value <= INT64_MAX:
        raise ValueError(f"{SIZE_MESSAGE}; {text!r} is not")
    return text


def _size_schema(rule: str, pattern: str) -> WithJsonSchema:
    return WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": pattern,
            "x-kubernetes-validations": [
                {"rule": f"type(self) == int ? self > 0 : ({rule})", "message": SIZE_MESSAGE}
            ],
        }
    )


Quantity = Annotated[
    str,
    Field(pattern=QUANTITY_PATTERN),
    AfterValidator(check_size),
    _size_schema(_SIZE_RULE, QUANTITY_PATTERN),
]
# Any resource quantity (a count of devices, ephemeral storage), checked by its pattern and,
# in the models, by the parser: no size rule (the CEL cost of one per map value is more
# than a CRD may have).
ResourceQuantity = Annotated[
    str,
    Field(pattern=QUANTITY_PATTERN, max_length=64),
    AfterValidator(_parsed),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "maxLength": 64,
        }
    ),
]
# A size or "auto".
SHM_PATTERN = r"^(auto|([0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*))$"
SizeOrAuto = Annotated[
    str,
    Field(pattern=SHM_PATTERN),
    AfterValidator(lambda text: text if text == "auto" else check_size(text)),
    _size_schema(f"self == 'auto' || ({_SIZE_RULE})", SHM_PATTERN),
]

# A Kubernetes object as the API serves it (apiVersion, kind, metadata, ...).
Manifest: TypeAlias = dict[str, Any]

# A DNS-1123 label / subdomain, as Kubernetes validates object names.
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ObjectName = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]
# The name a LoRA adapter is served under (requests give it as their model).
ADAPTER_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9._]*[a-z0-9])?$"


def to_camel(name: str) -> str:
    """snake_case → camelCase, leaving letters after digits alone (e2e_p99 → e2eP99)."""
    first, *rest = name.split("_")
    return first + "".join(part[:1].upper() + part[1:] for part in rest)


class ApiModel(BaseModel):
    """Base of every API type: camelCase on the wire, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """The manifest form: camelCase keys, unset optional fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def cel_rules(*rules: dict[str, str]) -> ConfigDict:
    """Model config carrying CEL rules (x-kubernetes-validations) into the CRD schema.

    Each rule has a twin pydantic validator on the same model; the tests hold both to one
    catalog of invalid manifests.
    """
    return ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
        json_schema_extra=cast("JsonDict", {"x-kubernetes-validations": list(rules)}),
    )


ConditionStatus = Literal["True", "False", "Unknown"]

# metav1.Condition's validation (k8s.io/apimachinery pkg/apis/meta/v1 types.go, its
# kubebuilder markers), so that status.conditions of our kinds reads and merges as every
# Kubernetes tool expects: tests/test_crds.py compares the generated schema with those
# markers. A type is a qualified name with an optional DNS-subdomain prefix; a reason one
# CamelCase word (commas, colons and underscores allowed inside).
CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
CONDITION_MESSAGE_MAX = 32768


def map_list(key: str) -> JsonDict:
    """The schema extension of a list keyed by its items' ``key``: server-side apply
    merges it item by item, so two writers' items do not replace each other's."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [key]}


# status.conditions: keyed by type, as metav1.Condition lists are.
CONDITIONS_LIST: Final[JsonDict] = map_list("type")


class Condition(ApiModel):
    """One observation of the object's state, in the shape of metav1.Condition."""

    type: str = Field(
        max_length=316,
        pattern=CONDITION_TYPE_PATTERN,
        description="Type of condition in CamelCase, such as Ready.",
    )
    status: ConditionStatus = Field(description="Status of the condition: True, False or Unknown.")
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=CONDITION_REASON_PATTERN,
        description="A one-word CamelCase reason for the condition's last transition.",
    )
    message: str = Field(
        max_length=CONDITION_MESSAGE_MAX,
        description="A human-readable message with details of the transition (may be empty).",
    )
    last_transition_time: datetime = Field(
        description="When the condition last changed from one status to another."
    )
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        json_schema_extra={"format": "int64"},
        description="The .metadata.generation that the condition was set upon.",
    )


class LocalObjectReference(ApiModel):
    """A reference to an object in the same namespace."""

    name: ObjectName = Field(description="Name of the referenced object.")


class SecretKeyReference(ApiModel):
    """A key of a Secret in the same namespace."""

    name: ObjectName = Field(description="Name of the Secret.")
    key: str = Field(
        default="token", min_length=1, description="Key within the Secret. Defaults to token."
    )


class ConfigMapKeyReference(ApiModel):
    """A key of a ConfigMap in the same namespace."""

    name: ObjectName = Field(description="Name of the ConfigMap.")
    key: str = Field(min_length=1, description="Key within the ConfigMap.")
