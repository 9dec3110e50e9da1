"""Structural OpenAPI v3 schemas (the CRD dialect) from the pydantic API models.

The mapping, type by type:

    str / int / bool          string / integer / boolean
    StrEnum                   string with `enum` (its values, in declaration order)
    Quantity                  int-or-string with the Kubernetes quantity pattern
    list[T]                   array of T
    dict[str, Any]            object with x-kubernetes-preserve-unknown-fields
    dict[str, T]              object with additionalProperties T
    Annotated[.., CoreSchema] the core/v1 type's schema from `coreschema` (Kubernetes' OpenAPI)
    ApiModel subclass         object with properties (JSON names), `required`
    T | None                  T (optional)

Field metadata becomes schema keywords: `description`; `min_length`/`max_length` (minItems/
maxItems on arrays, minLength/maxLength on strings); `ge`/`le` (minimum/maximum);
`pattern`; and `json_schema_extra` (a dict) merged last, for CRD-only keywords such as
`x-kubernetes-validations` or `format`. Unknown-field tolerance of the models (extra="allow")
does not leak into the schema: the apiserver prunes fields the schema does not name, like
KServe's CRDs do. Anything outside this mapping raises `TypeError`, so a new model field
cannot silently produce a wrong CRD.
"""

from __future__ import annotations

import copy
import types
import typing
from enum import StrEnum
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from localcache.api import coreschema, meta
from localcache.api.quantity import CRD_PATTERN, Quantity

Schema = dict[str, Any]

QUANTITY_SCHEMA: Schema = {
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "pattern": CRD_PATTERN,
    "x-kubernetes-int-or-string": True,
}
API_VERSION_DESCRIPTION = (
    "APIVersion defines the versioned schema of this representation of an object. Servers "
    "should convert recognized schemas to the latest internal value, and may reject "
    "unrecognized values."
)
KIND_DESCRIPTION = (
    "Kind is a string value representing the REST resource this object represents. Servers "
    "may infer this from the endpoint the client submits requests to. In CamelCase."
)


def positive_quantity(field: str) -> Schema:
    """`x-kubernetes-validations` refusing a quantity that is not greater than zero, with a
    message naming `field`. `self` is an integer or a string (int-or-string); strings that are
    no quantity at all are left to the pattern, which reports them."""
    return {
        "x-kubernetes-validations": [
            {
                "rule": (
                    "type(self) == int ? self > 0 : "
                    "(!isQuantity(self) || quantity(self).isGreaterThan(quantity('0')))"
                ),
                "message": f"{field} must be greater than zero",
            }
        ]
    }


def _strip_optional(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"unions other than `T | None` have no CRD schema: {annotation}")
        return args[0]
    return annotation


def type_schema(annotation: Any) -> Schema:
    """The schema of a type, without field metadata."""
    annotation = _strip_optional(annotation)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is list:
        return {"type": "array", "items": type_schema(args[0])}
    if origin is dict:
        if args[0] is not str:
            raise TypeError(f"map keys must be strings: {annotation}")
        if args[1] is Any:
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        return {"type": "object", "additionalProperties": type_schema(args[1])}
    if annotation is Quantity:
        return copy.deepcopy(QUANTITY_SCHEMA)  # shared lists would become YAML anchors
    if isinstance(annotation, type):
        if issubclass(annotation, StrEnum):
            return {"type": "string", "enum": [member.value for member in annotation]}
        if issubclass(annotation, bool):
            return {"type": "boolean"}
        if issubclass(annotation, int):
            return {"type": "integer"}
        if issubclass(annotation, str):
            return {"type": "string"}
        if issubclass(annotation, meta.ApiModel):
            return object_schema(annotation)
    raise TypeError(f"no CRD schema for {annotation!r}")


def _constraints(info: FieldInfo, schema: Schema) -> Schema:
    array = schema.get("type") == "array"
    keywords = {
        "min_length": "minItems" if array else "minLength",
        "max_length": "maxItems" if array else "maxLength",
        "ge": "minimum",
        "le": "maximum",
        "pattern": "pattern",
    }
    out: Schema = {}
    for item in info.metadata:
        if isinstance(item, coreschema.CoreSchema):
            continue
        found = {kw: getattr(item, attr) for attr, kw in keywords.items() if hasattr(item, attr)}
        found = {kw: value for kw, value in found.items() if value is not None}
        if not found:
            raise TypeError(f"no CRD keyword for field constraint {item!r}")
        out.update(found)
    return out


def field_schema(info: FieldInfo) -> Schema:
    """The schema of one model field: its type, constraints, description and extras."""
    core = [item for item in info.metadata if isinstance(item, coreschema.CoreSchema)]
    schema = core[0].schema() if core else type_schema(info.annotation)
    schema.update(_constraints(info, schema))
    if info.description:
        schema["description"] = info.description
    extra = info.json_schema_extra
    if extra is not None:
        if not isinstance(extra, dict):
            raise TypeError("json_schema_extra must be a dict for CRD generation")
        schema.update(extra)
    return schema


def _json_name(name: str, info: FieldInfo) -> str:
    return info.serialization_alias or info.alias or name


def object_schema(model: type[BaseModel], *, skip: tuple[str, ...] = ()) -> Schema:
    """The object schema of a model: one property per field (by JSON name), `required`
    for fields without a default. Fields named in `skip` are left out."""
    properties: Schema = {}
    required: list[str] = []
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        json_name = _json_name(name, info)
        properties[json_name] = field_schema(info)
        if info.is_required():
            required.append(json_name)
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = sorted(required)
    return schema


def root_schema(model: type[meta.KubeObject]) -> Schema:
    """The `openAPIV3Schema` of a top-level kind: its class docstring as description,
    `metadata` left to the apiserver, and every other field generated."""
    schema = object_schema(model, skip=("api_version", "kind", "metadata"))
    schema["properties"].update(
        apiVersion={"type": "string", "description": API_VERSION_DESCRIPTION},
        kind={"type": "string", "description": KIND_DESCRIPTION},
        metadata={"type": "object"},
    )
    doc = " ".join((model.__doc__ or "").split())
    if doc:
        schema["description"] = doc
    return schema
