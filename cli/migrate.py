"""`kubectl migrate` (and `berth migrate`): create PodMigrationJobs and follow them.

`migrate pod NAME` creates one job; `--to NODE` pins its Reservation to a node (the
defragmentation use: move a pod to where it packs best). `migrate node NAME` creates a
job for every migratable pod on a node: a drain that reserves first. With `--wait` the
jobs are followed until they end; the exit code is 0 only if every job succeeded.
`migrate abort` ends jobs in flight (`cli.abort`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid
from collections.abc import Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

import aiohttp

from berth import eviction
from berth.api import SUCCEEDED_PHASES, TERMINAL_PHASES
from berth.api.duration import parse_duration
from berth.exits import CONFIG_ERRORS, TIMED_OUT, bad_config
from berth.kube.client import NODES, PODMIGRATIONJOBS, PODS, Kube, KubeError, default_namespace
from berth.protocol import is_object_name
from cli import abort
from cli.errors import api_problem, said, transient

Object = dict[str, Any]
POLL = 1.0
COLUMNS = ("JOB", "PHASE", "STATUS", "NODE", "POD", "NEWPOD", "MESSAGE")


def job_for(
    pod: Mapping[str, Any], *, to: str | None, mode: str | None, ttl: str | None, paused: bool
) -> Object:
    """The PodMigrationJob that moves `pod` (to node `to`, when given). A mode or ttl not
    given is left out: the controller's defaultJobMode applies, and no TTL. A pin needs a
    Reservation, so a job pinned to a node is ReservationFirst when no mode is given."""
    metadata = pod["metadata"]
    # A pod's name cut where a dot or a dash ends it would make no object name.
    name = f"{metadata['name'][:40].rstrip('.-')}-{uuid.uuid4().hex[:6]}"
    spec: Object = {
        "paused": paused,
        "podRef": {
            "namespace": metadata["namespace"],
            "name": metadata["name"],
            "uid": metadata["uid"],
        },
    }
    if ttl is not None:
        spec["ttl"] = ttl
    if mode is not None or to:
        spec["mode"] = mode or "ReservationFirst"
    if to:
        pin = {"key": "metadata.name", "operator": "In", "values": [to]}
        spec["reservationOptions"] = {
            "template": {
                "spec": {
                    "template": {
                        "spec": {
                            "affinity": {
                                "nodeAffinity": {
                                    "requiredDuringSchedulingIgnoredDuringExecution": {
                                        "nodeSelectorTerms": [{"matchFields": [pin]}]
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "PodMigrationJob",
        "metadata": {"name": name},
        "spec": spec,
    }


def why_not_migratable(pod: Mapping[str, Any]) -> str | None:
    """Why a pod on a drained node is left alone (None: it is migrated).

    The rules arbitration applies to every pod whatever the configuration, from the one
    place that holds them, so the drain creates no job arbitration would refuse for what
    the pod is. What depends on the controller's configuration (namespaces, local storage,
    priority, ...) is left to arbitration, which fails such a job and says why.
    """
    return eviction.forbidden(pod)


def rows(jobs: Iterable[Mapping[str, Any]]) -> list[tuple[str, ...]]:
    result: list[tuple[str, ...]] = []
    for job in jobs:
        status = job.get("status") or {}
        result.append((job["metadata"]["name"], status.get("phase") or "Pending",
                       status.get("status") or "", status.get("nodeName") or "",
                       job["spec"]["podRef"]["name"], (status.get("podRef") or {}).get("name", ""),
                       (status.get("message") or "")[:60]))  # fmt: skip
    return result


def table(lines: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in [COLUMNS, *lines]) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [COLUMNS, *lines]
    )


DELETED = "Deleted"
"""The phase shown for a job deleted while it was followed (it did not succeed)."""

POLL_MAX = 10.0
"""The longest wait between two reads while the API server does not answer."""


async def follow(
    kube: Kube,
    names: list[str],
    *,
    out: TextIO,
    err: TextIO = sys.stderr,
    timeout: float | None = None,
) -> bool | None:
    """Show the jobs until they all end; True when every one succeeded, False when one
    did not (failed, or deleted meanwhile), None when `timeout` seconds passed first.

    The jobs are read together each round. An answer that may fare otherwise next time
    (a connection lost, a timeout, 429, a 5xx) keeps the last table and is read again,
    each time later, up to `POLL_MAX`; any other refusal (401, 403) ends the wait."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    last: dict[str, Object] = {}
    shown, delay = "", POLL
    while True:
        reads = await asyncio.gather(
            *(_read(kube, name, last.get(name)) for name in names), return_exceptions=True
        )
        failed = [error for error in reads if isinstance(error, BaseException)]
        for name, read in zip(names, reads, strict=True):
            if not isinstance(read, BaseException):
                last[name] = read
        if failed:
            problem = failed[0]
            if not transient(problem):
                raise problem
            delay = min(delay * 2, POLL_MAX)
            err.write(f"kubectl-migrate: the jobs could not be read ({said(problem)}); "
                      f"trying again in {delay:g}s\n")  # fmt: skip
            shown = ""  # the table again, below the line
        else:
            delay = POLL
        jobs = [last[name] for name in names if name in last]
        shown = _show(jobs, shown, out)
        phases = [(job.get("status") or {}).get("phase") for job in jobs]
        if len(jobs) == len(names) and all(
            phase in (*TERMINAL_PHASES, DELETED) for phase in phases
        ):
            return all(phase in SUCCEEDED_PHASES for phase in phases)
        if deadline is None:
            await asyncio.sleep(delay)
            continue
        remaining = deadline - loop.time()
        if remaining <= 0:
            return None
        await asyncio.sleep(min(delay, remaining))  # then one more read, at the deadline


async def _read(kube: Kube, name: str, before: Object | None) -> Object:
    """The job `name` as the API server has it; shown `Deleted` once it is gone."""
    try:
        return await kube.get(PODMIGRATIONJOBS, name)
    except KubeError as error:
        if not error.not_found:
            raise
    gone = dict(before or {"metadata": {"name": name}, "spec": {"podRef": {"name": ""}}})
    gone["status"] = {**(gone.get("status") or {}), "phase": DELETED, "message": "deleted"}
    return gone


def _show(jobs: list[Object], shown: str, out: TextIO) -> str:
    """Write the table if it changed (in place on a terminal); the table shown now."""
    text = table(rows(jobs))
    if text == shown:
        return shown
    live = out.isatty()
    if live and shown:
        out.write(f"\x1b[{shown.count(chr(10)) + 1}F\x1b[J")
    out.write(text + "\n" if live else text + "\n\n")
    out.flush()
    return text


async def _create(kube: Kube, pods: list[Object], args: argparse.Namespace) -> list[str]:
    names = []
    for pod in pods:
        job = job_for(
            pod, to=getattr(args, "to", None), mode=args.mode, ttl=args.ttl, paused=args.paused
        )
        await kube.create(PODMIGRATIONJOBS, job)
        names.append(job["metadata"]["name"])
        print(
            f"podmigrationjob/{job['metadata']['name']} created for "
            f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        )
    return names


async def _run(args: argparse.Namespace) -> int:
    if args.target == "abort":
        return await _abort(args)
    problem = _bad_arguments(args)
    if problem:
        print(f"kubectl-migrate: {problem}", file=sys.stderr)
        return 2
    timeout = parse_duration(args.timeout_text) if args.timeout_text else None
    args.timeout = timeout.total_seconds() if timeout is not None else None
    kube = await Kube.connect(args.kubeconfig)
    try:
        pods, problem = await _pods(kube, args)
        if problem:
            print(f"kubectl-migrate: {problem}", file=sys.stderr)
            return 1
        if not pods:
            print(f"no migratable pod on node {args.name}")
            return 0
        names = await _create(kube, pods, args)
        if not args.wait:
            return 0
        return await _wait(kube, names, args)
    except (KubeError, aiohttp.ClientError, TimeoutError) as error:
        print(f"kubectl-migrate: {api_problem(error)}", file=sys.stderr)
        return 1
    finally:
        await kube.close()


async def _abort(args: argparse.Namespace) -> int:
    problem = abort.bad_arguments(args) or _bad_durations(args)
    if problem:
        print(f"kubectl-migrate: {problem}", file=sys.stderr)
        return 2
    timeout = parse_duration(args.timeout_text) if args.timeout_text else None
    kube = await Kube.connect(args.kubeconfig)
    try:
        return await abort.abort(
            kube,
            None if args.all else frozenset(args.name),
            wait=args.wait,
            timeout=timeout.total_seconds() if timeout is not None else None,
        )
    except (KubeError, aiohttp.ClientError, TimeoutError) as error:
        print(f"kubectl-migrate: {api_problem(error)}", file=sys.stderr)
        return 1
    finally:
        await kube.close()


async def _wait(kube: Kube, names: list[str], args: argparse.Namespace) -> int:
    """Follow the jobs; the exit code their ends make."""
    ok = await follow(kube, names, out=sys.stdout, timeout=args.timeout)
    if ok is None:
        print(
            f"kubectl-migrate: timed out after {args.timeout_text}; the jobs go on", file=sys.stderr
        )
        return TIMED_OUT
    if not ok:
        print(
            "migration failed: see `kubectl describe pmj` for each job that failed or was deleted",
            file=sys.stderr,
        )
    return 0 if ok else 1


async def _pods(kube: Kube, args: argparse.Namespace) -> tuple[list[Object], str | None]:
    """The pods to migrate, or why none may be."""
    to = getattr(args, "to", None)
    for node in (args.name if args.target == "node" else None, to):
        if node is not None and not await _node_exists(kube, node):
            return [], f"no node {node}"
    if args.target == "pod":
        namespace = args.namespace or default_namespace(args.kubeconfig)
        pods = [await kube.get(PODS, args.name, namespace)]
    else:
        pods = await _migratable_on(kube, args.name, args.namespace)
    return pods, _already_on(pods, to)


async def _migratable_on(kube: Kube, node: str, namespace: str | None) -> list[Object]:
    """The pods on `node` (of `namespace`, when given) that may be migrated; the others
    are named with the reason."""
    listed = await kube.list(PODS, namespace=namespace, field_selector=f"spec.nodeName={node}")
    pods = []
    for pod in listed.get("items", []):
        reason = why_not_migratable(pod)
        if reason:
            metadata = pod["metadata"]
            print(f"skipping {metadata['namespace']}/{metadata['name']}: {reason}")
        else:
            pods.append(pod)
    return pods


async def _node_exists(kube: Kube, name: str) -> bool:
    """False only when the API server says there is no such node (a user who may not
    read nodes is not stopped: the pods on it are listed all the same)."""
    try:
        await kube.get(NODES, name)
    except KubeError as error:
        if error.not_found:
            return False
        if error.status != 403:
            raise
    return True


def _already_on(pods: list[Object], to: str | None) -> str | None:
    """Why `--to` cannot move these pods (None: it can): a job never reserves on the
    pod's own node, so one pinned there could only fail at its TTL."""
    for pod in pods:
        if to is not None and pod.get("spec", {}).get("nodeName") == to:
            metadata = pod["metadata"]
            return f"pod {metadata['namespace']}/{metadata['name']} is already on node {to}"
    return None


def _bad_durations(args: argparse.Namespace) -> str | None:
    """What is wrong with `--ttl` or `--timeout` (None: nothing)."""
    for flag, text in (("--ttl", getattr(args, "ttl", None)), ("--timeout", args.timeout_text)):
        if text is None:
            continue
        try:
            negative = parse_duration(text) < timedelta(0)
        except ValueError as error:
            return f"{flag}: {error}"
        if negative:
            return f"{flag}: {text!r} is negative"
    if args.timeout_text is not None and not args.wait:
        return "--timeout bounds --wait: give --wait too"
    return None


def _bad_arguments(args: argparse.Namespace) -> str | None:
    """What in the names given cannot name a pod, node or namespace, or what in the flags
    cannot go together (None: nothing)."""
    if getattr(args, "to", None) and args.mode == "EvictDirectly":
        return "--to pins the pod's Reservation to a node; --mode EvictDirectly reserves none"
    problem = _bad_durations(args)
    if problem:
        return problem
    names = (
        (args.target, args.name),
        ("namespace", args.namespace),
        ("node", getattr(args, "to", None)),
    )
    for what, value in names:
        if value is not None and not is_object_name(value):
            return f"{value!r} is not a {what} name"
    return None


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("migrate", help="create PodMigrationJobs and follow them")
    configure(parser)


def configure(parser: argparse.ArgumentParser) -> None:
    targets = parser.add_subparsers(dest="target", required=True)
    for target, help_text in (
        ("pod", "migrate one pod"),
        ("node", "migrate every migratable pod on a node"),
    ):
        sub = targets.add_parser(target, help=help_text)
        sub.add_argument("name", help=f"the {target}'s name")
        if target == "pod":
            sub.add_argument(
                "-n", "--namespace", default=None, help="(default: the context's namespace)"
            )
            sub.add_argument("--to", metavar="NODE", help="reserve the place on this node")
        else:
            sub.add_argument(
                "-n", "--namespace", default=None, help="only pods of this namespace (default: all)"
            )
        sub.add_argument(
            "--mode",
            choices=("ReservationFirst", "EvictDirectly"),
            default=None,
            help="(default: the controller's defaultJobMode; ReservationFirst with --to)",
        )
        # A node's jobs queue behind the controller's limits (maxMigratingPerNode), and a
        # TTL counts from creation: one TTL for them all would time out those at the back.
        sub.add_argument(
            "--ttl",
            default="5m" if target == "pod" else None,
            help=(
                "job TTL, a Go duration (default 5m)"
                if target == "pod"
                else "each job's TTL, a Go duration, counted from its creation while it "
                "waits its turn (default: none, as kubectl drain waits)"
            ),
        )
        sub.add_argument("--paused", action="store_true", help="create the jobs paused")
        sub.add_argument("--wait", action="store_true", help="follow the jobs until they end")
        sub.add_argument(
            "--timeout",
            dest="timeout_text",
            metavar="DURATION",
            default=None,
            help="with --wait, stop waiting after this long, a Go duration (exit code "
            f"{TIMED_OUT}; the jobs go on; default: wait until they end)",
        )
        sub.add_argument(
            "--kubeconfig",
            type=Path,
            default=None,
            help="kubeconfig (default: $KUBECONFIG or ~/.kube/config)",
        )
    abort.add_parser(targets)
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_run(args))
    except CONFIG_ERRORS as error:
        return bad_config("kubectl-migrate", error)
    except KeyboardInterrupt:
        said = (
            "the jobs aborted so far stay aborted"
            if args.target == "abort"
            else "any job created goes on (`kubectl get pmj`)"
        )
        print(f"kubectl-migrate: interrupted; {said}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # its output piped into `head`, say, which has had enough
        # What is left in stdout's buffer would fail again at exit: it goes nowhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def main(argv: list[str] | None = None) -> int:
    """The `kubectl-migrate` plugin."""
    parser = argparse.ArgumentParser(prog="kubectl migrate", description=__doc__)
    configure(parser)
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
