"""The work queue: the keys of the objects the controller must look at again.

A key names an object, never an event (`job/<name>`, `rsv/<name>` or `ns/<name>`): the
reconcile reads the latest state of the object whatever made the key come in, so adding a
key that already waits changes nothing.
"""

from __future__ import annotations

import asyncio

JOB = "job"
RESERVATION = "rsv"
NAMESPACE = "ns"

BACKOFF_BASE = 2.0
"""A key whose pass raised waits this, doubled with each failure in a row..."""
BACKOFF_MAX = 300.0
"""...up to this."""


def job_key(name: str) -> str:
    return f"{JOB}/{name}"


def reservation_key(name: str) -> str:
    return f"{RESERVATION}/{name}"


def namespace_key(name: str) -> str:
    return f"{NAMESPACE}/{name}"


def split(key: str) -> tuple[str, str]:
    """`(kind, name)` of a key: kind is JOB, RESERVATION or NAMESPACE."""
    kind, name = key.split("/", 1)
    return kind, name


class WorkQueue:
    """Keys to reconcile, with the guarantees of client-go's work queue.

    - A key is handed to one worker at a time: from `get` until `done` it is not handed
      out again. Added meanwhile, it is remembered and queued again on `done`, so the
      change that brought it is seen by a pass that starts after the change.
    - Re-adding a key that waits changes nothing (the pass reads the latest state).
    - A key that keeps failing waits longer each time (`retry`), until `forget`; the count
      is per key, whichever worker ran the failing pass.
    """

    def __init__(self, *, base_delay: float = BACKOFF_BASE, max_delay: float = BACKOFF_MAX) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._dirty: set[str] = set()
        """Keys to process: queued, or added again while being processed."""
        self._processing: set[str] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._failures: dict[str, int] = {}

    def add(self, key: str) -> None:
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:  # else `done` queues it
            self._queue.put_nowait(key)

    def add_after(self, key: str, seconds: float) -> None:
        """Add the key in `seconds`; an earlier time already set for it wins."""
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
        """The next key; the caller must call `done(key)` when its pass is over."""
        key = await self._queue.get()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.put_nowait(key)

    def retry(self, key: str, *, first: float | None = None, limit: float | None = None) -> float:
        """Add the key again after a back-off that doubles with each failure in a row
        (from `first` and up to `limit`, when given); returns the delay."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        base = self.base_delay * 2.0 if first is None else first
        delay = min(base * 2.0 ** min(failures - 1, 32), limit or self.max_delay)
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        """The key's pass succeeded: its next failure starts the back-off afresh."""
        self._failures.pop(key, None)

    def __len__(self) -> int:
        return self._queue.qsize()
