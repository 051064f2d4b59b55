"""What must hold after a run under faults, judged on the recorded history alone.

Pure functions over `recorder.Seen` versions in etcd's order. The faults the run made on
purpose (a user deleting a pod, scaling a workload to zero, deleting a node) are passed
in, so that what they did is not blamed on Berth while everything Berth did is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from berth import protocol
from berth.api import keys
from tests.e2e.faults.recorder import Seen

Object = dict[str, Any]
SUCCEEDED = ("Succeed", "Succeeded")
TERMINAL = (*SUCCEEDED, "Failed", "Aborted")
GATE = keys.RESERVATION_GATE


@dataclass
class UserFaults:
    """What the run did to workloads itself, as a user or an operator would."""

    deleted_pods: set[str] = field(default_factory=set)
    """UIDs of pods deleted as their user would."""
    scaled_to_zero: dict[str, int] = field(default_factory=dict)
    """namespace/app → the revision from which that workload was scaled to zero."""
    deleted_nodes: dict[str, int] = field(default_factory=dict)
    """node → the revision of its deletion."""


@dataclass
class Verdict:
    jobs: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    """"Succeed" or "Failed/<reason>" → jobs."""
    lost: list[str] = field(default_factory=list)
    stranded: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    untruthful: list[str] = field(default_factory=list)
    double_evictions: list[str] = field(default_factory=list)
    unreserved_evictions: list[str] = field(default_factory=list)
    pdb_violations: list[str] = field(default_factory=list)
    evictions: int = 0
    messages: dict[str, list[str]] = field(default_factory=dict)
    """outcome → "job: message" of each job that ended so."""

    def failures(self) -> dict[str, list[str]]:
        """Each invariant that does not hold, with what broke it."""
        found = {
            "lost jobs": self.lost,
            "stranded pods": self.stranded,
            "orphans": self.orphans,
            "untruthful reasons": self.untruthful,
            "double evictions": self.double_evictions,
            "evictions without an Available Reservation": self.unreserved_evictions,
            "PDB violations": self.pdb_violations,
        }
        return {name: items for name, items in found.items() if items}


def phase(job: Object) -> str:
    return str((job.get("status") or {}).get("phase") or "Pending")


def condition(job: Object, kind: str) -> Object:
    conditions = (job.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), {})


def is_placeholder(pod: Object) -> bool:
    return keys.RESERVATION_LABEL in (pod["metadata"].get("labels") or {})


def gated(pod: Object) -> bool:
    return any(g.get("name") == GATE for g in pod["spec"].get("schedulingGates") or [])


def available(pod: Object) -> bool:
    if pod["metadata"].get("deletionTimestamp") or is_placeholder(pod):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class History:
    """The recorded versions, with the lookups the invariants need."""

    def __init__(self, seen: list[Seen]) -> None:
        self.seen = seen
        self.final: dict[tuple[str, str], Object] = {}
        for one in seen:
            if one.type == "DELETED":
                self.final.pop((one.plural, one.key), None)
            else:
                self.final[(one.plural, one.key)] = one.obj

    def versions(self, plural: str, key: str) -> list[Seen]:
        return [s for s in self.seen if s.plural == plural and s.key == key]

    def at(self, plural: str, key: str, revision: int) -> Object | None:
        """The object as it stood just before `revision` (None: absent)."""
        current = None
        for one in self.versions(plural, key):
            if one.revision >= revision:
                break
            current = None if one.type == "DELETED" else one.obj
        return current

    def removal(self, uid: str) -> Seen | None:
        """The first version of pod `uid` that shows it going: deleting or deleted."""
        return next(
            (
                s
                for s in self.seen
                if s.plural == "pods"
                and s.obj["metadata"].get("uid") == uid
                and (s.type == "DELETED" or s.obj["metadata"].get("deletionTimestamp"))
            ),
            None,
        )

    def pods_named(self, namespace: str, name: str) -> dict[str, Object]:
        """Every pod that had this name (a StatefulSet's replacement keeps it), by UID."""
        found: dict[str, Object] = {}
        for one in self.seen:
            metadata = one.obj["metadata"]
            if one.plural == "pods" and (metadata.get("namespace"), metadata["name"]) == (
                namespace,
                name,
            ):
                found.setdefault(metadata["uid"], one.obj)
        return found


def judge(
    seen: list[Seen],
    *,
    jobs: list[str],
    namespaces: set[str],
    min_available: dict[str, int],
    faults: UserFaults,
) -> Verdict:
    """Every invariant over the history of a run that created `jobs` for pods in
    `namespaces`; `min_available` maps namespace/app to its PDB's minAvailable."""
    history = History(seen)
    verdict = Verdict(jobs=len(jobs))
    for name in jobs:
        _judge_job(history, name, faults, verdict)
    for (plural, key), obj in history.final.items():
        namespace = obj["metadata"].get("namespace")
        if plural == "pods" and namespace in namespaces:
            if gated(obj):
                verdict.stranded.append(f"pod {key} still gated")
            if is_placeholder(obj):
                verdict.orphans.append(f"placeholder {key}")
        if plural == "reservations" and phase(obj) in ("Pending", "Available"):
            job = obj["metadata"].get("annotations", {}).get(keys.JOB, "")
            if job in jobs:
                verdict.orphans.append(f"reservation {key} still {phase(obj)}")
    verdict.pdb_violations += _availability(history, min_available, faults)
    return verdict


def _judge_job(history: History, name: str, faults: UserFaults, verdict: Verdict) -> None:
    versions = history.versions("podmigrationjobs", name)
    job = history.final.get(("podmigrationjobs", name))
    if job is None or phase(job) not in TERMINAL:
        state = "gone" if job is None else phase(job)
        verdict.lost.append(f"{name} ({state})")
        return
    status = job.get("status") or {}
    outcome = "Succeed" if phase(job) in SUCCEEDED else f"{phase(job)}/{status.get('reason')}"
    verdict.outcomes[outcome] += 1
    verdict.messages.setdefault(outcome, []).append(f"{name}: {status.get('message')}")
    ref = job["spec"]["podRef"]
    first = versions[0].obj
    source_uid = (first["metadata"].get("annotations") or {}).get(keys.POD_UID) or next(
        (
            (v.obj["metadata"].get("annotations") or {}).get(keys.POD_UID)
            for v in versions
            if (v.obj["metadata"].get("annotations") or {}).get(keys.POD_UID)
        ),
        None,
    )
    end = next(v for v in versions if phase(v.obj) in TERMINAL)
    ended = end.revision
    started = versions[0].revision
    evicting = next((v.revision for v in versions if condition(v.obj, "Eviction")), ended + 1)
    # Berth's evictions: pods of this name removed while the job ran. Its pod, once the job
    # recorded that it evicts it, is Berth's; any other removal is, unless the run itself
    # took the pod away (then it is the run's, and the job must say so).
    evicted = []
    for uid, pod in history.pods_named(ref["namespace"], ref["name"]).items():
        removal = history.removal(uid)
        if removal is None or not started <= removal.revision <= ended:
            continue
        ours = uid == source_uid and removal.revision >= evicting
        if ours or not _by_user(pod, removal, faults):
            evicted.append((uid, removal))
    verdict.evictions += len(evicted)
    if len(evicted) > 1:
        verdict.double_evictions.append(f"{name}: {len(evicted)} pods of {ref['name']} removed")
    for _uid, removal in evicted:
        _check_reserved(history, name, job, removal, verdict, faults=faults)
    why = _untruthful(
        history, job, source_uid=source_uid, evicted=bool(evicted), faults=faults, ended_at=end.at
    )
    if why:
        verdict.untruthful.append(f"{name} {phase(job)}/{status.get('reason')}: {why}")


def _by_user(pod: Object, removal: Seen, faults: UserFaults) -> bool:
    """Whether the run took the pod away: deleted it, scaled its workload to zero, or
    deleted the node it ran on or, unbound, was tied to (a replacement tied to its
    Reservation's node, which Berth deletes once that node is gone: it never ran)."""
    metadata = pod["metadata"]
    app = (metadata.get("labels") or {}).get("app")
    scaled = faults.scaled_to_zero.get(f"{metadata.get('namespace')}/{app}")
    node = (removal.obj.get("spec") or {}).get("nodeName") or protocol.tied_node(removal.obj)
    return (
        metadata["uid"] in faults.deleted_pods
        or (scaled is not None and removal.revision >= scaled)
        or (node in faults.deleted_nodes and removal.revision >= faults.deleted_nodes[node])
    )


def _check_reserved(
    history: History,
    name: str,
    job: Object,
    removal: Seen,
    verdict: Verdict,
    *,
    faults: UserFaults,
) -> None:
    """ReservationFirst: when the pod went, its Reservation was Available elsewhere, on a
    node not deleted before."""
    if job["spec"].get("mode", "ReservationFirst") != "ReservationFirst":
        return
    reservation = history.at("reservations", job["metadata"]["uid"], removal.revision)
    node = (removal.obj.get("spec") or {}).get("nodeName")
    if reservation is None or phase(reservation) != "Available":
        state = "absent" if reservation is None else phase(reservation)
        verdict.unreserved_evictions.append(f"{name}: Reservation {state} at the eviction")
    elif (reserved := (reservation.get("status") or {}).get("nodeName")) in (None, node):
        verdict.unreserved_evictions.append(f"{name}: Reservation on the pod's own node {node}")
    elif reserved in faults.deleted_nodes and removal.revision >= faults.deleted_nodes[reserved]:
        verdict.unreserved_evictions.append(f"{name}: Reservation on deleted node {reserved}")


def _untruthful(
    history: History,
    job: Object,
    *,
    source_uid: str | None,
    evicted: bool,
    faults: UserFaults,
    ended_at: float,
) -> str | None:
    """Why the job's ending contradicts the history (None: it agrees); `ended_at` is when
    the recorder saw it end."""
    status = job.get("status") or {}
    if phase(job) in SUCCEEDED:
        return _false_success(history, job, source_uid=source_uid, evicted=evicted)
    if phase(job) == "Aborted":
        return None  # the user's own word
    node = status.get("nodeName")
    by_user = source_uid in faults.deleted_pods or faults.scaled_to_zero or faults.deleted_nodes
    checks: dict[str, Callable[[], str | None]] = {
        "Timeout": lambda: _early_timeout(job, ended_at),
        "MissingPod": lambda: None if by_user else "its pod was removed by nobody but Berth",
        # Arbitration refuses a pod already terminating: one its user deleted (or scaled
        # away) before the job was admitted.
        "ForbiddenMigratePod": lambda: (
            None if by_user else f"refused a pod nobody removed: {status.get('message')}"
        ),
        "ReservationLost": lambda: (
            None if node in faults.deleted_nodes else f"its Reservation's node {node} stayed"
        ),
        # Its replacement deleted before binding: by the user, by its ReplicaSet when the
        # workload was scaled to zero, or by Berth when the replacement's node went
        # (StrandedPodDeleted).
        "ReservationOwnerGone": lambda: (
            None
            if faults.deleted_pods or faults.deleted_nodes or _scaled(job, faults)
            else "its replacement stayed"
        ),
        "ReservationNotUsed": lambda: None if evicted or by_user else "its pod was never evicted",
        # Or its pod deleted by the user while its eviction was refused: the ReplicaSet's
        # new pod, made as the place reopened, counts with the pods it kept.
        "WorkloadScaledDown": lambda: (
            None
            if _scaled(job, faults) or source_uid in faults.deleted_pods
            else "its pod's workload was not scaled to zero, nor its pod deleted by the user"
        ),
        "ReservationExpired": lambda: None,
        "MissingReservation": lambda: None,
    }
    check = checks.get(str(status.get("reason")))
    return check() if check else f"unexpected ending: {status.get('message')}"


def _scaled(job: Object, faults: UserFaults) -> bool:
    """Whether the run scaled the workload of the job's pod to zero (the storm's workloads
    name their pods after their `app`)."""
    ref = job["spec"]["podRef"]
    for key in faults.scaled_to_zero:
        namespace, _, app = key.partition("/")
        if namespace == ref.get("namespace") and str(ref.get("name")).startswith(f"{app}-"):
            return True
    return False


def _early_timeout(job: Object, ended_at: float) -> str | None:
    """Why a Timeout came before the job's TTL ran out (None: it did not)."""
    ttl = _seconds(job["spec"].get("ttl") or "")
    lived = ended_at - _time(job["metadata"]["creationTimestamp"]).timestamp()
    # creationTimestamp has whole seconds: a second's slack.
    if ttl is not None and lived + 1 < ttl:
        return f"timed out {lived:.0f}s after its creation, before its TTL of {ttl:.0f}s"
    return None


def _false_success(
    history: History, job: Object, *, source_uid: str | None, evicted: bool
) -> str | None:
    """Why a Succeed job did not in fact migrate its pod (None: it did)."""
    owners = [
        (v.obj.get("status") or {}).get("currentOwners")
        for v in history.versions("reservations", job["metadata"]["uid"])
    ]
    new = ((job.get("status") or {}).get("podRef") or {}).get("name") or ""
    pods = history.pods_named(job["spec"]["podRef"]["namespace"], new)
    if not evicted:
        return "succeeded without evicting its pod"
    if not any(owners):
        return "succeeded though no pod ever owned its Reservation"
    if not [uid for uid in pods if uid != source_uid]:
        return f"its new pod {new} never existed"
    return None


def _seconds(ttl: str) -> float | None:
    units = {"h": 3600.0, "m": 60.0, "s": 1.0}
    total, number = 0.0, ""
    for char in ttl:
        if char.isdigit() or char == ".":
            number += char
        elif char in units and number:
            total, number = total + float(number) * units[char], ""
        else:
            return None
    return total or None


def _availability(history: History, min_available: dict[str, int], faults: UserFaults) -> list[str]:
    """Walk the pods' history: each workload keeps at least its PDB's minAvailable ready
    pods from the moment it first has them, except once the run itself took pods away
    (scaled it, deleted one of its pods or the node under one)."""
    ready: dict[str, set[str]] = {workload: set() for workload in min_available}
    armed: set[str] = set()
    excused: set[str] = set()
    violations = []
    for one in history.seen:
        if one.plural != "pods":
            continue
        metadata = one.obj["metadata"]
        workload = f"{metadata.get('namespace')}/{(metadata.get('labels') or {}).get('app')}"
        if workload not in ready:
            continue
        if one.type != "DELETED" and _by_user(one.obj, one, faults):
            excused.add(workload)
        node = (one.obj.get("spec") or {}).get("nodeName")
        if node in faults.deleted_nodes and one.revision >= faults.deleted_nodes[node]:
            excused.add(workload)
        if one.type != "DELETED" and available(one.obj):
            ready[workload].add(metadata["uid"])
        else:
            ready[workload].discard(metadata["uid"])
        count, floor = len(ready[workload]), min_available[workload]
        if count >= floor:
            armed.add(workload)
        elif workload in armed and workload not in excused:
            violations.append(f"{workload}: {count} ready < minAvailable {floor} at {one.revision}")
    return violations
