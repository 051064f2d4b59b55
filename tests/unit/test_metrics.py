"""Berth's metrics: the controller's helpers, and what the webhook and extender count.

The registry is the process's default one, shared by every test: each test reads a
sample before and after, and checks the difference.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client import REGISTRY

from berth import metrics
from berth.ledger import Ledger
from extender.app import make_app as extender_app
from extender.decide import Placement
from tests.served import served
from tests.unit.builders import job, later, reservation, ts, with_status
from tests.unit.test_extender import FILTER_ARGS, PRIORITIZE_ARGS
from tests.unit.webhook_cases import claimed_by, request, review_body
from tests.unit.webhook_cases import reservation as claimable
from webhook.app import Webhook
from webhook.app import make_app as webhook_app


def sample(name: str, **labels: str) -> float:
    """The sample's value now; 0 for a series not yet created."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


def series(name: str, **labels: str) -> str:
    """A sample as the text format names it: `name{label="value",...}`."""
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def changes(action: Callable[[], None], *names: str) -> dict[str, float]:
    """How `action` changed the counts and sums of the metrics `names`, by series."""

    def samples() -> dict[str, float]:
        return {
            series(s.name, **s.labels): s.value
            for family in REGISTRY.collect()
            if family.name in names
            for s in family.samples
            if s.name.endswith(("_total", "_count", "_sum"))
        }

    before = samples()
    action()
    return {
        key: value - before.get(key, 0)
        for key, value in samples().items()
        if value != before.get(key, 0)
    }


# ----- gauges recomputed from the caches --------------------------------------------------


def test_jobs_by_phase_counts_every_phase_and_a_job_without_status_as_pending() -> None:
    jobs = [
        job("a", phase=None),
        job("b", phase="Pending"),
        job("c", phase="Running"),
        job("d", phase="Failed"),
    ]
    metrics.observe_jobs(jobs)
    assert {
        phase: sample("berth_jobs", phase=phase)
        for phase in ("Pending", "Running", "Succeed", "Failed", "Aborted")
    } == {"Pending": 2, "Running": 1, "Succeed": 0, "Failed": 1, "Aborted": 0}
    metrics.observe_jobs([job("e", phase="Succeed"), job("f", phase="Succeeded")])
    assert sample("berth_jobs", phase="Succeed") == 2  # Succeeded: earlier releases' spelling
    metrics.observe_jobs(jobs[2:3])
    assert sample("berth_jobs", phase="Pending") == 0
    assert sample("berth_jobs", phase="Running") == 1


def test_reservations_by_phase() -> None:
    metrics.observe_reservations(
        [reservation("a"), reservation("b", phase="Available"), reservation("c", phase="Available")]
    )
    assert {
        phase: sample("berth_reservations", phase=phase)
        for phase in ("Pending", "Available", "Succeeded", "Failed")
    } == {"Pending": 1, "Available": 2, "Succeeded": 0, "Failed": 0}


# ----- job transitions --------------------------------------------------------------------


def condition(kind: str, seconds: float) -> dict[str, Any]:
    return {"type": kind, "status": "True", "lastTransitionTime": ts(later(seconds))}


STARTED = [condition("Eviction", 30), condition("ReservationCreated", 10)]


def timed(phase: str, seconds: float) -> dict[str, float]:
    return {
        series("berth_job_phase_duration_seconds_count", phase=phase): 1,
        series("berth_job_phase_duration_seconds_sum", phase=phase): seconds,
    }


def finished(phase: str, reason: str) -> dict[str, float]:
    return {series("berth_jobs_finished_total", phase=phase, reason=reason): 1}


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        pytest.param(
            job(phase="Pending"),
            job(phase="Running"),
            timed("Pending", 40),
            id="admitted: time pending",
        ),
        pytest.param(
            job(phase=None),
            job(phase="Running"),
            timed("Pending", 40),
            id="admitted before any status",
        ),
        pytest.param(
            job(phase="Pending"),
            with_status(job(phase="Failed"), reason="ForbiddenMigratePod"),
            timed("Pending", 40) | finished("Failed", "ForbiddenMigratePod"),
            id="failed by arbitration",
        ),
        pytest.param(
            job(conditions=STARTED),
            job(phase="Succeed", conditions=STARTED),
            timed("Running", 30) | finished("Succeed", ""),
            id="succeeded: time since the first step",
        ),
        pytest.param(
            job(),
            with_status(job(phase="Failed"), reason="MissingPod"),
            finished("Failed", "MissingPod"),
            id="ended before any step: not timed",
        ),
        pytest.param(
            job(conditions=STARTED[1:]), job(conditions=STARTED), {}, id="same phase: nothing"
        ),
        pytest.param(
            job(conditions=[*STARTED, {"type": "Eviction", "lastTransitionTime": "soon"}]),
            job(phase="Succeed", conditions=STARTED),
            timed("Running", 30) | finished("Succeed", ""),
            id="a time no one can read is passed over",
        ),
        pytest.param(
            job(conditions=[{**STARTED[1], "lastTransitionTime": ts(later(10)).lower()}]),
            job(phase="Succeed", conditions=STARTED),
            timed("Running", 30) | finished("Succeed", ""),
            id="lower-case t and z",
        ),
    ],
)
def test_record_job_status(
    before: dict[str, Any], after: dict[str, Any], expected: dict[str, float]
) -> None:
    def record() -> None:
        metrics.record_job_status(before, after, now=later(40))

    assert changes(record, "berth_job_phase_duration_seconds", "berth_jobs_finished") == expected


# ----- the webhook ------------------------------------------------------------------------


@pytest.fixture
async def webhook_http(webhook: Webhook) -> AsyncIterator[aiohttp.ClientSession]:
    async with served(webhook_app(webhook)) as test_client:
        yield test_client


@pytest.mark.parametrize(
    ("store", "body", "result"),
    [
        pytest.param({}, b"{not json", "malformed", id="malformed"),
        pytest.param({}, review_body(), "skipped", id="no reservation"),
        pytest.param({"r1": claimable("r1")}, review_body(), "error", id="API server down"),
        pytest.param(
            {"r1": claimable("r1", claim="5f1c0ffee")},
            review_body(request=request(claimed_by("r1"))),
            "reasserted",
            id="called again",
        ),
    ],
)
async def test_webhook_counts_and_times_every_review(
    webhook: Webhook,
    webhook_http: aiohttp.ClientSession,
    store: dict[str, Any],
    body: bytes,
    result: str,
) -> None:
    for cached in store.values():
        webhook.reservations.put(cached)
    requests = sample("berth_webhook_requests_total", result=result)
    timed = sample("berth_webhook_request_duration_seconds_count")
    await webhook_http.post("/mutate-pod", data=body)
    assert sample("berth_webhook_requests_total", result=result) == requests + 1
    assert sample("berth_webhook_request_duration_seconds_count") == timed + 1


async def test_webhook_serves_metrics(webhook_http: aiohttp.ClientSession) -> None:
    await webhook_http.post("/mutate-pod", data=review_body())
    response = await webhook_http.get("/metrics")
    assert response.status == 200
    assert response.content_type == "text/plain"
    assert 'berth_webhook_requests_total{result="skipped"}' in await response.text()
    # An Accept that prometheus_client cannot read gets the text format, not a 500.
    odd = await webhook_http.get(
        "/metrics", headers={"Accept": "application/openmetrics-text; version=abc"}
    )
    assert odd.status == 200
    assert odd.content_type == "text/plain"


# ----- the extender -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("verb", "body", "ready", "result"),
    [
        pytest.param("filter", FILTER_ARGS, True, "ok", id="filter"),
        pytest.param("prioritize", PRIORITIZE_ARGS, True, "ok", id="prioritize"),
        pytest.param("filter", {"Pod": None}, True, "bad_request", id="bad filter (HTTP 200)"),
        pytest.param("prioritize", [], True, "bad_request", id="bad prioritize (HTTP 400)"),
        pytest.param("filter", FILTER_ARGS, False, "not_ready", id="not synced"),
    ],
)
async def test_extender_counts_and_times_every_request_by_verb(
    verb: str, body: Any, ready: bool, result: str
) -> None:
    app = extender_app(Ledger(), placement=Placement.SPREAD, ready=lambda: ready)
    requests = sample("berth_extender_requests_total", verb=verb, result=result)
    timed = sample("berth_extender_request_duration_seconds_count", verb=verb)
    async with served(app) as http:
        await http.post(f"/{verb}", data=orjson.dumps(body))
        scraped = await (await http.get("/metrics")).text()
    assert sample("berth_extender_requests_total", verb=verb, result=result) == requests + 1
    assert sample("berth_extender_request_duration_seconds_count", verb=verb) == timed + 1
    assert f'berth_extender_requests_total{{result="{result}",verb="{verb}"}}' in scraped
