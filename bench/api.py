"""A lean client of the bench cluster's API server, as its admin.

The bench sends tens of thousands of requests, and every CPU cycle it spends comes out of
the cores the cluster itself runs on, so this speaks JSON bytes over one aiohttp session
(orjson, no client models) rather than going through the Kubernetes client.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import aiohttp
import orjson

from bench.progress import say
from devtools.cluster import LocalCluster

Object = dict[str, Any]
REPORT_EVERY = 15.0


class ApiError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, body: bytes) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:300].decode(errors='replace')}")
        self.status = status


def pods_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


class Api:
    """Requests to one API server; `await Api.connect(cluster)`, then `await api.close()`."""

    def __init__(self, session: aiohttp.ClientSession, server: str) -> None:
        self.session = session
        self.server = server

    @classmethod
    async def connect(cls, cluster: LocalCluster, *, connections: int = 64) -> Api:
        apiserver = next(c for c in cluster.running() if c.name == "kube-apiserver")
        context = ssl.create_default_context(cafile=str(cluster.pki / "ca.crt"))
        context.load_cert_chain(cluster.pki / "admin.crt", cluster.pki / "admin.key")
        connector = aiohttp.TCPConnector(ssl=context, limit=connections)
        session = aiohttp.ClientSession(connector=connector)
        return cls(session, f"https://127.0.0.1:{apiserver.port}")

    async def close(self) -> None:
        await self.session.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        as_user: str | None = None,
    ) -> Object:
        """One request; with `as_user`, made as that user (impersonated: the admin may)."""
        data = None if body is None else body if isinstance(body, bytes) else orjson.dumps(body)
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        if as_user is not None:
            headers["Impersonate-User"] = as_user
        async with self.session.request(
            method, self.server + path, data=data, params=params, headers=headers
        ) as response:
            raw = await response.read()
            if response.status >= 400:
                raise ApiError(response.status, method, path, raw)
            result: Object = orjson.loads(raw) if raw else {}
            return result

    async def create(
        self, path: str, obj: Object | bytes, *, dry_run: bool = False, as_user: str | None = None
    ) -> Object:
        return await self.request(
            "POST", path, body=obj, params={"dryRun": "All"} if dry_run else None, as_user=as_user
        )

    async def merge_patch(self, path: str, patch: Object) -> Object:
        return await self.request(
            "PATCH", path, body=patch, content_type="application/merge-patch+json"
        )

    async def apply(self, path: str, obj: Object) -> Object:
        """Create the object, or replace it when it exists (its name is in metadata)."""
        try:
            return await self.create(path, obj)
        except ApiError as error:
            if error.status != 409:
                raise
        name = obj["metadata"]["name"]
        current = await self.request("GET", f"{path}/{name}")
        fresh = {
            **obj,
            "metadata": {
                **obj["metadata"],
                "resourceVersion": current["metadata"]["resourceVersion"],
            },
        }
        return await self.request("PUT", f"{path}/{name}", body=fresh)

    async def delete(self, path: str, *, missing_ok: bool = True) -> None:
        try:
            await self.request("DELETE", path, body={"gracePeriodSeconds": 0})
        except ApiError as error:
            if not (missing_ok and error.status == 404):
                raise

    async def delete_pods(self, namespace: str, *, selector: str | None = None) -> None:
        """Delete the namespace's pods (those matching `selector`) at once, no grace."""
        params = {"labelSelector": selector} if selector else None
        await self.request(
            "DELETE", pods_path(namespace), body={"gracePeriodSeconds": 0}, params=params
        )

    async def list_all(self, path: str, params: Mapping[str, str] | None = None) -> list[Object]:
        """Every item, read in pages."""
        items: list[Object] = []
        query = {**(params or {}), "limit": "2000"}
        while True:
            page = await self.request("GET", path, params=query)
            items += page.get("items") or []
            token = page["metadata"].get("continue")
            if not token:
                return items
            query["continue"] = token

    async def count(self, path: str, params: Mapping[str, str] | None = None) -> int:
        """How many objects the list would return (one small page, read from the cache)."""
        page = await self.request("GET", path, params={**(params or {}), "limit": "1"})
        return len(page.get("items") or []) + int(page["metadata"].get("remainingItemCount", 0))

    async def watch(
        self, path: str, *, resource_version: str, params: Mapping[str, str] | None = None
    ) -> AsyncIterator[Object]:
        """Watch events from `resource_version` until the server ends the watch."""
        query = {
            **(params or {}),
            "watch": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": "1800",
        }
        async with self.session.get(
            self.server + path, params=query, timeout=aiohttp.ClientTimeout(total=None)
        ) as response:
            if response.status >= 400:
                raise ApiError(response.status, "WATCH", path, await response.read())
            async for line in response.content:
                if line.strip():
                    yield orjson.loads(line)


async def create_all(
    api: Api,
    path: str,
    objects: Iterable[Object],
    *,
    workers: int,
    what: str | None = None,
    as_user: str | None = None,
) -> list[Object]:
    """Create the objects with `workers` concurrent clients, each sending one at a time
    (as `as_user`, if given); with `what`, say how far it got every REPORT_EVERY seconds."""
    queue = list(objects)
    total = len(queue)
    queue.reverse()
    created: list[Object] = []

    async def worker() -> None:
        while queue:
            created.append(await api.create(path, queue.pop(), as_user=as_user))

    async def report() -> None:
        while True:
            await asyncio.sleep(REPORT_EVERY)
            say(f"{what}: {len(created):,} of {total:,} created")

    reporter = asyncio.create_task(report()) if what else None
    try:
        await asyncio.gather(*(worker() for _ in range(workers)))
    finally:
        if reporter is not None:
            reporter.cancel()
    return created
