"""A pod under a DoNotSchedule topology spread constraint that counts every node
(`nodeAffinityPolicy: Ignore`), against the real scheduler: the placeholder, which
carries none of the pod's labels, may be placed where the replacement, once the pod has
left, could not go. Nothing is evicted then. (With the default policy the webhook's pin
leaves the replacement's node the only one counted, and such a migration goes through.)"""

from __future__ import annotations

import json

import pytest

from cli.migrate import job_for
from tests.e2e.capacity import NODES
from tests.e2e.kube import Cluster, pods
from tests.e2e.migrate import LONG_TTL, condition, deployment, expire, phase_is, ready_pods

pytestmark = pytest.mark.e2e

SPREAD = {
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}},
            "nodeAffinityPolicy": "Ignore",
        }
    ]
}


def test_nothing_is_evicted_where_the_replacement_would_break_the_spread(
    cluster: Cluster, namespace: str
) -> None:
    """One pod per node; the pod of node A pinned to node B, which holds one already:
    the scheduler places the placeholder there (it is none of the pods the constraint
    counts), but the replacement on B would make 2 against 0 on A, which the scheduler
    would refuse it (every node counts). The job waits, saying so, and its TTL ends it
    with the pod where it was."""
    cluster.apply(deployment("web", replicas=len(NODES), spec_extra=SPREAD), namespace)
    placed = cluster.wait(
        lambda: ready_pods(cluster, namespace, "web", len(NODES)), what="a pod on each node"
    )
    moving = placed[0]
    target = next(p["spec"]["nodeName"] for p in placed[1:])
    job = job_for(moving, to=target, mode=None, ttl=LONG_TTL, paused=False)
    name = job["metadata"]["name"]
    cluster.kubectl("create", "-f", "-", input=json.dumps(job))
    waiting = cluster.wait(
        lambda: (
            (found := phase_is(cluster, name, "Running"))
            and "would break its topology spread on kubernetes.io/hostname"
            in (condition(found, "ReservationScheduled") or {}).get("message", "")
            and found
        ),
        what="the job to wait for the spread",
    )
    assert (
        "nothing is evicted while it would" in condition(waiting, "ReservationScheduled")["message"]
    )
    expire(cluster, name)
    ended = cluster.wait(lambda: phase_is(cluster, name, "Failed"), what="the TTL to end the job")
    assert ended["status"]["reason"] == "Timeout"
    still = {p["metadata"]["uid"] for p in pods(cluster, namespace, "app=web")}
    assert moving["metadata"]["uid"] in still
