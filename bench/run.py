"""`make bench`: measure what Berth costs, side by side with the same cluster without it,
and write bench/RESULTS.md.

One local cluster (`berth dev up`, in the bench's own state directory) grows through the
run: the rows at the first size, then more fake nodes for the rows at the second size,
then more again, and pods, for memory. Handlers and arbitration run in processes of
their own meanwhile. Every comparison is made in one run, in alternating batches, so the
figures of a noisy machine still compare; absolute numbers depend on the machine.

    python -m bench.run [--scale full|busy|small] [--only scheduler,creation,...]
                        [--out bench/RESULTS.md]

`--only` measures some row families; the tables of the others are kept from the results
page already there, marked with the date and commit of the run that measured them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import statistics
import subprocess
import sys
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from bench import arbitration, creation, handlers, memory, migrations, scheduler
from bench.api import Api
from bench.cluster import Bench, start
from bench.loop import arbitration_loop_row
from bench.modes import cluster_mode
from bench.progress import elapsed, say
from bench.table import Row, Table, number, render_results
from berth.settings import MigrationControllerArgs
from devtools.binaries import REPO, kubernetes_version

RESULTS = REPO / "bench" / "RESULTS.md"


@dataclass(frozen=True)
class Scale:
    """How big each row family runs."""

    name: str
    nodes: tuple[int, int, int]
    """The cluster's sizes: first rows, second rows, memory."""
    scheduler_batches: int
    """Batches per scope and size, half with Berth (a multiple of 4: ABBA)."""
    scheduler_pods: int
    """Pods per batch."""
    creation_batches: int
    creation_pods: int
    handler_names: tuple[int, ...]
    handler_requests: int
    arbitration: tuple[int, int, int]
    """Jobs, nodes and pods of the synthetic arbitration snapshot."""
    arbitration_rounds: int
    migration_jobs: int
    """Jobs per mode."""
    memory_pods: int


SCALES = {
    "full": Scale(
        name="full",
        nodes=(500, 2000, 5000),
        scheduler_batches=12,
        scheduler_pods=500,
        creation_batches=12,
        creation_pods=500,
        handler_names=(500, 5000),
        handler_requests=500,
        arbitration=(10_000, 5_000, 50_000),
        arbitration_rounds=7,
        migration_jobs=50,
        memory_pods=50_000,
    ),
    "busy": Scale(
        name="busy",
        nodes=(500, 2000, 5000),
        scheduler_batches=8,
        scheduler_pods=300,
        creation_batches=8,
        creation_pods=300,
        handler_names=(500, 5000),
        handler_requests=500,
        arbitration=(10_000, 5_000, 50_000),
        arbitration_rounds=7,
        migration_jobs=50,
        memory_pods=50_000,
    ),
    "small": Scale(
        name="small",
        nodes=(50, 200, 500),
        scheduler_batches=4,
        scheduler_pods=100,
        creation_batches=4,
        creation_pods=100,
        handler_names=(500, 5000),
        handler_requests=100,
        arbitration=(1_000, 500, 5_000),
        arbitration_rounds=5,
        migration_jobs=10,
        memory_pods=5_000,
    ),
}


FAMILIES = ("scheduler", "creation", "handlers", "arbitration", "migrations", "memory")
"""The row families, in the order measured (`--only` names some of them)."""


# ----- arbitration --------------------------------------------------------------------------


def arbitration_row(scale: Scale) -> list[Row]:
    """The arbitration round (bench/arbitration.py) at the scale's jobs, nodes and pods,
    with the controller's defaults: a steady round (handed the memo of the round before,
    as in the controller) and a new leader's first round.

    Then the longest time the controller's event loop is blocked during a round, at
    10,000 jobs / 5,000 nodes / 50,000 pods, from bench/loop.py."""
    jobs, nodes, pods = scale.arbitration
    size = f"{scale.arbitration_rounds} rounds; {jobs:,} jobs, {nodes:,} nodes, {pods:,} pods"
    snapshot = arbitration.build(jobs=jobs, nodes=nodes, pods=pods)
    snapshot = replace(snapshot, args=MigrationControllerArgs())
    rows = []
    for steady, label in ((True, "steady round"), (False, "a new leader's first round")):
        timings, _, _ = arbitration.run(snapshot, scale.arbitration_rounds, steady=steady)
        rows.append(
            Row(
                measure=f"{label}, median",
                figure=number(statistics.median(timings), "ms"),
                n=size,
                what="time of one arbitration round over every pending job",
            )
        )
        say(f"arbitration: {label}: {rows[-1].figure}")
    blocked = arbitration_loop_row()
    rows.append(
        Row(
            measure="event loop blocked, longest",
            figure=(
                f"{number(blocked.longest_block_ms, 'ms')} "
                f"(less waits for a core: {number(blocked.longest_own_ms, 'ms')}; "
                f"p99 {number(blocked.p99_block_ms, 'ms')})"
            ),
            n=(
                f"{blocked.name}: steady round {number(blocked.round_ms, 'ms')}, "
                f"first round {number(blocked.cold_round_ms, 'ms')}, on the admission thread"
            ),
            what="the longest the controller's event loop stalls during a round (bench/loop.py)",
        )
    )
    say(f"arbitration: event loop blocked at most {rows[-1].figure}")
    return rows


ARBITRATION_METHOD = (
    "`bench/arbitration.py`'s seeded synthetic cluster (Deployments and StatefulSets of 1 "
    "to 100 replicas, PDBs, rollouts, forbidden pods, jobs in flight and finished), timed "
    "in this process with the controller's default configuration."
)


# ----- the report ---------------------------------------------------------------------------


def _git(*args: str) -> str:
    result = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else ""


def machine() -> list[tuple[str, str]]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown",
    )
    memory_kib = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    commit = _git("rev-parse", "HEAD") or "unknown"
    # A results page left by an earlier run is no change to what is measured.
    if _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/RESULTS.md"):
        commit += " (with uncommitted changes)"
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    return [
        ("date", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")),
        ("git commit", commit),
        ("cores", f"{os.cpu_count()}, {cpu}"),
        ("memory", f"{memory_kib / 1024 / 1024:.1f} GiB"),
        ("Python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("kernel", f"{platform.system()} {platform.release()}"),
        ("Kubernetes", kubernetes_version()),
        ("load average at start (1, 5, 15 min)", load),
    ]


# ----- the run ------------------------------------------------------------------------------

Family = Callable[[], Awaitable[list[Row]]]


class Run:
    """The tables measured so far, and what went wrong on the way."""

    def __init__(self) -> None:
        self.tables: list[Table] = []
        self.notes: list[str] = []
        """What the reader needs besides the tables: the cluster's scope, what failed."""

    async def family(self, table: Table, rows: Family) -> None:
        """Measure one row family into `table`; a family that fails is reported as such
        and the run goes on."""
        try:
            self.tables.append(replace(table, rows=await rows()))
        except Exception as error:
            traceback.print_exc()
            say(f"{table.title}: failed: {error}")
            self.tables.append(replace(table, method=f"{table.method}\n\n**Failed**: {error}"))

    async def grow(self, bench: Bench, nodes: int) -> bool:
        """Grow the cluster; False (and a note in the report) when that failed."""
        try:
            await bench.grow(nodes)
        except Exception as error:
            traceback.print_exc()
            self.notes.append(
                f"**Growing the cluster to {nodes:,} nodes failed** ({error}): the rows at "
                "that size are missing."
            )
            return False
        return True


def merge(tables: list[Table]) -> list[Table]:
    """One table per title, rows in the order measured."""
    merged: dict[str, Table] = {}
    for table in tables:
        if table.title in merged:
            previous = merged[table.title]
            method = previous.method if table.method in previous.method else table.method
            merged[table.title] = replace(previous, method=method, rows=previous.rows + table.rows)
        else:
            merged[table.title] = table
    return list(merged.values())


ARBITRATION = Table(
    title="Arbitration",
    method=ARBITRATION_METHOD,
    figure_header="time",
    baseline_header=None,
    ratio_header=None,
)


async def measure(scale: Scale, run: Run, only: frozenset[str] = frozenset(FAMILIES)) -> None:
    first = scale.nodes[0]
    say(f"starting a local cluster of {first:,} nodes (berth dev up)")
    cluster = await asyncio.to_thread(start, first)
    api = await Api.connect(cluster)
    bench = Bench(cluster=cluster, api=api, nodes=first)
    try:
        await bench.measure_idle()
        run.notes.append(
            f"The cluster runs Berth in the **{cluster_mode(cluster)}** scope, as `berth dev "
            "up` starts it: that is the scope of the migration and memory rows. The "
            "scheduler and pod creation rows measure both scopes."
        )
        at_start = memory.resident(bench, "VmRSS")

        async def scheduler_rows() -> list[Row]:
            return await scheduler.rows(
                bench,
                batches=scale.scheduler_batches,
                pods=scale.scheduler_pods,
                floor=bench.nodes == scale.nodes[1],
            )

        async def memory_rows() -> list[Row]:
            await memory.populate(bench, scale.memory_pods)
            return memory.rows(bench, start=at_start, pods=scale.memory_pods)

        # (family, the cluster size it runs at: an index into scale.nodes, table, rows)
        steps: list[tuple[str, int, Table, Family]] = [
            ("scheduler", 0, scheduler.table([]), scheduler_rows),
            (
                "handlers",
                0,
                handlers.table([]),
                lambda: handlers.rows(names=scale.handler_names, requests=scale.handler_requests),
            ),
            ("arbitration", 0, ARBITRATION, lambda: asyncio.to_thread(arbitration_row, scale)),
            ("scheduler", 1, scheduler.table([]), scheduler_rows),
            (
                "creation",
                1,
                creation.table([]),
                lambda: creation.rows(
                    bench, batches_=scale.creation_batches, pods=scale.creation_pods
                ),
            ),
            (
                "migrations",
                1,
                migrations.table([]),
                lambda: migrations.rows(bench, jobs_per_mode=scale.migration_jobs),
            ),
            ("memory", 2, memory.table([]), memory_rows),
        ]
        size, grown = 0, True
        for family, at, table, rows in steps:
            if family not in only:
                continue
            if at > size:
                size, grown = at, await run.grow(bench, scale.nodes[at])
            if grown:
                await run.family(table, rows)
    finally:
        await api.close()
        say("stopping the local cluster (berth dev down)")
        await asyncio.to_thread(cluster.down)


KEPT = "*Not measured in this run (`--only`): kept from the run of "


def earlier_tables(previous: str, measured: set[str]) -> tuple[str, list[str]]:
    """Where an earlier results page was measured (date and commit), and its tables
    whose titles are not in `measured`, each marked as kept from that run (a table kept
    before keeps its own mark)."""
    head, *sections = previous.split("\n## ")
    fields = dict(re.findall(r"^- \*\*(.+?)\*\*: (.*)$", head, flags=re.MULTILINE))
    origin = f"{fields.get('date', 'an unknown date')}, commit {fields.get('git commit', '?')}"
    kept = []
    for section in sections:
        title, _, body = section.partition("\n")
        if title in measured:
            continue
        if not body.lstrip().startswith(KEPT):
            body = f"\n{KEPT}{origin}.*\n{body}"
        kept.append(f"## {title}\n{body.rstrip()}\n")
    return origin, kept


def notes(scale: Scale, seconds: float) -> list[str]:
    lines = [
        f"Scale **{scale.name}**: clusters of {', '.join(f'{n:,}' for n in scale.nodes)} "
        f"fake nodes (kwok); the run took {seconds / 60:.1f} minutes.",
    ]
    if scale.name == "busy":
        lines.append(
            "**Scale busy**: the full sizes with fewer pods per batch (scheduler 300, pod "
            "creation 300), for a machine shared with other work."
        )
    elif scale.name != "full":
        lines.append(
            "**A small run, for checking the bench itself: these are not the figures of "
            "record.** `make bench` (full scale) on a quiet machine writes those."
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="full")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--only",
        type=lambda text: frozenset(text.split(",")),
        default=frozenset(FAMILIES),
        help=f"comma-separated row families to measure, of: {', '.join(FAMILIES)}",
    )
    options = parser.parse_args(argv)
    if unknown := options.only - set(FAMILIES):
        parser.error(f"unknown row families: {', '.join(sorted(unknown))}")
    scale = SCALES[options.scale]
    described = machine()
    say(f"bench at {scale.name} scale; writing {options.out}")
    run = Run()
    asyncio.run(measure(scale, run, options.only))
    tables = merge(run.tables)
    extra: list[str] = []
    if options.only != frozenset(FAMILIES) and options.out.exists():
        origin, extra = earlier_tables(options.out.read_text(), {t.title for t in tables})
        if extra:
            run.notes.append(
                f"Only {', '.join(f for f in FAMILIES if f in options.only)} measured in "
                f"this run (`--only`); the other tables are kept from the run of {origin}."
            )
    document = render_results(
        machine=described,
        notes=[*notes(scale, elapsed()), *run.notes],
        tables=tables,
    )
    options.out.write_text("\n".join([document, *extra]))
    say(f"wrote {options.out} after {elapsed() / 60:.1f} minutes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
