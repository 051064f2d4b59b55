"""The CustomResourceDefinitions of PodMigrationJob and Reservation, derived from the models.

The pydantic models in `berth.api` are the only definition of the API; this module turns
their JSON schema into the structural OpenAPI schema the API server requires: references
inlined, optional fields as plain non-required properties (no `anyOf` with null), core
Kubernetes objects as preserved objects, and the CEL rules the models carry. It fails on
anything it does not know how to make structural rather than writing a schema the API
server would reject or, worse, prune data with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from berth.api import GROUP, VERSION, PodMigrationJob, Reservation

Schema = dict[str, Any]

HEADER = "# Generated from the models in berth/api by `berth crds`; do not edit.\n"

_KEPT = {
    "type", "description", "properties", "required", "items", "additionalProperties",
    "enum", "default", "format", "maxLength", "minLength", "maxItems", "minItems",
    "maxProperties",
}  # fmt: skip
_ROOT_FIELDS: Schema = {
    "apiVersion": {"type": "string", "description": "Versioned schema of this representation."},
    "kind": {"type": "string", "description": "The REST resource this object represents."},
    "metadata": {"type": "object"},
}


def _column(name: str, json_path: str, *, kind: str = "string") -> Schema:
    return {"name": name, "type": kind, "jsonPath": json_path}


_AGE = _column("Age", ".metadata.creationTimestamp", kind="date")

# The columns `kubectl get podmigrationjob` shows in the PodMigrationJob documentation.
PODMIGRATIONJOB_COLUMNS = [
    _column("Phase", ".status.phase"),
    _column("Status", ".status.status"),
    _AGE,
    _column("Node", ".status.nodeName"),
    _column("Reservation", ".spec.reservationOptions.reservationRef.name"),
    _column("PodNamespace", ".spec.podRef.namespace"),
    _column("Pod", ".spec.podRef.name"),
    _column("NewPod", ".status.podRef.name"),
    _column("TTL", ".spec.ttl"),
]
RESERVATION_COLUMNS = [
    _column("Phase", ".status.phase"),
    _AGE,
    _column("Node", ".status.nodeName"),
    _column("TTL", ".spec.ttl"),
    _column("Expires", ".spec.expires"),
]


def openapi_schema(model: type[BaseModel]) -> Schema:
    """The structural `openAPIV3Schema` of a top-level API kind."""
    generated = model.model_json_schema(by_alias=True)
    # apiVersion, kind and metadata are the API server's business: the standard schema.
    generated["properties"] = _ROOT_FIELDS | {
        name: value for name, value in generated["properties"].items() if name not in _ROOT_FIELDS
    }
    return _structural(generated, generated.get("$defs", {}))


def _structural(node: Schema, defs: Schema) -> Schema:
    """`node` with references inlined, null alternatives dropped and only structural keys."""
    node = dict(node)
    node.pop("$defs", None)
    if "$ref" in node:
        target = defs[node.pop("$ref").removeprefix("#/$defs/")]
        return _structural(_merge(target, node), defs)
    if "anyOf" in node:
        # Optional[X] is anyOf [X, null]: the field is X and simply not required.
        branches = [branch for branch in node.pop("anyOf") if branch != {"type": "null"}]
        if len(branches) != 1:
            raise ValueError(f"cannot make a structural schema of a union: {branches}")
        return _structural(_merge(branches[0], node), defs)
    result: Schema = {}
    for key, value in node.items():
        kept = _structural_value(key, value, node, defs)
        if kept is not _DROP:
            result[key] = kept
    return dict(sorted(result.items()))


_DROP = object()


def _structural_value(key: str, value: Any, node: Schema, defs: Schema) -> Any:
    """What a structural schema keeps of one key of `node` (`_DROP`: nothing)."""
    if key == "title" or (key == "default" and value is None):
        return _DROP
    if key == "additionalProperties" and isinstance(value, bool):
        return _DROP  # extra="forbid": the API server prunes unknown fields anyway
    if key == "description":
        return " ".join(value.split())
    if key == "properties":
        return {name: _structural(sub, defs) for name, sub in value.items()}
    if key in ("items", "additionalProperties"):
        return _structural(value, defs)
    if key not in _KEPT and not key.startswith("x-kubernetes-"):
        raise ValueError(f"cannot put {key!r} in a structural schema: {node}")
    return value


def _merge(base: Schema, override: Schema) -> Schema:
    """A field's own keys over its type's; CEL rules of both apply."""
    merged = base | override
    rules = base.get("x-kubernetes-validations", []) + override.get("x-kubernetes-validations", [])
    if rules:
        merged["x-kubernetes-validations"] = rules
    return merged


def custom_resource_definition(
    model: type[BaseModel], *, plural: str, short_names: list[str], columns: list[Schema]
) -> Schema:
    """The cluster-scoped CRD of `model`, with a status subresource."""
    kind = model.__name__
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
            },
            "scope": "Cluster",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": openapi_schema(model)},
                }
            ],
        },
    }


def render_crds() -> dict[str, str]:
    """File name -> YAML text of the CRDs and the kustomization that lists them."""
    crds = {
        f"{GROUP}_podmigrationjobs.yaml": custom_resource_definition(
            PodMigrationJob,
            plural="podmigrationjobs",
            short_names=["pmj"],
            columns=PODMIGRATIONJOB_COLUMNS,
        ),
        f"{GROUP}_reservations.yaml": custom_resource_definition(
            Reservation,
            plural="reservations",
            short_names=["rsv"],
            columns=RESERVATION_COLUMNS,
        ),
    }
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": list(crds),
    }
    files = crds | {"kustomization.yaml": kustomization}
    return {name: HEADER + _dump(document) for name, document in files.items()}


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, _data: Any) -> bool:
        return True  # a schema fragment used twice is written twice, not as a YAML anchor


def _dump(document: Schema) -> str:
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)


def write_crds(out_dir: Path) -> list[Path]:
    """Write the files of `render_crds()` into `out_dir`; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_crds().items():
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
