"""What a webhook call costs kube-apiserver: its CPU per pod created with the webhook
called and not, and the functions where the difference goes, from its own CPU profile.

The pod creation rows of RESULTS.md stay below 0.85 even against a webhook that answers
at once (`bench.nullhook`). This harness shows why: on a small cluster of the bench's
(`berth dev up --profiling`), one client creates pods as the ReplicaSet controller does,
in streams alternating between a namespace the strict configuration matches and one it
skips, while kube-apiserver profiles itself (`/debug/pprof/profile`) for the stream's
whole length. Per pod: the API server's and the webhook's CPU time (/proc), the mean
latency, and the cumulative time of each API server function, called less not called
(`go tool pprof -top -cum` of each profile over the pods created during it).

    python -m bench.apicost [--against berth|null] [--seconds 20] [--streams 2]

Not part of `make bench`: the bench's cluster keeps profiling off. Prints markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from bench import nullhook
from bench.api import Api, pods_path
from bench.cluster import Bench, cpu_seconds, start
from bench.creation import (
    REPLICASET_CONTROLLER,
    Counter,
    Source,
    berth_reviews,
    clear,
    configure,
    hold,
    hold_owner,
)
from bench.modes import MIGRATING_LABEL, webhook_configuration

NODES = 10
SHOWN = 25
"""Functions listed: those whose time per pod grew the most."""

PARTS = (
    (
        "k8s.io/apiserver/pkg/admission/plugin/webhook/mutating.(*mutatingDispatcher).Dispatch",
        "the mutating webhooks' dispatch, all of it",
    ),
    (
        "k8s.io/apiserver/pkg/admission/plugin/webhook/generic.(*Webhook).ShouldCallHook",
        "whether to call: selectors and the matchCondition (CEL)",
    ),
    (
        "k8s.io/apiserver/pkg/admission/plugin/webhook/mutating.(*mutatingDispatcher)"
        ".callAttrMutatingHook",
        "the call: the review built, encoded, sent; the answer decoded",
    ),
    ("k8s.io/client-go/rest.(*Request).Body", "of which encoding the AdmissionReview"),
    ("runtime.gcBgMarkWorker", "garbage collection (marking)"),
)
"""The parts of a webhook call shown first, by function and what it is."""

_TOP_LINE = re.compile(
    r"\s*[\d.]+(?:ms|s|us)?\s+[\d.]+%\s+[\d.]+%\s+([\d.]+)(ms|s|us)?\s+[\d.]+%\s+(.+)$"
)
_UNIT = {"s": 1.0, "ms": 1e-3, "us": 1e-6, None: 1.0}


def cumulative(top: str) -> dict[str, float]:
    """Seconds of CPU per function, cumulative, from `go tool pprof -top -cum`'s text."""
    found: dict[str, float] = {}
    for line in top.splitlines():
        if match := _TOP_LINE.match(line):
            found[match[3]] = float(match[1]) * _UNIT[match[2]]
    return found


@dataclass
class Side:
    """What the streams of one side (webhook called or not) measured, pooled."""

    pods: int = 0
    seconds: float = 0.0
    apiserver: float = 0.0
    webhook: float = 0.0
    functions: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    profiled_pods: int = 0

    def per_pod(self, seconds: float) -> float:
        return seconds / self.pods * 1000

    def function_ms(self, name: str) -> float:
        return self.functions.get(name, 0.0) / self.profiled_pods * 1000


async def profile(bench: Bench, seconds: int) -> bytes:
    async with bench.api.session.get(
        f"{bench.api.server}/debug/pprof/profile", params={"seconds": str(seconds)}
    ) as answer:
        answer.raise_for_status()
        return await answer.read()


async def stream(
    bench: Bench,
    namespace: str,
    source: Source,
    side: Side,
    *,
    webhook: int,
    seconds: int,
    tag: str,
) -> None:
    """Create pods one at a time while the API server profiles itself; `webhook` is the
    pid of the server under test."""
    apiserver = bench.component("kube-apiserver").pid
    cpu = cpu_seconds(apiserver), cpu_seconds(webhook)
    profiling = asyncio.create_task(profile(bench, seconds))
    made, started = 0, time.perf_counter()
    while not profiling.done():
        [body] = source.pods(namespace, tag, 1, start=made)
        await bench.api.create(pods_path(namespace), body, as_user=source.as_user)
        made += 1
    side.seconds += time.perf_counter() - started
    side.pods += made
    side.apiserver += cpu_seconds(apiserver) - cpu[0]
    side.webhook += cpu_seconds(webhook) - cpu[1]
    for name, spent in (await asyncio.to_thread(functions, await profiling)).items():
        side.functions[name] += spent
    side.profiled_pods += made
    await clear(bench, (namespace,), tag)


def functions(profile: bytes) -> dict[str, float]:
    """Seconds of CPU per function, cumulative, in a pprof CPU profile."""
    with tempfile.NamedTemporaryFile(suffix=".pb.gz") as saved:
        saved.write(profile)
        saved.flush()
        top = subprocess.run(
            [_go(), "tool", "pprof", "-top", "-cum", "-nodecount=5000", saved.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    return cumulative(top)


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise SystemExit("go is not on PATH: `go tool pprof` reads the profiles")
    return go


@asynccontextmanager
async def answering(
    bench: Bench, against: str
) -> AsyncIterator[tuple[Counter, list[str] | None, int]]:
    """The server under test: its reviews counter, webhook URLs (None: Berth's) and pid."""
    if against == "null":
        async with nullhook.running(bench) as null:
            yield null.count, [f"{null.url}/mutate-pod"], null.pid
    else:
        yield berth_reviews(bench), None, bench.component("berth-webhook").pid


async def measure(against: str, *, seconds: int, streams: int) -> tuple[Side, Side]:
    cluster = await asyncio.to_thread(start, NODES, profiling=True)
    api = await Api.connect(cluster)
    bench = Bench(cluster=cluster, api=api, nodes=NODES)
    called, quiet = Side(), Side()
    try:
        on = await bench.namespace("bench-webhook-on", {MIGRATING_LABEL: "true"})
        off = await bench.namespace("bench-webhook-off")
        await hold(bench, on)
        owners = {ns: await hold_owner(bench, ns) for ns in (on, off)}
        source = Source("ReplicaSet", REPLICASET_CONTROLLER, owners)
        async with answering(bench, against) as (reviews, urls, pid):
            config = webhook_configuration(cluster, "strict", skip=(off,), urls=urls)
            await configure(
                bench,
                config,
                reviews,
                expected={on: True, off: False},
                source=source,
                what=f"the strict configuration ({against})",
            )
            for index in range(streams):
                for namespace, side in ((off, quiet), (on, called)):
                    tag = f"p-{index}-{namespace}"
                    await stream(
                        bench, namespace, source, side, webhook=pid, seconds=seconds, tag=tag
                    )
    finally:
        await api.close()
        await asyncio.to_thread(cluster.down)
    return called, quiet


def report(against: str, called: Side, quiet: Side) -> str:
    lines = [
        f"Webhook: {against}; {called.pods + quiet.pods:,} pods in streams of one client.",
        "",
        "| per pod created | webhook called | not called | difference |",
        "|---|---|---|---|",
    ]
    for label, with_, without in (
        ("latency, mean", called.per_pod(called.seconds), quiet.per_pod(quiet.seconds)),
        ("kube-apiserver CPU", called.per_pod(called.apiserver), quiet.per_pod(quiet.apiserver)),
        ("webhook CPU", called.per_pod(called.webhook), quiet.per_pod(quiet.webhook)),
    ):
        lines.append(f"| {label} | {with_:.3f} ms | {without:.3f} ms | {with_ - without:+.3f} ms |")
    ratio = quiet.seconds / quiet.pods / (called.seconds / called.pods)
    lines += [
        "",
        f"Ratio (1 / latency, called over not called): {ratio:.2f}.",
        "",
        "| kube-apiserver, per pod | called | not called | difference |",
        "|---|---|---|---|",
    ]
    for name, what in PARTS:
        with_, without = called.function_ms(name), quiet.function_ms(name)
        lines.append(f"| {what} | {with_:.3f} ms | {without:.3f} ms | {with_ - without:+.3f} ms |")
    lines += [
        "",
        "| kube-apiserver function (cumulative) | called | not called | difference |",
        "|---|---|---|---|",
    ]
    names = set(called.functions) | set(quiet.functions)
    grown = sorted(names, key=lambda n: quiet.function_ms(n) - called.function_ms(n))[:SHOWN]
    for name in grown:
        with_, without = called.function_ms(name), quiet.function_ms(name)
        lines.append(
            f"| `{name}` | {with_:.3f} ms | {without:.3f} ms | {with_ - without:+.3f} ms |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", choices=("berth", "null"), default="berth")
    parser.add_argument("--seconds", type=int, default=20, help="length of a stream")
    parser.add_argument("--streams", type=int, default=2, help="streams of each side")
    options = parser.parse_args()
    called, quiet = asyncio.run(
        measure(options.against, seconds=options.seconds, streams=options.streams)
    )
    print(report(options.against, called, quiet))


if __name__ == "__main__":
    main()
