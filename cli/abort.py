"""`kubectl migrate abort`: end jobs in flight, and wait until Berth holds nothing for them.

Aborting a job is what a user may always do (`status.phase: Aborted`, README "Who may
migrate pods"); the controller then rolls it back or lets go of what it holds: its
Reservation is deleted or released, the placeholder deleted, any replacement gated on
it ungated. `--wait` follows that until it is done, so that `--all --wait` is what runs
before Berth is uninstalled (the chart's pre-delete hook): without a controller, a pod
still gated on a Reservation would stay Pending.

What Berth holds is judged on what only Berth writes: a Reservation by the job named in
its `berth.sh/job` annotation (as the controller judges its own), a placeholder by the
pod recorded on its Reservation (`berth.sh/placeholder`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp
import orjson

from berth import protocol
from berth.api import TERMINAL_PHASES, PodMigrationJobPhase, ReservationPhase, keys
from berth.eviction import soft_eviction_job
from berth.exits import TIMED_OUT
from berth.kube.client import (
    PODMIGRATIONJOBS,
    PODS,
    RESERVATIONS,
    Kube,
    KubeError,
    add_kubeconfig_argument,
)
from cli import errors

Object = dict[str, Any]
POLL = 1.0

ENDED_RESERVATION = frozenset({ReservationPhase.SUCCEEDED, ReservationPhase.FAILED})


def job_phase(job: Mapping[str, Any]) -> str:
    return str((job.get("status") or {}).get("phase") or "Pending")


def in_scope(job: Mapping[str, Any], names: frozenset[str] | None) -> bool:
    """Whether the job is one of those named (every job, for `--all`)."""
    return names is None or job["metadata"]["name"] in names


def to_abort(jobs: Iterable[Object], names: frozenset[str] | None) -> list[Object]:
    """The jobs in scope that have not ended."""
    return [job for job in jobs if in_scope(job, names) and job_phase(job) not in TERMINAL_PHASES]


def abort_patch(job: Mapping[str, Any]) -> Object:
    """The status patch that aborts the job as it was read: the API server refuses it (409)
    if the job changed since, so that a job that ended meanwhile keeps its ending."""
    return {
        "metadata": {"resourceVersion": job["metadata"]["resourceVersion"]},
        "status": {"phase": PodMigrationJobPhase.ABORTED},
    }


def holding(
    jobs: Iterable[Object],
    reservations: Iterable[Object],
    pods: Iterable[Object] | None,
    names: frozenset[str] | None,
) -> list[str]:
    """What Berth still holds for the jobs in scope, a line each (empty: nothing).

    `pods` are those carrying Berth's placeholder or claim label (None: they could not
    be read, and only jobs and Reservations are judged)."""
    jobs = list(jobs)
    held = [
        f"podmigrationjob/{job['metadata']['name']} is {job_phase(job)}"
        for job in to_abort(jobs, names)
    ]
    # Ended, but the controller has not acted on it yet: the first thing it does for a
    # finished job is take its admission mark off (`controller.jobs.machine`).
    held += [
        f"podmigrationjob/{job['metadata']['name']} is {job_phase(job)}, not yet let go of "
        "by the controller"
        for job in jobs
        if in_scope(job, names)
        and job_phase(job) in TERMINAL_PHASES
        and keys.ADMISSION in protocol.annotations_of(job)
    ]
    ours = [
        reservation
        for reservation in reservations
        if (job := protocol.annotations_of(reservation).get(keys.JOB))
        and (names is None or job in names)
    ]
    held += [
        f"reservation/{r['metadata']['name']} is {protocol.phase(r) or 'Pending'}"
        for r in ours
        if protocol.phase(r) not in ENDED_RESERVATION
    ]
    if pods is None:
        return held
    placeholders = {
        record.pod_uid: r["metadata"]["name"]
        for r in ours
        if (record := protocol.recorded_placeholder(r)) is not None
    }
    reserved = {r["metadata"]["name"] for r in ours}
    for pod in pods:
        meta = pod["metadata"]
        where = f"{meta['namespace']}/{meta['name']}"
        if meta.get("uid") in placeholders:
            held.append(f"placeholder {where} of reservation/{placeholders[meta['uid']]}")
        elif protocol.is_gated(pod) and (names is None or _allocated(pod) in reserved):
            held.append(f"pod {where} is gated by Berth")
    return held


def _allocated(pod: Object) -> str | None:
    """The Reservation named in the pod's `reservation-allocated` annotation."""
    try:
        value = orjson.loads(protocol.annotations_of(pod).get(keys.RESERVATION_ALLOCATED) or "{}")
    except ValueError:
        return None
    return value.get("name") if isinstance(value, dict) else None


def add_parser(targets: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = targets.add_parser(
        "abort",
        help="abort jobs in flight; with --wait, until Berth holds nothing for them",
    )
    sub.add_argument("name", nargs="*", help="the jobs to abort")
    sub.add_argument("--all", action="store_true", help="every job that has not ended")
    sub.add_argument(
        "--wait",
        action="store_true",
        help="wait until the jobs have ended and Berth holds nothing for them: no live "
        "Reservation, placeholder or gated pod (with --all, jobs created meanwhile are "
        "aborted too)",
    )
    sub.add_argument(
        "--timeout",
        dest="timeout_text",
        metavar="DURATION",
        default=None,
        help=f"with --wait, stop waiting after this long, a Go duration (exit code {TIMED_OUT})",
    )
    add_kubeconfig_argument(sub)


def bad_arguments(args: argparse.Namespace) -> str | None:
    if args.all == bool(args.name):
        return "name the jobs to abort, or give --all"
    for name in args.name:
        if not protocol.is_object_name(name):
            return f"{name!r} is not a job name"
    return None


async def abort(
    kube: Kube,
    names: frozenset[str] | None,
    *,
    wait: bool,
    timeout: float | None,
    out: Any = sys.stdout,
    err: Any = sys.stderr,
) -> int:
    """Abort the jobs in scope (every job that has not ended, for `names=None`); with
    `wait`, until Berth holds nothing for them. The exit code: 0 done; 1 a job named does
    not exist, or one could not be aborted (each said); 3 `timeout` seconds passed first
    (what is still held is said)."""
    run = _Abort(kube, names, out, err)
    jobs = await _jobs(kube)
    if names is not None:
        missing = sorted(names - jobs.keys())
        if missing:
            err.write(f"kubectl-migrate: no podmigrationjob {', '.join(missing)}\n")
            return 1
        for name in sorted(names):
            if job_phase(jobs[name]) in TERMINAL_PHASES:
                out.write(f"podmigrationjob/{name} has already ended ({job_phase(jobs[name])})\n")
    if not await run.abort(jobs):
        return 1
    if not wait:
        return 1 if run.unsettled else 0
    return await run.wait(jobs, timeout)


async def _jobs(kube: Kube) -> dict[str, Object]:
    return {job["metadata"]["name"]: job for job in await _items(kube, PODMIGRATIONJOBS)}


TRIES = 3
"""Patches of one job, each after reading it again, while it changes under them (409)."""

_CHANGING: Object = {}
"""What `_Abort._abort_one` answers for a job that changed under each of its patches."""


class _Abort:
    """Aborts the jobs in scope, and follows what Berth holds for them, aborting (with
    `--all`) jobs made meanwhile. Pods are read while the user may read them; a user who
    may not (`berth-operator` grants no pod reads) is told once, and jobs and
    Reservations are judged alone. A read that may fare otherwise next time (429, a 5xx,
    a connection lost) is said and tried again; any other refusal ends the command."""

    def __init__(self, kube: Kube, names: frozenset[str] | None, out: Any, err: Any) -> None:
        self.kube, self.names, self.out, self.err = kube, names, out, err
        self.aborted: dict[str, Object] = {}
        """The jobs this command aborted, as it aborted them."""
        self.refused: set[str] = set()
        """The jobs the API server would not let this command abort (said once each)."""
        self.unsettled: set[str] = set()
        """The jobs that changed under every patch of the last round (said): the next
        round, if any, tries again."""
        self.let_go: set[str] = set()
        """Aborted jobs whose pod is known free of their soft eviction, for good: the
        controller took the job's mark off, and the pod carries none of it (or is gone)."""
        self.pods_readable = True

    async def abort(self, jobs: dict[str, Object]) -> bool:
        """Abort the jobs in scope that have not ended; `jobs` takes the answers. False
        when one could not be aborted (said)."""
        ok = True
        for job in to_abort(jobs.values(), self.names):
            name = job["metadata"]["name"]
            if name in self.refused:
                continue
            try:
                done = await self._abort_one(job)
            except KubeError as error:
                if errors.transient(error):
                    raise
                self.err.write(f"kubectl-migrate: podmigrationjob/{name} not aborted: "
                               f"{errors.said(error)}\n")  # fmt: skip
                self.refused.add(name)
                ok = False
                continue
            if done is _CHANGING:
                self.unsettled.add(name)
                self.err.write(f"kubectl-migrate: podmigrationjob/{name} changed under each of "
                               f"{TRIES} patches; not aborted yet\n")  # fmt: skip
            elif done is not None:
                self.unsettled.discard(name)
                jobs[name] = self.aborted[name] = done
                self.out.write(f"podmigrationjob/{name} aborted\n")
        return ok

    async def _abort_one(self, job: Object) -> Object | None:
        """The job as aborted; None when it is gone or has ended meanwhile; `_CHANGING`
        when it changed under each of `TRIES` patches (409). A job changed since it was
        read is read again and aborted as it is then."""
        name = job["metadata"]["name"]
        for attempt in range(TRIES):
            try:
                return await self.kube.patch(
                    PODMIGRATIONJOBS, name, abort_patch(job), subresource="status"
                )
            except KubeError as error:
                if error.not_found:
                    return None
                if error.conflict and attempt == TRIES - 1:
                    return _CHANGING
                if not error.conflict:
                    raise
            found = await self.kube.find(PODMIGRATIONJOBS, name)
            if found is None or job_phase(found) in TERMINAL_PHASES:
                return None
            job = found
        return None

    async def wait(self, jobs: dict[str, Object], timeout: float | None) -> int:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        shown = ""
        while True:
            held = await self._read(jobs)
            if self.refused:
                return 1  # said as it happened
            if held is not None and not held:
                done = "for these jobs" if self.names is not None else ""
                self.out.write(f"Berth holds nothing {done}".rstrip() + "\n")
                return 0
            text = "\n".join(held or []) or shown
            if text != shown:
                self.out.write(f"waiting for the controller to let go of:\n{text}\n")
                self.out.flush()
                shown = text
            if deadline is not None and loop.time() >= deadline:
                self.err.write(f"kubectl-migrate: timed out; still held:\n{shown}\n")
                return TIMED_OUT
            await asyncio.sleep(POLL if deadline is None else min(POLL, deadline - loop.time()))
            jobs = {}

    async def _read(self, jobs: dict[str, Object]) -> list[str] | None:
        """What is held (None: the API server could not say this time). Empty `jobs`
        are read again, and those in scope that have not ended aborted."""
        try:
            if not jobs:
                jobs = await _jobs(self.kube)
                if not await self.abort(jobs):
                    return None
            reservations = await _items(self.kube, RESERVATIONS)
            held = holding(jobs.values(), reservations, await self._pods(), self.names)
            return held + await self._soft_evictions(jobs)
        except (KubeError, aiohttp.ClientError, TimeoutError) as error:
            if not errors.transient(error):
                raise
            self.err.write(f"kubectl-migrate: {errors.said(error)}; reading again\n")
            return None

    async def _pods(self) -> list[Object] | None:
        if not self.pods_readable:
            return None
        try:
            return await _berth_pods(self.kube)
        except KubeError as error:
            if error.status != 403:
                raise
        self._unreadable()
        return None

    async def _soft_evictions(self, jobs: dict[str, Object]) -> list[str]:
        """The pods of the jobs this command aborted that still carry their soft eviction
        (`evictionPolicy: SoftEviction`): whatever acts on it would evict the pod with no
        place held once the controller, which takes it off, is gone. A pod is read until
        it is known free of it for good (`let_go`)."""
        found = []
        for name, job in self.aborted.items():
            ref = job.get("spec", {}).get("podRef") or {}
            if name in self.let_go or not self.pods_readable or not ref.get("name"):
                continue
            try:
                pod = await self.kube.find(PODS, ref["name"], ref.get("namespace"))
            except KubeError as error:
                if error.status != 403:
                    raise
                self._unreadable()
                continue
            if pod is not None and soft_eviction_job(pod) == name:
                found.append(f"pod {ref['namespace']}/{ref['name']} carries the soft eviction "
                             f"of podmigrationjob/{name}")  # fmt: skip
            elif keys.ADMISSION not in protocol.annotations_of(jobs.get(name) or {}):
                self.let_go.add(name)
        return found

    def _unreadable(self) -> None:
        self.pods_readable = False
        self.err.write("kubectl-migrate: pods cannot be read: placeholders, gated pods and "
                       "soft evictions are not checked\n")  # fmt: skip


async def _items(kube: Kube, resource: Any, label_selector: str | None = None) -> list[Object]:
    listed = await kube.list(resource, label_selector=label_selector)
    return list(listed.get("items") or [])


async def _berth_pods(kube: Kube) -> list[Object]:
    """Every pod carrying Berth's placeholder or claim label, once each."""
    found: dict[str, Object] = {}
    for label in (keys.RESERVATION_LABEL, keys.CLAIM):
        for pod in await _items(kube, PODS, label_selector=label):
            found[pod["metadata"]["uid"]] = pod
    return list(found.values())
