"""What a round reads of each Pending job and its pod, once per version of them.

A round weighs every Pending job, so what it reads of a job and its pod (the pod's
facts, the job's mode, whether the pod is forbidden to migrate, its first sort keys) is
read once into a `Candidate` and kept, through the `Memo`, for as long as the informers
hand back the very same objects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from berth.api import PodMigrationJobMode, keys
from berth.eviction import eviction_cost, guarded_by_budgets, is_healthy
from berth.protocol import made_from_eviction
from controller.arbitration.objects import Object
from controller.arbitration.order import first_keys, last_keys, qos_rank

if TYPE_CHECKING:
    from controller.arbitration.pdbs import PdbIndex
    from controller.arbitration.round import Decision
    from controller.arbitration.workloads import Workload

EVICT_DIRECTLY = PodMigrationJobMode.EVICT_DIRECTLY.value
LOCAL_STORAGE_VOLUMES = ("emptyDir", "hostPath")
"""The kinds of volume whose data stays behind on the node."""
CLAIM_VOLUMES = ("persistentVolumeClaim", "ephemeral")
"""The kinds of volume that are PersistentVolumeClaims (a generic ephemeral one makes one)."""


class PodFacts:
    """What the checks and the order read of one pod, worked out once per version of it.

    The informers replace a pod's object whenever it changes, so these are kept from one
    round to the next beside the very object they were read from (`Memo`) and read again
    only for a new object. Nothing here depends on the configuration.
    """

    __slots__ = (
        "bypass",
        "controller",
        "cost",
        "guarded",
        "healthy",
        "key",
        "label_set",
        "labels",
        "local_storage",
        "namespace",
        "node",
        "priority",
        "priority_class",
        "pvc",
        "qos",
        "scheduler",
        "spec",
        "uid",
    )

    def __init__(self, pod: Object) -> None:
        metadata: Object = pod["metadata"]
        self.spec: Object = (spec := pod.get("spec") or {})
        self.namespace: str = metadata["namespace"]
        self.key = f"{self.namespace}/{metadata['name']}"
        self.uid: str = metadata["uid"]
        self.labels: Mapping[str, str] = (labels := metadata.get("labels") or {})
        self.label_set = frozenset(labels.items())
        annotations: Mapping[str, str] = metadata.get("annotations") or {}
        owners: Sequence[Object] = metadata.get("ownerReferences") or ()
        self.controller: str | None = next(
            (ref["uid"] for ref in owners if ref.get("controller")), None
        )
        """The UID of the pod's controller, if it has one."""
        self.node: str = spec.get("nodeName") or ""
        self.cost = eviction_cost(annotations)
        self.priority: int = spec.get("priority") or 0
        self.priority_class: str = spec.get("priorityClassName") or ""
        self.scheduler: str = spec.get("schedulerName") or "default-scheduler"
        self.healthy = is_healthy(pod)
        self.guarded = guarded_by_budgets(pod)
        self.bypass = keys.DESCHEDULER_EVICT in annotations
        self.qos = qos_rank(labels, pod)
        self.local_storage: str | None = None
        """Why the pod's data would stay behind (emptyDir, hostPath), or None."""
        self.pvc: str | None = None
        """Which volume is a PersistentVolumeClaim (generic ephemeral ones are too), or None."""
        for volume in spec.get("volumes") or ():
            for kind in LOCAL_STORAGE_VOLUMES:
                if kind in volume and self.local_storage is None:
                    self.local_storage = f"{kind} volume {volume.get('name')}"
            if any(kind in volume for kind in CLAIM_VOLUMES) and self.pvc is None:
                self.pvc = f"volume {volume.get('name')}"


class Candidate(PodFacts):
    """A Pending job whose pod exists: the job, its pod and the pod's facts, whether the
    pod is forbidden to migrate (`failure`), and (set each round) its workload and place
    in the order. What is read of the job and pod holds while they are these very objects
    (and the configuration the same).

    `healthy` means Running, Ready and not terminating (its eviction takes a replica away);
    `bypass` means the pod carries descheduler.alpha.kubernetes.io/evict, which lifts the
    limits; not for a job made from an intercepted eviction.
    """

    __slots__ = (
        "age",
        "failure",
        "job",
        "order",
        "pdbs",
        "pod",
        "rank",
        "reservation_first",
        "workload",
        "workload_key",
    )

    def __init__(self, job: Object, *, pod: Object) -> None:
        super().__init__(pod)
        self.job, self.pod = job, pod
        self.reservation_first = (job.get("spec") or {}).get("mode") != EVICT_DIRECTLY
        if made_from_eviction(job):
            # Made from an eviction the webhook intercepted: whoever may evict the pod
            # may write its annotations too, and lifts no limit of the cluster with them.
            self.bypass = False
        self.rank = first_keys(self)
        self.age = last_keys(job)
        self.failure: Decision | None = None
        self.workload_key: str | None = None
        """`controlled_key` of the pod's workload: its UID within the pod's namespace."""
        self.workload: Workload | None = None
        self.order: tuple[Any, ...] = ()
        self.pdbs: tuple[PdbIndex, list[tuple[str, Object]]] | None = None
        """The PDB index last asked, and the PDBs it said cover the pod."""
