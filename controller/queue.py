"""The work queue: the keys of the objects the controller must look at again.

A key names an object, never an event (`job/<name>` or `rsv/<name>`): the reconcile reads
the latest state of the object whatever made the key come in, so adding a key that
already waits changes nothing.
"""

from __future__ import annotations

import asyncio

JOB = "job"
RESERVATION = "rsv"


def job_key(name: str) -> str:
    return f"{JOB}/{name}"


def reservation_key(name: str) -> str:
    return f"{RESERVATION}/{name}"


def split(key: str) -> tuple[str, str]:
    """`(kind, name)` of a key: kind is JOB or RESERVATION."""
    kind, name = key.split("/", 1)
    return kind, name


class WorkQueue:
    """Keys to reconcile; re-adding a key that waits changes nothing."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._waiting: set[str] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def add(self, key: str) -> None:
        if key not in self._waiting:
            self._waiting.add(key)
            self._queue.put_nowait(key)

    def add_after(self, key: str, seconds: float) -> None:
        timer = self._timers.get(key)
        due = asyncio.get_running_loop().time() + seconds
        if timer is not None and timer.when() <= due:
            return
        if timer is not None:
            timer.cancel()
        self._timers[key] = asyncio.get_running_loop().call_at(due, self._fire, key)

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> str:
        key = await self._queue.get()
        self._waiting.discard(key)
        return key

    def __len__(self) -> int:
        return self._queue.qsize()
