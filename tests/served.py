"""An app served by `berth.server` on a free local port, for tests that talk HTTP to it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp

from berth import web
from berth.server import Limits, listening


@asynccontextmanager
async def served(
    app: web.App, *, limits: Limits | None = None
) -> AsyncIterator[aiohttp.ClientSession]:
    """A client of `app` served over plain HTTP: paths are relative, and a body is sent
    as JSON (the servers refuse any other type on POST)."""
    async with (
        listening(app, host="127.0.0.1", port=0, limits=limits) as site,
        aiohttp.ClientSession(
            base_url=f"http://127.0.0.1:{site.port}",
            headers={"Content-Type": "application/json"},
        ) as session,
    ):
        yield session
