"""How a round names the API objects it reads, and recognises the ones it has seen.

Objects are the API server's dicts. A round files pods, PDBs and workloads by
namespace/name, and finds a Pending job's pod by the job's podRef. Its memo reuses what
it read only from the very same objects (the informers replace an object whenever it
changes), so "the same" means identity, not equality.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

Object = Mapping[str, Any]


def object_key(obj: Object) -> str:
    """namespace/name."""
    return f"{obj['metadata'].get('namespace')}/{obj['metadata']['name']}"


def pod_key(job: Object) -> str:
    """namespace/name of the pod a PodMigrationJob names in spec.podRef."""
    ref = (job.get("spec") or {}).get("podRef") or {}
    return f"{ref.get('namespace')}/{ref.get('name')}"


def missing_pod(job: Object, pod: Object | None, key: str) -> str | None:
    """Why the job's pod is not there (None: it is): no pod at podRef's namespace/name, or
    another pod of that name than the one podRef's uid names (a StatefulSet's pod made
    again since the job was written: migrating it would move a pod nobody asked to)."""
    if pod is None:
        return f"pod {key} not found"
    uid = ((job.get("spec") or {}).get("podRef") or {}).get("uid")
    if uid and uid != pod["metadata"].get("uid"):
        return (
            f"pod {key} is another pod than podRef names (uid {pod['metadata'].get('uid')}, "
            f"podRef.uid {uid}): the pod it named is gone"
        )
    return None


def same_objects(objects: Sequence[Object], known: tuple[Object, ...]) -> bool:
    """Whether `objects` are the very objects of `known`, in the same order."""
    return len(objects) == len(known) and all(map(operator.is_, objects, known))
