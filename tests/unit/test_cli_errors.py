"""Every command given a kubeconfig or a configuration file it cannot use says so on one
line naming the file, and exits with code 2: never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml

from berth import tls
from berth.kube.client import KubeError, default_namespace
from cli import errors
from devtools.processes import free_port

COMMANDS = {
    "berth controller": ["-m", "cli.berth", "controller", "--insecure", "--health-port=0"],
    "berth webhook": ["-m", "cli.berth", "webhook", "{certs}", "--port=0"],
    "berth extender": ["-m", "cli.berth", "extender", "--insecure", "--port=0"],
    "python -m webhook": ["-m", "webhook", "{certs}", "--port=0"],
    "python -m extender": ["-m", "extender", "--insecure", "--port=0"],
    "kubectl-migrate": ["-m", "cli.migrate", "pod", "web-1"],
}


def run(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    paths = tls.write_serving_set(tmp_path / "certs", dns_names=(), ip_addresses=("127.0.0.1",))
    certs = [f"--tls-cert-file={paths[2]}", f"--tls-private-key-file={paths[3]}"]
    args = [a for arg in argv for a in (certs if arg == "{certs}" else [arg])]
    env = {
        k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    }
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "HOME": str(tmp_path)},  # no ~/.kube/config to fall back on
        check=False,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_kubeconfig(command: str, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "kubeconfig"
    line = one_line(run([*COMMANDS[command], f"--kubeconfig={missing}"], tmp_path))
    assert line.endswith(f": {missing}: no such kubeconfig file")


@pytest.mark.parametrize("command", ["berth controller", "python -m webhook", "kubectl-migrate"])
def test_an_invalid_kubeconfig(command: str, tmp_path: Path) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("clusters: [unclosed\n")
    line = one_line(run([*COMMANDS[command], f"--kubeconfig={bad}"], tmp_path))
    assert f"{bad}: not a usable kubeconfig: " in line


def test_no_kubeconfig_at_all(tmp_path: Path) -> None:
    line = one_line(run(COMMANDS["berth extender"], tmp_path))
    assert "no kubeconfig" in line
    assert "give --kubeconfig, set KUBECONFIG, or run in a cluster" in line


def test_a_bad_controller_configuration_file(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("maxMigratingGlobally: many\nfoo: 1\n")
    line = one_line(run([*COMMANDS["berth controller"], f"--config={config}"], tmp_path))
    assert line.startswith(f"berth controller: {config}: ")
    assert "foo: unknown key" in line


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["-m", "cli.berth", "webhook", "{certs}", "--port=70000"], "must be a port from 0"),
        (["-m", "cli.berth", "extender", "--insecure", "--port=-5"], "must be a port from 0"),
        (["-m", "cli.berth", "controller", "--insecure", "--health-port=70000"], "a port"),
        (["-m", "cli.berth", "webhook", "{certs}", "--request-deadline=nan"], "positive number"),
        (["-m", "cli.berth", "webhook", "{certs}", "--idle-timeout=inf"], "positive number"),
    ],
)
def test_a_flag_out_of_its_range_is_named(argv: list[str], problem: str, tmp_path: Path) -> None:
    result = run(argv, tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert problem in result.stderr


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["-m", "cli.migrate", "pod", ""], "'' is not a pod name"),
        (["-m", "cli.migrate", "pod", "web", "-n", "Prod"], "'Prod' is not a namespace name"),
        (["-m", "cli.migrate", "node", "../nodes"], "'../nodes' is not a node name"),
        (["-m", "cli.migrate", "pod", "web", "--to", "Node_1"], "'Node_1' is not a node name"),
        (
            ["-m", "cli.migrate", "pod", "web", "--to", "node-1", "--mode", "EvictDirectly"],
            "--to pins the pod's Reservation to a node; --mode EvictDirectly reserves none",
        ),
        (
            ["-m", "cli.migrate", "pod", "web", "--ttl", "5"],
            "--ttl: '5' is not a Go duration such as 90s, 5m or 1h30m",
        ),
        (["-m", "cli.migrate", "node", "n", "--ttl=-5m"], "--ttl: '-5m' is negative"),
        (
            ["-m", "cli.migrate", "pod", "web", "--timeout", "1m"],
            "--timeout bounds --wait: give --wait too",
        ),
        (
            ["-m", "cli.migrate", "pod", "web", "--wait", "--timeout", "soon"],
            "--timeout: 'soon' is not a Go duration",
        ),
    ],
)
def test_kubectl_migrate_refuses_a_name_no_object_can_have(
    argv: list[str], problem: str, tmp_path: Path
) -> None:
    assert problem in one_line(run(argv, tmp_path))


def kubeconfig_to_a_closed_port(tmp_path: Path, namespace: str | None = None) -> Path:
    context: dict[str, str] = {"cluster": "c", "user": "u"}
    if namespace:
        context["namespace"] = namespace
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": f"http://127.0.0.1:{free_port()}"}}
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "ctx", "context": context}],
                "current-context": "ctx",
            }
        )
    )
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "cli.migrate", "pod", "web-1"],
        ["-m", "cli.berth", "controller", "--insecure", "--health-port=0"],
    ],
)
def test_an_api_server_that_cannot_be_reached_is_said_on_one_line(
    argv: list[str], tmp_path: Path
) -> None:
    result = run([*argv, f"--kubeconfig={kubeconfig_to_a_closed_port(tmp_path)}"], tmp_path)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "Connect" in result.stderr.strip().splitlines()[-1]


def test_the_namespace_of_a_command_is_the_contexts_as_kubectl_s(tmp_path: Path) -> None:
    assert default_namespace(kubeconfig_to_a_closed_port(tmp_path, "prod")) == "prod"
    assert default_namespace(kubeconfig_to_a_closed_port(tmp_path)) == "default"
    assert default_namespace(tmp_path / "missing") == "default"


def test_kubeconfig_wins_over_the_pods_service_account_as_with_kubectl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a pod, a command given $KUBECONFIG acts where that file says, not as the pod's
    ServiceAccount in the pod's own cluster."""
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig_to_a_closed_port(tmp_path, "prod")))
    assert default_namespace() == "prod"
    monkeypatch.delenv("KUBECONFIG")
    # The pod's own namespace file, absent here: the in-cluster path answers "default".
    assert default_namespace() == "default"
    # $KUBECONFIG naming no file falls back on the pod's account, as kubectl's loader does.
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert default_namespace() == "default"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig_to_a_closed_port(tmp_path, "prod")))
    assert default_namespace() == "prod"


def test_a_file_that_cannot_be_written_is_said_on_one_line(tmp_path: Path) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("")
    for argv in (
        ["-m", "cli.berth", "certs", f"--out={taken}"],
        ["-m", "cli.berth", "crds", f"--out={taken}/x"],
    ):
        result = run(argv, tmp_path)
        assert result.returncode == 1, result.stderr
        assert "Traceback" not in result.stderr
        assert str(taken) in result.stderr


@pytest.mark.parametrize(
    ("error", "again"),
    [
        (KubeError(429, {"message": "slow down"}), True),
        (KubeError(503, {"message": "unavailable"}), True),
        (KubeError(403, {"message": "forbidden"}), False),
        (KubeError(401, {"message": "token expired"}), False),
        (aiohttp.ServerDisconnectedError(), True),
        (TimeoutError(), True),
        (ValueError("a bug"), False),
    ],
)
def test_a_wait_reads_the_jobs_again_after_an_answer_that_may_fare_otherwise(
    error: BaseException, again: bool
) -> None:
    """One lost connection or throttled read while following the jobs says nothing of
    them: the wait goes on. A refusal (401, 403) ends it."""
    assert errors.transient(error) is again
