"""`berth dev`: start, inspect and stop the local control plane, and run the demo.

Registered in the `berth.commands` entry point group, so the `berth` command offers it
wherever devtools is importable (a checkout) and never imports it itself.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from pathlib import Path

from devtools.binaries import BuildError, cert_manager, ensure_binaries
from devtools.cluster import ClusterSpec, LocalCluster
from devtools.processes import ClusterError
from devtools.render import Scope

Handler = Callable[[argparse.Namespace], int]


def _up(args: argparse.Namespace) -> int:
    cluster = LocalCluster(args.state_dir)
    spec = ClusterSpec(
        nodes=args.nodes,
        node_cpu=args.node_cpu,
        node_memory=args.node_memory,
        node_pods=args.node_pods,
        scope=Scope(args.scope),
        cert_manager=args.cert_manager,
        profiling=args.profiling,
    )
    cluster.up(spec)
    for component in cluster.components:
        print(f"{component.name:<24} pid {component.pid:<8} port {component.port}")
    print(f"scope: {cluster.scope}")
    if cluster.cert_manager:
        print(f"serving certificate: cert-manager's, mounted in {cluster.tls_mount}")
    print(f"logs: {cluster.logs}")
    print(_export_line(cluster))
    return 0


def _build(_args: argparse.Namespace) -> int:
    print(ensure_binaries().bin_dir)
    print(cert_manager())
    return 0


def _env(args: argparse.Namespace) -> int:
    cluster = LocalCluster(args.state_dir)
    if not cluster.running() or cluster.binaries is None:
        print(f"berth: no local cluster runs from {cluster.state_dir}", file=sys.stderr)
        return 1
    print(_export_line(cluster))
    return 0


def _export_line(cluster: LocalCluster) -> str:
    assert cluster.binaries is not None
    return f"export KUBECONFIG={cluster.kubeconfig} PATH={cluster.binaries.bin_dir}:$PATH"


def _demo(args: argparse.Namespace) -> int:
    from devtools import demo

    cluster = LocalCluster(args.state_dir)
    if not cluster.running():
        print(
            f"berth: no local cluster runs from {cluster.state_dir}; run `berth dev up`",
            file=sys.stderr,
        )
        return 1
    return asyncio.run(demo.run(cluster.kubeconfig))


def _down(args: argparse.Namespace) -> int:
    stopped = LocalCluster(args.state_dir).down()
    print(f"stopped: {', '.join(stopped)}" if stopped else "no local cluster was running")
    return 0


def _status(args: argparse.Namespace) -> int:
    cluster = LocalCluster(args.state_dir)
    report = cluster.status()
    if not report:
        print(f"no local cluster in {cluster.state_dir}")
        return 1
    for component, healthy, seen in report:
        state = "healthy" if healthy else "UNHEALTHY"
        print(
            f"{component.name:<24} pid {component.pid:<8} port {component.port:<6} "
            f"{state}  {seen[:60]}"
        )
    print(f"scope: {cluster.scope}")
    if cluster.cert_manager:
        print(f"serving certificate: cert-manager's, mounted in {cluster.tls_mount}")
    print(f"kubeconfig: {cluster.kubeconfig}")
    return 0 if all(healthy for _, healthy, _ in report) else 1


def _handle(args: argparse.Namespace) -> int:
    """Run the chosen `dev` sub-command; a failure it can explain is one line, exit 1."""
    handler: Handler = args.dev_handler
    try:
        return handler(args)
    except (ClusterError, BuildError) as error:
        print(f"berth: {error}", file=sys.stderr)
        return 1


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev = commands.add_parser("dev", help="a local control plane for tests and the demo")
    dev_commands = dev.add_subparsers(dest="dev_command", required=True)
    for name, handler, help_text in (
        (
            "up",
            _up,
            "start etcd, kube-apiserver, kube-controller-manager, "
            "kube-scheduler, kwok and fake nodes",
        ),
        ("down", _down, "stop exactly the processes `up` started"),
        ("status", _status, "show each component and its health"),
        ("env", _env, "print the line that points kubectl at the running cluster"),
        (
            "build",
            _build,
            "build (or reuse) the control plane binaries and cert-manager; print where",
        ),
        ("demo", _demo, "defragment the running cluster with reservation-first migrations"),
    ):
        sub = dev_commands.add_parser(name, help=help_text)
        sub.add_argument(
            "--state-dir",
            type=Path,
            default=None,
            help="where state, logs and the kubeconfig live (default: $XDG_STATE_HOME/berth/dev)",
        )
        sub.set_defaults(handler=_handle, dev_handler=handler)
        if name == "up":
            sub.add_argument("--nodes", type=int, default=3, help="fake nodes (default 3)")
            sub.add_argument("--node-cpu", default="8", help="CPU of each node (default 8)")
            sub.add_argument(
                "--node-memory", default="16Gi", help="memory of each node (default 16Gi)"
            )
            sub.add_argument(
                "--node-pods", type=int, default=110, help="pod capacity of each node (default 110)"
            )
            sub.add_argument(
                "--scope",
                choices=[scope.value for scope in Scope],
                default=Scope.DEFAULT.value,
                help="which pods reach Berth's extender and webhook: `default`, only those "
                "of a migration (managedResources, namespaceSelector); `strict`, every pod, "
                "as manifests/strict (default: default)",
            )
            sub.add_argument(
                "--cert-manager",
                action="store_true",
                help="run cert-manager (built from its Go module): it issues the webhook's "
                "and extender's certificate from manifests/cert-manager and injects the "
                "webhook's caBundle; the components reload the certificate when renewed",
            )
            sub.add_argument(
                "--profiling",
                action="store_true",
                help="serve kube-apiserver's /debug/pprof to the cluster's admin, for CPU "
                "profiles (`kubectl get --raw '/debug/pprof/profile?seconds=20'`)",
            )
