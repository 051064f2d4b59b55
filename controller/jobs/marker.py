"""The admission mark: proof, on a job, that arbitration admitted it.

Users who may abort a job may write its status subresource, and with it `phase: Running`.
The state machine must not take that as admission: arbitration's checks (forbidden pods,
limits, PDBs, expected replicas) would be skipped. So the admission write also records an
HMAC-SHA256 over what arbitration judged, the job's UID, the pod's UID and the mode,
and over what the limits count it against (its source node and workload), keyed by a
random key that only the controller can read (a Secret in its namespace). A
user can copy a mark but not make one: a copied mark names another job's UID.

Pure: the key comes in as bytes.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from berth.api import keys

VERSION = "v2"
"""Prefix of the mark, so that a later change of what is signed is told apart."""


def sign(
    key: bytes,
    *,
    job_uid: str,
    pod_uid: str,
    mode: str,
    source_node: str = "",
    workload: str = "",
) -> str:
    """The mark for a job admitted to move the pod `pod_uid` in `mode`, counted against
    `source_node` and `workload` (the annotations the limits read once the pod is gone:
    rewritten, they would move the job's count off its node or workload)."""
    fields = (VERSION, job_uid, pod_uid, mode, source_node, workload)
    return f"{VERSION}:{_digest(key, fields)}"


def _digest(key: bytes, fields: tuple[str, ...]) -> str:
    return hmac.new(key, "\x00".join(fields).encode(), hashlib.sha256).hexdigest()


def admitted(key: bytes, job: Mapping[str, Any]) -> bool:
    """Whether the job carries a valid mark for its UID, its recorded pod UID, its current
    mode (a mode changed after admission voids the mark) and its recorded source node and
    workload. A mark of version v1 (written before these two were signed) still counts
    for the first three, so that an upgrade starts no job over."""
    if not key:
        return False
    annotations = job["metadata"].get("annotations") or {}
    mark = str(annotations.get(keys.ADMISSION) or "")
    pod_uid = annotations.get(keys.POD_UID)
    mode = (job.get("spec") or {}).get("mode")
    if not (mark and pod_uid and mode):
        return False
    uid = job["metadata"]["uid"]
    if mark.startswith("v1:"):
        expected = f"v1:{_digest(key, ('v1', uid, pod_uid, mode))}"
    else:
        expected = sign(
            key,
            job_uid=uid,
            pod_uid=pod_uid,
            mode=mode,
            source_node=str(annotations.get(keys.SOURCE_NODE) or ""),
            workload=str(annotations.get(keys.WORKLOAD) or ""),
        )
    return hmac.compare_digest(mark, expected)
