"""Pod creation throughput with and without the webhook, and the webhook's own latency.

Two namespaces, one the webhook configuration matches and one it does not, receive pods
in turn. The configuration is Berth's as shipped for the scope
(`bench.modes.webhook_configuration`); the "without" namespace is one it does not see:
unlabelled in default scope, added to the namespaces it skips (as kube-system is) in
strict scope. So the two sides differ only in whether the API server calls the webhook.
The matched namespace is one where a migration waits for its replacement (a Reservation
of that namespace is Available), which is when the controller labels a namespace
`berth.sh/migrating` in the default scope.

Who creates the pods matters: the API server sends the webhook only pods a workload
controller creates (the configuration's matchCondition on the creator), the only pods
it can bind. So most rows create pods as kube-controller-manager's ReplicaSet controller
does: as its ServiceAccount (impersonated), each pod controlled by a ReplicaSet of its
namespace. That ReplicaSet is held in deletion by a finalizer of the bench's, so that its
controller neither adopts, releases nor deletes the pods and the garbage collector
leaves them alone. Rows of pods "a user creates" create them as the bench's admin,
without an owner: the webhook is not called (n counts its reviews).

- **One client**: one stream of creations alternating namespace at every pod, so that
  both sides meet the same moments of the machine. With one client, pods/s is the
  inverse of a creation's mean latency; the ratio is that of the two sides' mean
  latencies. The stream is cut in consecutive trials (a ratio each); the row gives the
  median trial, n the lowest and highest.
- **Eight clients**: the API server and the webhook share the two cores, so alternating
  pods would let the webhook's CPU slow both sides alike. Instead, batches alternate
  (ABBA), each pair of batches a trial. Before each batch the bench waits until the
  cluster's processes are back near their idle CPU (`Bench.settle`), so that no batch
  pays for the previous one's aftermath.
- **Registration**: in the default scope, pods created in a namespace that is not
  migrating, with the configuration registered against not registered at all (batches
  of one client and of eight, since the configuration is the whole cluster's; dry-run
  creations confirm each change is in effect before a batch). The API server never
  calls the webhook there.
- **Floor**: the strict rows again against `bench.nullhook`, a webhook that answers
  every review at once without any work: what being called costs on this machine.

The pods name a scheduler that does not exist, so they stay Pending: what is timed is
admission and storage, not scheduling. The webhook's p50/p99 come from its own histogram
(`berth_webhook_request_duration_seconds`), read before and after a row.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bench import nullhook
from bench.api import Object, create_all, pods_path
from bench.cluster import Bench, pod, wait_for
from bench.modes import MIGRATING_LABEL, MODES, webhook_configuration
from bench.progress import say
from bench.scheduler import order
from bench.stats import (
    added_per_event,
    bucket_bound,
    difference,
    histogram,
    paired_ratios,
    rate,
    spread,
)
from bench.table import Row, Table, added, number
from berth.protocol import CONTROLLER_IDENTITIES

HISTOGRAM = "berth_webhook_request_duration_seconds"
REQUESTS = "berth_webhook_requests_total"
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
RESERVATIONS = "/apis/scheduling.koordinator.sh/v1alpha1/reservations"
REPLICASETS = "/apis/apps/v1/namespaces/{namespace}/replicasets"
CLIENTS = 8
"""The clients of the concurrent rows (the other rows have one)."""
UNSCHEDULED = "bench-nobody"
"""The scheduler name of the created pods: no scheduler serves it."""
REPLICASET_CONTROLLER = CONTROLLER_IDENTITIES[("apps/v1", "ReplicaSet")]
HELD = "bench.berth.sh/held"
"""The finalizer that keeps the owning ReplicaSet in deletion, and so out of its
controller's way, for as long as the rows run."""
OWNER_LABEL = {"bench-owner": "held"}

METHOD = (
    "Pods of one pause container go to a namespace Berth's MutatingWebhookConfiguration "
    "matches (as shipped for the scope) or to one it does not, created as "
    "kube-controller-manager's ReplicaSet controller creates them (its ServiceAccount, "
    "impersonated; each pod controlled by a ReplicaSet of its namespace, held in deletion "
    "so that no controller touches the pods): the webhook's matchCondition sends it only "
    "pods a workload controller creates. Rows of pods 'a user creates' (the bench's admin, "
    f"no owner) show that the webhook is then not called. The matched namespace holds a "
    f"migration waiting for its replacement (an Available Reservation), so in the default "
    f"scope it carries `{MIGRATING_LABEL}=true`; the other is unlabelled (default) or added "
    "to the namespaces the configuration skips, as kube-system is (strict); dry-run "
    "creations confirm that the API server calls the webhook exactly where the "
    "configuration says. **1 client**: one stream of creations alternating namespace at "
    "every pod, so both sides meet the same moments of the machine; pods/s is the inverse "
    "of the mean latency, the stream is cut in trials (a ratio each), and '+x ms a pod' is "
    "the mean latency with the webhook called less without (the same added time reads as "
    "a lower ratio against a faster baseline). **8 clients**: "
    "batches alternating (ABBA) between the sides, each pair a trial, each batch started "
    "once the cluster's CPU is back near idle. Ratio: the median trial; n: the lowest and "
    "highest. 'Namespace not migrating': the default scope's configuration registered "
    "against deleted, in batches of 1 and of 8 clients (the configuration is "
    "cluster-wide). 'A webhook that "
    "answers at once': the strict rows against `bench/nullhook.py`, which answers every "
    "review from bare asyncio with no work: what being called costs on this machine, "
    "whatever answers. The pods stay Pending (their scheduler does not exist): this times "
    "admission and storage only. The webhook's p50/p99 come from its own histogram "
    "`berth_webhook_request_duration_seconds`: the upper bound of the bucket holding each "
    "(buckets 0.1, 0.25, 0.5, 1, 2.5, 5, 10 ms, ...)."
)


@dataclass(frozen=True)
class Source:
    """Who creates the pods of a row."""

    name: str
    as_user: str | None
    owners: dict[str, Object]
    """A namespace's controlling ownerReference (none: pods without an owner)."""

    def pods(self, namespace: str, tag: str, count: int, *, start: int = 0) -> list[Object]:
        owner = self.owners.get(namespace)
        made = []
        for index in range(start, start + count):
            body = pod(
                f"{tag}-{index}",
                scheduler=UNSCHEDULED,
                labels={"bench-batch": tag, **(OWNER_LABEL if owner else {})},
            )
            if owner is not None:
                body["metadata"]["ownerReferences"] = [owner]
            made.append(body)
        return made


Counter = Callable[[], Awaitable[float]]
"""How many reviews the webhook under test has answered so far."""


def berth_reviews(bench: Bench) -> Counter:
    async def count() -> float:
        return await bench.counter("berth-webhook", REQUESTS)

    return count


async def is_called(bench: Bench, reviews: Counter, namespace: str, source: Source) -> bool:
    """Whether the API server calls the webhook for a pod `source` creates in `namespace`."""
    before = await reviews()
    [probe] = source.pods(namespace, "probe", 1)
    await bench.api.create(pods_path(namespace), probe, dry_run=True, as_user=source.as_user)
    return await reviews() > before


async def configure(
    bench: Bench,
    config: Object,
    reviews: Counter,
    *,
    expected: dict[str, bool],
    source: Source,
    what: str,
) -> None:
    """Install `config` and wait until the API server acts on it: calls the webhook for
    the namespaces `expected` says and for no other."""
    await bench.api.apply(WEBHOOKS, config)

    async def in_effect() -> bool:
        return all(
            [await is_called(bench, reviews, ns, source) == on for ns, on in expected.items()]
        )

    await wait_for(in_effect, what=f"the API server to use {what}")


async def hold_owner(bench: Bench, namespace: str) -> Object:
    """A ReplicaSet of `namespace`, held in deletion (its controller then leaves pods it
    controls alone: no adoption, release or scaling), as the pods' controlling owner."""
    path = REPLICASETS.format(namespace=namespace)
    template: dict[str, Any] = pod("owned", scheduler=UNSCHEDULED, labels=OWNER_LABEL)
    body = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "bench-owner", "finalizers": [HELD]},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": OWNER_LABEL},
            "template": {"metadata": template["metadata"], "spec": template["spec"]},
        },
    }
    created = await bench.api.create(path, body)
    await bench.api.delete(f"{path}/bench-owner")
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": "bench-owner",
        "uid": created["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": False,
    }


async def let_go(bench: Bench, namespace: str) -> None:
    path = REPLICASETS.format(namespace=namespace)
    await bench.api.merge_patch(f"{path}/bench-owner", {"metadata": {"finalizers": None}})


async def clear(bench: Bench, namespaces: tuple[str, ...], tag: str) -> None:
    for namespace in namespaces:
        await bench.clear_pods(namespace, f"bench-batch={tag}")


async def create_batch(
    bench: Bench, namespace: str, source: Source, *, pods: int, clients: int, tag: str
) -> float:
    """Create a batch once the cluster has settled; the seconds it took. The pods are
    deleted afterwards, untimed."""
    await bench.settle()
    objects = source.pods(namespace, tag, pods)
    started = time.monotonic()
    await create_all(
        bench.api, pods_path(namespace), objects, workers=clients, as_user=source.as_user
    )
    seconds = time.monotonic() - started
    await clear(bench, (namespace,), tag)
    return seconds


@dataclass(frozen=True)
class Stream:
    """What one client's alternating stream measured."""

    ratios: list[float]
    """Mean latency without over mean latency with, in each consecutive trial."""
    with_rate: float
    without_rate: float
    """Pods/s of one client: 1 / the side's mean latency."""


async def alternating(
    bench: Bench, called: str, quiet: str, source: Source, *, pods: int, trials: int, tag: str
) -> Stream:
    """One client, one stream of `pods` creations alternating between the namespaces."""
    await bench.settle()
    made = {ns: source.pods(ns, tag, pods // 2) for ns in (called, quiet)}
    latencies: dict[str, list[float]] = {called: [], quiet: []}
    for index in range(pods // 2):
        for namespace in (called, quiet) if index % 2 else (quiet, called):
            started = time.perf_counter()
            await bench.api.create(
                pods_path(namespace), made[namespace][index], as_user=source.as_user
            )
            latencies[namespace].append(time.perf_counter() - started)
    await clear(bench, (called, quiet), tag)
    size = len(latencies[called]) // trials
    return Stream(
        ratios=[
            statistics.fmean(latencies[quiet][i : i + size])
            / statistics.fmean(latencies[called][i : i + size])
            for i in range(0, size * trials, size)
        ],
        with_rate=1 / statistics.fmean(latencies[called]),
        without_rate=1 / statistics.fmean(latencies[quiet]),
    )


@dataclass
class Case:
    """One row's setting: the webhook called (in `called`) or not (in `quiet`)."""

    label: str
    called: str
    quiet: str
    source: Source
    reviews: Counter
    histogram_of: str | None
    """The component whose histogram gives the webhook's p50/p99 (None: not Berth's)."""


async def one_client(bench: Bench, case: Case, *, pods: int, trials: int) -> Row:
    before_reviews, before = await case.reviews(), await _histogram(bench, case)
    stream = await alternating(
        bench,
        case.called,
        case.quiet,
        case.source,
        pods=pods,
        trials=trials,
        tag=f"a-{int(time.monotonic() * 1000)}",
    )
    reviews = await case.reviews() - before_reviews
    latency = _ms_figure(await _histogram(bench, case), before)
    ratio = statistics.median(stream.ratios)
    say(f"pod creation, {case.label}, 1 client: ratio {ratio:.2f}")
    return Row(
        measure=f"{case.label}, 1 client",
        figure=number(stream.with_rate, "pods/s")
        + added(added_per_event(stream.with_rate, stream.without_rate), "pod")
        + (f"; {latency}" if latency != "—" else ""),
        baseline=number(stream.without_rate, "pods/s"),
        ratio=ratio,
        n=f"{_trials(stream.ratios)}, {pods:,} pods in one stream; {reviews:,.0f} reviews",
        what="pods/s of one client (1 / mean latency), webhook called vs not",
    )


async def batches(bench: Bench, case: Case, *, batches: int, pods: int) -> Row:
    before_reviews, before = await case.reviews(), await _histogram(bench, case)
    runs: list[tuple[bool, float]] = []
    for index, with_berth in enumerate(order(batches)):
        namespace = case.called if with_berth else case.quiet
        tag = f"b-{index}-{int(time.monotonic() * 1000)}"
        took = await create_batch(
            bench, namespace, case.source, pods=pods, clients=CLIENTS, tag=tag
        )
        runs.append((with_berth, took))
        say(
            f"pod creation, {case.label}, {CLIENTS} clients: batch {index + 1}/{batches} "
            f"{'with' if with_berth else 'without'} webhook: {number(rate(pods, took))} pods/s"
        )
    reviews = await case.reviews() - before_reviews
    latency = _ms_figure(await _histogram(bench, case), before)
    return _row(
        f"{case.label}, {CLIENTS} clients",
        runs,
        pods=pods,
        figure_note=f"; {latency}" if latency != "—" else "",
        reviews=reviews,
        what="pods the API server admits and stores per second, webhook called vs not",
    )


async def registration(
    bench: Bench,
    source: Source,
    *,
    batches: int,
    pods: int,
    clients: int,
    into: str,
    probe: str,
) -> Row:
    """Pods created by `clients` clients in a namespace that is not migrating, with the
    default scope's configuration registered against not registered at all. `probe`, a
    migrating namespace, shows when a change is in effect."""
    config = webhook_configuration(bench.cluster, "default", skip=())
    reviews = berth_reviews(bench)
    runs: list[tuple[bool, float]] = []
    counted = 0.0
    for index, registered in enumerate(order(batches)):
        if registered:
            await bench.api.apply(WEBHOOKS, config)
        else:
            await bench.api.delete(f"{WEBHOOKS}/{config['metadata']['name']}")

        async def in_effect(registered: bool = registered) -> bool:
            return await is_called(bench, reviews, probe, source) == registered

        state = "registered" if registered else "deleted"
        await wait_for(in_effect, what=f"the API server to see the webhook configuration {state}")
        before = await reviews()
        tag = f"r-{clients}-{index}"
        took = await create_batch(bench, into, source, pods=pods, clients=clients, tag=tag)
        counted += await reviews() - before
        runs.append((registered, took))
        say(
            f"pod creation, namespace not migrating, {_clients(clients)}: batch "
            f"{index + 1}/{batches} webhook {state}: {number(rate(pods, took))} pods/s"
        )
    return _row(
        f"default, namespace not migrating, pods a ReplicaSet creates, {_clients(clients)}",
        runs,
        pods=pods,
        figure_note="",
        reviews=counted,
        what="pods the API server admits and stores per second, webhook registered vs not",
    )


async def rows(bench: Bench, *, batches_: int, pods: int) -> list[Row]:
    # Labelled here too, for a controller that does not label namespaces itself.
    called = await bench.namespace("bench-webhook-on", {MIGRATING_LABEL: "true"})
    quiet = await bench.namespace("bench-webhook-off")
    plain = await bench.namespace("bench-webhook-probe")
    namespaces = (called, quiet, plain)
    own = await bench.api.request("GET", f"{WEBHOOKS}/berth")
    held = await hold(bench, called)
    owners = {ns: await hold_owner(bench, ns) for ns in namespaces}
    controller = Source("ReplicaSet", REPLICASET_CONTROLLER, owners)
    user = Source("user", None, {})
    stream = pods * 4
    trials = max(batches_ // 2, 1)
    result: list[Row] = []
    try:
        for mode in MODES:
            scope = "migrating namespace" if mode == "default" else "every namespace"
            config = webhook_configuration(bench.cluster, mode, skip=(quiet,))
            reviews = berth_reviews(bench)
            await configure(
                bench,
                config,
                reviews,
                expected={called: True, quiet: False, plain: mode == "strict"},
                source=controller,
                what=f"the {mode} webhook configuration",
            )
            for source in (controller, user):
                case = Case(
                    f"{mode}, {scope}, pods a {source.name} creates",
                    called,
                    quiet,
                    source,
                    reviews,
                    "berth-webhook",
                )
                result.append(await one_client(bench, case, pods=stream, trials=trials))
                if source is controller:
                    result.append(await batches(bench, case, batches=batches_, pods=pods))
            if mode == "default":
                for clients in (1, CLIENTS):
                    result.append(
                        await registration(
                            bench,
                            controller,
                            batches=batches_,
                            pods=pods,
                            clients=clients,
                            into=quiet,
                            probe=called,
                        )
                    )
        async with nullhook.running(bench) as null:
            reviews = null.count
            await configure(
                bench,
                webhook_configuration(
                    bench.cluster, "strict", skip=(quiet,), urls=[f"{null.url}/mutate-pod"]
                ),
                reviews,
                expected={called: True, quiet: False},
                source=controller,
                what="the webhook that answers at once",
            )
            case = Case(
                "a webhook that answers at once, every namespace, pods a ReplicaSet creates",
                called,
                quiet,
                controller,
                reviews,
                None,
            )
            result.append(await one_client(bench, case, pods=stream, trials=trials))
            result.append(await batches(bench, case, batches=batches_, pods=pods))
    finally:
        # The cluster's own configuration again, for the rows after these.
        await bench.api.apply(WEBHOOKS, {**own, "metadata": {"name": own["metadata"]["name"]}})
        await bench.api.delete(f"{RESERVATIONS}/{held}")
        for namespace in namespaces:
            await let_go(bench, namespace)
    return result


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


async def _histogram(bench: Bench, case: Case) -> dict[float, float]:
    if case.histogram_of is None:
        return {}
    return histogram(await bench.metrics(case.histogram_of), HISTOGRAM)


def _ms_figure(after: dict[float, float], before: dict[float, float]) -> str:
    """The webhook's p50 and p99 between two reads of its histogram."""
    if not after:
        return "—"
    observed = difference(after, before)
    p50, p99 = (bucket_bound(observed, share) for share in (0.5, 0.99))
    return f"webhook p50 {_ms(p50)}, p99 {_ms(p99)}"


def _clients(count: int) -> str:
    return "1 client" if count == 1 else f"{count} clients"


def _trials(ratios: list[float]) -> str:
    return spread(ratios).replace("pairs", "trials").replace("pair", "trial")


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


def _ms(seconds: float | None) -> str:
    """A bucket's bound: the quantile is at most this."""
    if seconds is None:
        return "—"
    return "> 10 s" if math.isinf(seconds) else f"≤ {seconds * 1000:g} ms"


def table(rows_: list[Row]) -> Table:
    return Table(title="Pod creation and the webhook", method=METHOD, rows=rows_)
