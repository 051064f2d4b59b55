"""Pod creation throughput with and without the webhook, and the webhook's own latency.

Two namespaces, one the webhook configuration matches and one it does not, receive
batches of pods in turn (ABBA order), from 1 or 8 concurrent clients. The configuration
is Berth's as shipped for the scope (`bench.modes.webhook_configuration`); the "without"
namespace is one it does not see: unlabelled in default scope, added to the namespaces
it skips (as kube-system is) in strict scope. So the two sides differ only in whether
the API server calls the webhook. The matched namespace is one where a migration waits
for its replacement (a Reservation of that namespace is Available), which is when the
controller labels a namespace `berth.sh/migrating` in the default scope. Before
measuring, dry-run creations in each namespace confirm that the API server calls the
webhook exactly where the configuration says.

In the default scope one more pair of rows measures what a pod that is not part of a
migration pays: pods created in the namespace that is not migrating, with Berth's
configuration registered against not registered at all (deleted), alternating. The API
server never calls the webhook there (n counts its reviews), so the ratio is the cost of
the registration itself, expected to be 1 within the run's noise.

Each pair of batches (one each side, moments apart) is a trial with a ratio of its own;
a row's ratio is the median trial, and n gives the lowest and the highest.

The pods name a scheduler that does not exist, so they stay Pending: what is timed is
admission and storage, not scheduling. The webhook's p50/p99 come from its own histogram
(`berth_webhook_request_duration_seconds`), read before and after a scope's batches.
"""

from __future__ import annotations

import math
import statistics
import time

from bench.api import Object, create_all, pods_path
from bench.cluster import Bench, pod, wait_for
from bench.modes import MIGRATING_LABEL, MODES, Mode, webhook_configuration
from bench.progress import say
from bench.scheduler import order
from bench.stats import bucket_bound, difference, histogram, paired_ratios, rate, spread
from bench.table import Row, Table, number

HISTOGRAM = "berth_webhook_request_duration_seconds"
REQUESTS = "berth_webhook_requests_total"
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
RESERVATIONS = "/apis/scheduling.koordinator.sh/v1alpha1/reservations"
CONCURRENCY = (1, 8)
UNSCHEDULED = "bench-nobody"
"""The scheduler name of the created pods: no scheduler serves it."""

METHOD = (
    "Pods of one pause container, without an owner, are created in batches alternating "
    "(ABBA) between a namespace Berth's MutatingWebhookConfiguration matches (as shipped "
    "for the scope) and one it does not, by 1 or 8 concurrent clients each sending one "
    "request at a time. The matched namespace holds a migration waiting for its "
    f"replacement (an Available Reservation), so in the default scope it carries "
    f"`{MIGRATING_LABEL}=true`; the other is unlabelled (default) or added to the "
    "namespaces the configuration skips, as kube-system is (strict). Before a scope's "
    "batches, dry-run creations confirm that the API server calls the webhook exactly in "
    "the namespaces the configuration matches. In the default scope the 'not migrating' "
    "rows create pods in the unlabelled namespace only, with the configuration registered "
    "against deleted (batches alternate, and dry-run creations confirm each change is in "
    "effect before a batch): what a pod outside any migration pays. Each pair of batches "
    "(one a side, moments apart) is a trial with a ratio of its own: the ratio column is "
    "the median trial, n gives the lowest and highest; pods/s pool a side. The pods stay "
    "Pending (their scheduler "
    "does not exist): this times admission and storage only. The webhook's p50/p99 come "
    "from its own histogram `berth_webhook_request_duration_seconds` over the batches: "
    "the upper bound of the bucket holding each (buckets 0.1, 0.25, 0.5, 1, 2.5, 5, 10 ms, "
    "...). A ReplicaSet's pod in that namespace would also cost the webhook a lookup of "
    "its owner (not measured here)."
)


async def calls(bench: Bench) -> float:
    """How many reviews the webhook has answered so far."""
    return await bench.counter("berth-webhook", REQUESTS)


async def is_called(bench: Bench, namespace: str) -> bool:
    """Whether the API server calls the webhook for a pod created in `namespace`."""
    before = await calls(bench)
    await bench.api.create(pods_path(namespace), pod("probe", scheduler=UNSCHEDULED), dry_run=True)
    return await calls(bench) > before


async def configure(bench: Bench, mode: Mode, *, matched: str, unmatched: str, probe: str) -> None:
    """Install the scope's configuration and wait until the API server acts on it: calls
    the webhook for `matched` and not for `unmatched`; for `probe`, a plain namespace,
    only in strict scope (which tells the two scopes apart)."""
    config = webhook_configuration(bench.cluster, mode, skip=(unmatched,))
    await bench.api.apply(WEBHOOKS, config)
    expected = {matched: True, unmatched: False, probe: mode == "strict"}

    async def in_effect() -> bool:
        return all([await is_called(bench, ns) == called for ns, called in expected.items()])

    await wait_for(in_effect, what=f"the API server to use the {mode} webhook configuration")


async def create_batch(bench: Bench, namespace: str, *, pods: int, clients: int, tag: str) -> float:
    """Create a batch; the seconds it took. The pods are deleted afterwards, untimed."""
    objects = [
        pod(f"{tag}-{i}", scheduler=UNSCHEDULED, labels={"bench-batch": tag}) for i in range(pods)
    ]
    started = time.monotonic()
    await create_all(bench.api, pods_path(namespace), objects, workers=clients)
    seconds = time.monotonic() - started
    await bench.clear_pods(namespace, f"bench-batch={tag}")
    return seconds


def reservation(namespace: str) -> Object:
    """A Reservation for a pod of `namespace`, owned by a ReplicaSet that has no pods."""
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Reservation",
        "metadata": {"name": f"bench-{namespace}"},
        "spec": {
            "ttl": "1h",
            "template": {
                "metadata": {"namespace": namespace},
                "spec": pod("placeholder", cpu="10m")["spec"],
            },
            "owners": [
                {
                    "controller": {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": "bench-nobody",
                        "uid": "00000000-0000-4000-8000-00000000be4c",
                        "namespace": namespace,
                    }
                }
            ],
        },
    }


async def hold(bench: Bench, namespace: str) -> str:
    """Make `namespace` one where a migration waits for its replacement: a Reservation
    there, Available and unowned, is what the controller labels a namespace
    `berth.sh/migrating` for (and keeps the label for), as the default scope's webhook
    configuration requires."""
    body = reservation(namespace)
    name = str(body["metadata"]["name"])
    await bench.api.apply(RESERVATIONS, body)

    async def available() -> bool:
        found = await bench.api.request("GET", f"{RESERVATIONS}/{name}")
        return (found.get("status") or {}).get("phase") == "Available"

    await wait_for(available, what=f"Reservation {name} to be Available")
    return name


async def rows(bench: Bench, *, batches: int, pods: int) -> list[Row]:
    # Labelled here too, for a controller that does not label namespaces itself.
    matched = await bench.namespace("bench-webhook-on", {MIGRATING_LABEL: "true"})
    unmatched = await bench.namespace("bench-webhook-off")
    probe = await bench.namespace("bench-webhook-probe")
    own = await bench.api.request("GET", f"{WEBHOOKS}/berth")
    held = await hold(bench, matched)
    result = []
    try:
        for mode in MODES:
            await configure(bench, mode, matched=matched, unmatched=unmatched, probe=probe)
            for clients in CONCURRENCY:
                row = await measure(
                    bench, mode, clients, batches=batches, pods=pods, into=(matched, unmatched)
                )
                result.append(row)
            if mode == "default":
                for clients in CONCURRENCY:
                    row = await measure_registration(
                        bench, clients, batches=batches, pods=pods, into=unmatched, probe=matched
                    )
                    result.append(row)
    finally:
        # The cluster's own configuration again, for the rows after these.
        await bench.api.apply(WEBHOOKS, {**own, "metadata": {"name": own["metadata"]["name"]}})
        await bench.api.delete(f"{RESERVATIONS}/{held}")
    return result


async def measure(
    bench: Bench, mode: Mode, clients: int, *, batches: int, pods: int, into: tuple[str, str]
) -> Row:
    """Pods created where the webhook is called against where it is not, same configuration."""
    before = histogram(await bench.metrics("berth-webhook"), HISTOGRAM)
    runs: list[tuple[bool, float]] = []
    for index, with_berth in enumerate(order(batches)):
        tag = f"c{clients}-{mode}-{index}"
        namespace = into[0] if with_berth else into[1]
        took = await create_batch(bench, namespace, pods=pods, clients=clients, tag=tag)
        runs.append((with_berth, took))
        say(
            f"pod creation {mode}, {clients} client(s): batch {index + 1}/{batches} "
            f"{'with' if with_berth else 'without'} webhook: {number(rate(pods, took))} pods/s"
        )
    observed = difference(histogram(await bench.metrics("berth-webhook"), HISTOGRAM), before)
    p50, p99 = (bucket_bound(observed, share) for share in (0.5, 0.99))
    scope = "migrating namespace" if mode == "default" else "every namespace"
    return _row(
        f"{mode}, {scope}, {_clients(clients)}",
        runs,
        pods=pods,
        figure_note=f"; webhook p50 {_ms(p50)}, p99 {_ms(p99)}",
        reviews=observed.get(math.inf, 0),
        what="pods the API server admits and stores per second, webhook called vs not",
    )


async def measure_registration(
    bench: Bench, clients: int, *, batches: int, pods: int, into: str, probe: str
) -> Row:
    """Pods created in a namespace that is not migrating, with the default scope's
    configuration registered against not registered at all. `probe`, a migrating
    namespace, shows when a change is in effect."""
    config = webhook_configuration(bench.cluster, "default", skip=())
    runs: list[tuple[bool, float]] = []
    reviews = 0.0
    for index, registered in enumerate(order(batches)):
        if registered:
            await bench.api.apply(WEBHOOKS, config)
        else:
            await bench.api.delete(f"{WEBHOOKS}/{config['metadata']['name']}")

        async def in_effect(registered: bool = registered) -> bool:
            return await is_called(bench, probe) == registered

        state = "registered" if registered else "deleted"
        await wait_for(in_effect, what=f"the API server to see the webhook configuration {state}")
        before = await calls(bench)
        took = await create_batch(
            bench, into, pods=pods, clients=clients, tag=f"r{clients}-{index}"
        )
        reviews += await calls(bench) - before
        runs.append((registered, took))
        say(
            f"pod creation, namespace not migrating, {clients} client(s): batch "
            f"{index + 1}/{batches} webhook {state}: {number(rate(pods, took))} pods/s"
        )
    return _row(
        f"default, namespace not migrating, {_clients(clients)}",
        runs,
        pods=pods,
        figure_note="",
        reviews=reviews,
        what="pods the API server admits and stores per second, webhook registered vs not",
    )


def _row(
    measure: str,
    runs: list[tuple[bool, float]],
    *,
    pods: int,
    figure_note: str,
    reviews: float,
    what: str,
) -> Row:
    """A row from the batches' seconds, `(with_berth, seconds)` in the order run."""
    seconds = {
        side: sum(took for with_berth, took in runs if with_berth == side) for side in (True, False)
    }
    per_side = pods * (len(runs) // 2)
    ratios = paired_ratios([(with_berth, rate(pods, took)) for with_berth, took in runs])
    return Row(
        measure=measure,
        figure=f"{number(rate(per_side, seconds[True]), 'pods/s')}{figure_note}",
        baseline=number(rate(per_side, seconds[False]), "pods/s"),
        ratio=statistics.median(ratios) if ratios else None,
        n=f"{spread(ratios)}, {pods:,} pods a batch; {reviews:,.0f} reviews",
        what=what,
    )


def _clients(clients: int) -> str:
    return f"{clients} client{'s' if clients > 1 else ''}"


def _ms(seconds: float | None) -> str:
    """A bucket's bound: the quantile is at most this."""
    if seconds is None:
        return "—"
    return "> 10 s" if math.isinf(seconds) else f"≤ {seconds * 1000:g} ms"


def table(rows_: list[Row]) -> Table:
    return Table(title="Pod creation and the webhook", method=METHOD, rows=rows_)
