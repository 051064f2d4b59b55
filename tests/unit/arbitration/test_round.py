"""The round as a whole: a missing or already migrating pod fails its job, paused jobs
get no decision, arbitration can be turned off, and the memo reuses only what it read
from the very same objects."""

from __future__ import annotations

import copy
from collections.abc import Sequence

from berth.api import keys, migrating_job
from berth.settings import MigrationControllerArgs
from controller.arbitration import (
    Arbitration,
    Decision,
    LimiterState,
    Memo,
    Snapshot,
    TokenBucket,
    arbitrate,
)
from tests.unit.arbitration.helpers import (
    LOOSE,
    Object,
    annotate,
    decide,
    of,
    pending,
    pods_of,
    running,
    tweak,
    tweaked,
    verdicts,
    workload_of,
    workloads_by_key,
)
from tests.unit.builders import T0, pdb, pod, workload


def test_missing_pod_fails() -> None:
    result = decide([pending("job-1", pod("gone-0"))], pods=pods_of(), workloads=[workload()])
    assert of(result) == Decision(
        of(result).job, "fail", "MissingPod", "pod default/gone-0 not found"
    )


def test_a_job_whose_podref_uid_names_another_pod_fails_and_moves_none() -> None:
    """podRef names the pod by UID too (the eviction webhook and kubectl migrate set it):
    a StatefulSet's pod made again under that name since is not the one asked for."""
    web = pods_of()
    named = pending("job-1", web[0])
    named["spec"]["podRef"]["uid"] = "uid-of-an-earlier-pod"
    same = pending("job-2", web[1])
    same["spec"]["podRef"]["uid"] = web[1]["metadata"]["uid"]
    result = decide([named, same], pods=web, workloads=[workload()], **LOOSE)
    assert verdicts(result) == {"job-1": "fail", "job-2": "admit"}
    assert of(result, "job-1").reason == "MissingPod"
    assert "podRef.uid uid-of-an-earlier-pod" in of(result, "job-1").message


def test_a_pod_already_migrating_fails_the_second_job() -> None:
    web = pods_of()
    result = decide(
        [pending("job-1", web[0]), pending("job-2", web[1]), pending("job-3", web[1], age=5)],
        pods=web,
        workloads=[workload()],
        in_flight=[running("job-0", web[0])],
        **LOOSE,
    )
    assert verdicts(result) == {"job-1": "fail", "job-2": "fail", "job-3": "admit"}
    # The job each waits behind is named, whether running or admitted in the same round:
    # the eviction webhook reads it.
    message = of(result, "job-2").message
    assert message == (
        "pod default/web-1 is already being migrated by another job (PodMigrationJob job-3)"
    )
    assert migrating_job(message) == "job-3"
    assert migrating_job(of(result, "job-1").message) == "job-0"


def test_paused_jobs_get_no_decision() -> None:
    web = pods_of()
    paused = pending("job-1", web[0])
    paused["spec"]["paused"] = True
    assert decide([paused], pods=web, workloads=[workload()]).decisions == []


# ----- arbitration disabled ---------------------------------------------------------------


def test_disabled_arbitration_admits_all_but_still_forbids() -> None:
    web = pods_of(count=4, nodes=["node-0"] * 4)
    web[3]["spec"]["volumes"] = [{"name": "cache", "emptyDir": {}}]
    state = LimiterState(TokenBucket(0.0, T0))
    result = decide(
        [pending(f"job-{i}", web[i]) for i in range(4)] + [pending("job-9", pod("gone"))],
        pods=web,
        workloads=[workload(updated=1)],
        pdbs=[pdb(allowed=0)],
        limiter=state,
        evictQPS=1,
        arbitrationArgs={"enabled": False},
    )
    assert verdicts(result) == {
        "job-0": "admit",
        "job-1": "admit",
        "job-2": "admit",
        "job-3": "fail",
        "job-9": "fail",
    }
    assert result.limiter is state


# ----- the memo: a round reuses only what it read from the very same objects ---------------


def round_with(
    memo: Memo | None,
    *,
    jobs: Sequence[Object],
    pods: Sequence[Object],
    workloads: Sequence[Object],
    args: MigrationControllerArgs,
) -> Arbitration:
    return arbitrate(
        Snapshot(
            pending=jobs,
            in_flight=(),
            pods={f"default/{p['metadata']['name']}": p for p in pods},
            workload_of=workload_of(pods),
            workloads=workloads_by_key(workloads),
            args=args,
            memo=memo,
            now=T0,
        )
    )


def test_memo_rereads_a_replaced_pod() -> None:
    members, args = pods_of(), MigrationControllerArgs.model_validate(LOOSE)
    jobs = [pending("job-1", members[0])]
    first = round_with(None, jobs=jobs, pods=members, workloads=[workload()], args=args)
    assert of(first).verdict == "admit"
    changed = tweaked(
        copy.deepcopy(members[0]), annotate({keys.EVICTION_COST: str(keys.EVICTION_COST_NEVER)})
    )
    second = round_with(
        first.memo, jobs=jobs, pods=[changed, *members[1:]], workloads=[workload()], args=args
    )
    assert (of(second).verdict, of(second).reason) == ("fail", "ForbiddenMigratePod")


def test_memo_rereads_a_replaced_workload() -> None:
    members, args = pods_of(), MigrationControllerArgs.model_validate(LOOSE)
    jobs = [pending("job-1", members[0])]
    first = round_with(None, jobs=jobs, pods=members, workloads=[workload()], args=args)
    second = round_with(
        first.memo, jobs=jobs, pods=members, workloads=[workload(updated=2)], args=args
    )
    assert (of(first).verdict, of(second).reason) == ("admit", "RolloutInProgress")


def test_memo_is_dropped_with_another_configuration() -> None:
    members = pods_of()
    target = tweaked(members[0], tweak(spec__volumes=[{"name": "scratch", "emptyDir": {}}]))
    jobs = [pending("job-1", target)]
    allowing = MigrationControllerArgs.model_validate({**LOOSE, "evictLocalStoragePods": True})
    first = round_with(None, jobs=jobs, pods=members, workloads=[workload()], args=allowing)
    second = round_with(
        first.memo,
        jobs=jobs,
        pods=members,
        workloads=[workload()],
        args=MigrationControllerArgs.model_validate(LOOSE),
    )
    assert (of(first).verdict, of(second).reason) == ("admit", "ForbiddenMigratePod")
    assert "emptyDir volume scratch" in of(second).message


def test_memo_keeps_only_what_the_round_read() -> None:
    members, args = pods_of(), MigrationControllerArgs.model_validate(LOOSE)
    jobs = [pending("job-1", members[0]), pending("job-2", members[1])]
    first = round_with(None, jobs=jobs, pods=members, workloads=[workload()], args=args)
    second = round_with(first.memo, jobs=jobs[1:], pods=members, workloads=[workload()], args=args)
    assert [c.job for c in first.memo.jobs.values()] == jobs
    assert [c.job for c in second.memo.jobs.values()] == jobs[1:]
