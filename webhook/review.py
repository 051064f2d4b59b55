"""The AdmissionReview wire format (`admission.k8s.io/v1`): reading a request, writing
the answer.

A review that cannot be read is the caller's mistake, not the webhook's: it is refused
with a message naming the problem (HTTP 400), so the API server's log says what was wrong
and, with `failurePolicy: Ignore`, the pod is still created.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson

from webhook.decide import Patch

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"


class MalformedReview(ValueError):
    """The body is not an AdmissionReview this webhook can answer."""


def parse(body: bytes) -> dict[str, Any]:
    """The `request` of an AdmissionReview about a pod, or MalformedReview."""
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
    pod = request.get("object")
    if (
        not isinstance(pod, dict)
        or pod.get("kind") != "Pod"
        or not isinstance(pod.get("metadata"), dict)
        or not isinstance(pod.get("spec"), dict)
    ):
        raise MalformedReview("the request's object is not a Pod")
    return request


def response(uid: str, patch: Patch) -> dict[str, Any]:
    """Allow the request; with the JSONPatch when there is one."""
    answer: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
    return {"apiVersion": API_VERSION, "kind": KIND, "response": answer}
