"""The faults themselves: real processes killed with SIGKILL and started again, the API
server restarted over a compacted etcd, nodes and pods deleted as an operator would.

Every fault is logged (what, when, the etcd revision it happened at) so the summary table
can list them and a failure can be read against them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from berth.kube.client import NODES, Kube
from devtools.processes import Component
from tests.e2e.kube import Cluster

LEASE = ("berth-system", "berth-controller")
REVIVED = "exited, restarted"
"""The log's kind for a component that exited on its own and was started again."""


async def delete_node(kube: Kube, name: str) -> int:
    """Delete node `name` as an operator would, and the etcd revision of its deletion, as
    the node's watch tells it (a revision read before the delete would blame on Berth an
    eviction made while the node still stood)."""
    # From the list's revision, now: a node's own may be older than a compaction.
    listed = await kube.list(NODES, field_selector=f"metadata.name={name}")
    before = listed["metadata"]["resourceVersion"]
    await kube.delete(NODES, name)
    async with contextlib.aclosing(
        kube.watch(NODES, resource_version=before, timeout_seconds=60)
    ) as events:
        async for event in events:
            node = event["object"]
            if event["type"] == "ERROR":
                raise AssertionError(f"node {name}: its watch failed: {node.get('message')}")
            if event["type"] == "DELETED" and node["metadata"]["name"] == name:
                return int(node["metadata"]["resourceVersion"])
    raise AssertionError(f"node {name}: its watch ended before its deletion was seen")


@dataclass
class Injected:
    at: float
    kind: str
    detail: str


@dataclass
class Injector:
    cluster: Cluster
    started: float = field(default_factory=time.monotonic)
    log: list[Injected] = field(default_factory=list)
    down: dict[str, Component] = field(default_factory=dict)
    """Components killed and not yet started again, by name."""
    argv: dict[str, list[str]] = field(default_factory=dict)
    """Each component's command line, read while it ran, to start it again."""

    def __post_init__(self) -> None:
        for component in self.cluster.local.running():
            self.argv[component.name] = self.cluster.local.command_line(component)

    def note(self, kind: str, detail: str = "") -> None:
        entry = Injected(time.monotonic() - self.started, kind, detail)
        self.log.append(entry)
        print(f"  fault t={entry.at:6.1f}s {kind} {detail}", flush=True)

    # ----- processes ------------------------------------------------------------------

    def component(self, name: str) -> Component:
        return next(c for c in self.cluster.local.components if c.name == name)

    def leader(self) -> Component | None:
        """The controller replica that holds the Lease, if a running one does."""
        got = self.cluster.kubectl(
            "get", "lease", LEASE[1], "-n", LEASE[0], "-o", "json", check=False
        )
        if got.returncode != 0:  # the API server is restarting
            return None
        holder = json.loads(got.stdout)["spec"].get("holderIdentity") or ""
        return next(
            (
                c
                for c in self.cluster.local.running()
                if c.name.startswith("berth-controller") and f"-{c.pid}-" in holder
            ),
            None,
        )

    async def kill(self, name: str, *, why: str = "") -> None:
        """SIGKILL one component; it stays down until `restart`."""
        target = self.component(name)
        await asyncio.to_thread(self.cluster.local.kill, target)
        self.down[name] = target
        self.note("kill -9", f"{name} {why}".strip())

    async def restart(self, name: str) -> None:
        """Start a killed component again, on the same port, and wait until it is healthy."""
        target = self.down.pop(name)
        await asyncio.to_thread(self.cluster.local.respawn, target, self.argv[name])

    async def revive(self) -> None:
        """Start again each Berth component that exited on its own (as the controller does
        when it loses its Lease, for its Deployment to restart it), as a kubelet would."""
        for component in list(self.cluster.local.components):
            if component.name in self.down or not component.name.startswith("berth-"):
                continue
            if not self.cluster.local.owns(component):
                await asyncio.to_thread(self.cluster.local.stop, component)
                await asyncio.to_thread(
                    self.cluster.local.respawn, component, self.argv[component.name]
                )
                self.note(REVIVED, component.name)

    async def kill_leader(self) -> str | None:
        leader = await asyncio.to_thread(self.leader)
        if leader is None:
            return None
        await self.kill(leader.name, why="(the leader)")
        return leader.name

    async def restart_all(self) -> None:
        for name in list(self.down):
            await self.restart(name)

    # ----- the API server and etcd ----------------------------------------------------

    def etcd(self, verb: str, body: dict[str, object]) -> dict[str, object]:
        """One call to etcd's JSON gateway (the v3 API over HTTP on its client URL)."""
        request = urllib.request.Request(
            f"{self.cluster.local.etcd_url()}/v3/{verb}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            result: dict[str, object] = json.loads(answer.read())
            return result

    def revision(self) -> int:
        """etcd's current revision (a range over one key answers with it)."""
        answer = self.etcd("kv/range", {"key": base64.b64encode(b"/").decode()})
        header = answer["header"]
        assert isinstance(header, dict)
        return int(header["revision"])

    async def restart_apiserver_over_compacted_etcd(self) -> int:
        """Kill the API server, compact etcd up to its current revision, start the API
        server again: every watch that resumes from a revision it had seen before then is
        answered 410 Gone, as after a long disconnection in production."""
        await self.kill("kube-apiserver", why="(restart)")
        revision = await asyncio.to_thread(self.revision)
        await asyncio.to_thread(
            self.etcd, "kv/compaction", {"revision": revision, "physical": True}
        )
        self.note("etcd compacted", f"at revision {revision}")
        await self.restart("kube-apiserver")
        return revision

    def expired_watches(self) -> int:
        """Watches Berth's components saw end in 410 Gone, from their logs."""
        count = 0
        for component in self.cluster.local.components:
            if component.name.startswith("berth-"):
                text = Path(component.log).read_text(errors="replace")
                count += text.count("expired (")
        return count
