"""The fault suite runs on a cluster of its own, started for this package and stopped
after it.

Its faults are cluster-wide: an API server restart, etcd compacted, a node deleted,
every replica of a component killed. On the session's cluster they would reach into the
tests that run beside or after them, and the suite needs a shape the session's cluster
does not have (two controller and two webhook replicas, more nodes, higher migration
limits). A second small cluster costs some 20 s to start; it is stopped as soon as the
package is done, and teardown checks that nothing it started is left running.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from devtools.cluster import LocalCluster
from devtools.processes import pid_alive
from tests.e2e.conftest import BERTH
from tests.e2e.kube import Cluster

REPLICAS = 2
NODES = 6

CONTROLLER_CONFIG = """\
# Room for many migrations at once, so that faults meet jobs at every step.
maxMigratingPerNode: 6
evictQPS: 50
evictBurst: 10
"""


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state_dir = tmp_path_factory.mktemp("faults-cluster")
    up = subprocess.run(
        [*BERTH, "dev", "up", f"--state-dir={state_dir}", f"--nodes={NODES}", "--node-cpu=4"],
        capture_output=True,
        text=True,
    )
    if up.returncode != 0:
        pytest.fail(f"berth dev up failed:\n{up.stdout}\n{up.stderr}", pytrace=False)
    local = LocalCluster(state_dir)
    pids: list[int] = []
    try:
        config = state_dir / "controller-config.yaml"
        config.write_text(CONTROLLER_CONFIG)
        local.stop(next(c for c in local.components if c.name == "berth-controller"))
        for index in range(1, REPLICAS + 1):
            local.start_controller(name=f"berth-controller-{index}", config=config)
        # Each webhook replica gets an entry of its own in the MutatingWebhookConfiguration.
        # The extender stays one: kube-scheduler refuses two extender entries that manage
        # the same resource ("duplicate extender managed resource name"), and here no
        # Service balances replicas behind one entry.
        local.start_webhook(name="berth-webhook-2")
        yield Cluster(local=local, up_output=up.stdout)
    finally:
        pids += [component.pid for component in LocalCluster(state_dir).components]
        down = subprocess.run(
            [*BERTH, "dev", "down", f"--state-dir={state_dir}"], capture_output=True, text=True
        )
        left = [pid for pid in pids if pid_alive(pid)]
        assert down.returncode == 0, down.stderr
        assert not left, f"berth dev down left processes behind: {left}"
