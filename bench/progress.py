"""Progress lines on the terminal while the bench runs, each with the time since start."""

from __future__ import annotations

import sys
import time

_START = time.monotonic()


def elapsed() -> float:
    return time.monotonic() - _START


def say(text: str) -> None:
    minutes, seconds = divmod(int(elapsed()), 60)
    print(f"[{minutes:02d}:{seconds:02d}] {text}", file=sys.stderr, flush=True)
