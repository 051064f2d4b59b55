"""The AdmissionReview wire format (`admission.k8s.io/v1`): reading a request, writing
the answer.

A review that cannot be read is the caller's mistake, not the webhook's: it is refused
with a message naming the problem (HTTP 400), so the API server's log says what was wrong
and, with `failurePolicy: Ignore`, the pod is still created.

The API server only sends pods it has decoded, but anyone who reaches the webhook's port
can post any JSON. So every field the webhook reads (`webhook.decide`, `berth.protocol`)
is checked for its type here, before anything is decided or claimed: a review the checks
pass can be decided and patched without a type error.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

from berth.protocol import is_object_name
from webhook.decide import Patch
from webhook.evictions import Eviction

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"


class MalformedReview(ValueError):
    """The body is not an AdmissionReview this webhook can answer."""


class _Read(BaseModel):
    """The fields of an object the webhook reads, each of the type the API has; the
    others are not looked at."""

    model_config = ConfigDict(strict=True)


class OwnerReference(_Read):
    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None


class ObjectMeta(_Read):
    name: str | None = None
    generateName: str | None = None
    namespace: str | None = None
    annotations: dict[str, str] | None = None
    labels: dict[str, str] | None = None
    ownerReferences: list[OwnerReference] | None = None


class NodeSelectorRequirement(_Read):
    key: str
    operator: str
    values: list[str] | None = None


class NodeSelectorTerm(_Read):
    matchExpressions: list[NodeSelectorRequirement] | None = None
    matchFields: list[NodeSelectorRequirement] | None = None


class NodeSelector(_Read):
    nodeSelectorTerms: list[NodeSelectorTerm] | None = None


class NodeAffinity(_Read):
    requiredDuringSchedulingIgnoredDuringExecution: NodeSelector | None = None


class Affinity(_Read):
    nodeAffinity: NodeAffinity | None = None


class PodSchedulingGate(_Read):
    name: str


class ResourceRequirements(_Read):
    requests: dict[str, Any] | None = None
    limits: dict[str, Any] | None = None


class Container(_Read):
    name: str | None = None
    resources: ResourceRequirements | None = None


class PodSpec(_Read):
    nodeName: str | None = None
    containers: list[Container] | None = None
    schedulingGates: list[PodSchedulingGate] | None = None
    affinity: Affinity | None = None


class Pod(_Read):
    metadata: ObjectMeta
    spec: PodSpec


class UserInfo(_Read):
    username: str | None = None
    groups: list[str] | None = None


class AdmissionRequest(_Read):
    operation: str | None = None
    namespace: str | None = None
    dryRun: bool | None = None
    userInfo: UserInfo | None = None


def _request(body: bytes) -> dict[str, Any]:
    """The `request` of an AdmissionReview, with its uid, or MalformedReview."""
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise MalformedReview(f"the body is not JSON: {error}") from None
    if (
        not isinstance(review, dict)
        or review.get("apiVersion") != API_VERSION
        or review.get("kind") != KIND
    ):
        raise MalformedReview(f"the body is not an {API_VERSION} {KIND}")
    request = review.get("request")
    if not isinstance(request, dict):
        raise MalformedReview(f"the {KIND} has no request")
    if not request.get("uid") or not isinstance(request["uid"], str):
        raise MalformedReview("the request has no uid")
    return request


def parse(body: bytes) -> dict[str, Any]:
    """The `request` of an AdmissionReview about a pod, or MalformedReview."""
    request = _request(body)
    pod = request.get("object")
    if (
        not isinstance(pod, dict)
        or pod.get("kind") != "Pod"
        or not isinstance(pod.get("metadata"), dict)
        or not isinstance(pod.get("spec"), dict)
    ):
        raise MalformedReview("the request's object is not a Pod")
    try:
        AdmissionRequest.model_validate(request)
        Pod.model_validate(pod)
    except ValidationError as error:
        raise MalformedReview(f"the request cannot be read: {_first(error)}") from None
    return request


class Requester(UserInfo):
    """Who asks for an eviction: the API server always names the user."""

    username: str


class Preconditions(_Read):
    uid: str | None = None


class DeleteOptions(_Read):
    dryRun: list[str] | None = None
    preconditions: Preconditions | None = None
    gracePeriodSeconds: int | None = None


class EvictionObject(_Read):
    deleteOptions: DeleteOptions | None = None


class EvictionRequest(_Read):
    """An AdmissionRequest for `pods/eviction` CREATE: the pod is named by the request
    (the Eviction object in it carries only the name and delete options)."""

    name: str
    namespace: str
    subResource: str
    userInfo: Requester
    dryRun: bool | None = None
    object: EvictionObject


def parse_eviction(body: bytes) -> Eviction:
    """The eviction an AdmissionReview about `pods/eviction` asks for, or MalformedReview.

    A dry run is asked for either way: by the request (`?dryRun=All`, the review's
    `dryRun`) or in the Eviction's own `deleteOptions.dryRun`, which is how kubectl drain
    asks and which the review's `dryRun` does not reflect."""
    request = _request(body)
    try:
        read = EvictionRequest.model_validate(request)
    except ValidationError as error:
        raise MalformedReview(f"the request cannot be read: {_first(error)}") from None
    if read.subResource != "eviction":
        raise MalformedReview(f"the request is about pods/{read.subResource}, not pods/eviction")
    for field, value in (("name", read.name), ("namespace", read.namespace)):
        if not is_object_name(value):
            raise MalformedReview(f"the request's {field} {value[:64]!r} is not an object's name")
    options = read.object.deleteOptions
    return Eviction(
        uid=request["uid"],
        namespace=read.namespace,
        pod=read.name,
        user=read.userInfo.username,
        groups=tuple(read.userInfo.groups or ()),
        dry_run=bool(read.dryRun) or bool(options and options.dryRun),
        uid_precondition=options.preconditions.uid if options and options.preconditions else None,
        grace_period_seconds=_grace(options.gracePeriodSeconds if options else None),
    )


def _grace(seconds: int | None) -> int | None:
    """The eviction's grace period, as the API server would take it (None: the pod's own;
    a negative one, which the API server refuses, is left to it)."""
    return seconds if seconds is not None and seconds >= 0 else None


def _first(error: ValidationError) -> str:
    """Where the first problem is, and what it is: `object.spec.affinity: Input should be
    a valid dictionary` (the input itself is left out: it is the caller's, of any size)."""
    problem = error.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in problem["loc"])
    prefix = "" if error.title in ("AdmissionRequest", "EvictionRequest") else "object."
    return f"{prefix}{where}: {problem['msg']}"


def response(uid: str, patch: Patch) -> dict[str, Any]:
    """Allow the request; with the JSONPatch when there is one."""
    answer: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
    return {"apiVersion": API_VERSION, "kind": KIND, "response": answer}


def refusal(uid: str, *, code: int, reason: str, message: str) -> dict[str, Any]:
    """Deny the request with this HTTP code: the API server hands `code`, `reason` and
    `message` to the client as the Status of its answer (429 TooManyRequests: retry
    later; 404 NotFound: the object is gone)."""
    status = {"status": "Failure", "code": code, "reason": reason, "message": message}
    answer = {"uid": uid, "allowed": False, "status": status}
    return {"apiVersion": API_VERSION, "kind": KIND, "response": answer}
