"""The one way Berth talks to the Kubernetes API: raw JSON dicts over kubernetes_asyncio.

kubernetes_asyncio loads the kubeconfig or the in-cluster service account and owns the
TLS session; Berth uses only its transport and keeps objects as plain dicts (parsed with
orjson), so caches hold exactly what the API server sent and no model conversion sits on
the hot path.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from kubernetes_asyncio import client, config

Object = dict[str, Any]

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"

WATCH_IDLE = 120.0
"""Seconds a watch may stay silent: the API server sends a bookmark about once a minute
(its watch cache's default), so a healthy watch is never silent this long."""

GATHER_BELOW = 64 * 2**10
"""A read of a watch this large or larger is taken as a backlog (`Kube.watch`)."""

MAX_EVENT = 16 * 2**20
"""Bytes one watch event may take: far above the largest object etcd stores by default
(1.5 MiB), so that a large object never stops a watch, while a stream that never ends
its line cannot take all memory."""


@dataclass(frozen=True)
class Resource:
    """An API resource: where its objects live."""

    group: str
    version: str
    plural: str
    namespaced: bool

    def path(
        self,
        *,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if subresource:
            base += f"/{subresource}"
        return base


PODS = Resource("", "v1", "pods", namespaced=True)
NODES = Resource("", "v1", "nodes", namespaced=False)
PERSISTENTVOLUMES = Resource("", "v1", "persistentvolumes", namespaced=False)
EVENTS = Resource("", "v1", "events", namespaced=True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", namespaced=True)
SECRETS = Resource("", "v1", "secrets", namespaced=True)
PDBS = Resource("policy", "v1", "poddisruptionbudgets", namespaced=True)
REPLICASETS = Resource("apps", "v1", "replicasets", namespaced=True)
DEPLOYMENTS = Resource("apps", "v1", "deployments", namespaced=True)
STATEFULSETS = Resource("apps", "v1", "statefulsets", namespaced=True)
PRIORITYCLASSES = Resource("scheduling.k8s.io", "v1", "priorityclasses", namespaced=False)
PODMIGRATIONJOBS = Resource(
    "scheduling.koordinator.sh", "v1alpha1", "podmigrationjobs", namespaced=False
)
RESERVATIONS = Resource("scheduling.koordinator.sh", "v1alpha1", "reservations", namespaced=False)
NAMESPACES = Resource("", "v1", "namespaces", namespaced=False)


class KubeconfigError(Exception):
    """No usable kubeconfig: the message names the file and what is wrong with it."""


IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def default_namespace(kubeconfig: Path | None = None) -> str:
    """The namespace a command works in when none is given, as kubectl's: the current
    context's, else the ServiceAccount's in a cluster, else "default"."""
    if _in_cluster(kubeconfig):
        try:
            return IN_CLUSTER_NAMESPACE.read_text().strip() or "default"
        except OSError:
            return "default"
    try:
        _, current = config.list_kube_config_contexts(str(_kubeconfig_file(kubeconfig)))
        namespace = (current or {})["context"].get("namespace")
    except Exception:  # the library raises what its parsers raise; `Kube.connect` says it
        return "default"
    return namespace if isinstance(namespace, str) and namespace else "default"


def _in_cluster(given: Path | None) -> bool:
    """Whether to use the pod's ServiceAccount: in a pod, when neither a kubeconfig given
    nor a file $KUBECONFIG lists is there to use (as kubectl: $KUBECONFIG first, wherever
    it runs; one naming no file falls back on the pod's account)."""
    listed = [Path(p) for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return (
        given is None
        and not any(path.is_file() for path in listed)
        and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    )


def _kubeconfig_file(given: Path | None) -> Path:
    """The kubeconfig to read: `given`, else the first of $KUBECONFIG, else
    ~/.kube/config; KubeconfigError when it is not a file."""
    if given is not None:
        candidates = [given]
    else:
        listed = os.environ.get("KUBECONFIG", "")
        candidates = [Path(p) for p in listed.split(os.pathsep) if p] or [
            Path.home() / ".kube" / "config"
        ]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    if given is not None:
        raise KubeconfigError(f"{given}: no such kubeconfig file")
    raise KubeconfigError(
        f"no kubeconfig ({', '.join(str(c) for c in candidates)} not found): give "
        "--kubeconfig, set KUBECONFIG, or run in a cluster"
    )


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


class KubeError(Exception):
    """A non-2xx answer from the API server, with its Status reason and message."""

    def __init__(self, status: int, body: Mapping[str, Any]) -> None:
        self.status = status
        self.reason = str(body.get("reason", ""))
        self.message = str(body.get("message", body))
        details = body.get("details")
        causes = details.get("causes") if isinstance(details, dict) else None
        self.causes = tuple(
            str(cause.get("reason") or cause.get("type") or "")
            for cause in (causes if isinstance(causes, list) else [])
            if isinstance(cause, dict)
        )
        """The `reason` (Go's `Type`) of each of the Status's causes."""
        super().__init__(f"HTTP {status} {self.reason}: {self.message}")

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def gone(self) -> bool:
        return self.status == 410

    @property
    def disruption_budget(self) -> bool:
        """An eviction refused for a PodDisruptionBudget: 429 with a `DisruptionBudget`
        cause. Not every 429 is one: API Priority and Fairness, or a webhook, answer 429 too."""
        return self.status == 429 and "DisruptionBudget" in self.causes


class Kube:
    """An API client. Create with `await Kube.connect(...)`; close with `await kube.close()`."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    @classmethod
    async def connect(cls, kubeconfig: Path | None = None) -> Kube:
        """From a kubeconfig file, else from $KUBECONFIG, else from the in-cluster
        service account, else from ~/.kube/config. KubeconfigError, naming the file and
        the problem, when none of these can be used."""
        if _in_cluster(kubeconfig):
            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
            except config.ConfigException as error:
                raise KubeconfigError(f"in-cluster configuration: {_one_line(error)}") from None
            return cls(client.ApiClient())
        path = _kubeconfig_file(kubeconfig)
        try:
            api = await config.new_client_from_config(config_file=str(path))
        except Exception as error:  # the library raises what its parsers raise
            raise KubeconfigError(f"{path}: not a usable kubeconfig: {_one_line(error)}") from None
        return cls(api)

    async def close(self) -> None:
        await self.api.close()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | aiohttp.ClientTimeout | None = 30.0,
    ) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        response = await self.api.call_api(
            path,
            method,
            query_params=[(k, v) for k, v in (query or {}).items() if v is not None],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
            _request_timeout=timeout,
        )
        # Unread responses are not checked by the transport: an error is ours to raise.
        if response.status >= 400:
            raw = await response.read()
            response.release()
            raise KubeError(response.status, _body(raw))
        return response

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Object:
        response = await self._call(method, path, query=query, body=body, content_type=content_type)
        raw = await response.read()
        data: Object = orjson.loads(raw) if raw else {}
        return data

    async def get(self, resource: Resource, name: str, namespace: str | None = None) -> Object:
        return await self.request("GET", resource.path(namespace=namespace, name=name))

    async def find(
        self, resource: Resource, name: str, namespace: str | None = None
    ) -> Object | None:
        """`get`, but None when the API server says there is no such object."""
        try:
            return await self.get(resource, name, namespace)
        except KubeError as error:
            if error.not_found:
                return None
            raise

    async def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_: str | None = None,
        resource_version: str | None = None,
    ) -> Object:
        """Without `resource_version`, a consistent read (from the API server's watch cache
        once it has caught up with etcd). `resource_version="0"`: any version the API
        server has, with no bound on how far behind: only where a stale answer is fine."""
        return await self.request(
            "GET",
            resource.path(namespace=namespace),
            query={
                "labelSelector": label_selector,
                "fieldSelector": field_selector,
                "limit": limit,
                "continue": continue_,
                "resourceVersion": resource_version,
            },
        )

    async def create(
        self,
        resource: Resource,
        body: Object,
        *,
        namespace: str | None = None,
        dry_run: bool = False,
    ) -> Object:
        query = {"dryRun": "All"} if dry_run else None
        return await self.request(
            "POST", resource.path(namespace=namespace), query=query, body=body
        )

    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        content_type: str = MERGE_PATCH,
    ) -> Object:
        return await self.request(
            "PATCH",
            resource.path(namespace=namespace, name=name, subresource=subresource),
            body=patch,
            content_type=content_type,
        )

    async def replace_status(self, resource: Resource, obj: Object) -> Object:
        """PUT the status subresource; the object's resourceVersion makes it conditional."""
        metadata = obj["metadata"]
        return await self.request(
            "PUT",
            resource.path(
                namespace=metadata.get("namespace"), name=metadata["name"], subresource="status"
            ),
            body=obj,
        )

    async def delete(
        self,
        resource: Resource,
        name: str,
        *,
        namespace: str | None = None,
        uid: str | None = None,
        grace_period_seconds: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> Object:
        body: Object = {"apiVersion": "v1", "kind": "DeleteOptions", **(options or {})}
        if uid:
            body["preconditions"] = {**body.get("preconditions", {}), "uid": uid}
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        return await self.request(
            "DELETE", resource.path(namespace=namespace, name=name), body=body
        )

    async def evict(
        self, namespace: str, name: str, *, delete_options: Mapping[str, Any] | None = None
    ) -> Object:
        """The Eviction API: the API server refuses with 429 while a PDB forbids it
        (`KubeError.disruption_budget`)."""
        body: Object = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if delete_options:
            body["deleteOptions"] = dict(delete_options)
        return await self.request(
            "POST", PODS.path(namespace=namespace, name=name, subresource="eviction"), body=body
        )

    async def watch(
        self,
        resource: Resource,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
        idle: float = WATCH_IDLE,
        gather: float = 0.0,
    ) -> AsyncGenerator[Object, None]:
        """Watch events from `resource_version`, bookmarks included, until the server ends.

        With `gather` (seconds), the connection is left unread for that long after a
        small read: the events that come meanwhile are then decrypted, parsed and handed
        on in one go. An event after a quiet spell is taken at once. A read of `GATHER_BELOW`
        bytes or more means a backlog, and the next read follows at once: the pause
        never caps how fast a watch is drained. Taking a burst's events one read at a
        time costs a process several times the CPU, on a machine whose cores are busy."""
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_seconds,
            "labelSelector": label_selector,
        }
        # A connection that goes silent (half-open: a node of the API server lost, a
        # load balancer's idle drop) ends once nothing came for WATCH_IDLE, bookmarks
        # included, rather than at the request's end: the watch starts again from there.
        timeout = aiohttp.ClientTimeout(total=timeout_seconds + 30, sock_connect=30, sock_read=idle)
        response = await self._call(
            "GET", resource.path(namespace=namespace), query=query, timeout=timeout
        )
        async with response:
            connection = response.connection
            transport = connection.transport if gather and connection is not None else None
            lines = Lines()
            while chunk := await response.content.readany():
                for line in lines.feed(chunk):
                    yield orjson.loads(line)
                # At the end of the stream aiohttp may have handed the connection on.
                if (
                    transport is not None
                    and len(chunk) < GATHER_BELOW
                    and not response.content.is_eof()
                ):
                    transport.pause_reading()
                    try:
                        await asyncio.sleep(gather)
                    finally:
                        transport.resume_reading()
            last = lines.rest()
            if last.strip():
                yield orjson.loads(last)


class Lines:
    """The lines of a stream fed in chunks: each complete, non-blank line once its
    newline has come. A line is joined once, when complete, however many chunks it took;
    one longer than `MAX_EVENT` is refused (ValueError)."""

    def __init__(self) -> None:
        self._pieces: list[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        if b"\n" not in chunk:
            self._pieces.append(chunk)
            self._size += len(chunk)
            if self._size > MAX_EVENT:
                raise ValueError(f"a watch event longer than {MAX_EVENT} bytes")
            return []
        first, *middle, tail = chunk.split(b"\n")
        lines = [b"".join((*self._pieces, first)), *middle]
        self._pieces, self._size = [], 0
        self.feed(tail)
        return [line for line in lines if line.strip()]

    def rest(self) -> bytes:
        """What came after the last newline."""
        return b"".join(self._pieces)


def _body(raw: Any) -> Mapping[str, Any]:
    try:
        data = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        return {"message": str(raw)}
    return data if isinstance(data, dict) else {"message": str(data)}


def add_kubeconfig_argument(parser: argparse.ArgumentParser) -> None:
    """`--kubeconfig`: where a command finds the API server (`Kube.connect`)."""
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="kubeconfig file (default: in-cluster service account, "
        "else $KUBECONFIG or ~/.kube/config)",
    )
