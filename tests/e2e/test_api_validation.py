"""The API server's verdict on Berth's CRDs.

The quick start of the PodMigrationJob documentation (tests/e2e/seed_quickstart, verbatim)
must be accepted as it is, `kubectl get pmj` must print the documented columns, and
malformed objects must be refused with a message naming the offending field. The
structural checks of the same schemas that need no API server are in
tests/unit/test_crds.py.

PodMigrationJobs and Reservations are cluster-scoped, so every test names its objects
uniquely and deletes them afterwards. The jobs are paused where the test allows it, so a
running controller leaves them alone.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from berth.api import API_VERSION, PodMigrationJob, Reservation
from berth.api.podmigrationjob import REF_FIXED
from tests.e2e.kube import Cluster

pytestmark = pytest.mark.e2e

SEEDS = Path(__file__).resolve().parent / "seed_quickstart"
JOBS = sorted(SEEDS.glob("migrationjob-*.yaml"))
SEED_NAME_LINE = "\n  name: migrationjob-demo\n"

Object = dict[str, Any]
Created = list[tuple[str, str]]

MISSING = object()
"""As a value in a case table: remove the field."""


@pytest.fixture
def created(cluster: Cluster) -> Iterator[Created]:
    """(kind, name) of the cluster-scoped objects a test made, deleted when it ends."""
    objects: Created = []
    yield objects
    for kind, name in objects:
        cluster.kubectl("delete", kind, name, "--ignore-not-found", "--wait=false", check=False)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def renamed(manifest: str, name: str) -> str:
    """A quick-start job with only its metadata.name changed."""
    assert manifest.count(SEED_NAME_LINE) == 1
    return manifest.replace(SEED_NAME_LINE, f"\n  name: {name}\n")


def create(
    cluster: Cluster, created: Created, document: Object
) -> subprocess.CompletedProcess[str]:
    """`kubectl create` of `document` with strict field validation; the result unchecked."""
    created.append((document["kind"].lower(), document["metadata"]["name"]))
    return cluster.kubectl(
        "create", "--validate=strict", "-f", "-", input=yaml.safe_dump(document), check=False
    )


def test_quick_start_deployment_is_accepted(cluster: Cluster, namespace: str) -> None:
    manifest = (SEEDS / "pod-demo.yaml").read_text()
    in_namespace = manifest.replace("\n  namespace: default\n", f"\n  namespace: {namespace}\n")
    assert in_namespace != manifest
    result = cluster.kubectl("create", "-f", "-", input=in_namespace)
    assert "deployment.apps/pod-demo created" in result.stdout
    stored = cluster.get("deployment", "pod-demo", "-n", namespace)
    # Only the creation matters here; tests/e2e/test_migration.py runs the quick start.
    assert stored["spec"]["template"]["spec"]["schedulerName"] == "koord-scheduler"


@pytest.mark.parametrize("path", JOBS, ids=lambda path: path.stem)
def test_quick_start_job_is_accepted_verbatim(
    cluster: Cluster, created: Created, path: Path
) -> None:
    name = unique(path.stem)
    created.append(("podmigrationjob", name))
    result = cluster.kubectl("create", "-f", "-", input=renamed(path.read_text(), name))
    assert f"podmigrationjob.scheduling.koordinator.sh/{name} created" in result.stdout
    stored = cluster.get("podmigrationjob", name)
    # The controller may already have written the ttl back as Go prints it (5m0s).
    spec = yaml.safe_load(path.read_text())["spec"]
    assert stored["spec"] | {"ttl": spec["ttl"]} == spec
    assert stored["spec"]["ttl"] in ("5m", "5m0s")
    PodMigrationJob.model_validate(stored)


def test_get_prints_the_documented_columns(cluster: Cluster, created: Created) -> None:
    name = unique("columns")
    created.append(("podmigrationjob", name))
    cluster.kubectl(
        "create", "-f", "-", input=renamed((SEEDS / "migrationjob-paused.yaml").read_text(), name)
    )
    # The controller writes `ttl: 5m` back as Go prints it, as Koordinator's Go controller
    # does, so the TTL column reads 5m0s as in the documentation.
    printed = cluster.wait(
        lambda: shown if (shown := printed_row(cluster, "pmj", name))["TTL"] == "5m0s" else None,
        what="the TTL column to read 5m0s",
    )
    assert list(printed) == [
        "NAME", "PHASE", "STATUS", "AGE", "NODE", "RESERVATION", "PODNAMESPACE", "POD",
        "NEWPOD", "TTL",
    ]  # fmt: skip
    assert printed["NAME"] == name
    # The API server drops the created status; the schema's default gives it phase Pending.
    assert printed["PHASE"] == "Pending"
    assert printed["PODNAMESPACE"] == "default"
    assert printed["POD"] == "pod-demo-5f9b977566-c7lvk"


def printed_row(cluster: Cluster, *what: str) -> dict[str, str]:
    """The one row of `kubectl get`, by column name."""
    header, row = cluster.kubectl("get", *what).stdout.splitlines()
    return columns(header, row)


def columns(header: str, row: str) -> dict[str, str]:
    """A row of `kubectl get` by column name; empty columns (unset fields) are ''."""
    starts = [match.start() for match in re.finditer(r"\S+", header)]
    ends = [*starts[1:], None]
    return {
        header[start:end].strip(): row[start:end].strip()
        for start, end in zip(starts, ends, strict=True)
    }


def job(name: str) -> Object:
    return {
        "apiVersion": API_VERSION,
        "kind": "PodMigrationJob",
        "metadata": {"name": name},
        "spec": {
            "paused": True,
            "ttl": "5m",
            "mode": "ReservationFirst",
            "podRef": {"namespace": "default", "name": "pod-demo-5f9b977566-c7lvk"},
        },
    }


def reservation(name: str) -> Object:
    return {
        "apiVersion": API_VERSION,
        "kind": "Reservation",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}]}
            },
            "owners": [{"object": {"namespace": "default", "name": "pod-demo-5f9b977566-nxjdf"}}],
            "ttl": "5m",
        },
    }


def changed(document: Object, path: str, value: Any) -> Object:
    """`document` with the field at the dotted `path` set to `value` (MISSING removes it)."""
    result = copy.deepcopy(document)
    *parents, field = path.split(".")
    node = result
    for parent in parents:
        node = node.setdefault(parent, {})
    if value is MISSING:
        del node[field]
    else:
        node[field] = value
    return result


def test_omitted_fields_get_their_defaults(cluster: Cluster, created: Created) -> None:
    document = changed(job(unique("defaults")), "spec.mode", MISSING)
    created.append(("podmigrationjob", document["metadata"]["name"]))
    # The object as the API server stored it, before the controller records a mode.
    result = cluster.kubectl("create", "-o", "json", "-f", "-", input=yaml.safe_dump(document))
    stored_job = json.loads(result.stdout)
    assert "mode" not in stored_job["spec"]  # the controller's defaultJobMode applies
    document = reservation(unique("defaults"))
    assert create(cluster, created, document).returncode == 0
    stored = cluster.get("reservation", document["metadata"]["name"])
    assert stored["spec"]["allocateOnce"] is True
    Reservation.model_validate(stored)


# (case id, object builder, field path, value or MISSING, substrings expected in stderr)
INVALID_ON_CREATE = [
    ("job-without-podRef", job, "spec.podRef", MISSING, ["spec.podRef", "Required value"]),
    ("job-podRef-without-name", job, "spec.podRef.name", MISSING, ["spec.podRef.name"]),
    ("job-podRef-empty-name", job, "spec.podRef.name", "", ["spec.podRef.name"]),
    ("job-podRef-without-namespace", job, "spec.podRef.namespace", MISSING,
     ["spec.podRef.namespace"]),
    ("job-podRef-by-uid-only", job, "spec.podRef", {"uid": "5c4e1a7e-uid"},
     ["spec.podRef.name", "spec.podRef.namespace"]),
    ("job-unknown-mode", job, "spec.mode", "Fast", ["spec.mode", "Unsupported value"]),
    ("job-negative-ttl", job, "spec.ttl", "-5m", ["spec.ttl", "ttl must not be negative"]),
    ("job-garbage-ttl", job, "spec.ttl", "soon", ["spec.ttl", "ttl must be a Go duration"]),
    ("job-ttl-in-days", job, "spec.ttl", "1d", ["spec.ttl", "ttl must be a Go duration"]),
    ("job-ttl-as-number", job, "spec.ttl", 300, ["spec.ttl", "string"]),
    ("job-paused-as-string", job, "spec.paused", "yes", ["spec.paused", "boolean"]),
    ("job-without-spec", job, "spec", MISSING, ["spec", "Required value"]),
    ("job-misspelled-field", job, "spec.podref", {"name": "p"}, ['unknown field "spec.podref"']),
    ("job-reservationRef-without-name", job, "spec.reservationOptions",
     {"reservationRef": {"namespace": "default"}},
     ["spec.reservationOptions.reservationRef.name"]),
    ("job-deleteOptions-as-string", job, "spec.deleteOptions", "now",
     ["spec.deleteOptions", "object"]),
    ("job-template-with-ttl-and-expires", job, "spec.reservationOptions",
     {"template": {"spec": {"ttl": "5m", "expires": "2030-01-01T00:00:00Z"}}},
     ["spec.reservationOptions.template.spec.expires", "set ttl or expires, not both"]),
    ("reservation-without-template", reservation, "spec.template", MISSING,
     ["spec.template", "Required value"]),
    ("reservation-without-owners", reservation, "spec.owners", MISSING,
     ["spec.owners", "Required value"]),
    ("reservation-with-empty-owners", reservation, "spec.owners", [], ["spec.owners"]),
    ("reservation-owner-selecting-nothing", reservation, "spec.owners", [{}],
     ["spec.owners[0]", "object, controller or labelSelector"]),
    ("reservation-controller-without-uid", reservation, "spec.owners",
     [{"controller": {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "pod-demo"}}],
     ["spec.owners[0].controller.uid", "Required value"]),
    ("reservation-selector-In-without-values", reservation, "spec.owners",
     [{"labelSelector": {"matchExpressions": [{"key": "app", "operator": "In"}]}}],
     ["spec.owners[0].labelSelector.matchExpressions[0].values"]),
    ("reservation-selector-unknown-operator", reservation, "spec.owners",
     [{"labelSelector": {"matchExpressions": [{"key": "app", "operator": "Like"}]}}],
     ["spec.owners[0].labelSelector.matchExpressions[0].operator", "Unsupported value"]),
    ("reservation-ttl-and-expires", reservation, "spec.expires", "2030-01-01T00:00:00Z",
     ["spec.expires", "set ttl or expires, not both"]),
    ("reservation-garbage-ttl", reservation, "spec.ttl", "forever",
     ["spec.ttl", "ttl must be a Go duration"]),
    ("reservation-expires-not-a-time", reservation, "spec.expires", "tomorrow",
     ["spec.expires"]),
    ("reservation-allocateOnce-as-string", reservation, "spec.allocateOnce", "true",
     ["spec.allocateOnce", "boolean"]),
    ("reservation-without-spec", reservation, "spec", MISSING, ["spec", "Required value"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("build", "path", "value", "expected"),
    [pytest.param(*case, id=case_id) for case_id, *case in INVALID_ON_CREATE],
)
def test_invalid_object_is_refused(
    cluster: Cluster, created: Created, *, build: Any, path: str, value: Any, expected: list[str]
) -> None:
    document = changed(build(unique("invalid")), path, value)
    result = create(cluster, created, document)
    assert result.returncode != 0, f"accepted:\n{yaml.safe_dump(document)}"
    for text in expected:
        assert text in result.stderr


def patch(
    cluster: Cluster, kind: str, name: str, body: Object, *, status: bool
) -> subprocess.CompletedProcess[str]:
    subresource = ["--subresource=status"] if status else []
    return cluster.kubectl(
        "patch", kind, name, *subresource, "--type=merge", "-p", json.dumps(body), check=False
    )


# (case id, object builder, status patch, substrings expected in stderr)
INVALID_STATUS = [
    ("job-unknown-phase", job, {"phase": "Done"}, ["status.phase", "Unsupported value"]),
    ("job-unknown-condition-type", job, {"conditions": [{"type": "Bogus", "status": "True"}]},
     ["status.conditions[0].type", "Unsupported value"]),
    ("job-condition-without-status", job, {"conditions": [{"type": "Eviction"}]},
     ["status.conditions[0].status", "Required value"]),
    ("job-condition-status-yes", job, {"conditions": [{"type": "Eviction", "status": "Yes"}]},
     ["status.conditions[0].status", "Unsupported value"]),
    ("job-condition-time-not-a-time", job,
     {"conditions": [{"type": "Eviction", "status": "True", "lastTransitionTime": "yesterday"}]},
     ["status.conditions[0].lastTransitionTime"]),
    ("reservation-unknown-phase", reservation, {"phase": "Reserved"},
     ["status.phase", "Unsupported value"]),
    ("reservation-allocatable-as-number", reservation, {"allocatable": {"cpu": 2}},
     ["status.allocatable.cpu", "string"]),
    ("reservation-allocatable-not-a-quantity", reservation,
     {"allocatable": {"cpu": "1.5 cores"}},
     ["status.allocatable", "allocatable values must be quantities"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("build", "status", "expected"),
    [pytest.param(*case, id=case_id) for case_id, *case in INVALID_STATUS],
)
def test_invalid_status_is_refused(
    cluster: Cluster, created: Created, build: Any, status: Object, expected: list[str]
) -> None:
    document = build(unique("status"))
    assert create(cluster, created, document).returncode == 0
    kind, name = document["kind"].lower(), document["metadata"]["name"]
    result = patch(cluster, kind, name, {"status": status}, status=True)
    assert result.returncode != 0, f"accepted status {status}"
    for text in expected:
        assert text in result.stderr


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"podRef": {"name": "another-pod"}}, ["spec.podRef", "podRef is immutable"]),
        ({"mode": "EvictDirectly"}, ["spec.mode", "mode is immutable"]),
        ({"mode": None}, ["spec.mode", "mode cannot be removed once set"]),
    ],
)
def test_job_target_cannot_change(
    cluster: Cluster, created: Created, spec: Object, expected: list[str]
) -> None:
    document = job(unique("immutable"))
    assert create(cluster, created, document).returncode == 0
    name = document["metadata"]["name"]
    result = patch(cluster, "podmigrationjob", name, {"spec": spec}, status=False)
    assert result.returncode != 0, f"accepted {spec}"
    for text in expected:
        assert text in result.stderr


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"reservationRef": {"name": "another"}}, id="another Reservation"),
        pytest.param({"reservationRef": None}, id="the ref removed"),
        pytest.param(None, id="reservationOptions removed"),
    ],
)
def test_a_reservation_ref_cannot_change_once_set(
    cluster: Cluster, created: Created, options: Object | None
) -> None:
    """Changed in flight, the job would lose sight of its own Reservation, which would hold
    its capacity until its own TTL; set where none was, it is how the controller records
    the Reservation it made."""
    document = job(unique("ref"))
    document["spec"]["reservationOptions"] = {"reservationRef": {"name": "mine"}}
    assert create(cluster, created, document).returncode == 0
    name = document["metadata"]["name"]
    result = patch(cluster, "pmj", name, {"spec": {"reservationOptions": options}}, status=False)
    assert result.returncode != 0, f"accepted {options}"
    assert REF_FIXED in result.stderr
    unset = job(unique("unset"))
    assert create(cluster, created, unset).returncode == 0
    recorded = {"spec": {"reservationOptions": {"reservationRef": {"name": "made"}}}}
    result = patch(cluster, "pmj", unset["metadata"]["name"], recorded, status=False)
    assert result.returncode == 0, result.stderr


def test_ttl_and_paused_can_change(cluster: Cluster, created: Created) -> None:
    document = job(unique("mutable"))
    assert create(cluster, created, document).returncode == 0
    name = document["metadata"]["name"]
    result = patch(cluster, "pmj", name, {"spec": {"ttl": "1h", "paused": False}}, status=False)
    assert result.returncode == 0, result.stderr
    spec = cluster.get("pmj", name)["spec"]
    assert spec["ttl"] in ("1h", "1h0m0s")  # Go's form, once the controller rewrote it
    assert spec["paused"] is False


def test_a_job_stored_as_succeeded_stays_finished(cluster: Cluster, created: Created) -> None:
    """Earlier Berth releases wrote `Succeeded`; the schema still holds such a job, and
    as a finished job."""
    document = job(unique("succeeded"))
    assert create(cluster, created, document).returncode == 0
    name = document["metadata"]["name"]
    stored = patch(cluster, "pmj", name, {"status": {"phase": "Succeeded"}}, status=True)
    assert stored.returncode == 0, stored.stderr
    revived = patch(cluster, "pmj", name, {"status": {"phase": "Running"}}, status=True)
    assert "phase cannot change once it is Succeed, Failed or Aborted" in revived.stderr
    assert cluster.get("pmj", name)["status"]["phase"] == "Succeeded"
    PodMigrationJob.model_validate(cluster.get("pmj", name))


def test_aborted_job_stays_aborted(cluster: Cluster, created: Created) -> None:
    document = job(unique("aborted"))
    assert create(cluster, created, document).returncode == 0
    name = document["metadata"]["name"]
    aborted = patch(cluster, "pmj", name, {"status": {"phase": "Aborted"}}, status=True)
    assert aborted.returncode == 0, aborted.stderr
    revived = patch(cluster, "pmj", name, {"status": {"phase": "Pending"}}, status=True)
    assert revived.returncode != 0
    assert "status.phase" in revived.stderr
    assert "phase cannot change once it is Succeed, Failed or Aborted" in revived.stderr
