"""One real local control plane per test session, a namespace per test.

The cluster is started through the real `berth dev up` command and stopped with
`berth dev down`, so every session also exercises the CLI; teardown checks that no
process is left behind. When an e2e test fails, the tail of every component's log
is attached to its report. `BERTH_E2E_SCOPE=strict` runs the session's cluster in the
strict scope (`berth dev up --scope strict`); the default scope otherwise. The cluster
runs cert-manager (`--cert-manager`), as most clusters Berth is installed on do: Berth's
serving certificate is the one it issues, and its CA injector fills the webhook's caBundle.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client, config

from berth.kube.client import Kube
from devtools.cluster import LocalCluster
from devtools.processes import pid_alive, tail
from devtools.render import Scope
from tests.e2e.kube import Cluster

BERTH = [sys.executable, "-m", "cli.berth"]


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state_dir = tmp_path_factory.mktemp("cluster")
    up = subprocess.run(
        [
            *BERTH,
            "dev",
            "up",
            f"--state-dir={state_dir}",
            "--nodes=3",
            "--cert-manager",
            f"--scope={os.environ.get('BERTH_E2E_SCOPE', 'default')}",
        ],
        capture_output=True,
        text=True,
    )
    if up.returncode != 0:
        pytest.fail(f"berth dev up failed:\n{up.stdout}\n{up.stderr}", pytrace=False)
    local = LocalCluster(state_dir)
    pids = [component.pid for component in local.components]
    handle = Cluster(local=local, up_output=up.stdout)
    try:
        yield handle
    finally:
        # Components started by tests (e.g. a second scheduler) are in state.json too.
        pids += [component.pid for component in LocalCluster(state_dir).components]
        down = subprocess.run(
            [*BERTH, "dev", "down", f"--state-dir={state_dir}"], capture_output=True, text=True
        )
        left = [pid for pid in pids if pid_alive(pid)]
        assert down.returncode == 0, down.stderr
        assert not left, f"berth dev down left processes behind: {left}"


@pytest.fixture(scope="session")
def scope(cluster: Cluster) -> Scope:
    """Which pods the session's cluster sends through Berth's extender and webhook."""
    return Scope(cluster.local.scope)


@pytest.fixture(scope="session")
async def api(cluster: Cluster) -> AsyncIterator[client.ApiClient]:
    api_client = await config.new_client_from_config(config_file=str(cluster.kubeconfig))
    async with api_client:
        yield api_client


@pytest.fixture
async def kube(cluster: Cluster) -> AsyncIterator[Kube]:
    """Berth's own API client, on the session cluster."""
    kube = await Kube.connect(cluster.kubeconfig)
    yield kube
    await kube.close()


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
    name = f"{slug}-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", name)
    cluster.wait(
        lambda: (
            cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode
            == 0
        ),
        what=f"the default ServiceAccount of {name}",
    )
    yield name
    # Jobs are cluster-scoped: delete the test's own, or they would count against the
    # per-node limits of the tests after it until their TTL.
    jobs = cluster.get("pmj")["items"]
    mine = [
        job["metadata"]["name"]
        for job in jobs
        if job["spec"].get("podRef", {}).get("namespace") == name
    ]
    if mine:
        cluster.kubectl("delete", "pmj", *mine, "--wait=false", check=False)
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    handle = getattr(item, "funcargs", {}).get("cluster")
    if report.failed and isinstance(handle, Cluster):
        for component in LocalCluster(handle.local.state_dir).components:
            report.sections.append((f"log {component.name}", tail(component.log, 40)))
    return report


@pytest.fixture
def restart_controller(cluster: Cluster, tmp_path: Path) -> Iterator[Callable[[str], None]]:
    """Restart the session's controller with a config file's text; the default comes back."""

    def restart(config: str) -> None:
        path = tmp_path / "controller-config.yaml"
        path.write_text(config)
        current = next(c for c in cluster.local.components if c.name == "berth-controller")
        cluster.local.stop(current)
        cluster.local.start_controller(name="berth-controller", config=path)

    yield restart
    current = next(c for c in cluster.local.components if c.name == "berth-controller")
    cluster.local.stop(current)
    cluster.local.start_controller(name="berth-controller")
