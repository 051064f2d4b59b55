"""The admission mark: proof, on a job, that arbitration admitted it.

Users who may abort a job may write its status subresource, and with it `phase: Running`.
The state machine must not take that as admission: arbitration's checks (forbidden pods,
limits, PDBs, expected replicas) would be skipped. So the admission write also records an
HMAC-SHA256 over what arbitration judged, the job's UID, the pod's UID and the mode,
keyed by a random key that only the controller can read (a Secret in its namespace). A
user can copy a mark but not make one: a copied mark names another job's UID.

Pure: the key comes in as bytes.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from berth.api import keys

VERSION = "v1"
"""Prefix of the mark, so that a later change of what is signed is told apart."""


def sign(key: bytes, *, job_uid: str, pod_uid: str, mode: str) -> str:
    """The mark for a job admitted to move the pod `pod_uid` in `mode`."""
    message = "\x00".join((VERSION, job_uid, pod_uid, mode)).encode()
    return f"{VERSION}:{hmac.new(key, message, hashlib.sha256).hexdigest()}"


def admitted(key: bytes, job: Mapping[str, Any]) -> bool:
    """Whether the job carries a valid mark for its UID, its recorded pod UID and its
    current mode (a mode changed after admission voids the mark)."""
    if not key:
        return False
    annotations = job["metadata"].get("annotations") or {}
    mark = annotations.get(keys.ADMISSION)
    pod_uid = annotations.get(keys.POD_UID)
    mode = (job.get("spec") or {}).get("mode")
    if not (mark and pod_uid and mode):
        return False
    expected = sign(key, job_uid=job["metadata"]["uid"], pod_uid=pod_uid, mode=mode)
    return hmac.compare_digest(str(mark), expected)
