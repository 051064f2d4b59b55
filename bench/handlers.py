"""The extender's and the webhook's handlers alone: requests per second and p99.

Each app runs in a process of its own (`python -m bench.handlers serve ...`), the real
app served by `berth.server.serve` over TLS, with its caches filled as the
informers would fill them at that cluster size. The bench sends it one request at a
time on one kept-alive connection, as kube-scheduler calls an extender, and times each
round trip:

- extender `filter` and `prioritize`: the ExtenderArgs kube-scheduler sent for a
  ReplicaSet's pod (tests/data), asking for 100m CPU, with N node names; the ledger
  holds N nodes, 10 pods on each, 1% of the nodes with a Reservation whose placeholder
  is bound and 1% with a Reservation in handover;
- webhook: the AdmissionReview kube-apiserver sent for a ReplicaSet's pod (tests/data)
  with a fresh uid each time; the cache holds N/10 finished Reservations and none that
  a pod could claim: the path of every pod that is not a migration's replacement.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import ssl
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from kubernetes_asyncio import client

from bench.progress import say
from bench.stats import percentile, rate
from bench.table import Row, Table, number
from berth import tls
from berth.api import API_VERSION
from berth.kube.client import Kube
from berth.ledger import Ledger
from berth.server import Limits, Tls, serve
from devtools.processes import free_port
from extender.app import make_app as extender_app
from extender.decide import Placement
from webhook.app import Webhook
from webhook.app import make_app as webhook_app

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
PODS_PER_NODE = 10
WARMUP = 20

METHOD = (
    "Each app in a process of its own (the real app and `berth.server.serve`, "
    "TLS), its caches filled as at that cluster size; one client sends one request at a "
    "time on a kept-alive connection and times each round trip. Extender: the "
    "ExtenderArgs kube-scheduler sends (a ReplicaSet's pod asking for 100m CPU) with N "
    "node names, over a ledger of N nodes, 10 pods each, Reservations bound on 1% of the "
    "nodes and in handover on 1%. Webhook: the AdmissionReview kube-apiserver sends for a "
    "ReplicaSet's pod, with N/10 finished Reservations cached and none open (every pod "
    "that is not a replacement). The ratio compares requests/s with those at the smallest N."
)


# ----- the server side ------------------------------------------------------------------


def node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"}},
    }


def bound_pod(name: str, node_name: str, *, reservation: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "team", "uid": f"uid-{name}"}
    if reservation is not None:
        metadata["labels"] = {"berth.sh/reservation": reservation}
        metadata["ownerReferences"] = [
            {
                "apiVersion": API_VERSION,
                "kind": "Reservation",
                "name": reservation,
                "uid": f"uid-{reservation}",
                "controller": True,
            }
        ]
    return {
        "metadata": metadata,
        "spec": {
            "nodeName": node_name,
            "containers": [
                {"name": "app", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}
            ],
        },
        "status": {"phase": "Running"},
    }


def reservation(
    name: str, node_name: str | None, *, phase: str, owner: str | None
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "spec": {
            "template": {
                "metadata": {"namespace": "team"},
                "spec": {
                    "containers": [
                        {"name": "app", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}
                    ]
                },
            }
        },
        "status": {
            "phase": phase,
            "nodeName": node_name,
            "allocatable": {"cpu": "500m", "memory": "1Gi"},
            "currentOwners": [{"name": owner, "namespace": "team", "uid": owner}] if owner else [],
        },
    }


def ledger_of(names: int) -> Ledger:
    """The ledger of a cluster of `names` nodes, as the extender's informers fill it."""
    ledger = Ledger()
    for index in range(names):
        name = f"node-{index}"
        ledger.on_node("ADDED", node(name))
        for slot in range(PODS_PER_NODE):
            ledger.on_pod("ADDED", bound_pod(f"{name}-pod-{slot}", name))
    for index in range(0, names, 100):
        held, handed = f"node-{index}", f"node-{index + 1}"
        ledger.on_pod("ADDED", bound_pod(f"placeholder-{index}", held, reservation=f"rsv-{index}"))
        ledger.on_reservation(
            "ADDED", reservation(f"rsv-{index}", held, phase="Available", owner=None)
        )
        ledger.on_reservation(
            "ADDED",
            reservation(f"rsv-h-{index}", handed, phase="Available", owner=f"owner-{index}"),
        )
    return ledger


async def serve_app(app_name: str, names: int, port: int, certs: Path) -> None:
    serving = Tls(certs / "tls.crt", certs / "tls.key")
    if app_name == "extender":
        ledger = ledger_of(names)
        app = extender_app(ledger, placement=Placement.SPREAD, ready=lambda: True)
        await serve(app, host="127.0.0.1", port=port, tls=serving, limits=Limits())
        return
    # The webhook's API server is a closed port: the path measured makes no API call.
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{free_port()}"
    hook = Webhook(Kube(client.ApiClient(configuration)))
    for index in range(names // 10):
        done = reservation(f"done-{index}", f"node-{index}", phase="Succeeded", owner=f"o-{index}")
        hook.reservations.put(done)
    hook.reservations.synced.set()
    await serve(webhook_app(hook), host="127.0.0.1", port=port, tls=serving, limits=Limits())


# ----- the client side ------------------------------------------------------------------


def extender_body(names: int) -> bytes:
    args = json.loads((DATA / "extender_filter_args.json").read_text())
    args["Pod"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "100m", "memory": "128Mi"}
    }
    args["NodeNames"] = [f"node-{index}" for index in range(names)]
    return orjson.dumps(args)


def review_bodies() -> Callable[[], bytes]:
    review = json.loads((DATA / "admission_review_pod_create.json").read_text())

    def fresh() -> bytes:
        body = copy.deepcopy(review)
        body["request"]["uid"] = str(uuid.uuid4())
        return orjson.dumps(body)

    return fresh


async def timings(
    session: aiohttp.ClientSession, url: str, body: Callable[[], bytes], *, requests: int
) -> tuple[list[float], float]:
    """Round trips of `requests` requests one after another (after a warm-up), and the
    seconds they took together."""
    latencies = []
    started = 0.0
    for index in range(WARMUP + requests):
        if index == WARMUP:
            started = time.perf_counter()
        data = body()
        sent = time.perf_counter()
        async with session.post(
            url, data=data, headers={"Content-Type": "application/json"}
        ) as response:
            await response.read()
            if response.status != 200:
                raise RuntimeError(f"{url}: HTTP {response.status}")
        if index >= WARMUP:
            latencies.append(time.perf_counter() - sent)
    return latencies, time.perf_counter() - started


async def measure_app(
    app_name: str, names: int, *, requests: int, certs: Path
) -> dict[str, tuple[float, float]]:
    """Start the app's process, time each of its verbs; verb → (requests/s, p99 s)."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "bench.handlers", "serve", app_name, str(names), str(port)),
        str(certs),
        cwd=REPO,
    )
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    results = {}
    try:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context, limit=1)
        ) as session:
            await _wait_ready(session, f"https://127.0.0.1:{port}/readyz", process)
            if app_name == "extender":
                fixed = extender_body(names)
                verbs: dict[str, Callable[[], bytes]] = {
                    "filter": lambda: fixed,
                    "prioritize": lambda: fixed,
                }
            else:
                verbs = {"mutate-pod": review_bodies()}
            for verb, body in verbs.items():
                latencies, seconds = await timings(
                    session, f"https://127.0.0.1:{port}/{verb}", body, requests=requests
                )
                results[verb] = (rate(len(latencies), seconds), percentile(latencies, 0.99))
                say(
                    f"handlers: {app_name} {verb}, N={names:,}: "
                    f"{number(results[verb][0])} req/s, p99 {results[verb][1] * 1000:.1f} ms"
                )
    finally:
        process.terminate()
        await process.wait()
    return results


async def _wait_ready(
    session: aiohttp.ClientSession, url: str, process: asyncio.subprocess.Process
) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.returncode is not None:
            raise RuntimeError(f"the bench server exited with {process.returncode}")
        try:
            async with session.get(url) as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise TimeoutError(f"{url} not ready after 120s")


async def rows(*, names: tuple[int, ...], requests: int) -> list[Row]:
    result = []
    with tempfile.TemporaryDirectory() as directory:
        certs = Path(directory)
        tls.write_serving_set(certs, dns_names=("localhost",), ip_addresses=("127.0.0.1",))
        measured = {
            (app, count): await measure_app(app, count, requests=requests, certs=certs)
            for app in ("extender", "webhook")
            for count in names
        }
    for (app, count), verbs in measured.items():
        for verb, (per_second, p99) in verbs.items():
            smallest = measured[(app, names[0])][verb][0]
            label = "webhook" if app == "webhook" else f"extender {verb}"
            size = (
                f"{count:,} nodes ({count // 10:,} finished Reservations cached)"
                if app == "webhook"
                else f"{count:,} node names"
            )
            result.append(
                Row(
                    measure=f"{label}, {size}",
                    figure=f"{number(per_second, 'req/s')}, p99 {p99 * 1000:.1f} ms",
                    ratio=per_second / smallest if smallest else None,
                    n=f"{requests:,} requests",
                    what=f"one {label} request after another, answered by the real app",
                )
            )
    return result


def table(rows_: list[Row]) -> Table:
    return Table(
        title="Extender and webhook handlers alone",
        method=METHOD,
        rows=rows_,
        figure_header="requests/s, p99",
        baseline_header=None,
        ratio_header="vs smallest N",
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="serve one of Berth's apps for the bench")
    sub = parser.add_subparsers(dest="command", required=True)
    serve_parser = sub.add_parser("serve")
    serve_parser.add_argument("app", choices=["extender", "webhook"])
    serve_parser.add_argument("names", type=int)
    serve_parser.add_argument("port", type=int)
    serve_parser.add_argument("certs", type=Path)
    args = parser.parse_args(argv)
    asyncio.run(serve_app(args.app, args.names, args.port, args.certs))


if __name__ == "__main__":
    main()
