"""What the controller knows of the cluster: one informer per resource, their indexes,
the capacity ledger, and the read-only views the decisions take.

Watch events only name keys for the work queue (and feed the ledger); they never carry a
decision. The views are built from the caches when a decision is about to be made, so a
decision always reads the latest state, whatever event brought its key in.

An arbitration round reads much of the cluster and runs on its own thread
(`controller.admission`), so it reads a `Frozen` copy of the caches, taken on the event
loop in the time it takes to copy a few dicts, which later watch events do not change.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

from berth import protocol
from berth.api import TERMINAL_PHASES, keys
from berth.api.times import read_time
from berth.eviction import soft_eviction_job
from berth.kube.client import (
    DEPLOYMENTS,
    NAMESPACES,
    NODES,
    PDBS,
    PERSISTENTVOLUMES,
    PODMIGRATIONJOBS,
    PODS,
    PRIORITYCLASSES,
    REPLICASETS,
    RESERVATIONS,
    STATEFULSETS,
    Kube,
    Resource,
)
from berth.kube.informer import IndexFunc, Informer, Store, object_key, without_managed_fields
from berth.ledger import Ledger
from berth.resources import Resources
from berth.scheduling import (
    node_gates,
    node_refusal,
    selector_matches,
    spread_refusal,
    spreads_hard,
)
from berth.settings import MigrationControllerArgs
from controller import build, jobs, namespaces, reservations
from controller.actions import Plan
from controller.arbitration.candidates import CLAIM_VOLUMES, LOCAL_STORAGE_VOLUMES
from controller.queue import job_key, namespace_key, reservation_key

Object = dict[str, Any]


def _pod_ref_key(job: Mapping[str, Any]) -> list[str]:
    ref = job.get("spec", {}).get("podRef") or {}
    return [f"{ref.get('namespace')}/{ref.get('name')}"]


def _volume_claim(volume: Mapping[str, Any]) -> list[str]:
    """The claim a PersistentVolume is bound to, as `namespace/name`: a Bound one only (a
    Released volume keeps the claimRef of a claim deleted since, maybe made again)."""
    if (volume.get("status") or {}).get("phase") != "Bound":
        return []
    ref = (volume.get("spec") or {}).get("claimRef") or {}
    return [f"{ref['namespace']}/{ref['name']}"] if ref.get("namespace") and ref.get("name") else []


def lean_volume(volume: Object) -> Object:
    """What the volumes' cache keeps of a PersistentVolume: who it is, its phase, the
    claim it is bound to and where it can be used (its node affinity); not its source (a
    CSI handle, a server), which the controller never reads."""
    spec = volume.get("spec") or {}
    return {
        "metadata": without_managed_fields(volume)["metadata"],
        "spec": {key: spec[key] for key in ("claimRef", "nodeAffinity") if key in spec},
        "status": {"phase": (volume.get("status") or {}).get("phase")},
    }


def _single(value: str | None) -> list[str]:
    return [value] if value else []


CONTAINER_FIELDS = ("name", "resources", "ports", "restartPolicy")
"""What the controller reads of a container: what it requests, its host ports (a
Reservation's template, `build.reservation_for`; `berth.resources`) and whether an init
container is a sidecar."""
READ_VOLUMES = (*LOCAL_STORAGE_VOLUMES, *CLAIM_VOLUMES)
"""The kinds of volume the arbitration looks at (`arbitration.candidates.PodFacts`)."""
UNREAD_STATUS = (
    "containerStatuses",
    "initContainerStatuses",
    "ephemeralContainerStatuses",
    "podIP",
    "podIPs",
    "hostIP",
    "hostIPs",
)


def lean_pod(pod: Object) -> Object:
    """What the pods' cache keeps of a pod: all but what the controller never reads, which
    is over half of a running pod's memory here (bench/PROFILE.md): `managedFields`, of
    each container all but `CONTAINER_FIELDS`, the volumes of other kinds than
    `READ_VOLUMES`, ephemeral containers, the containers' statuses and the pod's
    addresses. Nothing the controller writes is made of a cached pod (pods are only
    patched, by merge patch or a JSON patch of their scheduling gates, which are kept)."""
    lean = without_managed_fields(pod)
    spec: Object = dict(lean.get("spec") or {})
    for field in ("containers", "initContainers"):
        if field in spec:
            spec[field] = [
                {key: c[key] for key in CONTAINER_FIELDS if key in c} for c in spec[field] or ()
            ]
    if "volumes" in spec:
        spec["volumes"] = [
            v for v in spec["volumes"] or () if any(kind in v for kind in READ_VOLUMES)
        ]
    spec.pop("ephemeralContainers", None)
    status = {k: v for k, v in (lean.get("status") or {}).items() if k not in UNREAD_STATUS}
    return {**lean, "spec": spec, "status": status}


WORKLOAD_TEMPLATES = ("template", "volumeClaimTemplates")


def lean_workload(workload: Object) -> Object:
    """What the workloads' caches keep of a ReplicaSet, Deployment or StatefulSet: all but
    `managedFields` and its templates (of pods, of volume claims), which the controller
    never reads: what a pod asks for, it reads off the pod. A template is most of such an
    object (11 of 14 kB of Python objects for a ReplicaSet of one ordinary pod, bench/
    PROFILE.md), and a cluster keeps up to 10 old ReplicaSets of every Deployment
    (`revisionHistoryLimit`). The controller writes no workload."""
    lean = without_managed_fields(workload)
    spec = lean.get("spec")
    if not isinstance(spec, dict) or not any(key in spec for key in WORKLOAD_TEMPLATES):
        return lean
    return {**lean, "spec": {k: v for k, v in spec.items() if k not in WORKLOAD_TEMPLATES}}


NODE_GRACE = 30.0
"""Seconds a node that a pod or a placeholder names may stay missing from the nodes' cache
before it counts as gone. The node watch may show a node later than the pod watch shows a
pod bound to it (a node added moments before, as an autoscaler does); a deletion the watch
shows counts at once. After a restart, a node deleted while the controller was away
counts as gone once this grace has passed."""

RECHECK_MARGIN = 0.5
"""Seconds past the grace at which a key waiting on a missing node comes back."""

FORGET_AFTER = 3600.0
"""Seconds a missing node is remembered (a deletion seen, or since its first look-up);
asked about later, it waits out the grace again."""


class Missing(Enum):
    """How a node named by a pod, placeholder or Reservation is missing from the cache."""

    UNSEEN = "unseen"
    """Not seen yet, for less than `NODE_GRACE`: added moments ago, or deleted while the
    controller was away."""
    GONE = "gone"
    """Deleted, as the watch showed, or missing longer than `NODE_GRACE`."""


class Absences:
    """Since when each node name the controller looked up was missing from its cache: at
    once gone if the watch showed it deleted, else gone `NODE_GRACE` after the first
    look-up that missed it. A node the watch shows is forgotten here, and any entry
    `FORGET_AFTER` old: the names a pod's affinity may carry are not kept for ever."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._since: dict[str, float] = {}
        """In the order the entries were made, so the oldest come first."""

    def __len__(self) -> int:
        return len(self._since)

    def seen(self, node: str) -> None:
        self._since.pop(node, None)

    def deleted(self, node: str) -> None:
        now = self._forget_old()
        self._since.pop(node, None)
        self._since[node] = now - NODE_GRACE

    def wait(self, node: str) -> float:
        """Seconds until `node`, missing from the cache, counts as gone; 0 if it does."""
        now = self._forget_old()
        return max(0.0, self._since.setdefault(node, now) + NODE_GRACE - now)

    def _forget_old(self) -> float:
        """Drop the entries older than `FORGET_AFTER` (from the oldest made; one made by a
        deletion is dated back by the grace, so it may go up to that much late); now."""
        now = self.clock()
        while self._since:
            oldest = next(iter(self._since))
            if self._since[oldest] > now - FORGET_AFTER:
                break
            del self._since[oldest]
        return now


ROOM_MADE = timedelta(seconds=30)
"""How long after a pod preempted on a node left (or was due to) room counts as being made
there (`Caches.making_room_on`)."""
PREEMPTED_MEMORY = timedelta(minutes=30)
"""How long the caches remember a pod marked for preemption after its last event: far
longer than a placeholder takes to bind once its victims are gone."""


class Caches:
    """The informers the controller reads, and the keys their events put in the queue."""

    def __init__(
        self,
        kube: Kube,
        args: MigrationControllerArgs,
        *,
        enqueue: Callable[[str], None],
        enqueue_after: Callable[[str, float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.args = args
        self.enqueue = enqueue
        self.enqueue_after = enqueue_after
        """Add a key in so many seconds: a key whose view names a node not seen yet
        comes back when that node would count as gone. None: nothing comes back."""
        self.absences = Absences(clock)
        self.node_gates: dict[str, tuple[object, ...]] = {}
        """Each node's cordon and taints as last seen (`scheduling.node_gates`)."""
        self.label_refusals: dict[str, namespaces.LabelRefused] = {}
        """Namespace → the API server's answer when it last refused it the berth.sh/migrating
        label for good (an admission policy, RBAC), until it takes the label; the jobs
        waiting there end on it (`controller.jobs.reserve`). Kept in memory: a
        restarted controller asks again."""
        self.admission_key = b""
        """The key of the admission marks (`controller.signing`), set before any job is
        reconciled or admitted; empty, no job counts as admitted."""
        # Every cache but the Reservations' (`protocol.claimed_at` reads them) leaves
        # out managedFields; those of pods and workloads keep only what the controller
        # reads (`lean_pod`, `lean_workload`).
        lean = without_managed_fields
        self.jobs = Informer(
            kube,
            PODMIGRATIONJOBS,
            indexes={"pod": _pod_ref_key, "reservation": lambda j: _single(jobs.reservation_of(j))},
            handler=self._on_job,
            keep=lean,
        )
        self.reservations = Informer(
            kube,
            RESERVATIONS,
            indexes={
                "claim": lambda r: _single(protocol.claim_of(r)),
                "job": lambda r: _single(protocol.annotations_of(r).get(keys.JOB)),
                # Where its replacement pod is created.
                "namespace": lambda r: [protocol.placeholder_namespace(r)],
            },
            handler=self._on_reservation,
        )
        self.pods = Informer(
            kube,
            PODS,
            indexes={
                # By the UID its controller reference names: a label proves nothing.
                "placeholder": lambda p: _single((protocol.placeholder_ref(p) or ("", ""))[1]),
                "claim": lambda p: _single(protocol.pod_claim(p)),
                "uid": lambda p: _single(p["metadata"].get("uid")),
                "gated": lambda p: ["yes"] if protocol.is_gated(p) else [],
                # Pods carrying a job's soft eviction, by that job.
                "soft-evicted": lambda p: _single(soft_eviction_job(p)),
                # Unbound pods with a claim, by the one node their affinity allows.
                "tied": lambda p: _single(protocol.tied_node(p)) if protocol.pod_claim(p) else [],
                "controller": _controlled_by,
                "namespace": lambda p: _single(p["metadata"].get("namespace")),
            },
            handler=self._on_pod,
            keep=lean_pod,
        )
        by_uid: dict[str, IndexFunc] = {"uid": lambda o: _single(o["metadata"].get("uid"))}
        self.replicasets = Informer(kube, REPLICASETS, indexes=by_uid, keep=lean_workload)
        self.deployments = Informer(kube, DEPLOYMENTS, indexes=by_uid, keep=lean_workload)
        self.statefulsets = Informer(kube, STATEFULSETS, indexes=by_uid, keep=lean_workload)
        self.pdbs = Informer(
            kube,
            PDBS,
            indexes={"namespace": lambda o: _single(o["metadata"].get("namespace"))},
            keep=lean,
        )
        self.nodes = Informer(kube, NODES, handler=self._on_node, keep=lean)
        self.volumes = Informer(
            kube, PERSISTENTVOLUMES, indexes={"claim": _volume_claim}, keep=lean_volume
        )
        self.priority_classes = Informer(kube, PRIORITYCLASSES, keep=lean)
        self.namespaces = Informer(kube, NAMESPACES, handler=self._on_namespace, keep=lean)
        self.preempted: dict[str, tuple[Object, datetime]] = {}
        """Pods the scheduler marked for preemption, by UID: their last state (`lean_pod`)
        and when it was seen; kept `PREEMPTED_MEMORY` after deletion, for the job whose
        placeholder they made room for to record them (`controller.jobs.preempt`)."""
        self.ledger = Ledger() if args.node_fit else None
        """Free capacity per node, kept up to date by the watches; only nodeFit reads it."""
        self.informers = [
            self.jobs,
            self.reservations,
            self.pods,
            self.replicasets,
            self.deployments,
            self.statefulsets,
            self.pdbs,
            self.nodes,
            self.volumes,
            self.priority_classes,
            self.namespaces,
        ]
        # Not namespaces: a job acts on the berth.sh/migrating label only once the watch
        # shows it, never on the controller's own write (`controller.namespaces`).
        self._by_plural = {
            informer.resource.plural: informer
            for informer in self.informers
            if informer is not self.namespaces
        }

    def synced(self) -> bool:
        return all(informer.synced.is_set() for informer in self.informers)

    def assume(self, resource: Resource, obj: Object) -> None:
        """Take this process's own write at once: the next arbitration round must count a
        job it admitted as Running, and the next pass of a Reservation must find the
        placeholder it created and recorded, even if the watch is slow to show them."""
        cache = self._by_plural.get(resource.plural)
        if cache is not None:
            cache.assume(obj)

    # ----- events -> keys -------------------------------------------------------------

    def _on_job(self, _kind: str, job: Object) -> None:
        self.enqueue(job_key(job["metadata"]["name"]))

    def _on_node(self, kind: str, node: Object) -> None:
        if self.ledger is not None:
            self.ledger.on_node(kind, node)
        name = node["metadata"]["name"]
        if kind != "DELETED":
            self.absences.seen(name)
            gates = node_gates(node)
            if self.node_gates.setdefault(name, gates) == gates:
                return
            self.node_gates[name] = gates
        else:
            self.absences.deleted(name)
            self.node_gates.pop(name, None)
        # Deleted, cordoned, tainted or relabelled: a placeholder there may hold nothing any
        # more (or again), and its Reservation must know, and its job. Reservations are few
        # (one per migration), and nodes rarely go or change their cordon, taints and labels.
        for reservation in self.reservations.values():
            uid = reservation["metadata"].get("uid", "")
            placeholders = self.pods.by_index("placeholder", uid)
            if protocol.node_of(reservation) == name or any(
                p["spec"].get("nodeName") == name for p in placeholders
            ):
                self._enqueue_reservation(reservation)

    def _on_reservation(self, kind: str, reservation: Object) -> None:
        if self.ledger is not None:
            self.ledger.on_reservation(kind, reservation)
        self._enqueue_reservation(reservation)
        # Its namespace may need the label now, or no longer.
        self.enqueue(namespace_key(protocol.placeholder_namespace(reservation)))

    def _on_namespace(self, _kind: str, namespace: Object) -> None:
        """A namespace Berth labelled, or one where Reservations wait: its label is looked
        at again, and the jobs of those Reservations see it."""
        name = namespace["metadata"]["name"]
        waiting = self.reservations.by_index("namespace", name)
        if waiting or keys.MIGRATING_LABEL in protocol.labels_of(namespace):
            self.enqueue(namespace_key(name))
        self._enqueue_jobs_waiting_in(name)

    def _enqueue_jobs_waiting_in(self, namespace: str) -> None:
        """The jobs of the Reservations whose replacements are made in `namespace`: the
        one each was made for, and those naming it (reservationRef)."""
        for reservation in self.reservations.by_index("namespace", namespace):
            job = protocol.annotations_of(reservation).get(keys.JOB)
            if job:
                self.enqueue(job_key(job))
            for naming in self.jobs.by_index("reservation", reservation["metadata"]["name"]):
                self.enqueue(job_key(naming["metadata"]["name"]))

    def label_refused(self, namespace: str, why: str | None) -> None:
        """Record why the API server refused `namespace` the label for good, for the
        Reservations waiting there now (None: it took it, was not asked, or did not
        answer for good), and let their jobs see it."""
        if why is None:
            self.label_refusals.pop(namespace, None)
            return
        waiting = frozenset(
            str(r["metadata"].get("uid"))
            for r in self.reservations.by_index("namespace", namespace)
            if namespaces.waits_for_replacement(r)
        )
        self.label_refusals[namespace] = namespaces.LabelRefused(why=why, waiting=waiting)
        self._enqueue_jobs_waiting_in(namespace)

    def _on_pod(self, kind: str, pod: Object) -> None:
        if self.ledger is not None:
            # The ledger follows the pod itself, and the Reservations it is the
            # placeholder or recorded owner of; the event is about the pod, so it never
            # reaches the ledger as an event of a Reservation.
            self.ledger.on_pod(kind, pod)
        if jobs.preemption_mark(pod) is not None:
            self._remember_preempted(pod)
        reservation = protocol.placeholder_reservation(pod)
        if reservation:
            self.enqueue(reservation_key(reservation))
        claim = protocol.pod_claim(pod)
        if claim:
            for rsv in self.reservations.by_index("claim", claim):
                self._enqueue_reservation(rsv)
        for job in self.jobs.by_index("pod", object_key(pod)):
            self.enqueue(job_key(job["metadata"]["name"]))

    def _remember_preempted(self, pod: Object) -> None:
        now = datetime.now(UTC)
        self.preempted = {
            uid: (seen, at)
            for uid, (seen, at) in self.preempted.items()
            if now - at < PREEMPTED_MEMORY
        }
        self.preempted[str(pod["metadata"].get("uid"))] = (lean_pod(pod), now)

    def preempted_on(self, node: str | None) -> tuple[Object, ...]:
        """The pods marked for preemption on `node` that the caches hold or remember."""
        if node is None:
            return ()
        return tuple(
            pod for pod, _ in self.preempted.values() if pod["spec"].get("nodeName") == node
        )

    def making_room_on(self, node: str | None) -> bool:
        """Whether room is being made on `node` by a preemption: a pod the scheduler
        marked for it is there, terminating within its grace period, or left less than
        `ROOM_MADE` ago (time for the scheduler to bind the preemptor). One kept longer
        (a finalizer, a node that no longer answers), or marked and never deleted, does
        not count."""
        now = datetime.now(UTC)
        for pod, seen in self.preempted.values():
            metadata = pod["metadata"]
            if pod["spec"].get("nodeName") != node or node is None or not metadata.get("uid"):
                continue
            live = self.pods.get(object_key(pod))
            if live is None or (live["metadata"].get("uid") != metadata["uid"]):
                if now - seen < ROOM_MADE:
                    return True
                continue
            due = read_time(live["metadata"].get("deletionTimestamp"))
            if jobs.preemption_mark(live) is not None and due is not None and now < due + ROOM_MADE:
                return True
        return False

    def _enqueue_reservation(self, reservation: Object) -> None:
        """The Reservation's key, and its jobs': a job follows its Reservation, the one
        made for it (`berth.sh/job`) or one made by hand that it names."""
        name = reservation["metadata"]["name"]
        self.enqueue(reservation_key(name))
        job = protocol.annotations_of(reservation).get(keys.JOB)
        if job:
            self.enqueue(job_key(job))
        for naming in self.jobs.by_index("reservation", name):
            if naming["metadata"]["name"] != job:
                self.enqueue(job_key(naming["metadata"]["name"]))

    # ----- views ----------------------------------------------------------------------

    def labelled_namespaces(self) -> list[str]:
        """Namespaces that carry the berth.sh/migrating label, whoever wrote it."""
        return [
            name
            for name, namespace in self.namespaces.store.items()
            if keys.MIGRATING_LABEL in protocol.labels_of(namespace)
        ]

    def namespace_plan(self, name: str) -> Plan:
        """The label's next step on namespace `name` (`controller.namespaces`)."""
        return namespaces.decide(
            self.namespaces.get(name), self.reservations.by_index("namespace", name)
        )

    def pod_by_uid(self, uid: str) -> Object | None:
        found = self.pods.by_index("uid", uid)
        return found[0] if found else None

    def owner(self, reservation: Mapping[str, Any] | None) -> Object | None:
        """The pod recorded as the Reservation's owner, if it exists."""
        for uid in protocol.owner_uids(reservation or {}):
            pod = self.pod_by_uid(uid)
            if pod is not None:
                return pod
        return None

    def workload_uid(self, pod: Mapping[str, Any] | None) -> str | None:
        """The top-level workload of a pod: a ReplicaSet's Deployment, else its controller."""
        return _workload_uid(self.replicasets, pod)

    def resolved_controller(self, pod: Mapping[str, Any]) -> tuple[str | None, str | None]:
        """`(controller UID, top-level workload UID)` of a pod, as the caches know them.

        Only the kinds whose replacements Berth binds count (`protocol.is_bindable`): the
        webhook gives a claim to no other pod. A ReplicaSet or StatefulSet counts only if
        the cache holds one of that kind and name in the pod's namespace with the UID the
        pod names. A Job is not watched: its UID is taken as the pod names it (the webhook
        gave the claim only to a pod the Job controller created, in that namespace, where
        the Reservation's namespace check already holds).
        """
        ref = protocol.controller_of(pod)
        if ref is None or not protocol.is_bindable(ref):
            return None, None
        informers = {"ReplicaSet": self.replicasets, "StatefulSet": self.statefulsets}
        informer = informers.get(str(ref.get("kind")))
        if informer is None:
            return str(ref.get("uid")), str(ref.get("uid"))
        found = informer.get(f"{pod['metadata'].get('namespace')}/{ref.get('name')}")
        if found is None or found["metadata"].get("uid") != ref.get("uid"):
            return None, None
        replicaset = found if ref.get("kind") == "ReplicaSet" else None
        return str(ref["uid"]), protocol.top_level_workload(ref, replicaset)

    def placeholder(self, reservation: Mapping[str, Any] | None) -> Object | None:
        """The Reservation's placeholder (`protocol.is_placeholder_of`), if it exists."""
        if reservation is None:
            return None
        named = self.pods.by_index("placeholder", reservation["metadata"].get("uid", ""))
        return next((p for p in named if protocol.is_placeholder_of(p, reservation)), None)

    def reservation_view(self, reservation: Object) -> reservations.ReservationView:
        key = reservation_key(reservation["metadata"]["name"])
        named = self.pods.by_index("placeholder", reservation["metadata"].get("uid", ""))
        placeholder = self.placeholder(reservation)
        strays = tuple(
            pod
            for pod in named
            if pod is not placeholder and not pod["metadata"].get("deletionTimestamp")
        )
        claim = protocol.claim_of(reservation)
        # Only pods where its replacement is made: one elsewhere that copied the token
        # (readable wherever Reservations are) would otherwise count as a second claimer
        # and stall the handover.
        namespace = protocol.placeholder_namespace(reservation)
        claimers = tuple(
            pod
            for pod in (self.pods.by_index("claim", claim) if claim else ())
            if pod["metadata"].get("namespace") == namespace
        )
        accepted = []
        for pod in claimers:
            controller_uid, workload_uid = self.resolved_controller(pod)
            if protocol.may_claim(
                reservation, pod, controller_uid=controller_uid, workload_uid=workload_uid
            ):
                accepted.append(pod)
        classes, default = self.priority_values(), self.default_priority()
        # A spec no placeholder can be made from ends the Reservation (`decide`) before
        # any class is needed; read further, it would raise on every pass instead.
        priority_class = (
            None
            if reservations.spec_problem(reservation) is not None
            or build.may_preempt(reservation, classes, default)
            else build.non_preempting_class(
                build.placeholder_priority(reservation, classes, default)
            )
        )
        owner = self.owner(reservation)
        return reservations.ReservationView(
            reservation=reservation,
            placeholder=placeholder,
            claimers=claimers,
            accepted=tuple(accepted),
            owner=owner,
            now=datetime.now(UTC),
            image=self.args.placeholder_image,
            strays=strays,
            priority_class=priority_class,
            priority_class_found=None
            if priority_class is None
            else self.priority_classes.get(priority_class["metadata"]["name"]),
            node_gone=self._node_gone(
                (placeholder or {}).get("spec", {}).get("nodeName"), again=key
            ),
            node_refuses=self.refusal(
                (placeholder or {}).get("spec", {}).get("nodeName"), placeholder
            ),
            stranded=self._stranded((owner, *accepted), again=key),
        )

    def _stranded(self, pods: tuple[Object | None, ...], *, again: str) -> tuple[Object, ...]:
        """Those of `pods` (a Reservation's owner and accepted claimers) not bound nor
        terminating whose affinity ties them to a node that is gone."""
        found: dict[str, Object] = {}
        for pod in pods:
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                continue
            if self._node_gone(protocol.tied_node(pod), again=again):
                found[str(pod["metadata"].get("uid"))] = pod
        return tuple(found.values())

    def tied_claimers(self) -> list[Object]:
        """Unbound pods with a claim whose affinity ties them to one node."""
        return [
            pod for node in self.pods.indexes["tied"] for pod in self.pods.by_index("tied", node)
        ]

    def stranded_claimers(self) -> list[Object]:
        """Unbound pods with a claim whose affinity ties them to a node that is gone."""
        tied = self.pods.indexes["tied"]
        return [
            pod
            for node in tied
            if self._node_gone(node)
            for pod in self.pods.by_index("tied", node)
        ]

    def refusal(self, node: str | None, pod: Object | None, *, where: bool = True) -> str | None:
        """Why `node`, as the cache holds it, takes no new pod like `pod` (cordoned, a
        taint the pod does not tolerate, labels its placement excludes unless `where` is
        False: `scheduling.node_refusal`, `build.replacement_placement`); None when it
        would, or when either is missing."""
        found = self.nodes.get(node) if node else None
        if found is None or pod is None:
            return None
        return node_refusal(found, build.replacement_placement(pod, where=where))

    def spread_refusal(self, node: str | None, pod: Object | None) -> str | None:
        """Why a replacement of `pod` could not go to `node` for its topology spread
        (`scheduling.spread_refusal`), counting the pods of its namespace as the cache
        holds them; None when it could, or when the pod spreads under no hard constraint."""
        found = self.nodes.get(node) if node else None
        if found is None or pod is None or not spreads_hard(pod):
            return None
        namespace = pod["metadata"].get("namespace") or ""
        return spread_refusal(
            pod,
            found,
            nodes=self.nodes.values(),
            pods=self.pods.by_index("namespace", namespace),
        )

    def _node_gone(self, node: str | None, *, again: str | None = None) -> bool:
        """Whether `node` names a node that is gone (`_missing`)."""
        return self._missing(node, again=again) is Missing.GONE

    def _missing(self, node: str | None, *, again: str | None = None) -> Missing | None:
        """Whether `node`, when named, is missing from the cache: gone (deleted, or
        missing longer than `NODE_GRACE`, `Absences`) or not seen yet; None when the
        cache holds it. Not seen yet, the key `again` is added back for when it would
        count as gone."""
        if node is None or self.nodes.get(node) is not None:
            return None
        wait = self.absences.wait(node)
        if not wait:
            return Missing.GONE
        if again is not None and self.enqueue_after is not None:
            self.enqueue_after(again, wait + RECHECK_MARGIN)
        return Missing.UNSEEN

    def siblings(self, reservation: Object) -> list[Object]:
        """The pods of the workloads the Reservation's controller owners name: of the
        namespace where its replacement is made, naming that kind, name and UID."""
        namespace = protocol.placeholder_namespace(reservation)
        found: list[Object] = []
        for owner in reservation.get("spec", {}).get("owners") or []:
            wanted = owner.get("controller") or {}
            if wanted.get("uid"):
                key = protocol.controlled_key(namespace, wanted["uid"])
                found += [
                    pod
                    for pod in self.pods.by_index("controller", key)
                    if protocol.same_controller(wanted, protocol.controller_of(pod) or {})
                ]
        return found

    def job_view(self, job: Object) -> jobs.JobView:
        ref = job["spec"]["podRef"]
        pod = self.pods.get(f"{ref.get('namespace')}/{ref.get('name')}")
        named = jobs.reservation_of(job)
        reservation = self.reservations.get(named) if named else None
        placeholder = self.placeholder(reservation)
        missing = self._missing(
            protocol.node_of(reservation) if reservation else None,
            again=job_key(job["metadata"]["name"]),
        )
        siblings = self.siblings(reservation) if reservation is not None else []
        replacements_in = protocol.placeholder_namespace(reservation) if reservation else ""
        labelled = reservation is not None and namespaces.is_labelled(
            self.namespaces.get(replacements_in)
        )
        sharing = [
            other
            for other in (self.jobs.by_index("reservation", named) if named else ())
            if other["metadata"].get("uid") != job["metadata"].get("uid")
            and (other.get("status") or {}).get("phase") not in TERMINAL_PHASES
        ]
        return jobs.JobView(
            job=job,
            pod=pod,
            reservation=reservation,
            namespace_labelled=labelled,
            label_refused=None if labelled else self.label_refusals.get(replacements_in),
            owner=self.owner(reservation),
            workload_uid=self.workload_uid(pod),
            now=datetime.now(UTC),
            args=self.args,
            admission_key=self.admission_key,
            siblings=tuple(siblings),
            sharing=tuple(sharing),
            priority_classes=self.priority_values(),
            placeholder=placeholder,
            preempted=self.preempted_on(
                jobs.placeholder_node(placeholder) if placeholder is not None else None
            ),
            making_room=self.making_room_on(protocol.node_of(reservation) if reservation else None),
            reserved_node_gone=missing is Missing.GONE,
            reserved_node_unseen=missing is Missing.UNSEEN,
            # Before the eviction, where the pod may go (only what it tolerates, for a
            # Reservation made by hand); after it, where its replacement may.
            reserved_node_refuses=self.refusal(
                protocol.node_of(reservation) if reservation else None,
                pod if pod is not None else self.owner(reservation),
                where=pod is None or jobs.own_reservation(job, reservation),
            ),
            reserved_node_spread=self.spread_refusal(
                protocol.node_of(reservation) if reservation else None, pod
            ),
            exhausted_pdb=(
                self.exhausted_pdb(pod)
                if reservation is not None and protocol.is_closed(reservation)
                else None
            ),
            volume_terms=self.volume_terms(pod),
            **self.reserved_workload(reservation),
        )

    def volume_terms(self, pod: Object | None) -> tuple[tuple[Object, ...], ...]:
        """The node selector terms each PersistentVolume bound to a claim of `pod`
        requires (`JobView.volume_terms`), as kube-scheduler reads them: against a
        node's labels alone (`CheckNodeAffinity` matches a node without a name, so field
        requirements are passed over), so a term is its label requirements, and a
        volume with a term of none may be used anywhere."""
        if pod is None:
            return ()
        namespace = pod["metadata"].get("namespace")
        found: list[tuple[Object, ...]] = []
        for volume in (pod.get("spec") or {}).get("volumes") or ():
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            for bound in self.volumes.by_index("claim", f"{namespace}/{claim}") if claim else ():
                required = ((bound.get("spec") or {}).get("nodeAffinity") or {}).get("required")
                terms = tuple(
                    {"matchExpressions": list(term.get("matchExpressions") or [])}
                    for term in (required or {}).get("nodeSelectorTerms") or ()
                    # An empty term matches no node (`NewLazyErrorNodeSelector`).
                    if term.get("matchExpressions") or term.get("matchFields")
                )
                if terms and all(term["matchExpressions"] for term in terms):
                    found.append(terms)
        return tuple(found)

    def exhausted_pdb(self, pod: Object | None) -> str | None:
        """A PodDisruptionBudget covering the ready pod that the cache shows allowing no
        disruption now (namespace/name); None when none does, or when the pod is not
        ready (the Eviction API may let an unready pod go whatever its budget allows)."""
        if pod is None or not protocol.is_ready(pod):
            return None
        namespace = str(pod["metadata"].get("namespace"))
        labels = protocol.labels_of(pod)
        for pdb in self.pdbs.by_index("namespace", namespace):
            selector = (pdb.get("spec") or {}).get("selector")
            if selector is None:
                continue
            allowed = int((pdb.get("status") or {}).get("disruptionsAllowed") or 0)
            if allowed < 1 and selector_matches(selector, labels):
                return f"{namespace}/{pdb['metadata']['name']}"
        return None

    def reserved_workload(self, reservation: Object | None) -> dict[str, Any]:
        """The controller a Reservation was made for (its one owner by controller
        reference: a ReplicaSet or a StatefulSet) and a ReplicaSet's Deployment, as the
        caches hold them (`JobView.workload`, `JobView.deployment`); and, when the
        caches (synced before any job is reconciled) hold neither it nor the Deployment
        the Reservation names as its top-level workload, that controller, named
        (`JobView.workload_deleted`)."""
        owners = (reservation or {}).get("spec", {}).get("owners") or []
        ref = (owners[0].get("controller") or {}) if len(owners) == 1 else {}
        store = {"ReplicaSet": self.replicasets, "StatefulSet": self.statefulsets}.get(
            str(ref.get("kind"))
        )
        # Only in the namespace of its replacement: a pod may name another's UID.
        namespace = protocol.placeholder_namespace(reservation or {})

        def here(objects: list[Object]) -> list[Object]:
            return [o for o in objects if o["metadata"].get("namespace") == namespace]

        found = here(store.by_index("uid", str(ref.get("uid")))) if store is not None else []
        workload = found[0] if found else None
        parent = protocol.controller_of(workload) if workload is not None else None
        above = (
            here(self.deployments.by_index("uid", str(parent.get("uid"))))
            if parent is not None and parent.get("kind") == "Deployment"
            else []
        )
        deleted = None
        if store is not None and workload is None and ref.get("uid") and not above:
            top = protocol.annotations_of(reservation or {}).get(keys.WORKLOAD)
            if not top or not here(self.deployments.by_index("uid", top)):
                deleted = f"{ref.get('kind')} {ref.get('name')} (uid {ref.get('uid')})"
        return {
            "workload": workload,
            "deployment": above[0] if above else None,
            "workload_deleted": deleted,
        }

    def priority_values(self) -> dict[str, int]:
        """PriorityClass name → its value."""
        return {
            name: int(obj.get("value") or 0) for name, obj in self.priority_classes.store.items()
        }

    def default_priority(self) -> int:
        """The priority of a pod that names no PriorityClass: the lowest global default
        class's value (as admission picks it), or 0."""
        defaults = [
            int(obj.get("value") or 0)
            for obj in self.priority_classes.store.values()
            if obj.get("globalDefault")
        ]
        return min(defaults, default=0)

    # ----- what arbitration reads -----------------------------------------------------

    def frozen(self) -> Frozen:
        """What the caches hold now, as arbitration reads it, for another thread to read
        while the watches go on (see `Informer.frozen`); only dicts and lists are copied,
        no object."""
        return Frozen(
            jobs=self.jobs.values(),
            reservations=self.reservations.values(),
            pods=self.pods.frozen("controller"),
            replicasets=self.replicasets.frozen("uid"),
            deployments=self.deployments.frozen("uid"),
            statefulsets=self.statefulsets.frozen("uid"),
            pdbs=self.pdbs.values(),
            nodes=dict(self.nodes.store) if self.args.node_fit else {},
            free=self.ledger.frozen_free() if self.ledger is not None else {},
            priority_classes=dict(self.priority_classes.store),
            admission_key=self.admission_key,
        )


@dataclass(frozen=True, kw_only=True)
class Frozen:
    """The caches at one moment (`Caches.frozen`), and the views arbitration takes of
    them. Nothing here changes after it is taken, so it may be read on any thread."""

    jobs: list[Object]
    reservations: list[Object]
    pods: Store
    """With the "controller" index."""
    replicasets: Store
    """With the "uid" index, as are Deployments and StatefulSets."""
    deployments: Store
    statefulsets: Store
    pdbs: list[Object]
    nodes: Mapping[str, Object]
    """Nodes by name; empty when nodeFit is off."""
    free: Mapping[str, Resources]
    """Node name → free capacity, for nodeFit; empty when nodeFit is off."""
    priority_classes: Mapping[str, Object]
    admission_key: bytes

    def workload_uid(self, pod: Mapping[str, Any] | None) -> str | None:
        """As `Caches.workload_uid`."""
        return _workload_uid(self.replicasets, pod)

    def workload_of(self) -> Mapping[str, str]:
        return _WorkloadOf(self.replicasets)

    def workloads(self) -> Mapping[str, Object]:
        return _Workloads([self.deployments, self.statefulsets, self.replicasets])

    def pods_of_workload(self) -> Mapping[str, list[Object]]:
        return _PodsOfWorkload(self.pods)

    def priority_values(self) -> dict[str, int]:
        """PriorityClass name → its value."""
        return {name: int(obj.get("value") or 0) for name, obj in self.priority_classes.items()}


def _workload_uid(replicasets: Store, pod: Mapping[str, Any] | None) -> str | None:
    controller = protocol.controller_of(pod or {})
    if controller is None or pod is None:
        return None
    replicaset = (
        replicasets.get(f"{pod['metadata']['namespace']}/{controller['name']}")
        if controller.get("kind") == "ReplicaSet"
        else None
    )
    return protocol.top_level_workload(controller, replicaset)


class _WorkloadOf(Mapping[str, str]):
    """`protocol.controlled_key` of a controller → the workload above it: a ReplicaSet's
    Deployment, from the caches, for the pods of the ReplicaSet's own namespace only (a
    pod elsewhere may name its UID). A ReplicaSet that another kind controls (an Argo
    Rollout, which Berth does not cache) is its own workload: its spec and status are
    what the limits can read."""

    def __init__(self, replicasets: Store) -> None:
        self.replicasets = replicasets

    def __getitem__(self, key: str) -> str:
        namespace, _, uid = key.partition("/")
        for replicaset in self.replicasets.by_index("uid", uid):
            above = protocol.deployment_above(replicaset)
            if above is not None and replicaset["metadata"].get("namespace") == namespace:
                return above
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (
            _key_of(o)
            for o in self.replicasets.store.values()
            if protocol.deployment_above(o) is not None
        )

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _key_of(obj: Object) -> str:
    return protocol.controlled_key(obj["metadata"].get("namespace") or "", obj["metadata"]["uid"])


class _Workloads(Mapping[str, Object]):
    """`protocol.controlled_key` of a workload → its Deployment, StatefulSet or
    ReplicaSet, from the caches: found by UID within the namespace of the key only."""

    def __init__(self, stores: list[Store]) -> None:
        self.stores = stores

    def __getitem__(self, key: str) -> Object:
        namespace, _, uid = key.partition("/")
        for store in self.stores:
            for found in store.by_index("uid", uid):
                if found["metadata"].get("namespace") == namespace:
                    return found
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (_key_of(o) for s in self.stores for o in s.store.values())

    def __len__(self) -> int:
        return sum(len(s.store) for s in self.stores)


def _controlled_by(pod: Object) -> list[str]:
    """The `controller` index: `protocol.controlled_key` of the pod's controller."""
    uid = (protocol.controller_of(pod) or {}).get("uid")
    return [protocol.controlled_key(pod["metadata"].get("namespace") or "", uid)] if uid else []


class _PodsOfWorkload(Mapping[str, list[Object]]):
    """`protocol.controlled_key` of a workload → the pods it directly controls."""

    def __init__(self, pods: Store) -> None:
        self.pods = pods

    def __getitem__(self, uid: str) -> list[Object]:
        return self.pods.by_index("controller", uid)

    def __iter__(self) -> Iterator[str]:
        return iter(self.pods.indexes["controller"])

    def __len__(self) -> int:
        return len(self.pods.indexes["controller"])
