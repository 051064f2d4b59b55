"""The generated CRDs: committed copies are current, schemas are structural, names and
columns match the PodMigrationJob documentation, and every CEL rule names its field.

The API server's own verdict on the same rules is tests/e2e/test_api_validation.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from berth.api.duration import DURATION_PATTERN
from berth.api.podmigrationjob import REF_FIXED
from berth.crds import render_crds, write_crds

CRDS = Path(__file__).resolve().parents[2] / "manifests" / "crds"
PMJ_FILE = "scheduling.koordinator.sh_podmigrationjobs.yaml"
RESERVATION_FILE = "scheduling.koordinator.sh_reservations.yaml"

Schema = dict[str, Any]

NOT_STRUCTURAL = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "nullable"}


def crd(file: str) -> Schema:
    document: Schema = yaml.safe_load(render_crds()[file])
    return document


def version(file: str) -> Schema:
    (only,) = crd(file)["spec"]["versions"]
    served: Schema = only
    return served


def schema(file: str) -> Schema:
    root: Schema = version(file)["schema"]["openAPIV3Schema"]
    return root


def nodes(node: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    """Every schema node with its path, e.g. `.spec.owners[*].controller`."""
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from nodes(child, f"{path}.{name}")
    if "items" in node:
        yield from nodes(node["items"], f"{path}[*]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from nodes(node["additionalProperties"], f"{path}.*")


def test_committed_files_are_current() -> None:
    rendered = render_crds()
    committed = {path.name: path.read_text(encoding="utf-8") for path in CRDS.glob("*.yaml")}
    assert committed == rendered, "run `berth crds` and commit manifests/crds"


def test_write_crds_writes_what_render_crds_renders(tmp_path: Path) -> None:
    written = write_crds(tmp_path / "crds")
    assert {path.name: path.read_text(encoding="utf-8") for path in written} == render_crds()


def test_kustomization_lists_both_crds() -> None:
    kustomization = yaml.safe_load(render_crds()["kustomization.yaml"])
    assert kustomization["resources"] == [PMJ_FILE, RESERVATION_FILE]


@pytest.mark.parametrize(
    ("file", "plural", "kind", "short_names"),
    [
        (PMJ_FILE, "podmigrationjobs", "PodMigrationJob", ["pmj"]),
        (RESERVATION_FILE, "reservations", "Reservation", ["rsv"]),
    ],
)
def test_names_and_scope(file: str, plural: str, kind: str, short_names: list[str]) -> None:
    document = crd(file)
    assert document["metadata"]["name"] == f"{plural}.scheduling.koordinator.sh"
    assert document["spec"]["group"] == "scheduling.koordinator.sh"
    assert document["spec"]["scope"] == "Cluster"
    names = document["spec"]["names"]
    assert (names["plural"], names["kind"], names["shortNames"]) == (plural, kind, short_names)
    assert names["singular"] == kind.lower()
    served = version(file)
    assert (served["name"], served["served"], served["storage"]) == ("v1alpha1", True, True)
    assert served["subresources"] == {"status": {}}


@pytest.mark.parametrize(
    ("file", "columns"),
    [
        (
            PMJ_FILE,
            [
                ("Phase", ".status.phase"),
                ("Status", ".status.status"),
                ("Age", ".metadata.creationTimestamp"),
                ("Node", ".status.nodeName"),
                ("Reservation", ".spec.reservationOptions.reservationRef.name"),
                ("PodNamespace", ".spec.podRef.namespace"),
                ("Pod", ".spec.podRef.name"),
                ("NewPod", ".status.podRef.name"),
                ("TTL", ".spec.ttl"),
            ],
        ),
        (
            RESERVATION_FILE,
            [
                ("Phase", ".status.phase"),
                ("Age", ".metadata.creationTimestamp"),
                ("Node", ".status.nodeName"),
                ("TTL", ".spec.ttl"),
                ("Expires", ".spec.expires"),
            ],
        ),
    ],
)
def test_printer_columns(file: str, columns: list[tuple[str, str]]) -> None:
    printed = version(file)["additionalPrinterColumns"]
    assert [(column["name"], column["jsonPath"]) for column in printed] == columns
    paths = dict(nodes(schema(file)))
    for column in printed:
        if column["name"] != "Age":
            assert column["jsonPath"] in paths, f"{column['jsonPath']} is not in the schema"


@pytest.mark.parametrize(
    ("file", "path", "fields"),
    [
        (PMJ_FILE, ".spec",
         ["paused", "ttl", "mode", "podRef", "reservationOptions", "deleteOptions"]),
        (PMJ_FILE, ".spec.reservationOptions",
         ["reservationRef", "template", "preemptionOptions"]),
        (PMJ_FILE, ".status",
         ["phase", "status", "reason", "message", "conditions", "nodeName", "podRef",
          "preemptedPodsRef", "preemptedPodsReservation"]),
        (PMJ_FILE, ".status.conditions[*]",
         ["type", "status", "lastProbeTime", "lastTransitionTime", "reason", "message"]),
        (PMJ_FILE, ".status.preemptedPodsReservation[*]",
         ["namespace", "name", "nodeName", "phase", "preemptedPodRef", "podsRef"]),
        (RESERVATION_FILE, ".spec", ["template", "owners", "ttl", "expires", "allocateOnce"]),
        (RESERVATION_FILE, ".spec.owners[*]", ["object", "controller", "labelSelector"]),
        (RESERVATION_FILE, ".status",
         ["phase", "nodeName", "conditions", "currentOwners", "allocatable"]),
    ],
)  # fmt: skip
def test_fields(file: str, path: str, fields: list[str]) -> None:
    assert list(dict(nodes(schema(file)))[path]["properties"]) == fields


@pytest.mark.parametrize("file", [PMJ_FILE, RESERVATION_FILE])
def test_schema_is_structural(file: str) -> None:
    root = schema(file)
    assert root["properties"]["metadata"] == {"type": "object"}
    for path, node in nodes(root):
        assert not NOT_STRUCTURAL & node.keys(), path
        assert "type" in node, f"{path} has no type"
        if node["type"] == "object" and "properties" not in node and path != ".metadata":
            preserved = node.get("x-kubernetes-preserve-unknown-fields") is True
            assert preserved or "additionalProperties" in node, f"{path} would be pruned empty"
        if "additionalProperties" in node:
            assert isinstance(node["additionalProperties"], dict), path
            assert "properties" not in node, path


@pytest.mark.parametrize(
    ("file", "required"),
    [
        (
            PMJ_FILE,
            {"": ["spec"], ".spec": ["podRef"], ".status.conditions[*]": ["type", "status"]},
        ),
        (RESERVATION_FILE, {"": ["spec"], ".status.conditions[*]": ["type", "status"]}),
    ],
)
def test_required_fields(file: str, required: dict[str, list[str]]) -> None:
    found = {path: node["required"] for path, node in nodes(schema(file)) if "required" in node}
    assert {path: found.get(path) for path in required} == required


@pytest.mark.parametrize("file", [PMJ_FILE, RESERVATION_FILE])
def test_conditions_are_a_map_by_type(file: str) -> None:
    conditions = schema(file)["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]


@pytest.mark.parametrize(
    ("file", "path", "default"),
    [
        (PMJ_FILE, ".spec.paused", False),
        (PMJ_FILE, ".status.phase", "Pending"),
        (PMJ_FILE, ".status", {}),  # so a job reads as Pending before the controller writes
        (RESERVATION_FILE, ".spec.allocateOnce", True),
        (RESERVATION_FILE, ".status.phase", "Pending"),
    ],
)
def test_defaults(file: str, path: str, default: object) -> None:
    node = dict(nodes(schema(file)))[path]
    assert node["default"] == default
    assert default in node.get("enum", [default])


def test_mode_has_no_default_so_the_controllers_default_job_mode_applies() -> None:
    spec = dict(nodes(schema(PMJ_FILE)))[".spec"]
    assert "default" not in spec["properties"]["mode"]
    assert "mode" not in spec.get("required", [])


def rules(file: str) -> Iterator[tuple[str, Schema, Schema]]:
    for path, node in nodes(schema(file)):
        for rule in node.get("x-kubernetes-validations", []):
            yield path, node, rule


@pytest.mark.parametrize("file", [PMJ_FILE, RESERVATION_FILE])
def test_every_rule_message_names_its_field(file: str) -> None:
    for path, node, rule in rules(file):
        field = rule.get("fieldPath", path).rstrip("[*]").rsplit(".", 1)[-1]
        assert field in rule["message"], f"{path}: {rule['message']!r} does not name {field}"
        if "fieldPath" in rule:
            assert rule["fieldPath"].removeprefix(".") in node["properties"], path


@pytest.mark.parametrize(
    ("file", "path", "messages"),
    [
        (PMJ_FILE, ".spec.ttl",
         ["ttl must be a Go duration such as 90s, 5m or 1h30m", "ttl must not be negative"]),
        (PMJ_FILE, ".spec", ["mode cannot be removed once set", REF_FIXED]),
        (PMJ_FILE, ".spec.mode", ["mode is immutable"]),
        (PMJ_FILE, ".spec.podRef",
         ["podRef.name is required", "podRef.namespace is required", "podRef is immutable"]),
        (
            PMJ_FILE,
            ".spec.reservationOptions.reservationRef",
            ["reservationRef.name is required", REF_FIXED],
        ),
        (PMJ_FILE, ".spec.reservationOptions", [REF_FIXED]),
        (PMJ_FILE, ".spec.reservationOptions.template.spec", ["set ttl or expires, not both"]),
        (PMJ_FILE, ".status.phase",
         ["phase cannot change once it is Succeed, Failed or Aborted"]),
        (RESERVATION_FILE, ".spec",
         ["set ttl or expires, not both", "template is required",
          "owners must list at least one owner"]),
        (RESERVATION_FILE, ".spec.owners[*]",
         ["each of owners needs object, controller or labelSelector"]),
        (RESERVATION_FILE, ".spec.owners[*].labelSelector.matchExpressions[*]",
         ["matchExpressions values must be set for In and NotIn and empty otherwise"]),
        (RESERVATION_FILE, ".spec.ttl",
         ["ttl must be a Go duration such as 90s, 5m or 1h30m", "ttl must not be negative"]),
    ],
)  # fmt: skip
def test_rules(file: str, path: str, messages: list[str]) -> None:
    assert [rule["message"] for at, _, rule in rules(file) if at == path] == messages


@pytest.mark.parametrize("file", [PMJ_FILE, RESERVATION_FILE])
def test_duration_rules_use_the_parsers_pattern(file: str) -> None:
    """The API server and berth.api.duration accept exactly the same ttl strings."""
    checks = [rule["rule"] for path, _, rule in rules(file) if "matches(" in rule["rule"]]
    assert checks
    assert all(check == f"self.matches('{DURATION_PATTERN}')" for check in checks)
    for path, node in nodes(schema(file)):
        if path.endswith(".ttl"):
            assert node["maxLength"] == 64, "an unbounded string makes matches() too costly"


def test_podref_namespace_rule_escapes_the_cel_keyword() -> None:
    pod_ref = dict(nodes(schema(PMJ_FILE)))[".spec.podRef"]
    expressions = [rule["rule"] for rule in pod_ref["x-kubernetes-validations"]]
    assert "has(self.__namespace__) && self.__namespace__ != ''" in expressions
