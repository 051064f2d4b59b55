"""Builders and a one-round runner shared by the arbitration tables."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from datetime import timedelta
from decimal import Decimal
from typing import Any

from berth import protocol
from berth.api import keys
from berth.protocol import controlled_key
from berth.settings import MigrationControllerArgs
from controller.arbitration import (
    Arbitration,
    Decision,
    Snapshot,
    arbitrate,
)
from tests.unit.builders import T0, job, pod, ts, workload

Object = dict[str, Any]
Tweak = Callable[[Object], object]

LOOSE: dict[str, Any] = {
    "maxMigratingPerNode": 0,
    "maxMigratingPerWorkload": "100%",
    "maxUnavailablePerWorkload": "100%",
}
"""Limits out of the way, for tests about something else."""


def pods_of(
    name: str = "web",
    count: int = 3,
    *,
    nodes: Sequence[str] | None = None,
    ready: bool = True,
    namespace: str = "default",
) -> list[Object]:
    """`count` pods of Deployment `name` (ReplicaSet `<name>-rs`), one per node unless told."""
    return [
        pod(
            f"{name}-{i}",
            node=nodes[i] if nodes else f"node-{i}",
            rs=f"{name}-rs",
            ready=ready,
            labels={"app": name},
            namespace=namespace,
        )
        for i in range(count)
    ]


def workload_uid(target: Object) -> str | None:
    """Pods of ReplicaSet `<name>-rs` belong to Deployment `<name>` (`uid-<name>`); other
    controllers are their own workload."""
    for owner in target["metadata"].get("ownerReferences") or []:
        if owner.get("controller"):
            if owner["kind"] == "ReplicaSet":
                return f"uid-{owner['name'].removesuffix('-rs')}"
            return str(owner["uid"])
    return None


def workload_of(pods: Sequence[Object]) -> dict[str, str]:
    """`controlled_key` of a controller → workload UID, as the controller's caches
    answer it."""
    return {
        controlled_key(p["metadata"]["namespace"], controller["uid"]): uid
        for p in pods
        if (uid := workload_uid(p)) and (controller := protocol.controller_of(p))
    }


def workloads_by_key(workloads: Sequence[Object]) -> dict[str, Object]:
    """`controlled_key` of each workload → the workload, as the controller's caches
    answer it."""
    return {
        controlled_key(w["metadata"].get("namespace") or "", w["metadata"]["uid"]): w
        for w in workloads
    }


def pending(name: str, target: Object, *, mode: str = "ReservationFirst", age: int = 0) -> Object:
    """A Pending job for `target`, created `age` seconds before T0."""
    obj = job(name, pod_name=target["metadata"]["name"], mode=mode, phase="Pending", pod_uid=None)
    obj["spec"]["podRef"]["namespace"] = target["metadata"]["namespace"]
    obj["metadata"]["creationTimestamp"] = ts(T0 - timedelta(seconds=age))
    return obj


def running(name: str, target: Object, *, phase: str = "Running", annotated: bool = True) -> Object:
    """A job for `target` as admission left it: Running, with source node, pod UID and
    workload annotations (or, `annotated=False`, as an older controller left it)."""
    obj = job(
        name,
        pod_name=target["metadata"]["name"],
        phase=phase,
        pod_uid=target["metadata"]["uid"] if annotated else None,
    )
    obj["spec"]["podRef"]["namespace"] = target["metadata"]["namespace"]
    if annotated:
        obj["metadata"]["annotations"][keys.SOURCE_NODE] = target["spec"].get("nodeName", "")
        uid = workload_uid(target)
        if uid:
            obj["metadata"]["annotations"][keys.WORKLOAD] = uid
    return obj


SNAPSHOT_FIELDS = frozenset(field.name for field in fields(Snapshot))


def decide(
    jobs: Sequence[Object],
    *,
    pods: Sequence[Object],
    workloads: Sequence[Object] = (),
    nodes: Sequence[Object] = (),
    free: dict[str, int | tuple[int, int]] | None = None,
    **given: Any,
) -> Arbitration:
    """Arbitrate one round, and again with its memo, which must decide the same.

    `free` is millicores of cpu per node, with 110 pod slots, or (millicores, pod slots).
    `given` holds Snapshot fields as Snapshot takes
    them (in_flight, history, pdbs, priority_classes, limiter, now) and
    MigrationControllerArgs keys, camelCase as in the configuration file. evictQPS is 0
    (no rate limit) unless a test sets it, so that rounds can admit more than one job.
    """
    taken = {name: given.pop(name) for name in SNAPSHOT_FIELDS & given.keys()}
    given.setdefault("evictQPS", 0)
    pods_by_workload: dict[str, list[Object]] = {}
    for member in pods:
        uid = workload_uid(member)
        if uid:
            key = controlled_key(member["metadata"]["namespace"], uid)
            pods_by_workload.setdefault(key, []).append(member)
    snapshot = Snapshot(
        **{"in_flight": (), "now": T0, **taken},
        pending=jobs,
        pods={f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods},
        workload_of=workload_of(pods),
        workloads=workloads_by_key(workloads),
        pods_of_workload=pods_by_workload,
        nodes={n["metadata"]["name"]: n for n in nodes},
        free={name: _free(value) for name, value in (free or {}).items()},
        args=MigrationControllerArgs.model_validate(given),
    )
    result = arbitrate(snapshot)
    again = arbitrate(replace(snapshot, memo=result.memo))
    assert again.decisions == result.decisions, "a round reusing the memo decided otherwise"
    assert again.limiter == result.limiter
    return result


def of(result: Arbitration, name: str = "job-1") -> Decision:
    return next(d for d in result.decisions if d.job["metadata"]["name"] == name)


def verdicts(result: Arbitration) -> dict[str, str]:
    return {d.job["metadata"]["name"]: d.verdict for d in result.decisions}


def one(
    target: Object | None = None,
    *,
    mode: str = "ReservationFirst",
    pods: Sequence[Object] | None = None,
    workloads: Sequence[Object] | None = None,
    **kwargs: Any,
) -> Decision:
    """The decision on job-1 for `target` (default: web-0 of a healthy 3-replica web)."""
    members = list(pods) if pods is not None else pods_of()
    target = target or members[0]
    if target not in members:
        members.append(target)
    result = decide(
        [pending("job-1", target, mode=mode)],
        pods=members,
        workloads=[workload()] if workloads is None else workloads,
        **kwargs,
    )
    return of(result)


def tweak(**changes: Any) -> Tweak:
    """Set fields of a pod: `spec__volumes=[...]` sets pod["spec"]["volumes"]."""

    def apply(target: Object) -> None:
        for path, value in changes.items():
            *parents, leaf = path.split("__")
            place = target
            for part in parents:
                place = place.setdefault(part, {})
            if value is None:
                place.pop(leaf, None)
            else:
                place[leaf] = value

    return apply


def annotate(annotations: dict[str, str]) -> Tweak:
    return lambda target: target["metadata"]["annotations"].update(annotations)


def tweaked(target: Object, *tweaks: Tweak) -> Object:
    for change in tweaks:
        change(target)
    return target


def _free(value: int | tuple[int, int]) -> dict[str, Decimal]:
    millicores, slots = value if isinstance(value, tuple) else (value, 110)
    return {"cpu": Decimal(millicores) / 1000, "pods": Decimal(slots)}
