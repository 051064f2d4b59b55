"""The work queue and its workers: one pass per key at a time, back-off per key."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from controller.queue import WorkQueue
from controller.reconcile import ApiFailure, work

Reconcile = Callable[[str], Awaitable[float | None]]


@contextlib.asynccontextmanager
async def workers(queue: WorkQueue, reconcile: Reconcile, count: int) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(work(queue, reconcile)) for _ in range(count)]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_key_being_processed_is_not_handed_out_again_until_done() -> None:
    queue = WorkQueue()
    queue.add("job/a")
    key = await queue.get()
    queue.add("job/a")  # an event about the job while a worker reconciles it
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(queue.get(), 0.05)
    queue.done(key)  # the pass is over: the change it may have missed is looked at now
    assert await asyncio.wait_for(queue.get(), 1) == "job/a"


async def test_a_key_added_twice_while_it_waits_is_handed_out_once() -> None:
    queue = WorkQueue()
    queue.add("job/a")
    queue.add("job/a")
    assert await queue.get() == "job/a"
    queue.done("job/a")
    assert len(queue) == 0


async def test_two_workers_never_reconcile_one_key_at_once() -> None:
    queue = WorkQueue()
    active: set[str] = set()
    overlaps: list[str] = []
    passes: list[str] = []

    async def reconcile(key: str) -> None:
        if key in active:
            overlaps.append(key)
        active.add(key)
        passes.append(key)
        if len(passes) == 1:
            queue.add(key)  # the job changed while this pass reads it
        await asyncio.sleep(0.02)
        active.discard(key)

    async with workers(queue, reconcile, 2):
        queue.add("job/a")
        await asyncio.sleep(0.1)
    assert passes == ["job/a", "job/a"]  # the change is seen, by a pass after the first
    assert overlaps == []


class Instant(WorkQueue):
    """Records each delay asked for, and adds the key back at once for any idle worker;
    `enough` is set once `until` delays were asked for."""

    def __init__(self, until: int = 0) -> None:
        super().__init__()
        self.delays: list[float] = []
        self.until = until
        self.enough = asyncio.Event()

    def add_after(self, key: str, seconds: float) -> None:
        self.delays.append(seconds)
        if len(self.delays) >= self.until:
            self.enough.set()
        asyncio.get_running_loop().call_later(0.001, self.add, key)


async def delays_of_failing(failure: type[Exception], *, passes: int, count: int) -> list[float]:
    """The delays before each next pass of one key whose every pass raises `failure`,
    with `count` workers."""
    queue = Instant(until=passes)

    async def fail(key: str) -> None:
        await asyncio.sleep(0)
        raise failure(key)

    async with workers(queue, fail, count):
        queue.add("job/a")
        await asyncio.wait_for(queue.enough.wait(), 2)
    return queue.delays[:passes]


async def test_back_off_grows_per_key_whichever_worker_fails() -> None:
    delays = await delays_of_failing(RuntimeError, passes=4, count=2)
    assert delays == [4.0, 8.0, 16.0, 32.0]


async def test_a_pass_that_succeeds_resets_the_back_off() -> None:
    queue = Instant(until=3)
    outcomes = iter([RuntimeError(), RuntimeError(), None, RuntimeError()])

    async def reconcile(key: str) -> None:
        outcome = next(outcomes, None)
        if outcome is not None:
            raise outcome
        if len(queue.delays) == 2:
            queue.add(key)  # after the success, one more pass that fails

    async with workers(queue, reconcile, 1):
        queue.add("job/a")
        await asyncio.wait_for(queue.enough.wait(), 2)
    assert queue.delays == [4.0, 8.0, 4.0]


async def test_back_off_has_a_ceiling() -> None:
    queue = Instant()
    assert [queue.retry("job/a") for _ in range(12)][-3:] == [300.0, 300.0, 300.0]
    queue.forget("job/a")
    assert queue.retry("job/a") == 4.0


async def test_a_pass_that_fails_on_the_api_backs_off_from_two_seconds_to_thirty() -> None:
    """An API server that throttles (429) or fails (5xx, 403) is asked ever later, not
    every 2 s for ever."""
    delays = await delays_of_failing(ApiFailure, passes=7, count=1)
    assert delays == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


@pytest.mark.parametrize("error", [aiohttp.ServerDisconnectedError, TimeoutError])
async def test_an_api_server_out_of_reach_backs_off_as_an_api_failure(
    error: type[Exception],
) -> None:
    """A connection refused or reset, or no answer in time, while the API server
    restarts: retried like any API failure, not after the minutes-long back-off of a bug,
    which would let jobs run into their TTLs."""
    delays = await delays_of_failing(error, passes=6, count=1)
    assert delays == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
